"""KernelBench's own ``eval_kernel_against_ref`` as a second opinion, loaded from the user's checkout.

KernelBench's package imports an LLM client (litellm, openai) and dotenv at the top of its
utilities, none of which its evaluation needs. Those modules are given empty stand-ins for the
import, only where they are not installed, so the harness loads on a machine that has only torch.
Call :func:`run_harness` in a process of its own: it builds and runs the candidate, and
KernelBench's package patches torch at import. ``python -m stitchcuda.verify.kernelbench_harness
REQUEST.json`` is that process: it reads a :class:`HarnessRequest` and writes a
:class:`HarnessReply` (see :mod:`stitchcuda.verify.second_opinion`, which starts it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from stitchcuda.verify.gate import GateClient, GateUse
from stitchcuda.verify.harness_controls import ask_controls, max_difference

# what KernelBench's modules import at the top without using it to evaluate
_UNUSED_AT_EVAL = {"dotenv": {"load_dotenv": lambda *a, **k: False}, "litellm": {"completion": None},
                   "openai": {"OpenAI": None}, "tqdm": {"tqdm": lambda it=None, *a, **k: it},
                   "requests": {}}  # imported by eval.py, used only to fetch problems


# KernelBench returns None, not a verdict, when its build met a lock file or a missing file: "retry"
NO_RESULT = "the harness returned no result (a lock or a build it could not finish)"


class HarnessError(RuntimeError):
    """KernelBench's harness could not be found or loaded; the message says why."""


class HarnessVerdict(BaseModel):
    """What ``eval_kernel_against_ref`` said of one candidate."""

    compiled: bool
    correct: bool
    runtime_ms: float | None = None
    detail: str = ""
    correct_true_fp32: bool | None = None  # asked again, TF32 off, when it said incorrect (see main)
    correct_v01: bool | None = None  # asked again at its v0/v0.1 fp32 tolerance, 1e-2, when both said incorrect
    ref_runtime_ms: float | None = None  # its reference's mean time under torch's default flags
    # where it said incorrect against a true-fp32 reference too: its verdicts on two controls
    # (verify/harness_controls.py); None where a control could not run or was not asked
    exact_correct: bool | None = None
    reordered_correct: bool | None = None
    control_detail: str = ""
    judgeable: bool = True  # False: a control failed by as much as the program (harness_controls)
    timed_apart: bool = False  # it judged the program wrong, so both were timed by time_both, not in its eval


def harness_root(checkout: str | Path) -> Path:
    """The folder holding the ``kernelbench`` package of a KernelBench checkout."""
    root = Path(checkout).expanduser().resolve()
    for candidate in (root / "src", root):
        if (candidate / "kernelbench" / "eval.py").is_file():
            return candidate
    raise HarnessError(f"{root} has no KernelBench harness (src/kernelbench/eval.py): a checkout of "
                       "github.com/ScalingIntelligence/KernelBench has one")


def harness_problem(checkout: str | Path) -> str | None:
    """Why ``checkout`` holds no KernelBench harness, or None when it holds one."""
    try:
        harness_root(checkout)
    except HarnessError as exc:
        return str(exc)
    return None


def load_eval(checkout: str | Path) -> Any:
    """KernelBench's ``kernelbench.eval`` module."""
    root = harness_root(checkout)
    for name, attrs in _UNUSED_AT_EVAL.items():
        try:
            importlib.import_module(name)
        except ImportError:
            stand_in = types.ModuleType(name)
            stand_in.__dict__.update(attrs)
            sys.modules[name] = stand_in
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        return importlib.import_module("kernelbench.eval")
    except Exception as exc:  # a harness of another version, a missing dependency: say which
        raise HarnessError(f"KernelBench's harness in {root} did not load: {type(exc).__name__}: {exc}") from exc


# KernelBench v0 and v0.1 judged fp32 programs at atol = rtol = 1e-2 (the level 1-3 results papers
# publish); its harness now takes 1e-4 for fp32 (torchbench's), which TF32 arithmetic misses.
V01_TOLERANCE = 1e-2


def run_harness(checkout: str | Path, reference: str, candidate: str, *, trials: int = 5,
                perf_trials: int = 20, build_dir: str | None = None,
                measure_performance: bool = True, tf32: bool | None = None,
                tolerance: float | None = None) -> HarnessVerdict:
    """KernelBench's verdict on ``candidate`` against ``reference`` with its defaults (seed 42, fp32,
    its tolerance), ``trials`` correctness trials and, with ``measure_performance``, its CUDA-event
    timing.

    ``tf32=None`` sets torch's default flags, as KernelBench leaves them: cuDNN convolutions then
    run in TF32 (``torch.backends.cudnn.allow_tf32`` is on by default), so the reference itself
    is off by about 1e-3 from fp32 and an fp32-exact convolution can miss KernelBench's 1e-4.
    ``tf32=False`` judges against a true-fp32 reference, as our Verifier does. ``tolerance``
    replaces its fp32 tolerance (``V01_TOLERANCE``: the one its v0/v0.1 used)."""
    import torch

    _set_tf32(tf32)
    harness = load_eval(checkout)
    if tolerance is not None:
        if not hasattr(harness, "get_tolerance_for_precision"):
            raise HarnessError("this KernelBench harness has no get_tolerance_for_precision to judge at another "
                               "tolerance")
        harness.get_tolerance_for_precision = lambda precision: tolerance
    reference, candidate, adapted = adapt_for_harness(reference, candidate)
    result = harness.eval_kernel_against_ref(
        reference, candidate, num_correct_trials=trials, num_perf_trials=perf_trials, measure_performance=measure_performance,
        build_dir=build_dir, device=torch.device("cuda:0"), backend="cuda", precision=torch.float32)
    if result is None:
        return HarnessVerdict(compiled=False, correct=False, detail=NO_RESULT)
    runtime = getattr(result, "runtime", -1.0)
    meta = getattr(result, "metadata", {}) or {}
    detail = "; ".join(f"{k}: {str(v)[:200]}" for k, v in meta.items()
                       if k not in ("hardware", "device", "correctness_trials"))
    if adapted:
        detail = f"{adapted}; {detail}"
    ref_runtime = getattr(result, "ref_runtime", -1.0)
    return HarnessVerdict(compiled=bool(result.compiled), correct=bool(result.correctness),
                          runtime_ms=float(runtime) if runtime and runtime > 0 else None,
                          ref_runtime_ms=float(ref_runtime) if ref_runtime and ref_runtime > 0 else None,
                          detail=detail[:600])


def _set_tf32(tf32: bool | None) -> None:
    """TF32 on or off for both cuDNN and cuBLAS; None: torch's defaults (cuDNN in TF32, cuBLAS not),
    as KernelBench's eval runs under."""
    import torch

    torch.backends.cudnn.allow_tf32 = True if tf32 is None else tf32
    torch.backends.cuda.matmul.allow_tf32 = False if tf32 is None else tf32


def time_both(checkout: str | Path, reference: str, candidate: str, *, perf_trials: int = 100,
              build_dir: str | None = None) -> tuple[float, float]:
    """(reference ms, candidate ms), both by KernelBench's own timing code in this process under
    torch's default flags, as its ``eval_kernel_against_ref`` times a program it judged correct:
    the reference through its ``measure_ref_program_time``, the program with the same timing
    function after building it as its eval does. For the program it judged wrong only because its
    reference ran in TF32: its eval then times nothing."""
    import torch

    _set_tf32(None)
    harness = load_eval(checkout)
    timing = importlib.import_module("kernelbench.timing")
    reference, candidate, _ = adapt_for_harness(reference, candidate)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")  # cpu: only under a test's fake harness
    ref_ms = timing.measure_ref_program_time("reference", reference, num_trials=perf_trials, device=device)["mean"]
    _, get_init_inputs, get_inputs = harness.load_original_model_and_inputs(reference, {})
    new_cls = harness.load_custom_model(candidate, {}, build_dir)
    with torch.no_grad():
        harness.set_seed(42)
        init = [x.to(device) if isinstance(x, torch.Tensor) else x for x in get_init_inputs()]
        harness.set_seed(42)
        model = new_cls(*init).to(device=device, dtype=torch.float32)
        harness.set_seed(42)
        inputs = [x.to(device=device, dtype=torch.float32) if isinstance(x, torch.Tensor) else x for x in get_inputs()]
        elapsed = timing.get_timing_function("cuda_event")(model, inputs, num_trials=perf_trials, verbose=False,
                                                          device=device)
    return float(ref_ms), float(timing.get_timing_stats(elapsed, device=device)["mean"])


@functools.lru_cache(maxsize=8)
def _output_form(reference: str) -> tuple[str, int, bool] | None:
    """The reference's output computed on the meta device, as (its type's name, its tensor leaves,
    whether they are tensors of one floating dtype); None where it is one tensor or the meta device
    cannot run it. Once per reference: each of the harness's questions about one task asks it."""
    import torch
    from torch.utils._pytree import tree_leaves

    scope: dict[str, Any] = {"__name__": "stitchcuda_harness_outputs"}
    try:
        exec(compile(reference, "reference.py", "exec"), scope)
        with torch.device("meta"), torch.no_grad():
            output = scope["Model"](*scope["get_init_inputs"]())(*scope["get_inputs"]())
    except Exception:  # noqa: BLE001 - not told here: the harness's own verdict stands
        return None
    if isinstance(output, torch.Tensor):
        return None
    leaves = tree_leaves(output)
    dtypes = {t.dtype for t in leaves if isinstance(t, torch.Tensor)}
    flat = bool(leaves) and all(isinstance(t, torch.Tensor) for t in leaves) and len(dtypes) == 1 \
        and next(iter(dtypes)).is_floating_point
    return type(output).__name__, len(leaves), flat


def flattened_outputs(reference: str) -> int | None:
    """How many tensors the reference returns where it returns a pytree of them (a tuple, a nested
    tuple, a dict) that can be given to KernelBench's harness as one tensor: every leaf a tensor of
    one floating dtype. None where it returns one tensor, or anything else."""
    form = _output_form(reference)
    return form[1] if form is not None and form[2] else None


def _not_one_tensor(reference: str) -> str | None:
    """Why KernelBench's harness cannot compare this task's outputs (it reads ``output.shape`` and
    calls ``torch.allclose`` on one tensor, and they cannot be flattened into one for it); None where
    it returns one tensor or flattenable ones, or where the meta device cannot tell."""
    form = _output_form(reference)
    if form is None or form[2]:
        return None
    return (f"KernelBench's harness compares one output tensor (output.shape, torch.allclose); this task returns "
            f"{form[0]} of {form[1]} values that are not tensors of one floating dtype, which it cannot compare: "
            "no verdict from it (ours compares them one by one)")


def integer_inputs(reference: str) -> dict[int, str]:
    """Positions and dtypes of the reference's integer and bool inputs (token ids, masks), which
    KernelBench's harness casts to float32 with the rest."""
    import torch

    scope: dict[str, Any] = {"__name__": "stitchcuda_harness_inputs"}
    exec(compile(reference, "reference.py", "exec"), scope)
    torch.manual_seed(0)
    inputs = scope["get_inputs"]()
    return {i: str(x.dtype) for i, x in enumerate(inputs)
            if isinstance(x, torch.Tensor) and not x.dtype.is_floating_point and not x.dtype.is_complex}


def adapt_for_harness(reference: str, candidate: str) -> tuple[str, str, str]:
    """Both sources as KernelBench's harness can judge them, and what was done, in words ("" where
    nothing): integer inputs, which it casts to float32, cast back first; a pytree of outputs
    returned as the concatenation of its leaves flattened, which it compares in one
    ``torch.allclose`` element by element (what comparing leaf by leaf decides; the leaves' shapes
    are our Verifier's check)."""
    restored, flattened = integer_inputs(reference), flattened_outputs(reference)
    said = []
    if restored:
        said.append(f"inputs {sorted(restored)} are {', '.join(sorted(set(restored.values())))}: KernelBench casts "
                    "every input to float32, so both models cast them back first (exact below 2^24)")
    if flattened:
        said.append(f"the task returns {flattened} tensors; KernelBench compares one, so both models return them "
                    "flattened and concatenated")
    if said:
        reference = _wrap_forward(reference, "Model", restored, bool(flattened))
        candidate = _wrap_forward(candidate, "ModelNew", restored, bool(flattened))
    return reference, candidate, "; ".join(said)


def _wrap_forward(source: str, cls: str, restored: dict[int, str], flatten: bool) -> str:
    """``source`` with ``cls``'s forward replaced by one that first casts the inputs at ``restored``
    back to their own dtypes and, with ``flatten``, returns its outputs' leaves flattened into one
    tensor. The class itself stays (a subclass under its name would send its
    ``super(Model, self).__init__()`` round in circles); constructor, parameters and keys unchanged."""
    casts = ", ".join(f"{i}: {dtype}" for i, dtype in sorted(restored.items()))
    call = f"_stitchcuda_{cls}_forward(self, *(a.to(dtypes[i]) if i in dtypes else a for i, a in enumerate(args)))"
    if flatten:
        call = f"torch.cat([t.reshape(-1) for t in _stitchcuda_leaves({call})])"
    return (source + "\n\n# stitchcuda: adapted for KernelBench's harness (its inputs all float32, one output "
            f"tensor)\nimport torch\nfrom torch.utils._pytree import tree_leaves as _stitchcuda_leaves\n"
            f"_stitchcuda_{cls}_forward = {cls}.forward\n\n\ndef _stitchcuda_{cls}_adapted(self, *args):\n"
            f"    dtypes = {{{casts}}}\n    return {call}\n\n\n{cls}.forward = _stitchcuda_{cls}_adapted\n")


class HarnessRequest(BaseModel):
    """What the harness process is asked: sources by path, so candidate code never passes a command line."""

    checkout: str
    reference_path: str
    candidate_path: str
    result_path: str
    build_dir: str | None = None
    cache_root: str | None = Field(None, description="our build cache: the program's load_inline loads the "
                                                     "extensions our Verifier built there instead of running nvcc again")
    gate_path: str | None = Field(None, description="the GPU gate: shared around its correctness, exclusive around "
                                                    "its timing (verify/gate.py)")
    reusable: bool = Field(False, description="our Verifier found the program correct and no hack: a warm harness "
                                              "process may serve another after it, if its own run was clean too")
    controls: bool = Field(True, description="where it finds the program wrong against both references, judge "
                                             "the controls too (verify/harness_controls.py); off where ours found "
                                             "the program wrong: the two agree whatever they say")
    trials: int = 5  # what KernelBench's scripts run (its function's own default is 1)
    perf_trials: int = 100  # likewise (the function's default is 10)
    measure_performance: bool = True


class HarnessReply(BaseModel):
    """The harness process's answer: KernelBench's verdict, or why it could not give one."""

    verdict: HarnessVerdict | None = None
    error: str | None = None
    ready_at: float = Field(0.0, description="unix time its imports were done (the process's start before it)")
    stages: dict[str, float] = Field({}, description="build, correctness, timing: seconds")
    builds_cached: bool | None = Field(None, description="every extension came from our build cache")
    gate: GateUse = GateUse()
    retiring: bool = Field(True, description="the process exits after this request")


class _Session:
    """What the harness process does around KernelBench's own functions, none of which it changes:
    the program's ``load_inline`` is served from our build cache (the extensions our Verifier built
    from the same source; torch's own build step would compile them again), KernelBench's timing
    functions run inside the exclusive section of the GPU gate, its other GPU work inside the
    shared one, and each stage is timed.

    Each of its calls builds both models on the CPU (their random init) before it moves anything to
    the GPU: seconds for a large model, during which a shared section would hold back every other
    process's timing. So a call enters the shared section at its first move of a tensor or module
    to a CUDA device (:meth:`gpu_from_first_move`), and leaves it when it returns."""

    def __init__(self, request: HarnessRequest):
        self.gate = GateClient(request.gate_path)
        self.timing_s = 0.0
        self.builder = None
        if request.cache_root:
            from stitchcuda.verify.build import ExtensionBuilder

            self.builder = ExtensionBuilder(Path(request.cache_root))

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        try:
            timing = importlib.import_module("kernelbench.timing")
        except ImportError:  # a version that times inside eval.py: the whole run is timed, so alone
            with self._built(), self.gate.section("exclusive"):
                yield
            return
        original = timing.get_timing_function

        def gated(method: str) -> Any:
            function = original(method)

            @functools.wraps(function)
            def timed(*args: Any, **kwargs: Any) -> Any:
                with self.gate.section("exclusive"):
                    started = time.perf_counter()  # after the wait, which the gate counts
                    try:
                        return function(*args, **kwargs)
                    finally:
                        self.timing_s += time.perf_counter() - started
            return timed

        timing.get_timing_function = gated
        try:
            with self._built():
                yield
        finally:
            timing.get_timing_function = original

    @contextlib.contextmanager
    def gpu_from_first_move(self) -> Iterator[None]:
        """One harness call: no gate until it first moves a tensor or module to a CUDA device
        (``.to``, ``.cuda``), the shared section from then until it returns. The tripwires remove
        themselves as they fire, so nothing of ours runs inside a timed forward."""
        if self.gate.held is not None:  # a harness timed as a whole holds the exclusive section throughout
            yield
            return
        import torch

        targets = [(torch.Tensor, "to"), (torch.Tensor, "cuda"), (torch.nn.Module, "to"), (torch.nn.Module, "cuda")]
        own = {(cls, name): cls.__dict__.get(name) for cls, name in targets}  # None: inherited from TensorBase

        def disarm() -> None:
            for (cls, name), method in own.items():
                if method is None:
                    with contextlib.suppress(AttributeError):
                        delattr(cls, name)
                else:
                    setattr(cls, name, method)

        def tripwire(cls: type, name: str) -> Any:
            method = getattr(cls, name)

            @functools.wraps(method)
            def moved(obj: Any, *args: Any, **kwargs: Any) -> Any:
                device = torch.device("cuda") if name == "cuda" else torch._C._nn._parse_to(*args, **kwargs)[0]
                if device is not None and device.type == "cuda":
                    disarm()
                    self.gate.switch("shared")
                return method(obj, *args, **kwargs)
            return moved

        for cls, name in targets:
            setattr(cls, name, tripwire(cls, name))
        try:
            yield
        finally:
            disarm()
            self.gate.switch(None)

    @contextlib.contextmanager
    def _built(self) -> Iterator[None]:
        if self.builder is None:
            yield
            return
        self.builder.install()
        try:
            yield
        finally:
            self.builder.uninstall()

    def stages(self, total_s: float) -> dict[str, float]:
        build = sum(r.seconds for r in self.builder.records) if self.builder is not None else 0.0
        timing = self.timing_s
        return {"build": round(build, 3), "timing": round(timing, 3),
                "correctness": round(max(total_s - build - timing - self.gate.use.waited_s, 0.0), 3)}

    @property
    def builds_cached(self) -> bool | None:
        records = self.builder.records if self.builder is not None else []
        return all(r.cache_hit for r in records) if records else None


def main(argv: list[str] | None = None) -> int:
    """The harness process: one request in, one reply file out (written whole, or not at all); or,
    with ``--standby --ready FILE``, a warm one serving the request paths read from stdin one at a
    time (verify/workers.py), for as long as every run is clean."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--standby"]:
        from stitchcuda.verify.workers import gpu_memory_returned, serve_requests

        serve_requests(serve, gpu_memory_returned, args[args.index("--ready") + 1] if "--ready" in args else None)
    serve(args[0])
    return 0


def serve(request_path: str, last: bool = True) -> bool:
    """One request; True when this process may serve another: our Verifier found the program
    clean, and KernelBench judged it correct without an error of its own."""
    request = HarnessRequest.model_validate_json(Path(request_path).read_text())
    ready_at = time.time()
    session: _Session | None = None
    try:
        load_eval(request.checkout)  # its package's import, apart from its work
        ready_at = time.time()
        session = _Session(request)
        with session.active():
            reply = _judge(request, session.gpu_from_first_move)
    except HarnessError as exc:
        reply = HarnessReply(error=str(exc))
    except Exception as exc:  # the harness itself raised (no GPU, an assert of its own): it did not judge
        reply = HarnessReply(error=f"KernelBench's harness raised {type(exc).__name__}: {str(exc)[:500]}")
    reply.ready_at = ready_at
    if session is not None:
        reply.stages = session.stages(time.time() - ready_at)
        reply.builds_cached = session.builds_cached
        reply.gate = session.gate.use
    clean = reply.verdict is not None and reply.verdict.compiled and reply.verdict.correct and reply.error is None
    reply.retiring = last or not (request.reusable and clean)
    tmp = Path(request.result_path + ".tmp")
    tmp.write_text(reply.model_dump_json())
    os.replace(tmp, request.result_path)  # a reader never sees half a reply
    sys.stdout.flush()
    sys.stderr.flush()
    return not reply.retiring


def _judge(request: HarnessRequest, on_gpu: Callable[[], contextlib.AbstractContextManager[None]]) -> HarnessReply:
    """KernelBench's verdict, asked again against a true-fp32 reference and at its v0.1 tolerance
    where it said incorrect, and timed apart where only those said correct. ``on_gpu`` scopes each
    call's use of the GPU gate."""
    reference, candidate = Path(request.reference_path).read_text(), Path(request.candidate_path).read_text()
    with on_gpu():
        verdict = run_harness(request.checkout, reference, candidate, trials=request.trials,
                              perf_trials=request.perf_trials, build_dir=request.build_dir,
                              measure_performance=request.measure_performance)
    if verdict.compiled and not verdict.correct and (why := _not_one_tensor(reference)):
        return HarnessReply(error=why)
    # Its reference runs under torch's default flags, cuDNN convolutions in TF32: an "incorrect"
    # is asked again against a true-fp32 reference (untimed), so that an fp32-accurate
    # convolution rejected only for the reference's TF32 shows as such.
    if verdict.compiled and not verdict.correct:
        with on_gpu():
            again = run_harness(request.checkout, reference, candidate, trials=request.trials,
                                build_dir=request.build_dir, measure_performance=False, tf32=False)
        verdict.correct_true_fp32 = None if again.detail == NO_RESULT else again.correct
        if verdict.correct_true_fp32 is False and hasattr(load_eval(request.checkout), "get_tolerance_for_precision"):
            # TF32 or bf16 arithmetic (tolerance paper) misses its fp32 1e-4 by design: asked at the
            # tolerance of its v0/v0.1, the one published results used, under its default flags (a
            # harness without the function is such a version: 1e-2 already)
            with on_gpu():
                loose = run_harness(request.checkout, reference, candidate, trials=request.trials,
                                    build_dir=request.build_dir, measure_performance=False, tolerance=V01_TOLERANCE)
            verdict.correct_v01 = None if loose.detail == NO_RESULT else loose.correct
        if verdict.correct_true_fp32 is False and request.controls:
            ask_controls(verdict, functools.partial(run_harness, request.checkout, reference, trials=request.trials,
                                                    build_dir=request.build_dir, measure_performance=False,
                                                    tf32=False), reference, on_gpu, max_difference(again.detail))
        # where it judged the program right at some reference, or cannot judge it on this task, its
        # speedup still counts: timed apart
        if (verdict.correct_true_fp32 or verdict.correct_v01 or not verdict.judgeable) and request.measure_performance:
            try:
                with on_gpu():
                    verdict.ref_runtime_ms, verdict.runtime_ms = time_both(
                        request.checkout, reference, candidate, perf_trials=request.perf_trials,
                        build_dir=request.build_dir)
                verdict.timed_apart = True
            except Exception as exc:  # its verdicts stand; only the speedup is missing, and said so
                verdict.detail += f"; timing it apart failed: {type(exc).__name__}: {str(exc)[:200]}"
    # no result is no judgement: a verdict of "incorrect" here would be a false disagreement
    return HarnessReply(error=NO_RESULT) if verdict.detail == NO_RESULT else HarnessReply(verdict=verdict)


if __name__ == "__main__":
    sys.exit(main())
