"""The agents' pure parts: taking programs and plans out of answers, routing, prompts, run store."""

from __future__ import annotations

import pytest

from stitchcuda.agents.coder import feedback_prompt, scratch_prompt
from stitchcuda.agents.extract import ExtractError, extract_plan, extract_program
from stitchcuda.agents.records import Plan, RunState, SampleOutcome, StepRecord, Subtask
from stitchcuda.agents.routing import RoutingConfig, route
from stitchcuda.store import RunStore
from stitchcuda.task import resolve_tasks

PROGRAM = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def test_program_from_a_fenced_block_after_reasoning():
    answer = f"<think>try a kernel</think>Here it is:\n```python\n{PROGRAM}```\nDone."
    assert extract_program(answer) == PROGRAM


def test_last_block_with_modelnew_wins_and_bare_programs_work():
    answer = f"```python\nprint('helper')\n```\n```py\n{PROGRAM}```"
    assert extract_program(answer) == PROGRAM
    assert extract_program(PROGRAM) == PROGRAM


@pytest.mark.parametrize("answer, reason", [
    ("", "empty"),
    ("I cannot help with that.", "no ```python block"),
    ("```python\nclass ModelNew(:\n```", "does not parse"),
    (f"```python\n{PROGRAM}", "cut off"),
])
def test_unusable_answers_give_reasons(answer, reason):
    with pytest.raises(ExtractError, match=reason):
        extract_program(answer, finish_reason="length")


def test_plan_from_json_with_ids_filled_in():
    plan = extract_plan('Plan:\n```json\n{"rationale": "gemm first", "subtasks": [{"title": "fc1", '
                        '"operators": ["aten::addmm"], "target_speedup": 1.1}, {"title": "rest", "operators": []}]}\n```')
    assert [s.id for s in plan.subtasks] == [1, 2] and plan.subtasks[0].target_speedup == 1.1
    with pytest.raises(ExtractError, match="schema"):
        extract_plan('{"subtasks": []}')
    with pytest.raises(ExtractError, match="JSON"):
        extract_plan("no plan here")


def _state() -> RunState:
    return RunState(run_id="r", task="t", task_sha256="x")


SUB = Subtask(id=1, title="all", operators=["aten::addmm"], target_speedup=1.5)
CFG = RoutingConfig(max_attempts_per_subtask=4, replan_after_failures=3, replan_after_stagnation=2, max_replans=1)


def ok(speedup: float, hacking: str = "none") -> SampleOutcome:
    return SampleOutcome(sample=0, passed=True, correct=True, compiled=True, hacking=hacking, speedup_eager=speedup)


def test_routing_fix_optimize_next_done():
    state = _state()
    assert route(state, SampleOutcome(sample=0, compiled=False, feedback="Build failed"), SUB, False, CFG).action == "fix"
    assert route(state, ok(1.0), SUB, False, CFG).action == "optimize"
    assert route(state, ok(1.6), SUB, False, CFG).action == "next"
    assert route(_state(), ok(2.0), SUB, True, CFG).action == "done"


def test_total_hack_is_never_progress():
    state = _state()
    hack = SampleOutcome(sample=0, passed=False, correct=True, compiled=True, hacking="total",
                         feedback="Hacking (total): no_custom_kernels: ...")
    decision = route(state, hack, SUB, True, CFG)
    assert decision.action == "fix" and "total hack" in decision.reason


def test_replan_after_failures_then_stagnation_without_replans_moves_on():
    state = _state()
    bad = SampleOutcome(sample=0, compiled=True, correct=False, feedback="Wrong result")
    assert [route(state, bad, SUB, False, CFG).action for _ in range(3)] == ["fix", "fix", "replan"]
    state = _state()
    assert route(state, ok(1.0), SUB, False, CFG).action == "optimize"
    assert route(state, ok(1.01), SUB, False, CFG).action == "optimize"
    assert route(state, ok(1.0), SUB, False, CFG).action == "replan"
    state.replans = 1
    assert route(state, ok(1.0), SUB, False, CFG).action == "next"


def test_prompts_render_from_templates():
    (task,) = resolve_tasks("mlp")
    plan = Plan(subtasks=[SUB], rationale="why")
    scratch = scratch_prompt(task, plan, SUB, None, "", "", "strict")
    assert scratch[0].role == "system" and "load_inline" in scratch[0].content and "0.0001" in scratch[0].content
    assert "class Model" in scratch[1].content and "(NOW)" in scratch[1].content
    fix = feedback_prompt(task, SUB, PROGRAM, "Build failed: x", "fix", "", "paper", note="cut off")
    assert "fix it" in fix[1].content and "Build failed: x" in fix[1].content and "cut off" in fix[1].content


def test_store_round_trip(tmp_path):
    store = RunStore(tmp_path)
    state = _state()
    state.run_id = store.new_run_id("mlp")
    store.create_run(state, RoutingConfig())
    store.add_plan(state.run_id, Plan(subtasks=[SUB]))
    outcome = ok(1.2).model_copy(update={"sha256": "abc", "path": "p.py", "verdict_path": "v.json"})
    store.save_step(state.run_id, StepRecord(index=0, subtask=1, skill="scratch", samples=[outcome], chosen=0))
    store.save_candidate(state.run_id, 0, outcome)
    store.add_llm_call(state.run_id, 0, "coder", 0, "m", [{"role": "user", "content": "hi"}], "answer",
                       prompt_tokens=3, completion_tokens=4)
    state.steps_done = 1
    store.save_state(state)
    again = RunStore(tmp_path)
    assert again.load_state(state.run_id).steps_done == 1 and again.resolve("last") == state.run_id
    assert again.verified(state.run_id, "abc").speedup_eager == 1.2
    assert again.llm_answers(state.run_id, 0) == {0: "answer"}
    assert again.steps(state.run_id)[0].samples[0].passed and again.plans(state.run_id)[0].subtasks[0].title == "all"
