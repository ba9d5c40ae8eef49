"""The offline Coder's programs judged by two harnesses on one GPU: our Verifier (through
``stitchcuda bench --evaluate``, strict, KernelBench's seeded-weights convention checked by the
second opinion) and KernelBench's own ``eval_kernel_against_ref`` (5 trials, its tolerance).

    # on the CPU machine: write the programs (capture + compile, no GPU needed)
    python benchmarks/kernelbench_gpu.py prepare --kernelbench ../shared/kernelbench --sample 60 --suite \
        --out .gpu/kb
    # on the GPU machine (the folder and a copy of KernelBench's harness travel along)
    python benchmarks/kernelbench_gpu.py harness --work .gpu/kb --checkout .gpu/kernelbench --out $OUT
    python benchmarks/kernelbench_gpu.py verify --work .gpu/kb --out $OUT
    python benchmarks/kernelbench_gpu.py table --work .gpu/kb --results DIR...

Every phase resumes: a task already judged is skipped, so a phase cut by a time limit goes on in
the next call. The table prints one row per task and the goals of the compiler issue.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRAPH_BASELINE = "cuda_graph"


def _manifest(work: Path) -> list[dict]:
    return json.loads((work / "manifest.json").read_text())


def prepare(args: argparse.Namespace) -> None:
    from stitchcuda.compiler import compile_task
    from stitchcuda.compiler.codegen import Unsupported
    from stitchcuda.compiler.graph import CaptureError
    from stitchcuda.task.load import bundled_tasks, load_kernelbench

    tasks = [t for level in (1, 2) for t in load_kernelbench(args.kernelbench, level)]
    random.Random(args.seed).shuffle(tasks)
    chosen = tasks[: args.sample] + (bundled_tasks() if args.suite else [])
    out = Path(args.out)
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    (out / "programs").mkdir(parents=True, exist_ok=True)
    rows = []
    for task in chosen:
        started = time.perf_counter()
        row = {"task": task.name, "stem": task.file_stem, "level": task.level or 0}
        try:
            program = compile_task(task).program()
            (out / "programs" / f"{task.file_stem}.py").write_text(program)
            row["status"] = "program"
        except (CaptureError, Unsupported) as exc:
            row["status"], row["why"] = "no program", str(exc)[:300]
        row["seconds"] = round(time.perf_counter() - started, 2)
        (out / "tasks" / f"{task.file_stem}.py").write_text(task.source)
        rows.append(row)
        print(f"{row['status']:>10}  {row['seconds']:5.1f} s  {task.name}", flush=True)
    (out / "manifest.json").write_text(json.dumps(rows, indent=1))


def build(args: argparse.Namespace) -> None:
    """Build every program ahead, in parallel on the CPU cores, into the folders KernelBench's harness
    builds in (its ``build_dir``), so that its evaluation finds them cached."""
    from concurrent.futures import ThreadPoolExecutor

    work = Path(args.work)
    rows = [r for r in _manifest(work) if r["status"] == "program"]

    def one(row: dict) -> str:
        folder = work / "kb-build" / row["stem"]
        if (folder / ".built").exists():
            return f"cached {row['task']}"
        folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(folder), "MAX_JOBS": "1"}
        code = f"exec(open({str(work / 'programs' / (row['stem'] + '.py'))!r}).read())"
        try:
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                  timeout=args.timeout)
            ok = done.returncode == 0
            if ok:
                (folder / ".built").write_text("")
            return f"{'built' if ok else 'FAILED'} {row['task']} {'' if ok else done.stderr[-400:]}"
        except subprocess.TimeoutExpired:
            return f"TIMEOUT {row['task']}"

    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(one, rows):
            print(line, flush=True)


def _one_harness(args: argparse.Namespace) -> None:
    """Runs in a process of its own: KernelBench's verdict on one program, as one JSON line."""
    from stitchcuda.verify.kernelbench_harness import run_harness

    work = Path(args.work)
    reference = (work / "tasks" / f"{args.stem}.py").read_text()
    program = (work / "programs" / f"{args.stem}.py").read_text()
    verdict = run_harness(args.checkout, reference, program, build_dir=str(work / "kb-build" / args.stem))
    print("HARNESS " + verdict.model_dump_json(), flush=True)


def harness(args: argparse.Namespace) -> None:
    work, out = Path(args.work), Path(args.out)
    done_path = work / "harness.jsonl"
    done = {json.loads(x)["stem"] for x in done_path.read_text().splitlines()} if done_path.exists() else set()
    deadline = time.monotonic() + args.budget
    for row in _manifest(work):
        if row["status"] != "program" or row["stem"] in done:
            continue
        if time.monotonic() > deadline:
            print("harness: out of time, the next call goes on", flush=True)
            break
        started = time.perf_counter()
        cmd = [sys.executable, __file__, "one-harness", "--work", str(work), "--checkout", args.checkout,
               "--stem", row["stem"]]
        try:
            done_run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            line = next((x for x in done_run.stdout.splitlines() if x.startswith("HARNESS ")), None)
            record = json.loads(line[8:]) if line else {
                "compiled": False, "correct": False, "detail": (done_run.stderr or done_run.stdout)[-600:]}
        except subprocess.TimeoutExpired:
            record = {"compiled": False, "correct": False, "detail": f"timed out after {args.timeout} s"}
        record |= {"stem": row["stem"], "seconds": round(time.perf_counter() - started, 1)}
        with done_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"harness {record['correct']!s:>5} {record['seconds']:6.1f} s {row['task']}", flush=True)
    (out / "harness.jsonl").write_text(done_path.read_text() if done_path.exists() else "")


def verify(args: argparse.Namespace) -> None:
    """Our Verifier over the programs not yet verified, through the bench (a CPU build pool ahead of
    the GPU), strict tolerance."""
    work, out = Path(args.work), Path(args.out)
    rows = [r for r in _manifest(work) if r["status"] == "program"]
    verdicts = work / "verdicts"
    verdicts.mkdir(exist_ok=True)
    pending = [r for r in rows if not (verdicts / f"{r['stem']}.json").exists()][: args.limit]
    if not pending:
        print("verify: nothing left", flush=True)
    else:
        solutions = work / "solutions-now"
        solutions.mkdir(exist_ok=True)
        for f in solutions.glob("*.py"):
            f.unlink()
        for r in pending:
            (solutions / f"{r['stem']}.py").write_text((work / "programs" / f"{r['stem']}.py").read_text())
        spec = ",".join(str(work / "tasks" / f"{r['stem']}.py") for r in pending)
        ws = work / "ws"
        cmd = [sys.executable, "-m", "stitchcuda.cli", "bench", spec, "--evaluate", str(solutions),
               "--preset", args.preset, "--tolerance", "strict", "--workspace", str(ws), "--json"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget)
        (out / "bench-stderr.txt").write_text(done.stderr[-20000:])
        print(done.stderr[-3000:], flush=True)
        for path in sorted(ws.rglob("*.verdict.json")):
            stem = path.name.split("-", 1)[1].removesuffix(".verdict.json")
            if any(r["stem"] == stem for r in pending):
                (verdicts / f"{stem}.json").write_text(path.read_text())
    for f in verdicts.glob("*.json"):
        (out / "verdicts").mkdir(exist_ok=True)
        (out / "verdicts" / f.name).write_text(f.read_text())


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def table(args: argparse.Namespace) -> None:
    work = Path(args.work)
    rows = _manifest(work)
    harness_by: dict[str, dict] = {}
    verdict_by: dict[str, dict] = {}
    for folder in map(Path, args.results):
        if (folder / "harness.jsonl").exists():
            for line in (folder / "harness.jsonl").read_text().splitlines():
                harness_by[json.loads(line)["stem"]] = json.loads(line)
        for f in (folder / "verdicts").glob("*.json") if (folder / "verdicts").is_dir() else []:
            verdict_by[f.stem] = json.loads(f.read_text())
    print(f"{'task':58} {'prog':>4} {'ours':>5} {'KB':>5} {'hack':>7} {'eager':>6} {'graph':>6} {'ms':>8} {'max rel':>9}")
    groups: dict[str, list[float]] = {"L1": [], "L2": [], "suite": []}
    agree = []
    for r in rows:
        v, h = verdict_by.get(r["stem"]), harness_by.get(r["stem"])
        ours = None if v is None else bool(v.get("correct"))
        kb = None if h is None else bool(h["correct"])
        hack = (v or {}).get("hacking", {}).get("level", "-")
        speed = (v or {}).get("speedup") or {}
        eager, graph = speed.get("eager"), speed.get(GRAPH_BASELINE)
        ms = (((v or {}).get("timing") or {}).get("candidate") or {}).get("median_ms")
        err = ((v or {}).get("correctness") or {}).get("max_rel_error")
        key = "suite" if not r["task"].startswith("L") else r["task"][:2]
        if ours and kb and eager:
            groups[key].append(eager)
        if ours is not None and kb is not None:
            agree.append(ours == kb)

        def mark(x):
            return "-" if x is None else ("yes" if x else "NO")

        print(f"{r['task'][:58]:58} {'yes' if r['status'] == 'program' else 'no':>4} {mark(ours):>5} {mark(kb):>5} "
              f"{hack:>7} {eager or 0:6.2f} {graph or 0:6.2f} {ms or 0:8.3f} {'-' if err is None else f'{err:.1e}':>9}")
    print()
    for key, xs in groups.items():
        g = _geomean(xs)
        print(f"{key}: {len(xs)} correct by both, geomean over eager {g:.2f}x" if g else f"{key}: none")
    print(f"agreement between the harnesses: {sum(agree)}/{len(agree)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="phase", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("--kernelbench", required=True)
    a.add_argument("--sample", type=int, default=60)
    a.add_argument("--seed", type=int, default=15)
    a.add_argument("--suite", action="store_true")
    a.add_argument("--out", required=True)
    for name in ("harness", "one-harness"):
        a = sub.add_parser(name)
        a.add_argument("--work", required=True)
        a.add_argument("--checkout", required=True)
        a.add_argument("--out", default=os.environ.get("OUT", "."))
        a.add_argument("--stem", default="")
        a.add_argument("--budget", type=float, default=500)
        a.add_argument("--timeout", type=float, default=240)
    a = sub.add_parser("build")
    a.add_argument("--work", required=True)
    a.add_argument("--jobs", type=int, default=14)
    a.add_argument("--timeout", type=float, default=400)
    a = sub.add_parser("verify")
    a.add_argument("--work", required=True)
    a.add_argument("--out", default=os.environ.get("OUT", "."))
    a.add_argument("--preset", default="quick")
    a.add_argument("--limit", type=int, default=1000)
    a.add_argument("--budget", type=float, default=540)
    a = sub.add_parser("table")
    a.add_argument("--work", required=True)
    a.add_argument("--results", nargs="+", required=True)
    args = p.parse_args()
    {"prepare": prepare, "build": build, "harness": harness, "one-harness": _one_harness, "verify": verify,
     "table": table}[args.phase](args)


if __name__ == "__main__":
    main()
