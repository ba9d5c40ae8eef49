"""Speed of the bench machinery on one GPU: verified candidates per GPU-hour, builds run
serially (build, then verify, one candidate at a time) against builds overlapped with other
candidates' verifications (the bench's GPU gate, ``--runs-per-gpu`` jobs per GPU).

The candidates are the offline Coder's variants of a few bundled tasks (distinct sources, so
every build is a real nvcc run); each mode starts from an empty build cache. Needs a CUDA GPU.

    python benchmarks/bench_throughput.py [--tasks mlp norm_softmax_gate] [--variants 2] [--runs-per-gpu 4]

(6 minutes on an H200 machine with 16 cores when a build still took about a minute: serial 61
verified candidates per GPU-hour, GPU busy 24%; overlapped 130, 53%. Builds of generated programs
now take about 20 s there, which leaves less for the overlap to hide.)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stitchcuda.agents.offline import variants
from stitchcuda.compiler.capture.graph import capture
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
from stitchcuda.compiler.schedule.fusion import fuse
from stitchcuda.task import resolve_tasks
from stitchcuda.task.record import Candidate
from stitchcuda.verify import Verifier
from stitchcuda.verify.config import PRESETS
from stitchcuda.verify.pool import GatedVerifier, GpuGate


def candidates(task_names: list[str], per_task: int) -> list[tuple]:
    out = []
    for name in task_names:
        task = resolve_tasks(name)[0]
        graph = capture(task)
        groups = fuse(graph)
        for i, options in enumerate(variants()[:per_task]):
            source = generate(task, graph, groups, CodegenOptions.model_validate(options))
            out.append((task, Candidate(name=f"{name}_v{i}", source=source)))
    return out


def serial(pairs: list[tuple], cache: Path) -> tuple[float, float, int]:
    verifier = Verifier(PRESETS["quick"], cache=cache)
    started, passed = time.time(), 0
    gpu_s = 0.0
    for task, cand in pairs:
        v = verifier.verify(task, cand)  # builds inside the worker, GPU visible: the GPU waits for nvcc
        gpu_s += v.wall.total_s - v.wall.build_s
        passed += v.passed
    return time.time() - started, gpu_s, passed


def overlapped(pairs: list[tuple], cache: Path, runs_per_gpu: int) -> tuple[float, float, int]:
    inner = Verifier(PRESETS["quick"], cache=cache)
    gate = GpuGate("cuda:0", cache / "locks")
    gated = [GatedVerifier(inner, gate) for _ in range(runs_per_gpu)]
    started = time.time()
    with ThreadPoolExecutor(runs_per_gpu) as pool:
        verdicts = list(pool.map(lambda i: gated[i % runs_per_gpu].verify(*pairs[i]), range(len(pairs))))
    return time.time() - started, sum(g.stats.gpu_s for g in gated), sum(v.passed for v in verdicts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["mlp", "norm_softmax_gate"])
    parser.add_argument("--variants", type=int, default=2)
    parser.add_argument("--runs-per-gpu", type=int, default=4)
    args = parser.parse_args()
    pairs = candidates(args.tasks, args.variants)
    rows = []
    for mode in ("serial", "overlapped"):
        with tempfile.TemporaryDirectory(prefix=f"stitchcuda-throughput-{mode}-") as tmp:
            wall, gpu_s, passed = serial(pairs, Path(tmp)) if mode == "serial" else overlapped(
                pairs, Path(tmp), args.runs_per_gpu)
        rows.append((mode, len(pairs), passed, wall, len(pairs) / wall * 3600, gpu_s / wall))
    print(f"\n{'mode':<11} {'candidates':>10} {'passed':>6} {'wall s':>8} {'per GPU-hour':>12} {'GPU busy':>8}")
    for mode, n, passed, wall, rate, busy in rows:
        print(f"{mode:<11} {n:>10} {passed:>6} {wall:>8.1f} {rate:>12.0f} {busy:>7.0%}")


if __name__ == "__main__":
    main()
