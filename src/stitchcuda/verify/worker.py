"""The worker: the only place where candidate code runs.

Started by the orchestrator as ``python -m stitchcuda.verify.worker REQUEST.json`` for one request
(a fresh process and process group), or as ``--standby``: a warm worker (verify/workers.py),
torch imported and CUDA up before any candidate exists, that reads request paths from stdin and
serves them one at a time. A warm worker forgets each candidate before the next and exits after
anything that could carry over (:func:`retire_after`). It always tries to write a
:class:`WorkerResult`; when it cannot (segfault, kill, hang), the orchestrator reads the exit
status, the phase file and the output tail instead. After any CUDA error the context is
unusable, so the worker records what happened and exits at once with ``os._exit``. Around its
GPU work it takes the GPU's gate (verify/gate.py).

Phases, in order: ``reference`` (import and construct the reference), ``build`` (import the
candidate, which builds its extensions), ``construct``, ``correctness`` (verify/trials.py),
``profile`` (verify/profile_checks.py), ``timing`` (verify/baselines.py, then the escape probe and
the post-timing trial). A crash inside a phase becomes a record through verify/crash.py.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

from stitchcuda import machine
from stitchcuda.task.inspect import TaskError, check_module, inspect_task_module
from stitchcuda.task.probe import user_error
from stitchcuda.verify import profiling
from stitchcuda.verify.baselines import time_candidate
from stitchcuda.verify.build import BuildFailed, ExtensionBuilder
from stitchcuda.verify.caching import stale_outputs
from stitchcuda.verify.conditioning import Fp64Reference
from stitchcuda.verify.correctness import make_trial_inputs
from stitchcuda.verify.crash import CandidateFailed, classify_error, fail, short_traceback
from stitchcuda.verify.escape import escaped_work
from stitchcuda.verify.gate import GateClient
from stitchcuda.verify.harness_guard import HarnessGuard
from stitchcuda.verify.model_state import ModelState, draws_random, kept, seed_check
from stitchcuda.verify.profile_checks import check_speed_of_light, profile_both
from stitchcuda.verify.protocol import WorkerRequest, WorkerResult
from stitchcuda.verify.torch_state import TorchState, set_tf32
from stitchcuda.verify.trials import passes_with_copied_weights, run_trials, same_state_layout
from stitchcuda.verify.verdict import (
    SEED_DEPENDENT,
    BuildReport,
    CorrectnessReport,
    CrashReport,
    DeviceInfo,
    Finding,
    WeightsTrial,
)
from stitchcuda.verify.weights_trial import follows_weights, like
from stitchcuda.verify.workers import MAX_SERVED, die_with_parent, gpu_memory_returned, serve_requests


class Progress:
    """Appends ``phase <tab> unix-time`` lines the orchestrator reads to know where we are,
    and checkpoints the result so far: a worker that dies keeps what it already learned. It also
    holds the worker's GPU gate: shared around a forward or a trial, exclusive around anything
    timed, none around a build (verify/gate.py)."""

    def __init__(self, path: str, result: WorkerResult, checkpoint_path: str, gate_path: str | None = None,
                 alone: bool = False):
        self.path = path
        self.phase = "start"
        self.result = result
        self.checkpoint_path = checkpoint_path
        self.gate = GateClient(gate_path, alone)

    def __call__(self, phase: str) -> None:
        self.checkpoint()
        self.phase = phase
        with open(self.path, "a") as f:
            f.write(f"{phase}\t{time.time():.3f}\n")

    def checkpoint(self) -> None:
        self.result.gate = self.gate.use
        tmp = Path(self.checkpoint_path + ".tmp")
        tmp.write_text(self.result.model_dump_json())
        tmp.replace(self.checkpoint_path)


def import_from_path(path: str, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def main(request_path: str) -> None:
    """One request, then exit."""
    die_with_parent()
    serve(request_path)
    # Skip interpreter teardown: after a CUDA error it can hang or crash.
    os._exit(0)


def serve(request_path: str, last: bool = True) -> bool:
    """Serve one request and write its result; True when this process may serve another (nothing
    went wrong and the candidate left no trace we know of). ``last``: no other will be asked for."""
    faulthandler.enable()  # a segfault still prints the Python stack to our log
    request = WorkerRequest.model_validate_json(Path(request_path).read_text())
    # off the timing cores before ninja or Inductor's compile workers start: they inherit it
    machine.confine(os.environ.get("STITCHCUDA_WORK_CPUS"))
    result = WorkerResult(started_at=time.time())
    progress = Progress(request.phase_path, result, request.result_path + ".partial", request.gate_path,
                        request.gate_alone)
    try:
        if request.mode == "build":
            _build_only(request, result, progress)
        elif request.mode == "profile":
            _profile_reference(request, result, progress)
        elif request.mode == "counters":
            _counters(request, result, progress)
        else:
            _verify(request, result, progress)
    except CandidateFailed:
        pass
    except BaseException as exc:  # nothing may escape: the result file is the contract
        result.crash = CrashReport(kind=classify_error(exc), phase=progress.phase, message=short_traceback(exc))
    finally:
        progress.gate.switch(None)
        result.gate = progress.gate.use
        result.retiring = last or retire_after(result)
        tmp = Path(request.result_path + ".tmp")
        tmp.write_text(result.model_dump_json())
        tmp.replace(request.result_path)
        sys.stdout.flush()
        sys.stderr.flush()
    return not result.retiring


def retire_after(result: WorkerResult) -> bool:
    """A worker serves another candidate only after a clean run: any crash (a CUDA error is sticky),
    hacking finding, changed torch flag, failed build or import, or unusable reference retires it."""
    return bool(result.crash or result.findings or result.flags_changed or result.import_error
                or result.reference_error or not result.build.ok)


def _forget() -> bool:
    """Between two candidates: drop the modules, the models and the cached GPU memory; True when
    the GPU memory came back (a candidate that keeps some alive retires its worker)."""
    for name in ("stitchcuda_candidate", "stitchcuda_reference"):
        sys.modules.pop(name, None)
    if "torch._dynamo" in sys.modules:  # the torch.compile baseline's graphs
        torch._dynamo.reset()
    return gpu_memory_returned()


def _import_candidate(request: WorkerRequest, result: WorkerResult, progress: Progress) -> ModuleType | None:
    progress("build")
    builder = ExtensionBuilder(Path(request.cache_root), Path(request.candidate_path).read_text(errors="replace"))
    builder.install()
    started = time.perf_counter()
    module = None
    try:
        module = import_from_path(request.candidate_path, "stitchcuda_candidate")
    except BuildFailed:
        pass  # the record says why
    except BaseException as exc:
        if any(not r.ok for r in builder.records):
            pass  # the candidate caught our BuildFailed and failed later: the build is the cause
        else:
            result.import_error = short_traceback(exc)
    finally:
        builder.uninstall()
    records = builder.records
    result.build = BuildReport(
        seconds=round(time.perf_counter() - started, 3),
        cache_hit=bool(records) and all(r.cache_hit for r in records),
        extensions=records,
    )
    return module if result.build.ok and result.import_error is None else None


def _build_only(request: WorkerRequest, result: WorkerResult, progress: Progress) -> None:
    result.ready_at = time.time()
    _import_candidate(request, result, progress)


# --- full verification -----------------------------------------------------------------------


def _init_device(request: WorkerRequest, result: WorkerResult) -> torch.device:
    device = torch.device(request.device)
    started = time.perf_counter()
    if device.type == "cuda" and (request.config.profile or request.mode == "profile"):
        # Measured on H100: the first profiler session costs ~6 s once CUDA is up, but opening an
        # empty one before CUDA initialises costs nothing beyond the CUDA init it then performs.
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities):
            pass
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.init()
        props = torch.cuda.get_device_properties(device)
        result.device = DeviceInfo(
            name=props.name, capability=f"{props.major}.{props.minor}", torch=torch.__version__,
            cuda=torch.version.cuda, l2_bytes=props.L2_cache_size,
        )
    else:
        result.device = DeviceInfo(name="cpu", torch=torch.__version__, cuda=torch.version.cuda)
    result.cuda_init_s = time.perf_counter() - started
    result.ready_at = time.time()
    return device


def _profile_reference(request: WorkerRequest, result: WorkerResult, progress: Progress) -> None:
    """``stitchcuda profile``: the reference alone, per operator and module, with its roofline."""
    device = _init_device(request, result)
    progress("reference")
    set_tf32(False)
    torch.set_grad_enabled(False)
    try:
        reference = import_from_path(request.reference_path or "", "stitchcuda_reference")
        torch.manual_seed(request.config.seed)
        init_inputs = list(inspect_task_module(reference, device)[0])
        model = reference.Model(*init_inputs)  # its random init runs on the CPU: outside the gate
        progress.gate.switch("shared")
        model = model.to(device)
        inputs = make_trial_inputs(reference.get_inputs, request.config.seed, "given", device)
        for _ in range(2):
            model(*inputs)
    except Exception as exc:
        result.reference_error = str(exc) if isinstance(exc, TaskError) else user_error(exc, request.reference_path or "")
        return
    if device.type != "cuda":
        result.errors.append("profiling needs a CUDA device")
        return
    progress("profile")
    progress.gate.switch("exclusive")
    started = time.perf_counter()
    profile = profiling.profile_call(lambda: model(*inputs), model=model, shapes=True, top=25)
    peaks = profiling.measure_peaks(device, Path(request.cache_root))  # timed (once per GPU and cache)
    progress.gate.switch("shared")  # counting FLOPs times nothing
    profile.roofline = profiling.roofline(model, inputs, peaks)
    result.reference_profile = profile
    result.profile_s = time.perf_counter() - started


def _counters(request: WorkerRequest, result: WorkerResult, progress: Progress) -> None:
    """One forward of a verified candidate inside the range Nsight Compute profiles (the
    orchestrator runs this worker under ``ncu --profile-from-start off``)."""
    config = request.config
    device = _init_device(request, result)
    progress("reference")
    set_tf32(False)
    torch.set_grad_enabled(False)
    progress.gate.switch("exclusive")  # under ncu, every kernel is replayed and timed
    reference = import_from_path(request.reference_path or "", "stitchcuda_reference")
    torch.manual_seed(config.seed)
    init_inputs = list(inspect_task_module(reference, device)[0])
    torch.manual_seed(config.seed)
    ref_model = reference.Model(*init_inputs).to(device)
    module = _import_candidate(request, result, progress)
    if module is None:
        return
    progress("construct")
    torch.manual_seed(config.seed)
    model = module.ModelNew(*init_inputs).to(device)
    if config.weights == "copy":  # the weights the verification used
        with contextlib.suppress(RuntimeError):
            model.load_state_dict(ref_model.state_dict())
    del ref_model
    inputs = make_trial_inputs(reference.get_inputs, config.seed, "given", device)
    progress("counters")
    for _ in range(2):  # builds, autotuning and lazy module loading stay outside the profiled range
        model(*inputs)
    torch.cuda.synchronize(device)
    torch.cuda.profiler.start()
    model(*inputs)
    torch.cuda.synchronize(device)
    torch.cuda.profiler.stop()


def _verify(request: WorkerRequest, result: WorkerResult, progress: Progress) -> None:
    config = request.config
    device = _init_device(request, result)

    # The reference: true fp32 (PyTorch enables TF32 for cuDNN convolutions by default).
    progress("reference")
    started = time.perf_counter()
    set_tf32(False)
    torch.set_grad_enabled(False)  # inference only, as KernelBench runs it; part of the clean state
    try:
        reference = import_from_path(request.reference_path or "", "stitchcuda_reference")
        torch.manual_seed(config.seed)
        init_inputs = list(inspect_task_module(reference, device)[0])
        torch.manual_seed(config.seed)
        ref_model = reference.Model(*init_inputs)  # the user's model: its random init runs on the CPU, outside the gate
        progress.gate.switch("shared")
        ref_model = ref_model.to(device)
        ref_start = ModelState.capture(ref_model)
        # One forward before any candidate code exists in this process: a reference that
        # cannot run is an unusable task, never blamed on the candidate.
        first_inputs = make_trial_inputs(reference.get_inputs, config.seed, "given", device)
        with torch.no_grad():
            draws = draws_random(lambda: ref_model(*first_inputs), device)[1]  # its output dropped now
            state = ref_start.changed(ref_model)
            ref_start.restore(ref_model)  # both models start from the state construction left
            seeds = seed_check(ref_model, first_inputs, ref_start, config.seed, config.tol) if draws else None
        first_inputs.clear()  # a level-1 task's inputs can take gigabytes
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:
        result.reference_error = str(exc) if isinstance(exc, TaskError) else user_error(exc, request.reference_path or "")
        return
    result.reference_s = time.perf_counter() - started
    if seeds is not None and not seeds.agree:
        result.reference_error = (
            f"{SEED_DEPENDENT}: on the same inputs, seeds "
            f"{seeds.seeds[0]} and {seeds.seeds[1]} give outputs {seeds.max_abs_difference or float('nan'):.3g} apart "
            f"at most ({seeds.error}), so no program can be checked against it")
        return

    clean_state = TorchState.capture()
    seen_changes: set[str] = set()

    def audit_state(where: str, threads: bool = True) -> None:
        changes = TorchState.capture().changes_since(clean_state)
        for flag, (before, after) in changes.items():
            if flag not in seen_changes:
                seen_changes.add(flag)
                result.flags_changed.append(flag)
                result.findings.append(Finding(
                    check="global_state", level="partial",
                    detail=f"the candidate changed torch flag {flag} from {before!r} to {after!r} ({where}); restored",
                ))
        if changes:
            clean_state.restore()
        result.findings.extend(guard.check(where, threads))

    guard = HarnessGuard()  # before any candidate code: the identities of the harness's functions
    progress.gate.switch(None)  # a build needs no GPU (normally a cache hit: built before the worker ran)
    module = _import_candidate(request, result, progress)
    audit_state("at import")
    if module is None:
        return
    if not result.build.extensions:
        result.findings.append(Finding(
            check="no_custom_kernels", level="total",
            detail="the candidate built no extension with load_inline: no kernel of its own runs",
        ))

    progress("construct")
    started = time.perf_counter()
    try:
        check_module(module, "ModelNew", needs_inputs=False)
    except TaskError as exc:
        result.errors.append(str(exc))
        return
    weights = "seeded"
    try:
        torch.manual_seed(config.seed)  # KernelBench's convention: the reference's seed, nothing copied
        new_model = module.ModelNew(*init_inputs)  # its random init on the CPU, outside the gate, as the reference's
        progress.gate.switch("shared")
        new_model = new_model.to(device)
        if config.weights == "copy" and same_state_layout(ref_model, new_model):
            new_model.load_state_dict(ref_model.state_dict())
            weights = "copied"
        new_start = ModelState.capture(new_model)
    except BaseException as exc:
        fail(result, exc, progress.phase)
    audit_state("in __init__")
    result.construct_s = time.perf_counter() - started
    result.correctness = CorrectnessReport(weights=weights, state=state, random_draws=seeds)

    progress("correctness")
    started = time.perf_counter()
    with torch.no_grad():
        # an fp64 re-run of the reference is the same computation only without state it reads or draws
        fp64 = None if draws or any(not _batch_statistics(name) for name in state) else Fp64Reference(ref_model)
        run_trials(request, result, reference, ref_model, new_model, device, audit_state, progress.checkpoint, fp64)
        conditioned = fp64 is not None and any(t.conditioning is not None for t in result.correctness.trials)
        if fp64 is not None and not conditioned:
            fp64.release()  # kept for the post-timing trial only where a trial needed it
        trials = result.correctness.trials
        passed = bool(trials) and all(t.passed for t in trials)
        if not passed and weights == "seeded" and trials and trials[0].max_abs_error is not None:
            ref_start.restore(ref_model)  # one call each, from the same state
            new_start.restore(new_model)
            result.correctness.passes_with_copied_weights = passes_with_copied_weights(
                request, reference, ref_model, new_model, device, next((t for t in trials if not t.passed), None))
            audit_state("with copied weights")
        if passed:  # then with new weights loaded between two calls; both models' weights and state restored
            # on the GPU where they take little of its free memory, else on the host (the trial itself
            # holds two outputs on the GPU, as any trial does)
            saved = [(m, _snapshot(m, device)) for m in (ref_model, new_model)]
            weights_started = time.perf_counter()
            try:
                with kept(ref_model, new_model):
                    trial = follows_weights(request, reference, ref_model, new_model, device, bool(draws), conditioned,
                                            fp64=fp64 is not None)
                result.correctness.weights_follow = trial
                passed = not trial.ran or bool(trial.passed)
            except torch.OutOfMemoryError as exc:  # an extra check: it does not fail a program that passed
                result.correctness.weights_follow = WeightsTrial(
                    skipped=f"out of GPU memory ({str(exc).splitlines()[0][:160]})")
                torch.cuda.empty_cache()
            except BaseException as exc:
                fail(result, exc, "trial with new weights")
            finally:
                for model, state in saved:
                    model.load_state_dict(state)
                del saved
                result.weights_trial_s = time.perf_counter() - weights_started
            audit_state("with new weights")
    result.correctness_s = time.perf_counter() - started
    result.fp64_s = fp64.seconds if fp64 is not None else 0.0
    if not passed or not config.timing:
        return

    progress.gate.switch("exclusive")  # from here on everything is timed, or probes timing
    if config.profile and device.type == "cuda":
        progress("profile")
        started = time.perf_counter()
        with torch.no_grad(), kept(ref_model, new_model):
            profile_both(request, result, reference, ref_model, new_model, device)
        audit_state("while profiled")
        result.profile_s = time.perf_counter() - started

    progress("timing")
    started = time.perf_counter()  # the escape probe is timing's: it runs the candidate as the rounds do
    with torch.no_grad(), kept(new_model):
        try:  # work left running beyond the caller's stream escapes event-based timers (verify/escape.py)
            result.findings.extend(escaped_work(new_model, reference.get_inputs, config.seed, device))
        except BaseException as exc:
            fail(result, exc, "escape probe")
    with torch.no_grad(), kept(ref_model, new_model):  # the post-timing trial goes on from the trials' state
        time_candidate(request, result, reference, ref_model, new_model, device, progress.gate)
    audit_state("during timing", threads=False)  # torch.compile's baseline starts worker threads
    result.timing_s = time.perf_counter() - started - result.baselines_s
    progress.gate.switch("shared")  # a trial again: nothing more is timed
    started = time.perf_counter()
    with torch.no_grad():
        try:  # outputs gone stale after the timed calls, or cached on the inputs' identity (verify/caching.py)
            result.findings.extend(stale_outputs(new_model, ref_model, reference.get_inputs, config, device,
                                                 fp64 if conditioned else None))
        except BaseException as exc:
            fail(result, exc, "post-timing trial")
    audit_state("in the post-timing trial", threads=False)
    result.correctness_s += time.perf_counter() - started  # a correctness trial, made after the timing
    check_speed_of_light(result)


def _snapshot(model: torch.nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s state_dict to restore later: on ``device`` when it takes under a quarter
    of the GPU's free memory (a ConvNeXt's copies to the host and back took seconds), else on the host."""
    state = model.state_dict()
    where = torch.device("cpu")
    if device.type == "cuda":
        size = sum(v.numel() * v.element_size() for v in state.values())
        if size < torch.cuda.mem_get_info(device)[0] // 4:
            where = device
    saved = like(state)
    saved.update((k, v.to(where, copy=True)) for k, v in state.items())
    return saved


def _batch_statistics(name: str) -> bool:
    """BatchNorm's running statistics: state a training-mode forward writes and never reads."""
    return name.rsplit(".", 1)[-1] in ("running_mean", "running_var", "num_batches_tracked")


def standby(profile: bool, ready_path: str | None, max_served: int) -> None:
    """A warm worker: get ready before any candidate exists, then serve the requests named on stdin
    one at a time (verify/workers.py: ``serve_requests``). Importing this module already loaded
    torch and every module a verification uses."""
    if torch.cuda.is_available():
        if profile:  # see _init_device: the profiler's first session is free before CUDA is up
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities):
                pass
        torch.cuda.init()
        torch.cuda.synchronize()  # the context exists now
    serve_requests(serve, _forget, ready_path, max_served)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--standby"]:
        ready = sys.argv[sys.argv.index("--ready") + 1] if "--ready" in sys.argv else None
        standby(profile="--profile" in sys.argv, ready_path=ready,
                max_served=int(os.environ.get("STITCHCUDA_WORKER_SERVES", MAX_SERVED)))
    else:
        main(sys.argv[1])
