"""The offline Planner and Coder behind the agents' interfaces, so the same loop, Verifier and
routing drive them: the Planner answers with the fusion plan, the Coder with generated programs.

The Coder walks a list of variants (precision, cuBLASLt or cuBLAS, CUDA graph on or off, block
size, vector width): the first step gets the first; every fix or optimize step gets the one the
Verifier's feedback on the last points to (:func:`choose_next`), and the Verifier's timings
decide which one the run keeps. When the variants are used up it answers with the last one
again, which the loop sees as stagnation.
"""

from __future__ import annotations

import itertools
import re
import threading
import time

from stitchcuda.agents.coder import feedback_in_prompt
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


LAUNCH_BOUND = re.compile(r"Launch-bound: the GPU is idle (\d+)%")
TOP_KERNEL = re.compile(r"Top kernel: .* \((own|library|pytorch)\) takes (\d+)%")


def choose_next(options: list[dict], tried: list[int], feedback: str) -> int:
    """The next variant to try, read from the Verifier's feedback on the last one: a failure
    rules out the feature it names (cuBLASLt, graph capture, float4 paths); a launch-bound
    profile asks for the CUDA graph; a library kernel on top asks for the other GEMM path or
    precision, one of our own kernels for another block size or vector width. Otherwise the next
    untried variant in order."""
    left = [i for i in range(len(options)) if i not in tried]
    if not left:
        return tried[-1] if tried else 0
    if not tried:
        return left[0]
    last = options[tried[-1]]
    text = feedback.lower()
    banned: list[tuple[str, object]] = []
    if "cublaslt" in text and ("failed" in text or "error" in text):
        banned.append(("cublaslt", True))
    if any(w in text for w in ("cudagraph", "streambegincapture", "capture")) and ("failed" in text or "error" in text):
        banned.append(("graph", True))
    if "misaligned" in text:
        banned.append(("vector_width", 4))
    allowed = [i for i in left if not any(options[i].get(k) == v for k, v in banned)] or left

    def differs(i: int, keys: tuple[str, ...]) -> bool:
        return any(options[i].get(k) != last.get(k) for k in keys)

    wants: list[tuple[str, ...]] = []
    idle = LAUNCH_BOUND.search(feedback)
    if idle and int(idle[1]) >= 20 and not last.get("graph"):
        wants.append(("graph",))
    top = TOP_KERNEL.search(feedback)
    if top and top[1] == "library":
        wants.append(("cublaslt", "tf32"))
    elif top and top[1] == "own":
        wants.append(("block", "vector_width"))
    for keys in wants:
        matching = [i for i in allowed if differs(i, keys) and (keys != ("graph",) or options[i].get("graph"))]
        if matching:
            return matching[0]
    return allowed[0]


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
        self.tried: list[int] = []
        self._lock = threading.Lock()

    def complete(self, messages: list[Message], *, max_tokens: int | None = None,
                 temperature: float | None = None) -> Completion:
        from stitchcuda.offline.codegen import CodegenOptions, generate

        with self._lock:
            index = choose_next(self.variants, self.tried, feedback_in_prompt(messages[-1].content) if messages else "")
            self.tried.append(index)
            options = CodegenOptions.model_validate(self.variants[index])
        started = time.perf_counter()
        source = generate(self.task, self.graph, self.groups, options)
        text = f"Offline Coder, variant {options.model_dump()}:\n```python\n{source}```\n"
        return Completion(text=text, model=OFFLINE.model, usage=Usage(), seconds=time.perf_counter() - started,
                          finish_reason="stop")
