"""How long a verification takes and how stable its speedup is (GPU; prints figures, asserts nothing).

    python benchmarks/verify_bench.py [--task mlp] [--candidate examples/mlp_cuda.py] [--repeats 5]

1. a cold build into an empty cache (extension compiled from scratch);
2. one verification that also measures and caches the baselines (torch.compile included);
3. ``--repeats`` verifications with the build and the baselines cached: the wall time split
   (worker start, build load, reference, correctness, timing) and the run-to-run spread of
   the measured speedup. Goals: a cached verification under 15 s for a ~10 ms task; speedup
   spread under 3 %.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from stitchcuda.task import load_candidate, resolve_tasks
from stitchcuda.verify import Verifier, VerifyConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="mlp")
    parser.add_argument("--candidate", default=str(Path(__file__).parents[1] / "examples" / "mlp_cuda.py"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    (task,) = resolve_tasks(args.task)
    candidate = load_candidate(args.candidate)
    console = Console()
    with tempfile.TemporaryDirectory(prefix="stitchcuda-bench-") as tmp:
        verifier = Verifier(VerifyConfig(), cache=Path(tmp))
        started = time.time()
        cold = verifier.build(candidate)
        cold_wall = time.time() - started
        if not cold.extensions or not all(e.ok for e in cold.extensions):
            raise SystemExit(f"the candidate does not build: {[e.messages for e in cold.extensions]}")
        first = verifier.verify(task, candidate)
        if not first.passed:
            raise SystemExit(f"the candidate does not pass: {first.errors}")
        runs = [verifier.verify(task, candidate) for _ in range(args.repeats)]

    table = Table(title=f"verification of {candidate.name} on {task.name} ({first.device.name})")
    for col in ("run", "total s", "worker start", "build", "reference", "correctness", "profile", "timing",
                "cand ms", "eager ms", "vs eager", "vs best"):
        table.add_column(col, justify="right")
    def row(label, v):
        w = v.wall
        table.add_row(label, f"{w.total_s:.1f}", f"{w.worker_start_s:.1f}", f"{w.build_s:.1f}",
                      f"{w.reference_s:.1f}", f"{w.correctness_s:.1f}", f"{w.profile_s:.1f}", f"{w.timing_s:.1f}",
                      f"{v.timing.candidate.median_ms:.3f}", f"{v.timing.baselines['eager'].stats.median_ms:.3f}",
                      f"{v.speedup['eager']:.3f}x", f"{v.speedup['best']:.3f}x")
    row("first (baselines measured)", first)
    for i, v in enumerate(runs):
        row(f"cached {i + 1}", v)
    console.print(table)

    def spread(values):
        return 100 * (max(values) - min(values)) / statistics.median(values)

    eager = [v.speedup["eager"] for v in runs]
    best = [v.speedup["best"] for v in runs]
    figures = {
        "task": task.name, "candidate": candidate.name, "gpu": first.device.name,
        "cold_build_s": round(cold.seconds, 1), "cold_build_wall_s": round(cold_wall, 1),
        "first_verify_s": round(first.wall.total_s, 1),
        "cached_verify_s_median": round(statistics.median(v.wall.total_s for v in runs), 2),
        "profile_s_median": round(statistics.median(v.wall.profile_s for v in runs), 2),
        "profile_share_of_wall_pct": round(100 * statistics.median(v.wall.profile_s / v.wall.total_s for v in runs), 1),
        "candidate_ms": round(statistics.median(v.timing.candidate.median_ms for v in runs), 4),
        "speedup_vs_eager_median": round(statistics.median(eager), 3),
        "speedup_vs_eager_spread_pct": round(spread(eager), 2),
        "speedup_vs_best_median": round(statistics.median(best), 3),
        "speedup_vs_best_spread_pct": round(spread(best), 2),
        "best_baseline": first.timing.best_baseline(first.tolerance.name).name,
    }
    summary = Table(title="summary (spread = (max - min) / median over the cached runs)")
    summary.add_column("figure")
    summary.add_column("value", justify="right")
    for key, value in figures.items():
        summary.add_row(key, str(value))
    console.print(summary)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
