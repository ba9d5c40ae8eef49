"""The offline Planner and Coder behind the agents' interfaces, so the same loop, Verifier and
routing drive them: the Planner answers with the fusion plan, the Coder with generated programs.

The Coder walks a grid of variants (precision, cuBLASLt or cuBLAS, CUDA graph on or off, block
size, vector width) as a local search: the first step gets the first; every later step starts from
the fastest verified variant it has been shown (the program a step starts from and the Verifier's
typed verdict on it, never the prompt's wording), and changes as few options of it as it can,
the ones the verdict points to first (:func:`choose_next`). When the variants are used up it answers with the last one again,
which the loop sees as stagnation.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import re
import threading
import time

from pydantic import BaseModel, Field

from stitchcuda.agents.offline_planner import OfflinePlanner
from stitchcuda.agents.planner import CallHook, PlanContext
from stitchcuda.agents.records import Best, CoderRequest, Plan
from stitchcuda.compiler import Compiled, compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from stitchcuda.compiler.emit.program import host_module
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.cost import Estimate, fixed_path
from stitchcuda.llm.base import Completion, LLMConfig, Message, Usage
from stitchcuda.task.record import Candidate, Task
from stitchcuda.verify.verdict import Verdict

OFFLINE = LLMConfig(provider="offline", model="stitchcuda-offline")
GEMM_PATH = ("cost_model", "split_tf32", "cutlass", "cublaslt", "bf16")
# (tf32, bf16): plain TF32 first, then bf16 with fp32 accumulation, then true fp32 (paper only)
PAPER_PRECISIONS = ((True, False), (True, True), (False, False))
# strict: true fp32 arithmetic (SGEMM, 3xTF32) first, then plain TF32, which the Verifier keeps
# only where every trial is within 1e-4 of the fp32 reference, as the eager TF32 baseline is
# counted only where it passes (it did on the suite's lm_head_nll, unet_tiny and small_cnn, at up
# to 2x our 3xTF32 programs)
STRICT_PRECISIONS = ((False, False), (True, False))


def variants(tolerance: str = "strict") -> list[dict]:
    """Tuning variants, the likeliest best first. Under ``paper`` (1e-2) TF32 comes first, then bf16
    (fp32 accumulate) where the cost model gives it an operator; under ``strict`` fp32 arithmetic
    first and plain TF32 after it (never bf16); the Verifier names the arithmetic in every verdict."""
    precisions = PAPER_PRECISIONS if tolerance == "paper" else STRICT_PRECISIONS
    # the GEMM path innermost (cost_model, split_tf32, cutlass, cublaslt). First the cost model
    # (compiler/lowering/cost.py), which gives each product and convolution the path it estimates
    # fastest: fp32 SGEMM, 3xTF32 by split operands on cuBLASLt's TF32 tensor cores (about 2.5x
    # SGEMM on an H100 where the split's traffic is small beside the product), CUTLASS's 3xTF32
    # (1.3-1.5x, no extra traffic). Then each path for every product: split where it pays, CUTLASS,
    # cuBLASLt with its bias epilogue, plain cuBLAS SGEMMs and epilogue kernels. Plain TF32 (paper)
    # needs no split; bf16 goes only where the model picks it, operator by operator.
    paths = ((True, True, True, True), (False, True, False, True), (False, False, True, False),
             (False, False, False, True), (False, False, False, False))
    # attention as its products, then as one kernel (which is faster depends on the shapes)
    grid = itertools.product((False, True), precisions, (True, False), (256, 128, 512), (4, 1), paths)
    out: list[dict] = []
    for fa, (p, h), g, b, v, (m, s, c, lt) in grid:
        if h and not m:
            continue
        option = CodegenOptions(tf32=p, bf16=h, graph=g, block=b, vector_width=v, cost_model=m, split_tf32=s and not p,
                                cutlass=c, cublaslt=lt, fused_attention=fa).model_dump()
        if option not in out:
            out.append(option)
    return out


def variant_estimates(estimates: dict[tuple[bool, bool], list[Estimate]], options: list[dict]) -> list[float]:
    """Each variant's estimated time for its products and convolutions, from the cost model's
    estimates of every path (one lowering with all paths on, per precision (tf32, bf16)): a
    variant that forces a path gets the split where the model says it beats SGEMM, else CUTLASS,
    else SGEMM, as it would run."""

    def one(e: Estimate, o: dict) -> float:
        return e.ms if o.get("cost_model") else e.paths[fixed_path(e.paths, o.get("split_tf32"), o.get("cutlass"))]

    def total(o: dict) -> float:  # a precision not estimated: last
        found = estimates.get((o.get("tf32", False), o.get("bf16", False)))
        return float("inf") if found is None else sum(one(e, o) for e in found)

    return [total(o) for o in options]


class OfflinePlannerAgent:
    """Same ``plan`` signature as :class:`stitchcuda.agents.planner.Planner`; no LLM."""

    def __init__(self, task: Task, compiled: Compiled | None = None):
        self.task = task
        self.compiled = compiled  # the Coder's capture, so that both agents read one graph

    def plan(self, ctx: PlanContext, on_call: CallHook, previous: Plan | None = None, why: str = "",
             failures: list[str] | None = None, best: Best | None = None) -> tuple[Plan, str | None]:
        if self.compiled is None:
            self.compiled = compile_task(self.task)
        plan, _ = OfflinePlanner().plan(self.task, graph=self.compiled.graph, groups=self.compiled.groups,
                                        profile=ctx.profile)
        plan.version = (previous.version + 1) if previous else 1
        return plan, None


LIBRARY_SHARE = 0.4  # of the GPU time in library kernels: their path is worth a step first
OPTIONS_LINE = re.compile(r"^\s*Options (\{[^}\n]*\})", re.M)


class Signals(BaseModel):
    """What the Verifier's verdict on the program a step starts from says about the next variant."""

    failure: str = Field("", description="build and run errors when it failed (compiler and CUDA messages)")
    idle_share: float = Field(0.0, description="share of the forward with the GPU idle")
    launches: int = 0
    top_origin: str | None = Field(None, description="own / library / pytorch: where the top kernel comes from")
    library_share: float = Field(0.0, description="share of the GPU time in library kernels (cuBLAS, cuDNN, CUTLASS)")

    @classmethod
    def from_verdict(cls, verdict: Verdict | None) -> Signals:
        if verdict is None:
            return cls()
        failure = ""
        if not verdict.correct:
            messages = [m.message for ext in verdict.build.extensions for m in ext.messages if m.severity == "error"]
            crash = [verdict.crash.message] if verdict.crash else []
            failure = "\n".join([*verdict.errors, *messages, *crash])
        profile = verdict.profile
        return cls(failure=failure, idle_share=profile.idle_share if profile else 0.0,
                   launches=profile.launches if profile else 0,
                   top_origin=profile.kernels[0].origin if profile and profile.kernels else None,
                   library_share=profile.origin_share.get("library", 0.0) if profile else 0.0)


def variant_of(program: str, options: list[dict]) -> int | None:
    """Which of ``options`` generated ``program`` (its docstring names them), if any."""
    found = OPTIONS_LINE.search(program)
    if not found:
        return None
    try:  # an option added since the program was written takes its default
        named = CodegenOptions.model_validate(ast.literal_eval(found[1])).model_dump()
    except (ValueError, SyntaxError):
        return None
    return next((i for i, o in enumerate(options) if o == named), None)


def choose_next(options: list[dict], tried: list[int], signals: Signals, base: int | None = None,
                estimates: list[float] | None = None) -> int:
    """The next variant to try: the untried one nearest ``base`` (the fewest options changed), and
    among those the one the verdict points to. ``base`` is the fastest verified variant so far (the
    last tried when none is known).
    A failure rules out the feature its errors name (cuBLASLt, graph capture, float4 paths); a
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
    failure = signals.failure.lower()
    banned: list[tuple[str, object]] = []
    if "cublaslt" in failure:
        banned.append(("cublaslt", True))
    if "cutlass" in failure:
        banned.append(("cutlass", True))
    if "split" in failure or (ref.get("split_tf32") and "incorrect in" in failure):  # its error is the larger
        banned.append(("split_tf32", True))
        if ref.get("tf32"):  # under TF32 only the cost model splits (convolutions: lower_conv)
            banned.append(("cost_model", True))
    if ref.get("cost_model") and "incorrect in" in failure:  # its products mixed both 3xTF32 paths: fp32 next
        banned.append(("cutlass", True))
    if "incorrect in" in failure and tried and options[tried[-1]].get("tf32"):  # plain TF32 missed the tolerance
        banned.append(("tf32", True))
    if any(w in failure for w in ("cudagraph", "streambegincapture", "capture")):
        banned.append(("graph", True))
    if "misaligned" in failure:
        banned.append(("vector_width", 4))
    allowed = [i for i in left if not any(options[i].get(k) == v for k, v in banned)] or left

    wants: list[tuple[str, ...]] = []
    if signals.idle_share >= 0.2 and signals.launches > 3 and not ref.get("graph"):
        wants.append(("graph",))
    # the products' and convolutions' path and arithmetic where the library holds much of the time
    # even if one of our kernels is the longest (the suite's small_cnn: 45% in cuDNN, our kernel on
    # top, and eager TF32, which passes strict there, ahead of it)
    if signals.top_origin == "library" or signals.library_share >= LIBRARY_SHARE:
        wants.append((*GEMM_PATH, "tf32"))
    if signals.top_origin == "own":
        wants.append(("block", "vector_width"))

    # the GEMM path and its arithmetic (split_tf32, cutlass, cublaslt, bf16, tf32) count as one option
    arithmetic = (*GEMM_PATH, "tf32")

    def distance(i: int) -> int:
        path = any(options[i].get(k) != ref.get(k) for k in arithmetic)
        return path + sum(options[i].get(k) != v for k, v in ref.items() if k not in arithmetic)

    def want_rank(i: int) -> int:
        return next((r for r, keys in enumerate(wants) if any(options[i].get(k) != ref.get(k) for k in keys)
                     and (keys != ("graph",) or options[i].get("graph"))), len(wants))

    # a local search: a variant two options away is a guess about both; one away says what one option is worth
    def path_first(i: int) -> tuple[int, float]:  # another GEMM path first, the fastest estimated of them
        changed = any(options[i].get(k) != ref.get(k) for k in arithmetic)
        return (0, round(estimates[i], 3) if estimates else 0.0) if changed else (1, 0.0)

    return min(allowed, key=lambda i: (distance(i), want_rank(i), path_first(i), i))


_HOSTS_STARTED: set[str] = set()  # build caches a program host build was started for, in this process
_HOSTS_LOCK = threading.Lock()


def build_host_ahead(verifier: object) -> None:
    """Start building the program host (the torch side every generated program shares, about 15 s
    of C++) into ``verifier``'s build cache, in the background, once per cache and process: a fresh
    cache then pays for it while the task is captured, not after its first program is written."""
    build, cache = getattr(verifier, "build", None), getattr(verifier, "cache", None)
    if build is None or cache is None or getattr(verifier, "gpu", None) is None:
        return  # on a CPU the program cannot link: nothing worth building
    with _HOSTS_LOCK:
        if str(cache) in _HOSTS_STARTED:
            return
        _HOSTS_STARTED.add(str(cache))
    candidate = Candidate(name="program-host", source=host_module())
    threading.Thread(target=build, args=(candidate,), name="host-build-ahead", daemon=True).start()


class OfflineCoder:
    """A Coder whose answers are generated programs, one variant per call. It reads each step as a
    typed :class:`CoderRequest` (the loop calls :meth:`answer`); :meth:`complete` keeps the
    ``LLMClient`` interface for callers without one and walks the variants in order."""

    config = OFFLINE

    def __init__(self, task: Task, tolerance: str = "strict", compiled: Compiled | None = None):
        self.task, self.tolerance = task, tolerance
        # CaptureError or Unsupported says why the compiler cannot work on it
        self.compiled = compiled or compile_task(task)
        self.graph, self.groups = self.compiled.graph, self.compiled.groups
        # where no group is attention, its one-kernel variants write the same programs: left out
        attention = any(g.kind == "attention" for g in self.groups)
        self.variants = [o for o in variants(tolerance) if attention or not o["fused_attention"]]
        self.tried: list[int] = []
        self.verified_ms: dict[int, float] = {}  # variant -> its time, from the verdicts it was shown
        self._made: dict[str, int] = {}  # sha256 of a program it wrote -> its variant
        self._lock = threading.Lock()
        self._variant_ms: list[float] | None = None

    @classmethod
    def prepare(cls, task: Task, tolerance: str = "strict") -> Compiled:
        """The task compiled, with the cost model's estimates and its first program already made (a
        bench makes them in another process, :mod:`stitchcuda.agents.compiling`: emitted in the bench's
        own process, a large program took turns on its interpreter with a dozen threads, 0.4 s → 33 s)."""
        coder = cls(task, tolerance)
        coder._estimates()
        coder.first_program()
        for index in coder.companions():
            coder.compiled.program(CodegenOptions.model_validate(coder.variants[index]))
        return coder.compiled

    def _estimates(self) -> list[float] | None:
        """The cost model's estimate of every variant (one lowering with every path on, per
        precision), once."""
        if self._variant_ms is None:
            by_precision = {}
            try:
                for tf32, bf16 in dict.fromkeys((o["tf32"], o["bf16"]) for o in self.variants):
                    options = CodegenOptions(tf32=tf32, bf16=bf16, split_tf32=not tf32, cutlass=True, cost_model=True)
                    by_precision[(tf32, bf16)] = self.compiled.lowering(options).estimates
                self._variant_ms = variant_estimates(by_precision, self.variants)
            except Unsupported:
                self._variant_ms = []
        return self._variant_ms or None

    def first_program(self) -> str:
        """The program a run's first step gets (nothing tried, no verdict yet: the first variant)."""
        return self.compiled.program(CodegenOptions.model_validate(self.variants[choose_next(self.variants, [],
                                                                                            Signals())]))

    def companions(self) -> list[int]:
        """The variants a first step verifies beside the first one, because no model predicts whether
        they pass: the same program in the arithmetic that is right only where the data is kind
        (plain TF32 under strict, bf16 under paper), and under strict the same in true fp32 where
        the cost model put 3xTF32 somewhere (its error grows with the reduction depth and the
        operands' spread, which only the trials measure). Only those whose estimate differs from the
        first's: where no product or convolution changes, neither does the program. And the same
        with attention as one kernel where a group takes it (whether its one launch beats the
        products depends on the sequence, the heads and the GPU)."""
        estimates = self._estimates()
        if not estimates:
            return []
        first = self.variants[0]
        if self.tolerance == "paper":
            changes = [{"bf16": True}]
        else:
            changes = [{"tf32": True, "split_tf32": False},
                       {"cost_model": False, "split_tf32": False, "cutlass": False, "cublaslt": True}]
        out = []
        for change in changes:
            index = next((i for i, o in enumerate(self.variants) if o == {**first, **change}), None)
            if index is not None and index not in out and abs(estimates[index] - estimates[0]) > 1e-9:
                out.append(index)
        fused = next((i for i, o in enumerate(self.variants) if o == {**first, "fused_attention": True}), None)
        if fused is not None and self._fuses_attention(fused):
            out.append(fused)
        return out

    def _fuses_attention(self, index: int) -> bool:
        """Whether variant ``index`` lowers some attention group to one kernel."""
        try:
            low = self.compiled.lowering(CodegenOptions.model_validate(self.variants[index]))
        except Unsupported:
            return False
        return any(lg.attention is not None for lg in low.groups)

    def samples_wanted(self, request: CoderRequest) -> int:
        """The first step verifies the first variant and its companions side by side (a one-step run
        then keeps the fastest that passes every trial); later steps one each."""
        return 1 + len(self.companions()) if request.skill == "scratch" and request.program is None else 1

    def _variant(self, program: str | None) -> int | None:
        if program is None:
            return None
        made = self._made.get(hashlib.sha256(program.encode()).hexdigest())
        # a program of a resumed run, written by another instance: its header names the options
        return made if made is not None else variant_of(program, self.variants)

    def answer(self, request: CoderRequest) -> Completion:
        with self._lock:
            carried, verdict = self._variant(request.program), request.verdict
            if carried is not None and verdict is not None and verdict.correct and verdict.timing:
                ms = verdict.timing.candidate.median_ms
                self.verified_ms[carried] = min(ms, self.verified_ms.get(carried, float("inf")))
            # From the fastest program seen, by its own time: the loop carries the last program
            # into a new subtask even when it was slower, and eager's time (so the speedup) is noisy.
            base = min(self.verified_ms, key=self.verified_ms.__getitem__) if self.verified_ms else carried
            companions = self.companions() if self.samples_wanted(request) > 1 else []
            if companions and request.sample == 0 and 0 not in self.tried:
                index = 0  # the first variant, whichever sample's thread answers first
            elif 0 < request.sample <= len(companions):
                index = companions[request.sample - 1]
            else:
                index = choose_next(self.variants, self.tried, Signals.from_verdict(verdict), base=base,
                                    estimates=self._estimates())
            self.tried.append(index)
            options = CodegenOptions.model_validate(self.variants[index])
        started = time.perf_counter()
        source = self.compiled.program(options)
        with self._lock:
            self._made[hashlib.sha256(source.encode()).hexdigest()] = index
        text = f"Offline Coder, variant {options.model_dump()}:\n```python\n{source}```\n"
        return Completion(text=text, model=OFFLINE.model, usage=Usage(), seconds=time.perf_counter() - started,
                          finish_reason="stop")

    def complete(self, messages: list[Message], *, max_tokens: int | None = None,
                 temperature: float | None = None) -> Completion:
        return self.answer(CoderRequest(skill="scratch"))
