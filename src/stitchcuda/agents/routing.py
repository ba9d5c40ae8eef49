"""The Verifier agent's routing: from a step's best outcome and the run's state to the next action.

A pure function over typed records, so every rule is testable without an LLM or a GPU.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from stitchcuda.agents.records import Decision, RunState, SampleOutcome, Subtask


class RoutingConfig(BaseModel):
    max_attempts_per_subtask: int = Field(6, ge=1, description="steps on one subtask before moving on or replanning")
    replan_after_failures: int = Field(3, ge=1, description="failed steps in a row that trigger a replan")
    replan_after_stagnation: int = Field(2, ge=1, description="correct steps in a row without improvement that "
                                                             "trigger a replan")
    min_improvement: float = Field(0.02, ge=0, description="relative speedup gain that counts as progress")
    max_replans: int = Field(2, ge=0)


def accepted(outcome: SampleOutcome | None) -> bool:
    """Progress is a correct program that is not a total hack; nothing else is ever accepted."""
    return bool(outcome and outcome.passed and outcome.hacking != "total")


def route(state: RunState, outcome: SampleOutcome | None, subtask: Subtask, last_subtask: bool,
          config: RoutingConfig) -> Decision:
    """Update the counters in ``state`` for this step's outcome and say what comes next."""
    state.attempts_on_subtask += 1
    can_replan = state.replans < config.max_replans
    move_on = "done" if last_subtask else "next"

    if not accepted(outcome):
        state.failures_in_row += 1
        why = _failure(outcome)
        if state.failures_in_row >= config.replan_after_failures and can_replan:
            return Decision(action="replan", reason=f"{state.failures_in_row} failed steps in a row (last: {why})")
        if state.attempts_on_subtask >= config.max_attempts_per_subtask:
            if can_replan:
                return Decision(action="replan", reason=f"subtask {subtask.id} used its "
                                                        f"{config.max_attempts_per_subtask} attempts (last: {why})")
            return Decision(action="done", reason=f"subtask {subtask.id} used its attempts and no replans are left")
        return Decision(action="fix", reason=why)

    state.failures_in_row = 0
    speedup = (outcome.speedup_eager if outcome else None) or 0.0
    previous = state.subtask_best
    improved = previous is None or speedup > previous * (1 + config.min_improvement)
    if improved:
        state.subtask_best = speedup
        state.no_improvement = 0
    else:
        state.no_improvement += 1
    if speedup >= subtask.target_speedup:
        return Decision(action=move_on, reason=f"{speedup:.2f}x meets the subtask's target of "
                                               f"{subtask.target_speedup:.2f}x")
    if state.no_improvement >= config.replan_after_stagnation:
        if can_replan:
            return Decision(action="replan", reason=f"no gain over {state.subtask_best:.2f}x in "
                                                    f"{state.no_improvement} steps (stagnation)")
        return Decision(action=move_on, reason=f"stagnating at {state.subtask_best:.2f}x and no replans left")
    if state.attempts_on_subtask >= config.max_attempts_per_subtask:
        return Decision(action=move_on, reason=f"attempts used; keeping {state.subtask_best:.2f}x")
    return Decision(action="optimize", reason=f"correct at {speedup:.2f}x, under the target of "
                                              f"{subtask.target_speedup:.2f}x")


def _failure(outcome: SampleOutcome | None) -> str:
    if outcome is None:
        return "no sample came back"
    if outcome.llm_error:
        return f"the LLM call failed: {outcome.llm_error}"
    if outcome.extract_error:
        return f"unusable answer: {outcome.extract_error}"
    if outcome.hacking == "total":
        return "rejected as a total hack: " + _first(outcome.feedback, "Hacking (total)")
    if not outcome.compiled:
        return "did not build or import: " + _first(outcome.feedback)
    if not outcome.correct:
        return "incorrect: " + _first(outcome.feedback)
    return "did not pass: " + _first(outcome.feedback)


def _first(feedback: str, prefix: str = "") -> str:
    lines = [line.strip() for line in feedback.splitlines() if line.strip()]
    at = next((i for i, line in enumerate(lines) if prefix and line.startswith(prefix)), 0)
    chosen = lines[at] if lines else ""
    if chosen.endswith(":") and at + 1 < len(lines):  # a heading: what it announces is on the next line
        chosen += " " + lines[at + 1]
    return chosen[:240]
