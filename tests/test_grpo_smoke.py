"""A GRPO smoke run on the CPU: a tiny randomly initialised Llama and a tokenizer trained here
(nothing from a hub), a few steps of `stitchcuda train`, rewards through the real reward
functions (extraction, verification on the CPU, rule reward, rubric over the scripted server)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stitchcuda.cli import app
from stitchcuda.rl.train import step_metrics
from tests.llm_server import ScriptedOpenAIServer
from tests.test_optimize_loop import plan

pytest.importorskip("trl")
pytest.importorskip("peft")

ROOT = Path(__file__).parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def tiny_model(folder: Path) -> None:
    """A 2-layer Llama with a word-level tokenizer over a few programs' words."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = [(FIXTURES / "cpu" / name).read_text() for name in ("tiny_mlp.py", "cpp_extension.py")]
    corpus.append("```python\nclass ModelNew(nn.Module):\n```")
    raw = Tokenizer(models.WordLevel(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(corpus, trainers.WordLevelTrainer(
        special_tokens=["<unk>", "<pad>", "<|end|>", "<|user|>", "<|system|>", "<|assistant|>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="<|end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    import torch

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)


def test_grpo_smoke_run_with_verified_rewards(tmp_path, cache):
    model_dir = tmp_path / "tiny"
    tiny_model(model_dir)
    data = tmp_path / "data"
    built = CliRunner().invoke(app, ["dataset", "build", "--tasks", str(FIXTURES / "cpu" / "tiny_mlp.py"),
                                     "--eval-fraction", "0", "-o", str(data), "--json"])
    assert built.exit_code == 0, built.output
    with ScriptedOpenAIServer() as server:
        config = {
            "model": str(model_dir), "dataset": str(data), "output_dir": str(tmp_path / "out"),
            "workspace": str(tmp_path / "ws"), "report_to": ["tensorboard"],
            "grpo": {"num_generations": 2, "max_completion_length": 8, "per_device_train_batch_size": 2,
                     "max_steps": 2, "save_steps": 1, "logging_steps": 1, "bf16": False},
            "generation": {"backend": "transformers"},
            "verify": {"preset": "tiny-debug", "gpus": ["cpu"], "runs_per_gpu": 1},
            "judge": server.config().model_dump(),
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        }
        (tmp_path / "train.json").write_text(json.dumps(config))
        result = CliRunner().invoke(app, ["train", str(tmp_path / "train.json"), "--json"])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert server.requests == []  # random text has no program: the rule reward is 0 and the judge is spared
    assert summary["status"] == "done" and summary["steps"] == 2 and summary["generation"] == "transformers"
    assert (Path(summary["adapter"]) / "adapter_config.json").exists()
    assert (tmp_path / "out" / "checkpoint-2").is_dir()
    db = sqlite3.connect(tmp_path / "ws" / "runs.sqlite")
    metrics = [m for _, m in step_metrics(tmp_path / "ws")]
    logged = {k for m in metrics for k in m}
    for part in ("reward", "rule", "rubric_r", "correct", "total_hack", "speedup", "judge_neutral"):
        assert any(part in k for k in logged), (part, sorted(logged))
    # every step keeps its rewards, the last too (the trainer's closing summary shares its step)
    assert len(metrics) == 2 and all("reward" in m for m in metrics) and "train_runtime" in metrics[-1]
    assert db.execute("SELECT status FROM train_runs").fetchone()[0] == "done"
    assert list((tmp_path / "out").rglob("events.out.tfevents.*"))  # TensorBoard got the same metrics

    # the adapter plugs into optimize as the Coder (a local HF model + LoRA); the Planner is scripted
    with ScriptedOpenAIServer([plan(target=0.01)]) as planner:
        run = CliRunner().invoke(app, [
            "optimize", str(FIXTURES / "cpu" / "tiny_mlp.py"), "--model", "scripted", "--base-url",
            planner.base_url, "--coder-provider", "hf", "--coder-model", str(model_dir), "--adapter",
            summary["adapter"], "--device", "cpu", "--preset", "tiny-debug", "--max-steps", "1",
            "--workspace", str(tmp_path / "ws-optimize"), "--json"])
    assert run.exit_code == 1, run.output  # random weights write no program: no best, but a clean run
    calls = sqlite3.connect(tmp_path / "ws-optimize" / "runs.sqlite").execute(
        "SELECT role, model, answer FROM llm_calls ORDER BY id").fetchall()
    coder = [c for c in calls if c[0] == "coder"]
    assert coder and coder[0][1] == f"{model_dir}+{summary['adapter']}" and coder[0][2] is not None

    # a resumed run starts from the last checkpoint
    config["grpo"]["max_steps"] = 3
    (tmp_path / "train.json").write_text(json.dumps(config))
    again = CliRunner().invoke(app, ["train", str(tmp_path / "train.json"), "--resume", "--json"])
    assert again.exit_code == 0, again.output
    resumed = json.loads(again.stdout)
    assert resumed["resumed_from"].endswith("checkpoint-2") and resumed["steps"] == 3


def test_reward_functions_verify_extracted_programs(tmp_path, cache):
    """The path a good completion takes: extracted, verified (a real g++ build), rule-rewarded."""
    from stitchcuda.reward import RewardConfig
    from stitchcuda.rl.config import VerifySection
    from stitchcuda.rl.rewards import VerificationPool, VerifiedRewards

    reference = (FIXTURES / "cpu" / "tiny_mlp.py").read_text()
    honest = (FIXTURES / "agents" / "tiny_mlp_full_cpp.py").read_text()
    pure = (FIXTURES / "cpu" / "pure_torch.py").read_text()
    pool = VerificationPool(VerifySection(preset="tiny-debug", gpus=["cpu"], runs_per_gpu=2), tmp_path)
    rewards = VerifiedRewards(pool, None, RewardConfig())
    functions, weights = rewards.functions()
    completions = [[{"role": "assistant", "content": f"```python\n{honest}```"}],
                   [{"role": "assistant", "content": f"```python\n{pure}```"}],
                   [{"role": "assistant", "content": "no code at all"}],
                   [{"role": "assistant", "content": f"```python\n{honest}```"}]]  # the same program again
    kwargs = dict(prompts=[[]] * 4, completions=completions, task=["tiny_mlp"] * 4, reference=[reference] * 4,
                  skill=[1] * 4, feedback=[""] * 4)
    values = functions[0](**kwargs)
    assert values[0] > 0.3 and values[1] == 0.0 and values[2] == 0.0 and values[3] == values[0]
    assert rewards.verifications == 2  # each distinct program verified once, and only once across functions
    gates = [b.rule.gate for b in rewards.score(completions, ["tiny_mlp"] * 4, [reference] * 4)]
    assert gates[:3] == ["passed", "total hack", gates[2]] and gates[2].startswith("no program")
    assert functions[4](**kwargs) == [0.0, 1.0, 0.0, 0.0] and weights == [1.0] + [0.0] * 6
    assert rewards.verifications == 2


def test_reward_verifications_on_ray_with_logical_gpus(tmp_path, cache):
    ray = pytest.importorskip("ray")
    from stitchcuda.reward import RewardConfig
    from stitchcuda.rl.config import VerifySection
    from stitchcuda.rl.rewards import VerificationPool, VerifiedRewards

    reference = (FIXTURES / "cpu" / "tiny_mlp.py").read_text()
    pure = (FIXTURES / "cpu" / "pure_torch.py").read_text()
    wrong = (FIXTURES / "cpu" / "wrong.py").read_text()
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pool = VerificationPool(VerifySection(preset="tiny-debug", gpus=["cpu"], ray="local", runs_per_gpu=2),
                                tmp_path)
        rewards = VerifiedRewards(pool, None, RewardConfig())
        found = rewards.score([f"```python\n{pure}```", f"```python\n{wrong}```"], ["tiny_mlp"] * 2,
                              [reference] * 2)
    finally:
        ray.shutdown()
    assert [b.rule.gate for b in found] == ["total hack", "total hack"] and rewards.verifications == 2
    assert all(b.reward == 0.0 for b in found)


def test_the_gpu_runs_taught_model_writes_through_its_tokenizer_and_template(tmp_path):
    """benchmarks/grpo_gpu.py's stand-in for a small coder (no hub on the GPU machine): its
    tokenizer must give back every byte of the programs it is taught (several per task), and its prompts must be
    rendered with the chat template GRPO uses (two teaching steps here; the GPU run takes 1,000)."""
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stitchcuda.rl.dataset import build_dataset

    spec = importlib.util.spec_from_file_location("grpo_gpu", ROOT / "benchmarks" / "grpo_gpu.py")
    grpo_gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grpo_gpu)
    build_dataset(tmp_path, [], tmp_path / "data", list(grpo_gpu.TAUGHT), eval_fraction=0.0)
    folder = grpo_gpu.taught_tiny(tmp_path / "taught", tmp_path / "data", steps=2)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for path in (p for paths in grpo_gpu.TAUGHT.values() for p in paths):
        text = "```python\n" + (ROOT / path).read_text() + "```"
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                           tokenize=False)
    assert prompt == "<|user|>x<|end|><|assistant|>"
    assert AutoModelForCausalLM.from_pretrained(folder).config.eos_token_id == tokenizer.eos_token_id
