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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRAPH_BASELINE = "cuda_graph"


def _manifest(work: Path) -> list[dict]:
    return json.loads((work / "manifest.json").read_text())


def prepare(args: argparse.Namespace) -> None:
    from stitchcuda.compiler import compile_task
    from stitchcuda.compiler.capture.graph import CaptureError
    from stitchcuda.compiler.emit.codegen import Unsupported
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
    if args.only:
        rows = [r for r in rows if r["stem"] in set(args.only.split(","))]

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
    verdict = run_harness(args.checkout, reference, program, build_dir=str(work / "kb-build" / args.stem),
                          measure_performance=args.perf, tf32=False if args.fp32_reference else None)
    print("HARNESS " + verdict.model_dump_json(), flush=True)


def harness(args: argparse.Namespace) -> None:
    """KernelBench's verdict on every program not yet judged, each in a process of its own. With
    ``--jobs`` above 1 (correctness only: its timing would share the GPU) several run at once."""
    from concurrent.futures import ThreadPoolExecutor

    work, out = Path(args.work), Path(args.out)
    name = "harness-fp32.jsonl" if args.fp32_reference else "harness.jsonl"
    done_path = work / name
    records = [json.loads(x) for x in done_path.read_text().splitlines()] if done_path.exists() else []
    # a verdict lost to another process's use of the GPU memory is not KernelBench's: run it again
    done = {r["stem"] for r in records if "OutOfMemoryError" not in r.get("detail", "")}
    deadline = time.monotonic() + args.budget
    perf = args.jobs == 1

    def one(row: dict) -> None:
        if time.monotonic() > deadline:
            return
        started = time.perf_counter()
        cmd = [sys.executable, __file__, "one-harness", "--work", str(work), "--checkout", args.checkout,
               "--stem", row["stem"]] + (["--perf"] if perf else []) + (
                   ["--fp32-reference"] if args.fp32_reference else [])
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            line = next((x for x in run.stdout.splitlines() if x.startswith("HARNESS ")), None)
            record = json.loads(line[8:]) if line else {
                "compiled": False, "correct": False, "detail": (run.stderr or run.stdout)[-600:]}
        except subprocess.TimeoutExpired:
            record = {"compiled": False, "correct": False, "detail": f"timed out after {args.timeout} s"}
        record |= {"stem": row["stem"], "seconds": round(time.perf_counter() - started, 1)}
        with lock:  # here for the next call, and under --out at once: a call cut short loses nothing
            for path in (done_path, out / name):
                with path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
        print(f"harness {record['correct']!s:>5} {record['seconds']:6.1f} s {row['task']}", flush=True)

    lock = threading.Lock()
    (out / name).write_text(done_path.read_text() if done_path.exists() else "")
    pending = [r for r in _manifest(work) if r["status"] == "program" and r["stem"] not in done]
    if args.only:
        pending = [r for r in pending if r["stem"] in set(args.only.split(","))]
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, pending))
    if time.monotonic() > deadline:
        print("harness: out of time, the next call goes on", flush=True)
    (out / name).write_text(done_path.read_text() if done_path.exists() else "")


def verify(args: argparse.Namespace) -> None:
    """Our Verifier over the programs not yet verified, through the bench (a CPU build pool ahead of
    the GPU), strict tolerance."""
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
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
        spec_dir = work / "tasks-now"  # a folder of the pending tasks: the bench's task spec
        spec_dir.mkdir(exist_ok=True)
        for f in spec_dir.glob("*.py"):
            f.unlink()
        for r in pending:
            (spec_dir / f"{r['stem']}.py").write_text((work / "tasks" / f"{r['stem']}.py").read_text())
        spec = str(spec_dir)
        ws = work / "ws"
        cmd = [sys.executable, "-m", "stitchcuda.cli", "bench", spec, "--evaluate", str(solutions),
               "--preset", args.preset, "--tolerance", "strict", "--workspace", str(ws)]
        try:  # a bench cut by the budget still leaves the verdicts it wrote: the next call goes on
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget)
            stderr = done.stderr
        except subprocess.TimeoutExpired as exc:
            stderr = (exc.stderr or b"").decode(errors="replace") + "\nverify: out of time, the next call goes on"
        (out / "bench-stderr.txt").write_text(stderr[-20000:])
        print(stderr[-3000:], flush=True)
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


def _jsonl(path: Path) -> dict[str, dict]:
    """The last record per task of a results file (a rerun replaces an earlier verdict)."""
    if not path.exists():
        return {}
    return {r["stem"]: r for r in map(json.loads, path.read_text().splitlines())}


def table(args: argparse.Namespace) -> None:
    """One row per task: our verdict, KernelBench's under torch's default flags (cuDNN in TF32) and,
    where that one failed, KernelBench's against a true-fp32 reference; then the issue's goals."""
    rows = _manifest(Path(args.work))
    harness_by: dict[str, dict] = {}
    fp32_by: dict[str, dict] = {}
    verdict_by: dict[str, dict] = {}
    for folder in map(Path, args.results):
        harness_by |= _jsonl(folder / "harness.jsonl")
        fp32_by |= _jsonl(folder / "harness-fp32.jsonl")
        for f in sorted((folder / "verdicts").glob("*.json")) if (folder / "verdicts").is_dir() else []:
            verdict_by[f.stem] = json.loads(f.read_text())

    def mark(x: bool | None) -> str:
        return "-" if x is None else ("yes" if x else "NO")

    print("| task | program | ours | KB | KB fp32 ref | hacking | vs eager | vs graph | ms | max rel err |")
    print("|---|---|---|---|---|---|---:|---:|---:|---:|")
    speed: dict[str, list[float]] = {"L1": [], "L2": [], "suite": []}
    counts = {key: {"tasks": 0, "programs": 0, "ours": [0, 0], "kb": [0, 0]} for key in speed}
    for r in rows:
        key = r["task"][:2] if r["task"].startswith("L") else "suite"
        c = counts[key]
        c["tasks"] += 1
        c["programs"] += r["status"] == "program"
        v, h, f = verdict_by.get(r["stem"]), harness_by.get(r["stem"]), fp32_by.get(r["stem"])
        ours = None if v is None else bool(v.get("correct"))
        kb = None if h is None or "OutOfMemoryError" in h.get("detail", "") else bool(h["correct"])
        kb32 = None if f is None else bool(f["correct"])
        kb_any = None if kb is None and kb32 is None else bool(kb or kb32)
        if ours is not None:
            c["ours"][0] += ours
            c["ours"][1] += 1
        if kb_any is not None:
            c["kb"][0] += kb_any
            c["kb"][1] += 1
        hack = (v or {}).get("hacking", {}).get("level", "-")
        sp = (v or {}).get("speedup") or {}
        eager, graph = sp.get("eager"), sp.get(GRAPH_BASELINE)
        ms = (((v or {}).get("timing") or {}).get("candidate") or {}).get("median_ms")
        err = ((v or {}).get("correctness") or {}).get("max_rel_error")
        if ours and eager:
            speed[key].append(eager)
        print(f"| {r['task'][:60]} | {'yes' if r['status'] == 'program' else 'no'} | {mark(ours)} | {mark(kb)} | "
              f"{mark(kb32)} | {hack} | {f'{eager:.2f}' if eager else '-'} | {f'{graph:.2f}' if graph else '-'} | "
              f"{f'{ms:.3f}' if ms else '-'} | {'-' if err is None else f'{err:.1e}'} |")
    print()
    for key, c in counts.items():
        g = _geomean(speed[key])
        print(f"{key}: {c['programs']}/{c['tasks']} programs; ours correct {c['ours'][0]}/{c['ours'][1]} verified; "
              f"KernelBench correct {c['kb'][0]}/{c['kb'][1]} judged (either reference); "
              + (f"geomean over eager {g:.2f}x over {len(speed[key])}" if g else "no timing"))


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
        a.add_argument("--jobs", type=int, default=1, help="harness processes at once (above 1: no timing)")
        a.add_argument("--perf", action="store_true")
        a.add_argument("--fp32-reference", action="store_true",
                       help="TF32 off for the reference (torch's default leaves cuDNN convolutions in TF32)")
        a.add_argument("--only", default="", help="comma-separated stems")
    a = sub.add_parser("build")
    a.add_argument("--work", required=True)
    a.add_argument("--jobs", type=int, default=14)
    a.add_argument("--timeout", type=float, default=400)
    a.add_argument("--only", default="", help="comma-separated stems")
    a = sub.add_parser("verify")
    a.add_argument("--work", required=True)
    a.add_argument("--out", default=os.environ.get("OUT", "."))
    a.add_argument("--preset", default="survey")
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
