"""The Planner: reads the reference, its profile and operator graph, and returns a typed Plan."""

from __future__ import annotations

from collections.abc import Callable

from stitchcuda.agents.extract import ExtractError, extract_plan
from stitchcuda.agents.prompting import conversation
from stitchcuda.agents.records import Best, Plan, Subtask
from stitchcuda.llm.base import Completion, LLMClient, Message
from stitchcuda.task.record import Task
from stitchcuda.verify.verdict import ProgramProfile

# Called for every LLM exchange so the loop can record and budget it: (messages, completion or error).
CallHook = Callable[[list[Message], Completion | None, str | None], None]


class PlanContext:
    """What the Planner knows about the task and the machine, gathered once per run."""

    def __init__(self, task: Task, machine: str, profile: ProgramProfile | None, profile_note: str,
                 graph: str | None, notes: str, tolerance: str):
        self.task = task
        self.machine = machine
        self.profile = profile
        self.profile_note = profile_note
        self.graph = graph
        self.notes = notes
        self.tolerance = tolerance


class Planner:
    def __init__(self, llm: LLMClient, max_subtasks: int = 4, attempts: int = 2):
        self.llm = llm
        self.max_subtasks = max_subtasks
        self.attempts = attempts

    def plan(self, ctx: PlanContext, on_call: CallHook, previous: Plan | None = None, why: str = "",
             failures: list[str] | None = None, best: Best | None = None) -> tuple[Plan, str | None]:
        """(plan, problem). When the LLM's answers never parse, a one-subtask plan covering the
        whole program is returned with the problem said, so the run goes on and the log shows why."""
        messages = conversation(
            "planner_system", "planner_user", task=ctx.task, machine=ctx.machine, profile=ctx.profile,
            profile_note=ctx.profile_note, graph=ctx.graph, notes=ctx.notes, previous=previous, why=why,
            failures=(failures or [])[-6:], best=best, tolerance=ctx.tolerance, max_subtasks=self.max_subtasks,
        )
        problem = None
        for _ in range(self.attempts):
            completion = self.llm.complete(messages)
            try:
                plan = extract_plan(completion.text)
            except ExtractError as exc:
                problem = f"the Planner's answer was unusable: {exc}"
                on_call(messages, completion, problem)
                messages = [*messages, Message(role="assistant", content=completion.text),
                            Message(role="user", content=f"That answer could not be used: {exc}. "
                                                          "Answer with the JSON plan only.")]
                continue
            on_call(messages, completion, None)
            plan.subtasks = plan.subtasks[: self.max_subtasks]
            plan.version = (previous.version + 1) if previous else 1
            return plan, None
        return default_plan(ctx, (previous.version + 1) if previous else 1), problem


def default_plan(ctx: PlanContext, version: int = 1) -> Plan:
    """The whole forward as one subtask: what a plan says when there is nothing smarter to say."""
    ops = [o.name for o in ctx.profile.ops[:8]] if ctx.profile else []
    return Plan(version=version, source="default", rationale="One subtask: the whole forward in custom kernels.",
                subtasks=[Subtask(id=1, title="the whole forward pass in custom CUDA kernels", operators=ops or ["all"],
                                  time_share=1.0, target_speedup=1.0)])
