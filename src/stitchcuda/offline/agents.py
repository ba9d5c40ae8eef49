"""The offline Planner and Coder behind the agents' interfaces, so the same loop, Verifier and
routing drive them: the Planner answers with the fusion plan, the Coder with generated programs.

The Coder walks a list of variants (precision, cuBLASLt or cuBLAS, CUDA graph on or off, block
size, vector width): the first step gets the first, every fix or optimize step the next, and
the Verifier's timings decide which one the run keeps. When the variants are used up it answers with the last one
again, which the loop sees as stagnation.
"""

from __future__ import annotations

import itertools
import threading
import time

from stitchcuda.agents.planner import CallHook, PlanContext
from stitchcuda.agents.records import Best, Plan
from stitchcuda.llm.base import Completion, LLMConfig, Message, Usage
from stitchcuda.task.record import Task

OFFLINE = LLMConfig(provider="offline", model="stitchcuda-offline")


def variants(tolerance: str = "strict") -> list[dict]:
    """Tuning variants, the likeliest best first. TF32 only where the tolerance policy allows it
    (``paper``, 1e-2): there it comes first; the Verifier discloses it in every verdict."""
    from stitchcuda.offline.codegen import CodegenOptions

    precisions = (True, False) if tolerance == "paper" else (False,)
    grid = itertools.product(precisions, (True, False), (256, 128, 512), (4, 1))
    found = [CodegenOptions(tf32=p, graph=g, block=b, vector_width=v) for p, g, b, v in grid]
    # second: the same as the first with plain cuBLAS SGEMMs + epilogue kernels instead of cuBLASLt epilogues
    found.insert(1, found[0].model_copy(update={"cublaslt": False}))
    return [o.model_dump() for o in found]


class OfflinePlannerAgent:
    """Same ``plan`` signature as :class:`stitchcuda.agents.planner.Planner`; no LLM."""

    def __init__(self, task: Task):
        self.task = task

    def plan(self, ctx: PlanContext, on_call: CallHook, previous: Plan | None = None, why: str = "",
             failures: list[str] | None = None, best: Best | None = None) -> tuple[Plan, str | None]:
        from stitchcuda.offline.planner import OfflinePlanner

        plan, _ = OfflinePlanner().plan(self.task, profile=ctx.profile)
        plan.version = (previous.version + 1) if previous else 1
        return plan, None


class OfflineCoder:
    """An ``LLMClient`` whose answers are generated programs, one variant per call."""

    config = OFFLINE

    def __init__(self, task: Task, tolerance: str = "strict"):
        from stitchcuda.offline.fusion import fuse
        from stitchcuda.offline.graph import capture

        self.task = task
        self.graph = capture(task)  # CaptureError says why the offline Coder cannot work on it
        self.groups = fuse(self.graph)
        self.variants = variants(tolerance)
        self._next = 0
        self._lock = threading.Lock()

    def complete(self, messages: list[Message], *, max_tokens: int | None = None,
                 temperature: float | None = None) -> Completion:
        from stitchcuda.offline.codegen import CodegenOptions, generate

        with self._lock:
            options = CodegenOptions.model_validate(self.variants[min(self._next, len(self.variants) - 1)])
            self._next += 1
        started = time.perf_counter()
        source = generate(self.task, self.graph, self.groups, options)
        text = f"Offline Coder, variant {options.model_dump()}:\n```python\n{source}```\n"
        return Completion(text=text, model=OFFLINE.model, usage=Usage(), seconds=time.perf_counter() - started,
                          finish_reason="stop")
