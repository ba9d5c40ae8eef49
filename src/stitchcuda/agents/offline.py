"""The offline Planner and Coder behind the agents' interfaces, so the same loop, Verifier and
routing drive them: the Planner answers with the fusion plan, the Coder with generated programs.

The Coder walks a grid of variants (precision, cuBLASLt or cuBLAS, CUDA graph on or off, block
size, vector width) as a local search: the first step gets the first; every later step starts from
the fastest verified variant that the prompts have shown (the program a prompt carries and its
time), and changes as few options of it as it can, the ones the Verifier's feedback points to
first (:func:`choose_next`). When the variants are used up it answers with the last one again,
which the loop sees as stagnation.
"""

from __future__ import annotations

import ast
import itertools
import re
import threading
import time

from stitchcuda.agents.coder import feedback_in_prompt
from stitchcuda.agents.planner import CallHook, PlanContext
from stitchcuda.agents.records import Best, Plan
from stitchcuda.compiler import Compiled, compile_task
from stitchcuda.llm.base import Completion, LLMConfig, Message, Usage
from stitchcuda.task.record import Task

OFFLINE = LLMConfig(provider="offline", model="stitchcuda-offline")


def variants(tolerance: str = "strict") -> list[dict]:
    """Tuning variants, the likeliest best first. TF32 only where the tolerance policy allows it
    (``paper``, 1e-2): there it comes first; the Verifier discloses it in every verdict."""
    from stitchcuda.compiler.codegen import CodegenOptions

    precisions = (True, False) if tolerance == "paper" else (False,)
    # cuBLAS or cuBLASLt innermost: the second variant is the first with plain cuBLAS SGEMMs and
    # epilogue kernels, the choice that matters most for GEMM-heavy models
    grid = itertools.product(precisions, (True, False), (256, 128, 512), (4, 1), (True, False))
    return [CodegenOptions(tf32=p, graph=g, block=b, vector_width=v, cublaslt=lt).model_dump()
            for p, g, b, v, lt in grid]


class OfflinePlannerAgent:
    """Same ``plan`` signature as :class:`stitchcuda.agents.planner.Planner`; no LLM."""

    def __init__(self, task: Task, compiled: Compiled | None = None):
        self.task = task
        self.compiled = compiled  # the Coder's capture, so that both agents read one graph

    def plan(self, ctx: PlanContext, on_call: CallHook, previous: Plan | None = None, why: str = "",
             failures: list[str] | None = None, best: Best | None = None) -> tuple[Plan, str | None]:
        from stitchcuda.agents.offline_planner import OfflinePlanner

        if self.compiled is None:
            self.compiled = compile_task(self.task)
        plan, _ = OfflinePlanner().plan(self.task, graph=self.compiled.graph, groups=self.compiled.groups,
                                        profile=ctx.profile)
        plan.version = (previous.version + 1) if previous else 1
        return plan, None


LAUNCH_BOUND = re.compile(r"Launch-bound: the GPU is idle (\d+)%")
TOP_KERNEL = re.compile(r"Top kernel: .* \((own|library|pytorch)\) takes (\d+)%")


CARRIED_TIME = re.compile(r"Correct\. (\d+(?:\.\d+)?) ms")
OPTIONS_LINE = re.compile(r"^\s*Options (\{[^}\n]*\})", re.M)


def variant_of(program: str, options: list[dict]) -> int | None:
    """Which of ``options`` generated ``program`` (its docstring names them), if any."""
    found = OPTIONS_LINE.search(program)
    if not found:
        return None
    try:
        named = ast.literal_eval(found[1])
    except (ValueError, SyntaxError):
        return None
    return next((i for i, o in enumerate(options) if o == named), None)


def choose_next(options: list[dict], tried: list[int], feedback: str, base: int | None = None) -> int:
    """The next variant to try: the untried one nearest ``base`` (the fewest options changed), and
    among those the one the Verifier's feedback points to. ``base`` is the fastest verified
    variant so far (the last tried when none is known).
    A failure rules out the feature it names (cuBLASLt, graph capture, float4 paths); a
    launch-bound profile asks for the CUDA graph; a library kernel on top asks for the other GEMM
    path or precision, one of our own kernels for another block size or vector width."""
    left = [i for i in range(len(options)) if i not in tried and i != base]
    if not left:
        return tried[-1] if tried else 0
    if base is None:
        if not tried:
            return left[0]
        base = tried[-1]
    ref = options[base]
    text = feedback.lower()
    banned: list[tuple[str, object]] = []
    if "cublaslt" in text and ("failed" in text or "error" in text):
        banned.append(("cublaslt", True))
    if any(w in text for w in ("cudagraph", "streambegincapture", "capture")) and ("failed" in text or "error" in text):
        banned.append(("graph", True))
    if "misaligned" in text:
        banned.append(("vector_width", 4))
    allowed = [i for i in left if not any(options[i].get(k) == v for k, v in banned)] or left

    wants: list[tuple[str, ...]] = []
    idle = LAUNCH_BOUND.search(feedback)
    if idle and int(idle[1]) >= 20 and not ref.get("graph"):
        wants.append(("graph",))
    top = TOP_KERNEL.search(feedback)
    if top and top[1] == "library":
        wants.append(("cublaslt", "tf32"))
    elif top and top[1] == "own":
        wants.append(("block", "vector_width"))

    def distance(i: int) -> int:
        return sum(options[i].get(k) != v for k, v in ref.items())

    def want_rank(i: int) -> int:
        return next((r for r, keys in enumerate(wants) if any(options[i].get(k) != ref.get(k) for k in keys)
                     and (keys != ("graph",) or options[i].get("graph"))), len(wants))

    # a local search: a variant two options away is a guess about both; one away says what one option is worth
    return min(allowed, key=lambda i: (distance(i), want_rank(i), i))


class OfflineCoder:
    """An ``LLMClient`` whose answers are generated programs, one variant per call."""

    config = OFFLINE

    def __init__(self, task: Task, tolerance: str = "strict"):
        self.task = task
        # CaptureError or Unsupported says why the compiler cannot work on it
        self.compiled = compile_task(task)
        self.graph, self.groups = self.compiled.graph, self.compiled.groups
        self.variants = variants(tolerance)
        self.tried: list[int] = []
        self.verified_ms: dict[int, float] = {}  # variant -> its time, as the prompts carrying it said
        self._lock = threading.Lock()

    def complete(self, messages: list[Message], *, max_tokens: int | None = None,
                 temperature: float | None = None) -> Completion:
        from stitchcuda.compiler.codegen import CodegenOptions, generate

        with self._lock:
            prompt = messages[-1].content if messages else ""
            carried, timed = variant_of(prompt, self.variants), CARRIED_TIME.search(prompt)
            if carried is not None and timed:
                self.verified_ms[carried] = min(float(timed[1]), self.verified_ms.get(carried, float("inf")))
            # From the fastest program seen, by its own time: the loop carries the last program
            # into a new subtask even when it was slower, and eager's time (so the speedup) is noisy.
            base = min(self.verified_ms, key=self.verified_ms.__getitem__) if self.verified_ms else carried
            index = choose_next(self.variants, self.tried, feedback_in_prompt(prompt), base=base)
            self.tried.append(index)
            options = CodegenOptions.model_validate(self.variants[index])
        started = time.perf_counter()
        source = generate(self.task, self.graph, self.groups, options)
        text = f"Offline Coder, variant {options.model_dump()}:\n```python\n{source}```\n"
        return Completion(text=text, model=OFFLINE.model, usage=Usage(), seconds=time.perf_counter() - started,
                          finish_reason="stop")
