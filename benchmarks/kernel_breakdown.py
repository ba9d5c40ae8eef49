"""Where the time goes: eager's kernels beside our program's, for every task a bench verified.

For each run of a bench workspace (its ``task.py`` and the verdict of its best program) it times
the reference in eager fp32, replayed from a CUDA graph and channels-last, lists eager's top
kernels under torch.profiler, then our program's top kernels from its verdict's profile, and
prints a table last. It builds nothing: our program's figures are the Verifier's. Run on a GPU
after ``stitchcuda bench FOLDER --workspace WS``::

    python benchmarks/kernel_breakdown.py WS [--top 12]

This is how MobileNetV2's program was found to have spent more time fetching its 263 parameters
(``get_parameter`` per tensor) than in its kernels.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _ms(fn, calls: int = 30) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def _graphed(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _kernels(fn, top: int, calls: int = 5) -> tuple[float, list[str]]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            row = rows.setdefault(event.name[:90], [0, 0.0])
            row[0] += 1
            row[1] += event.device_time_total / calls / 1e3
    total = sum(ms for _, ms in rows.values())
    lines = [f"  {ms:8.3f} ms {n / calls:5.0f}x  {name}" for name, (n, ms) in
             sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]]
    return total, lines


def _timed_verdict(path: Path) -> tuple[float, dict] | None:
    """A verdict's candidate median in milliseconds and the verdict, where it passed and was timed."""
    verdict = json.loads(path.read_text())
    ms = ((verdict.get("timing") or {}).get("candidate") or {}).get("median_ms")
    return (ms, verdict) if verdict.get("passed") and ms else None


@torch.no_grad()
def _eager_figures(model, inputs: list, top: int) -> tuple[float, float, float, float, list[str]]:
    """Eager fp32's time, its CUDA graph's, channels-last's, its kernels' time and top kernels."""
    eager = _ms(lambda: model(*inputs))
    graph = _ms(_graphed(lambda: model(*inputs)))
    kernel_ms, lines = _kernels(lambda: model(*inputs), top)
    last = model.to(memory_format=torch.channels_last)
    nhwc = [x.to(memory_format=torch.channels_last) if isinstance(x, torch.Tensor) and x.dim() == 4 else x
            for x in inputs]
    return eager, graph, _ms(lambda: last(*nhwc)), kernel_ms, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("kernel_breakdown.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # eager fp32, as we time it
    table = []
    for best in sorted(args.workspace.glob("**/best.py")):
        run = best.parent
        verdicts = sorted(run.glob("**/*verdict*.json"), key=lambda p: p.stat().st_mtime)
        ref = _load(run / "task.py", f"task_{len(table)}")
        torch.manual_seed(42)
        model = ref.Model(*ref.get_init_inputs()).cuda()
        torch.manual_seed(42)
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref.get_inputs()]
        eager, graph, channels_last, kernel_ms, lines = _eager_figures(model, inputs, args.top)
        print(f"=== {run.name}: eager {eager:.3f} ms, its CUDA graph {graph:.3f}, channels-last {channels_last:.3f}; "
              f"eager's kernels {kernel_ms:.3f} ms a call")
        print("\n".join(lines))
        ours = None
        timed = [v for v in map(_timed_verdict, verdicts) if v is not None]
        if timed:  # the fastest verified candidate: the one best.py holds (a first step verifies several)
            ours, verdict = min(timed, key=lambda v: v[0])
            prof = verdict.get("profile") or {}
            print(f" ours: {ours} ms, {prof.get('launches')} launches, GPU idle {prof.get('idle_share')}")
            for k in (prof.get("kernels") or [])[:args.top]:
                print(f"  {k['total_us'] / 1e3:8.3f} ms {k['calls']:5d}x {k['origin']:8s} {k['name'][:90]}")
        table.append((run.name[:48], eager, graph, ours))
    print(f"\n{'run':48s} {'eager ms':>9s} {'graph ms':>9s} {'ours ms':>9s} {'vs graph':>9s}")
    for name, eager, graph, ours in table:
        ratio = f"{graph / ours:8.2f}x" if ours else "        -"
        print(f"{name:48s} {eager:9.3f} {graph:9.3f} {ours if ours else float('nan'):9.3f} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
