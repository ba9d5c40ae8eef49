"""`stitchcuda dataset build`: skill samples from a recorded run store, de-duplicated, split by task."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from stitchcuda.agents.coder import feedback_prompt, scratch_prompt
from stitchcuda.agents.planner import PlanContext, default_plan
from stitchcuda.agents.records import RunState, SampleOutcome, StepRecord
from stitchcuda.agents.session import build_config
from stitchcuda.cli import app
from stitchcuda.store import RunStore
from stitchcuda.task import load_task_file, resolve_tasks

TINY = Path(__file__).parent / "fixtures" / "cpu" / "tiny_mlp.py"


def record_run(store: RunStore, task, answers: list[tuple[str, str]], feedback: str) -> str:
    """A run as the loop records it: per step the Coder's prompt and answer, the step's outcome
    and the verdict file of what the answer built."""
    config = build_config(model=None, coder="offline", provider="openai", base_url=None, api_key_env=None,
                          planner_model=None, coder_model=None, coder_provider=None, coder_base_url=None,
                          adapter=None, temperature=0.0, llm_timeout=10, samples=1, tolerance="strict",
                          device="cpu", preset="tiny-debug", max_steps=4, max_llm_calls=None, max_tokens=None,
                          max_cost=None, max_wall=None, max_attempts=2, max_replans=0, max_subtasks=1)
    state = RunState(run_id=store.new_run_id(task.name), task=task.name, task_sha256=task.sha256)
    store.create_run(state, config)
    run_dir = store.run_dir(state.run_id)
    (run_dir / "task.py").write_text(task.source)
    plan = default_plan(PlanContext(task, "", None, "", None, "", "strict"))
    for index, (skill, answer) in enumerate(answers):
        if skill == "scratch":
            messages = scratch_prompt(task, plan, plan.subtasks[0], None, "", "", "strict")
        else:
            messages = feedback_prompt(task, plan.subtasks[0], "class ModelNew: ...", feedback, "optimize", "",
                                       "strict")
        store.add_llm_call(state.run_id, index, "coder", 0, "scripted", [m.model_dump() for m in messages], answer)
        verdict_path = run_dir / f"step{index}.verdict.json"
        verdict_path.write_text(json.dumps({"passed": index > 0, "step": index}))
        outcome = SampleOutcome(sample=0, path=str(run_dir / f"step{index}.py"), passed=index > 0, compiled=True,
                                correct=index > 0, hacking="none", speedup_eager=1.5 * index or None,
                                verdict_path=str(verdict_path))
        store.save_step(state.run_id, StepRecord(index=index, subtask=1, skill=skill, samples=[outcome], chosen=0))
    return state.run_id


def test_dataset_from_runs_and_tasks_is_deduplicated_and_split_by_task(tmp_path):
    store = RunStore(tmp_path / "ws")
    tiny = load_task_file(TINY)
    mlp = resolve_tasks("mlp")[0]
    feedback = "correct, 1.50x vs eager; the GEMM is 80% of the time: fuse its epilogue"
    run_a = record_run(store, tiny, [("scratch", "```python\nA\n```"), ("feedback", "```python\nB\n```"),
                                     ("feedback", "```python\nB\n```")], feedback)  # the last repeats step 1
    record_run(store, mlp, [("scratch", "```python\nC\n```")], feedback)
    out = tmp_path / "data"
    result = CliRunner().invoke(app, ["dataset", "build", "all", "-o", str(out), "--tasks", "suite",
                                      "--eval-tasks", "mlp,swiglu_ffn", "--workspace", str(tmp_path / "ws"), "--json"])
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.stdout)
    assert manifest["duplicates_dropped"] == 1
    assert manifest["tasks"]["eval"] == ["mlp", "swiglu_ffn"]
    assert not set(manifest["tasks"]["train"]) & set(manifest["tasks"]["eval"])
    train = pq.read_table(out / "train.parquet").to_pylist()
    evaluation = pq.read_table(out / "eval.parquet").to_pylist()
    assert len(train) + len(evaluation) == 3 + 18  # 3 distinct run samples + one prompt per bundled task
    from_run = [r for r in train if r["source"].startswith(f"run:{run_a}")]
    assert [r["skill"] for r in from_run] == [1, 2]
    stored = json.loads(store.db.execute("SELECT messages FROM llm_calls WHERE run_id = ? AND step = 1",
                                         (run_a,)).fetchone()[0])
    assert from_run[1]["prompt"] == stored  # exactly as the agent sent it
    assert from_run[1]["feedback"] == feedback and from_run[1]["completion"] == "```python\nB\n```"
    assert json.loads(from_run[1]["verdict"])["step"] == 1 and from_run[1]["passed"] is True
    mlp_rows = [r for r in evaluation if r["task"] == "mlp"]
    assert {r["source"].split("/")[0].split(":")[0] for r in mlp_rows} == {"run", "tasks"}
    prompt_only = [r for r in mlp_rows if r["source"] == "tasks:suite"][0]
    assert prompt_only["completion"] is None and "class Model" in prompt_only["reference"]


def test_dataset_split_by_hash_is_stable_and_whole_tasks(tmp_path):
    from stitchcuda.rl.dataset import assign_splits, task_samples

    samples = task_samples(resolve_tasks("suite"), "suite")
    assign_splits(samples, eval_fraction=0.3)
    first = {s.task: s.split for s in samples}
    again = task_samples(resolve_tasks("suite"), "suite")
    assign_splits(again, eval_fraction=0.3)
    assert first == {s.task: s.split for s in again}
    assert 0 < sum(v == "eval" for v in first.values()) < len(first)


def test_dataset_build_needs_runs_or_tasks(tmp_path):
    result = CliRunner().invoke(app, ["dataset", "build", "-o", str(tmp_path / "d")])
    assert result.exit_code == 2 and "name runs" in result.output


def test_shipped_training_configs_load():
    from stitchcuda.rl.config import TrainConfig

    root = Path(__file__).parents[1] / "configs" / "train"
    paper = TrainConfig.load(root / "paper_qwen3_32b.toml")
    assert paper.model == "Qwen/Qwen3-32B" and paper.grpo["max_completion_length"] == 16384
    assert paper.generation.backend == "vllm-colocate" and paper.judge is not None
    small = TrainConfig.load(root / "small_single_gpu.toml")
    assert small.verify.gpus == ["cuda:0"] and Path(small.dataset).is_absolute()
