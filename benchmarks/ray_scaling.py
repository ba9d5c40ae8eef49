"""The bench on a multi-GPU node three ways: over Ray's local cluster on every GPU, with the local
executor on every GPU, and with the local executor on one GPU. Same tasks, offline Coder, one
step per task, each mode in a fresh workspace and from an empty build cache. Prints wall time,
verified candidates per GPU-hour, the share of the wall time the GPUs were held, and whether the
three agree task by task on correctness and hacking level; and for each, the GPUs' busy share
(the union of the gate's intervals), the slowest task and where the tasks' time went. Needs CUDA
GPUs (and Ray for the first mode: pip install 'stitchcuda[ray]').

    python benchmarks/ray_scaling.py [--tasks suite] [--runs-per-gpu 6] [--preset quick] --out results
    python benchmarks/zoo.py write zoo/ && python benchmarks/ray_scaling.py --tasks zoo/ \
        --kernelbench-harness ~/KernelBench --runs-per-gpu 8 --out results     # the whole zoo
    python benchmarks/ray_scaling.py ... --out results --resume   # modes cut short (--timeout-s) go on

A mode cut at ``--timeout-s`` keeps its workspace; ``--resume`` carries each unfinished bench on
(``stitchcuda bench --resume last``) and leaves finished ones as they are.

Each mode's figures and task-by-task outcomes go to ``OUT/mode-MODE.json`` as it ends, and the
table is drawn over every such file in ``OUT``: modes run one at a time (``--modes local``, then
``--modes ray``, ...) add up, and ``--table`` draws it from files alone, without a GPU (the files
of runs made on other machines copied into one folder)::

    python benchmarks/ray_scaling.py --table --out results

Goals it checks: all GPUs give 1.8x or more the throughput of one; the Ray path is within 10% of
the local one; the three agree on every task.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from stitchcuda.bench.store import BenchStore
from stitchcuda.verify.pool import default_gpus

MODES = ("ray", "local", "local-1gpu")


def run_mode(mode: str, args: argparse.Namespace, out: Path) -> dict:
    """One bench in its own workspace and build cache; returns its figures and per-task outcomes."""
    workspace, cache = out / f"ws-{mode}", out / f"cache-{mode}"
    gpus = default_gpus()
    if args.resume and (workspace / "runs.sqlite").exists():
        command = [sys.executable, "-m", "stitchcuda.cli", "bench", "--resume", "last", "--workspace", str(workspace),
                   "--json"]
    else:
        command = [sys.executable, "-m", "stitchcuda.cli", "bench", args.tasks, "--max-steps", "1",
                   "--runs-per-gpu", str(args.runs_per_gpu), "--preset", args.preset, "--tolerance", args.tolerance,
                   "--workspace", str(workspace), "--json"]
        if args.kernelbench_harness:
            command += ["--kernelbench-harness", args.kernelbench_harness]
        if mode == "ray":
            command += ["--ray", "local"]
        elif mode == "local-1gpu":
            command += ["--gpus", "0"]
    started = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s,
                              env={**os.environ, "STITCHCUDA_CACHE": str(cache)})
    except subprocess.TimeoutExpired:
        return {"mode": mode, "error": f"cut at {args.timeout_s:g} s: carry it on with --resume",
                "wall_s": time.time() - started, "progress": progress(workspace)}
    wall = time.time() - started
    (out / f"bench-{mode}.json").write_text(done.stdout)
    (out / f"bench-{mode}.err").write_text(done.stderr)
    if done.returncode != 0:
        return {"mode": mode, "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300], "wall_s": wall}
    summary = json.loads(done.stdout)
    store = BenchStore(workspace)
    try:
        results = store.result(summary["bench_id"]).tasks
    finally:
        store.close()
    tasks = {t.task: [t.correct, t.hacking] for t in results}
    slowest = max(results, key=lambda t: t.wall_s, default=None)
    totals, overall = summary.get("totals", {}), summary["overall"]
    return {"mode": mode, "gpus": 1 if mode == "local-1gpu" else len(gpus), "wall_s": summary["bench_wall_s"],
            "per_gpu_hour": totals.get("verified_per_gpu_hour"), "gpu_busy": totals.get("gpu_busy"),
            "gpu_busy_by_gpu": totals.get("gpu_busy_by_gpu", {}), "stages_s": totals.get("stages_s", {}),
            "slowest": (slowest.task, round(slowest.wall_s, 1)) if slowest else None,
            "verifications": totals.get("verifications"), "correct": overall["correct"], "tasks": overall["tasks"],
            "partial": overall["hacking_partial"], "total": overall["hacking_total"], "outcomes": tasks}


def progress(workspace: Path) -> dict:
    """How far a cut bench got: its finished tasks, the slowest of them with their largest stages,
    and the stages summed over them (the store keeps every finished task)."""
    if not (workspace / "runs.sqlite").exists():
        return {}
    store = BenchStore(workspace)
    try:
        tasks = store.result(store.resolve("last")).tasks
    except KeyError:
        return {}
    finally:
        store.close()
    done = [t for t in tasks if t.status not in ("pending", "running")]
    stages: dict[str, float] = {}
    for t in done:
        for k, v in t.stages.items():
            stages[k] = round(stages.get(k, 0.0) + v, 1)
    slowest = [{"task": t.task, "wall_s": round(t.wall_s, 1),
                "stages": dict(sorted(t.stages.items(), key=lambda kv: -kv[1])[:3])}
               for t in sorted(done, key=lambda t: -t.wall_s)[:8]]
    return {"done": len(done), "tasks": len(tasks), "stages_s": stages, "slowest": slowest}


def table(rows: list[dict]) -> list[str]:
    """The three runs side by side and the goals; returns the goals missed."""
    rows = sorted(rows, key=lambda r: MODES.index(r["mode"]) if r["mode"] in MODES else len(MODES))
    print(f"{'mode':12} {'GPUs':>4} {'wall s':>8} {'verified/GPU-h':>14} {'GPU busy':>8} {'correct':>8} {'hacks':>6}"
          "  slowest task")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:12} failed: {r['error']}")
            if r.get("progress"):
                p = r["progress"]
                top = sorted(((v, k) for k, v in p["stages_s"].items() if v), reverse=True)[:6]
                print(f"{'':12} {p['done']}/{p['tasks']} tasks finished; their time: "
                      + ", ".join(f"{k} {v:,.0f} s" for v, k in top))
                print(f"{'':12} slowest: " + "; ".join(f"{x['task']} {x['wall_s']:.0f} s" for x in p["slowest"]))
            continue
        slowest = f"{r['slowest'][0]} {r['slowest'][1]:.0f} s" if r.get("slowest") else "-"
        print(f"{r['mode']:12} {r['gpus']:>4} {r['wall_s']:8.1f} {r['per_gpu_hour'] or 0:14.1f} "
              f"{(r['gpu_busy'] or 0):8.0%} {r['correct']:>4}/{r['tasks']:<3} {r['partial'] + r['total']:>6}  {slowest}")
        top = sorted(((v, k) for k, v in r.get("stages_s", {}).items() if v), reverse=True)[:6]
        if top:
            print(f"{'':12} where the tasks' time went: " + ", ".join(f"{k} {v:,.0f} s" for v, k in top))
    by = {r["mode"]: r for r in rows if "error" not in r}
    missed = []
    if "local" in by and "local-1gpu" in by:
        scaling = by["local-1gpu"]["wall_s"] / by["local"]["wall_s"]
        print(f"throughput of {by['local']['gpus']} GPUs over one: {scaling:.2f}x (goal 1.8x)")
        if scaling < 1.8:
            missed.append("scaling")
    if "ray" in by and "local" in by:
        ratio = by["ray"]["wall_s"] / by["local"]["wall_s"]
        print(f"Ray's wall time over the local executor's: {ratio:.2f} (goal at most 1.10)")
        if ratio > 1.1:
            missed.append("ray")
    outcomes = [r["outcomes"] for r in by.values()]
    differ = sorted({t for o in outcomes for t in o
                     if any(tuple(x.get(t) or ()) != tuple(o[t]) for x in outcomes)})
    print("correctness and hacking level agree on every task" if not differ else f"they differ on: {differ}")
    if differ:
        missed.append("agreement")
    return missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="suite", help="what `stitchcuda bench` takes: suite, a folder, ...")
    parser.add_argument("--runs-per-gpu", type=int, default=6)
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--tolerance", default="strict")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--kernelbench-harness", default=None, help="a KernelBench checkout: its second opinion too")
    parser.add_argument("--resume", action="store_true", help="carry on the benches an earlier run cut short")
    parser.add_argument("--table", action="store_true",
                        help="run nothing: the table over the mode-*.json files already in --out")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    if not args.table:
        if not default_gpus():
            sys.exit("no CUDA GPU visible: this benchmark runs the bench on GPUs")
        out.mkdir(parents=True, exist_ok=True)
        for mode in args.modes.split(","):
            if mode not in MODES:
                sys.exit(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
            row = run_mode(mode, args, out)
            (out / f"mode-{mode}.json").write_text(json.dumps(row, indent=1))
            print(json.dumps({k: v for k, v in row.items() if k != "outcomes"}), flush=True)
    rows = [json.loads(f.read_text()) for f in sorted(out.glob("mode-*.json"))]
    if not rows:
        sys.exit(f"no mode-*.json in {out}: run a mode first")
    missed = table(rows)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
