"""Time to a verified program against torch.compile's compile time, model by model, on one GPU.

For each task file: ``stitchcuda optimize TASK --max-steps 1`` from an empty build cache, without
KernelBench's harness (its wall time, from the command's start to its verdict); beside it,
``torch.compile(mode="max-autotune")``'s compile time on the same model, inputs and GPU: its
first call minus a warm call, with Inductor's caches off (``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``),
in a process of its own. Needs a CUDA GPU.

    python benchmarks/zoo.py write zoo/
    python benchmarks/time_to_verified.py zoo/hf_gpt2.py zoo/nn_lstm.py ... --out ttv.jsonl
    python benchmarks/time_to_verified.py ... --out ttv.jsonl --resume   # skips models already in ttv.jsonl

Goals it checks: ours no slower than max-autotune on each model, and a median of at most 60 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AUTOTUNE = """
import importlib.util, sys, time, torch
spec = importlib.util.spec_from_file_location("task", sys.argv[1])
task = importlib.util.module_from_spec(spec)
spec.loader.exec_module(task)
torch.manual_seed(0)
model = task.Model(*task.get_init_inputs()).cuda()
inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
with torch.no_grad():
    compiled = torch.compile(model, mode="max-autotune")
    started = time.time(); compiled(*inputs); torch.cuda.synchronize(); first = time.time() - started
    started = time.time(); compiled(*inputs); torch.cuda.synchronize(); warm = time.time() - started
print("COMPILE_S", first - warm)
"""


def ours(path: Path, limit_s: float) -> dict:
    """``stitchcuda optimize`` from an empty build cache: its wall time and whether it kept a program."""
    env = {**os.environ, "STITCHCUDA_CACHE": tempfile.mkdtemp(prefix="ttv-cache-")}
    workspace = tempfile.mkdtemp(prefix="ttv-ws-")
    command = [sys.executable, "-m", "stitchcuda.cli", "optimize", str(path), "--max-steps", "1", "--json",
               "--workspace", workspace, "-o", tempfile.mktemp(suffix=".py")]
    started = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return {"ours_s": None, "verified": False, "note": f"over {limit_s:g} s"}
    seconds = time.time() - started
    try:
        summary = json.loads(done.stdout)
    except ValueError:
        return {"ours_s": round(seconds, 1), "verified": False, "note": (done.stderr.strip().splitlines() or [""])[-1]}
    best = summary.get("best") or {}
    return {"ours_s": round(seconds, 1), "verified": bool(best), "speedup": best.get("speedup", {}),
            "stages_s": stages(workspace, env)}


def stages(workspace: str, env: dict) -> dict:
    """Where the command's time went, as ``stitchcuda runs last`` records it (stages over half a second)."""
    done = subprocess.run([sys.executable, "-m", "stitchcuda.cli", "runs", "last", "--workspace", workspace, "--json"],
                          capture_output=True, text=True, env=env)
    try:
        run = json.loads(done.stdout)
    except ValueError:
        return {}
    recorded = (run.get("state") or run).get("stages") or {}
    return {name: round(s, 1) for name, s in recorded.items() if isinstance(s, (int, float)) and s > 0.5}


def max_autotune(path: Path, limit_s: float) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", AUTOTUNE, str(path)], capture_output=True, text=True, env=env,
                              timeout=limit_s)
    except subprocess.TimeoutExpired:
        return {"autotune_s": None, "autotune_note": f"over {limit_s:g} s"}
    found = [line for line in done.stdout.splitlines() if line.startswith("COMPILE_S")]
    if not found:
        return {"autotune_s": None, "autotune_note": (done.stderr.strip().splitlines() or [""])[-1][:200]}
    return {"autotune_s": round(float(found[0].split()[1]), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="+", type=Path, help="KernelBench-format task files")
    parser.add_argument("--limit-s", type=float, default=600)
    parser.add_argument("--out", type=Path, default=None, help="append one JSON line per model")
    parser.add_argument("--resume", action="store_true", help="keep the models already in --out and measure the rest")
    args = parser.parse_args()
    rows = []
    if args.resume and args.out is not None and args.out.exists():
        rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    measured = {r["model"] for r in rows}
    for path in args.tasks:
        if path.stem in measured:
            continue
        row = {"model": path.stem, **ours(path, args.limit_s), **max_autotune(path, args.limit_s)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out is not None:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print(f"\n{'model':32} {'ours (s)':>9} {'max-autotune (s)':>17}  verified")
    for r in rows:
        theirs = "-" if r["autotune_s"] is None else f"{r['autotune_s']:.1f}"
        print(f"{r['model']:32} {r['ours_s'] or float('nan'):9.1f} {theirs:>17}  {r['verified']}")
    timed = [r["ours_s"] for r in rows if r["ours_s"] is not None]
    median = statistics.median(timed) if timed else float("nan")
    slower = [r["model"] for r in rows if r["autotune_s"] is not None and (r["ours_s"] or 1e9) > r["autotune_s"]]
    print(f"median {median:.1f} s (goal 60 s); slower than max-autotune on: {', '.join(slower) or 'none'}")
    sys.exit(0 if median <= 60 and not slower and all(r["verified"] for r in rows) else 1)


if __name__ == "__main__":
    main()
