"""The Coder's two skills: a program from scratch for a subtask, and a better program from feedback."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from stitchcuda.agents.prompting import conversation
from stitchcuda.agents.records import Action, CoderRequest, Plan, Subtask
from stitchcuda.llm.base import Completion, Message
from stitchcuda.task.record import Task
from stitchcuda.verify.config import TOLERANCES


@runtime_checkable
class TypedCoder(Protocol):
    """A Coder that reads the step as data (the offline compiler) rather than as a prompt."""

    def answer(self, request: CoderRequest) -> Completion: ...

    def samples_wanted(self, request: CoderRequest) -> int:
        """How many samples this step is worth to the Coder itself (the loop verifies at least that
        many, and at least the run's ``samples``)."""
        ...


def _rules(tolerance: str, weights: str) -> dict[str, object]:
    return {"tolerance": tolerance, "atol": TOLERANCES[tolerance].fp32_atol, "weights": weights}


def scratch_prompt(task: Task, plan: Plan, subtask: Subtask, program: str | None, program_status: str,
                   notes: str, tolerance: str, note: str = "", weights: str = "seeded") -> list[Message]:
    """Skill 1: task + plan + current subtask + current program -> a program that adds the subtask."""
    return conversation("coder_system", "coder_scratch", task=task, plan=plan, subtask=subtask, program=program,
                        program_status=program_status, notes=notes, note=note, **_rules(tolerance, weights))


FEEDBACK_HEADING = "# The Verifier's feedback on it\n"  # as prompts/coder_feedback.j2 lays it out
_AFTER_FEEDBACK = ("\nIt failed: fix it.", "\nIt is correct but not fast enough")


def feedback_in_prompt(last_message: str) -> str:
    """The Verifier's feedback a skill-2 prompt carries (empty for a from-scratch prompt)."""
    at = last_message.find(FEEDBACK_HEADING)
    if at < 0:
        return ""
    body = last_message[at + len(FEEDBACK_HEADING):]
    for end in _AFTER_FEEDBACK:
        if end in body:
            body = body[: body.index(end)]
    return body.strip()


def feedback_prompt(task: Task, subtask: Subtask, program: str, feedback: str, action: Action, notes: str,
                    tolerance: str, note: str = "", weights: str = "seeded") -> list[Message]:
    """Skill 2: program + the Verifier's feedback -> a fixed or faster program."""
    return conversation("coder_system", "coder_feedback", task=task, subtask=subtask, program=program,
                        feedback=feedback or "(no feedback)", action=action, notes=notes, note=note,
                        **_rules(tolerance, weights))
