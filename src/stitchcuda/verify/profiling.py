"""Where a program's GPU time goes: torch.profiler attribution, roofline floors, measured peaks.

Runs inside a worker (torch and CUDA initialised). Every CUDA kernel of a profiled forward is
attributed through the profiler's correlation ids to the innermost CPU operator that launched
it: an ``aten::`` operator means PyTorch did the work; our marker scope (the candidate's
forward, outside any ATen operator) means the candidate's own code launched it, either its own
kernel or a library (cuBLAS, cuDNN, ...) it called directly.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from stitchcuda.verify.gate import busy_seconds
from stitchcuda.verify.kernel_names import is_library_kernel
from stitchcuda.verify.verdict import KernelStat, OpStat, Peaks, ProgramProfile, Roofline

MARKER = "stitchcuda::forward"
# ATen operators that allocate, copy or reshape: their kernels are not the model's compute.
DATA_MOVEMENT_OPS = {"aten::empty", "aten::empty_like", "aten::zeros", "aten::zeros_like", "aten::fill_",
                     "aten::zero_", "aten::copy_", "aten::contiguous", "aten::clone", "aten::cat", "aten::to",
                     "aten::_to_copy", "aten::empty_strided", "aten::ones", "aten::full", "aten::stack",
                     "aten::new_zeros", "aten::new_empty", "aten::resize_"}
# Random draws from torch's generator: a program draws what the reference's forward draws.
RANDOM_DRAW_OPS = {"aten::rand", "aten::randn", "aten::randint", "aten::randperm", "aten::normal", "aten::uniform_",
                   "aten::normal_", "aten::random_", "aten::bernoulli_", "aten::rand_like", "aten::randn_like"}
_SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
               "cudaMemcpyAsync+sync", "cuCtxSynchronize", "cudaStreamQuery"}


@contextlib.contextmanager
def module_scopes(model: torch.nn.Module) -> Iterator[None]:
    """Open a ``module::<name>`` profiler scope around every submodule's forward."""
    handles = []
    open_scopes: dict[int, list[Any]] = defaultdict(list)

    def pre(name: str):
        def hook(module, args):
            scope = torch.profiler.record_function(f"module::{name}")
            scope.__enter__()
            open_scopes[id(module)].append(scope)
        return hook

    def post(module, args, output):
        if open_scopes[id(module)]:
            open_scopes[id(module)].pop().__exit__(None, None, None)

    for name, sub in model.named_modules():
        if name:
            handles.append(sub.register_forward_pre_hook(pre(name)))
            handles.append(sub.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _is_device(evt: Any) -> bool:
    return str(getattr(evt, "device_type", "")).endswith("CUDA")


def _innermost(evt: Any, prefix: str) -> Any:
    while evt is not None:
        if evt.name.startswith(prefix):
            return evt
        evt = evt.cpu_parent
    return None


def _launch_owner(kernel: Any, runtime: dict[int, Any], frontend: dict[int, Any]) -> Any:
    """The CPU operator that launched a device event: the runtime call (cudaLaunchKernel, ...)
    shares the kernel's CUPTI correlation id, and its parent is the operator around it."""
    for key in (getattr(kernel, "id", None), getattr(kernel, "linked_correlation_id", None)):
        launch = runtime.get(key) if key else None
        if launch is not None:
            return launch.cpu_parent
    linked = getattr(kernel, "linked_correlation_id", None)
    return frontend.get(linked) if linked else None


def _enclosing(evt: Any, names: set[str]) -> str | None:
    while evt is not None:
        if evt.name in names:
            return evt.name
        evt = evt.cpu_parent
    return None


def profile_calls(calls: dict[str, Callable[[], Any]], models: dict[str, torch.nn.Module] | None = None,
                  shapes: bool = False, top: int = 12) -> dict[str, ProgramProfile]:
    """Profile several programs (each already warmed up) in one profiler session: starting the
    profiler costs more than a forward. ``models`` adds GPU time per submodule for those named."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    markers = {f"{MARKER}:{name}": name for name in calls}
    with contextlib.ExitStack() as stack:
        for model in (models or {}).values():
            stack.enter_context(module_scopes(model))
        prof = stack.enter_context(torch.profiler.profile(activities=activities, record_shapes=shapes))
        for name, call in calls.items():
            with torch.profiler.record_function(f"{MARKER}:{name}"):
                call()
            torch.cuda.synchronize()
    events = list(prof.events())
    cpu = [e for e in events if not _is_device(e)]
    runtime = {e.id: e for e in cpu if e.name.startswith(("cuda", "cu"))}
    frontend = {e.id: e for e in cpu if not e.name.startswith(("cuda", "cu"))}
    scopes = {e.name: e for e in cpu if e.name in markers}
    grouped: dict[str, list[tuple[Any, Any]]] = {name: [] for name in calls}
    for evt in events:
        if not _is_device(evt) or evt.name in markers or evt.name.startswith(("module::", MARKER)):
            continue  # GPU-side copies of our own annotations
        owner = _launch_owner(evt, runtime, frontend)
        scope = _enclosing(owner, set(markers))
        if scope is None:
            # Launched outside every profiled call's scope (another thread, say): it belongs to
            # the last call started before it, as each call is synchronised before the next.
            started = [(e.time_range.start, m) for m, e in scopes.items() if e.time_range.start <= evt.time_range.start]
            scope = max(started)[1] if started else None
            owner = None
        if scope is not None:
            grouped[markers[scope]].append((evt, owner))
    return {name: _summarize(grouped[name], cpu, scopes.get(f"{MARKER}:{name}"), shapes, top) for name in calls}


def _summarize(items: list[tuple[Any, Any]], cpu: list[Any], scope: Any, shapes: bool, top: int) -> ProgramProfile:
    kernels: dict[tuple[str, str], KernelStat] = {}
    ops: dict[str, OpStat] = {}
    modules: dict[str, OpStat] = {}
    intervals: list[tuple[float, float]] = []
    copies: dict[str, int] = defaultdict(int)
    copy_us = 0.0
    streams: set[int] = set()
    for evt, owner in items:
        start, end = evt.time_range.start, evt.time_range.end
        duration = max(end - start, 0.0)
        stream = getattr(evt, "device_resource_id", None)
        if evt.name.startswith("Memcpy"):
            kind = next((k for k in ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP") if k in evt.name), "other")
            copies[kind] += 1
            copy_us += duration
            continue
        if evt.name.startswith("Memset"):
            continue
        intervals.append((start, end))
        if stream is not None:
            streams.add(int(stream))
        aten = _innermost(owner, "aten::")
        if owner is None:
            origin = "unattributed"
        elif aten is not None:
            origin = "pytorch"
        else:
            origin = "library" if is_library_kernel(evt.name) else "own"
        stat = kernels.setdefault((evt.name, origin), KernelStat(name=evt.name, origin=origin, calls=0,  # type: ignore[arg-type]
                                                                  total_us=0.0, share=0.0))
        stat.calls += 1
        stat.total_us += duration
        if stream is not None and int(stream) not in stat.streams:
            stat.streams.append(int(stream))
        if aten is not None:
            op = ops.setdefault(aten.name, OpStat(name=aten.name, calls=0, gpu_us=0.0, share=0.0))
            op.gpu_us += duration
            op.kernels += 1
            shape = str(getattr(aten, "input_shapes", "") or "")
            if shapes and shape and shape not in op.shapes and len(op.shapes) < 4:
                op.shapes.append(shape)
        module = _innermost(owner, "module::")
        if module is not None:
            mod = modules.setdefault(module.name[8:], OpStat(name=module.name[8:], calls=0, gpu_us=0.0, share=0.0))
            mod.gpu_us += duration
            mod.kernels += 1
    for evt in cpu:  # call counts, inside this program's scope only
        if _inside(evt, scope):
            if evt.name in ops:
                ops[evt.name].calls += 1
            elif evt.name.startswith("module::") and evt.name[8:] in modules:
                modules[evt.name[8:]].calls += 1

    gpu_us = sum(k.total_us for k in kernels.values())
    window = (max(e for _, e in intervals) - min(s for s, _ in intervals)) if intervals else 0.0
    busy = busy_seconds(intervals)
    by_origin: dict[str, float] = defaultdict(float)
    for k in kernels.values():
        k.share = k.total_us / gpu_us if gpu_us else 0.0
        by_origin[k.origin] += k.share
    for stat in list(ops.values()) + list(modules.values()):
        stat.share = stat.gpu_us / gpu_us if gpu_us else 0.0
    syncs = sum(1 for e in cpu if e.name in _SYNC_CALLS and _inside(e, scope))
    return ProgramProfile(
        gpu_time_us=round(gpu_us, 2),
        window_us=round(window, 2),
        idle_share=round(1 - busy / window, 4) if window else 0.0,
        launches=sum(k.calls for k in kernels.values()),
        origin_share={k: round(v, 4) for k, v in sorted(by_origin.items())},
        kernels=sorted(kernels.values(), key=lambda k: -k.total_us)[:top],
        ops=sorted(ops.values(), key=lambda o: -o.gpu_us)[:top],
        modules=sorted(modules.values(), key=lambda o: -o.gpu_us)[:top],
        copies=dict(copies),
        copy_us=round(copy_us, 2),
        syncs=syncs,
        streams=sorted(streams),
    )


def profile_call(call: Callable[[], Any], model: torch.nn.Module | None = None, shapes: bool = False,
                 top: int = 12) -> ProgramProfile:
    """Profile one call (already warmed up). With ``model``, GPU time per submodule too."""
    return profile_calls({"program": call}, {"program": model} if model is not None else None, shapes, top)["program"]


def _inside(evt: Any, scope: Any) -> bool:
    if scope is None:
        return True
    return scope.time_range.start <= evt.time_range.start and evt.time_range.end <= scope.time_range.end


def pytorch_compute_share(profile: ProgramProfile) -> tuple[float, list[str]]:
    """Share of GPU time in PyTorch operators that compute (not allocation or copies), and which."""
    compute = [op for op in profile.ops if op.name not in DATA_MOVEMENT_OPS | RANDOM_DRAW_OPS]
    return sum(op.share for op in compute), [f"{op.name} {op.share:.0%}" for op in compute[:5]]


# The candidate's own kernels (with the libraries its C++ calls directly) do nothing of substance
# when they take under 1% of the GPU time AND under 10 us a forward: a decoy launch beside PyTorch
# doing the work, a total hack. A real kernel beside heavy PyTorch or library compute (a bias +
# GELU pass beside three 4096^3 GEMMs: ~1% and ~100 us) is a partial hack, whatever its share.
NEGLIGIBLE_OWN_SHARE = 0.01
NEGLIGIBLE_OWN_US = 10.0


def own_work_negligible(profile: ProgramProfile) -> bool:
    share = profile.origin_share
    mine = share.get("own", 0.0) + share.get("library", 0.0)
    return bool(profile.gpu_time_us) and mine < NEGLIGIBLE_OWN_SHARE and mine * profile.gpu_time_us < NEGLIGIBLE_OWN_US


def operator_coverage(reference: ProgramProfile, candidate: ProgramProfile) -> float | None:
    """Share of the reference's GPU time in operators the candidate no longer calls."""
    total = sum(op.gpu_us for op in reference.ops)
    if not total:
        return None
    still = {op.name for op in candidate.ops}
    return round(sum(op.gpu_us for op in reference.ops if op.name not in still) / total, 4)


# --- roofline ------------------------------------------------------------------------------------


def _tensor_bytes(values: Any) -> int:
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (list, tuple)):
        return sum(_tensor_bytes(v) for v in values)
    if isinstance(values, dict):
        return sum(_tensor_bytes(v) for v in values.values())
    return 0


def count_flops(model: torch.nn.Module, inputs: list[Any]) -> tuple[float, Any]:
    """FLOPs of one forward (matmuls, convolutions, attention) and its output."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        output = model(*inputs)
    return float(counter.get_total_flops()), output


def roofline(model: torch.nn.Module, inputs: list[Any], peaks: Peaks) -> Roofline:
    flops, output = count_flops(model, inputs)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    min_bytes = float(_tensor_bytes(inputs) + _tensor_bytes(output) + weights)
    best_tflops = max(peaks.fp32_tflops, peaks.tf32_tflops, peaks.bf16_tflops)
    compute_ms = flops / (best_tflops * 1e12) * 1e3 if best_tflops else 0.0
    memory_ms = min_bytes / (peaks.copy_gbps * 1e9) * 1e3 if peaks.copy_gbps else 0.0
    return Roofline(flops=flops, min_bytes=min_bytes, floor_ms=max(compute_ms, memory_ms),
                    compute_floor_ms=compute_ms, memory_floor_ms=memory_ms, peaks=peaks)


def _best_ms(call: Callable[[], Any], reps: int = 5) -> float:
    call()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def _measure_ceilings(device: torch.device, n: int = 8192) -> tuple[float, float, float, float]:
    previous = torch.backends.cuda.matmul.allow_tf32
    a32, b32 = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        fp32 = 2 * n**3 / _best_ms(lambda: a32 @ b32, 3) / 1e9
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = 2 * n**3 / _best_ms(lambda: a32 @ b32) / 1e9
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    bf16 = 2 * n**3 / _best_ms(lambda: a16 @ b16) / 1e9
    src = torch.empty(1 << 28, dtype=torch.float32, device=device)  # 1 GiB
    dst = torch.empty_like(src)
    gbps = 2 * src.numel() * 4 / _best_ms(lambda: dst.copy_(src)) / 1e6
    return fp32, tf32, bf16, gbps


def measure_peaks(device: torch.device, cache: Path | None = None) -> Peaks:
    """Matmul throughput (fp32, TF32, bf16) and copy bandwidth, measured once per GPU and torch."""
    name = torch.cuda.get_device_name(device)
    key = re.sub(r"[^0-9A-Za-z]+", "_", f"{name}_{torch.__version__}")
    path = cache / "peaks" / f"{key}.json" if cache else None
    if path is not None and path.exists():
        try:
            return Peaks.model_validate(json.loads(path.read_text()))
        except ValueError:
            pass
    fp32, tf32, bf16, gbps = _measure_ceilings(device)
    torch.cuda.empty_cache()
    peaks = Peaks(gpu=name, fp32_tflops=round(fp32, 1), tf32_tflops=round(tf32, 1), bf16_tflops=round(bf16, 1),
                  copy_gbps=round(gbps, 1))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(peaks.model_dump_json())
    return peaks
