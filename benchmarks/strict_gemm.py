"""Strict fp32 on tensor cores: eager, torch.compile and the offline Coder's cuBLAS and CUTLASS
(3xTF32) variants of each task, side by side, with each program's maximum relative error.

    # CPU machine: write both variants of every task (capture + compile, no GPU)
    python benchmarks/strict_gemm.py prepare --tasks mlp,swiglu_ffn --kernelbench ../shared/kernelbench \
        --pick L1/1,L2/12 --out .gpu/strict
    # GPU machine: build every program in parallel, then time them one task at a time
    python benchmarks/strict_gemm.py run --work .gpu/strict --out $OUT [--shard 1/2]

Eager, the baseline of every speedup, and torch.compile run in true fp32 (TF32 off everywhere), as
the Verifier times them (DESIGN.md: a fp32 candidate is not measured against a TF32 eager);
eager under torch's default flags, where cuDNN may use TF32, is timed beside them ("eager dflt").
"Strict" is the Verifier's: within 1e-4 (absolute and relative) of that true-fp32 reference. The error column is max|out - ref| / max|ref|
against the reference run in float64. The speedup of our program is the better of its two
variants, the choice the variant search makes by measured time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VARIANTS = {"cublas": {}, "cutlass": {"cutlass": True}, "split": {"split_tf32": True}}
LABELS = {"cublas": "cuBLAS", "cutlass": "CUTLASS", "split": "split"}


def prepare(args: argparse.Namespace) -> None:
    from stitchcuda.compiler import compile_task
    from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
    from stitchcuda.task import resolve_tasks

    work = Path(args.out)
    (work / "tasks").mkdir(parents=True, exist_ok=True)
    (work / "programs").mkdir(exist_ok=True)
    specs = [t for t in (args.tasks or "").split(",") if t]
    for pick in (args.pick or "").split(","):
        if pick:
            level, number = pick.split("/")
            folder = Path(args.kernelbench) / "KernelBench" / f"level{level[1:]}"
            specs += [str(p) for p in folder.glob(f"{number}_*.py")]
    chosen = [v for v in (args.variants.split(",") if args.variants else VARIANTS)]
    old = {e["task"]: e for e in json.loads((work / "manifest.json").read_text())} if (
        work / "manifest.json").exists() else {}
    manifest = []
    for spec in specs:
        task = resolve_tasks(spec)[0]
        stem = (f"L{task.level}_" if task.level else "") + task.name
        (work / "tasks" / f"{stem}.py").write_text(task.source)
        entry = {"task": stem, "programs": dict(old.get(stem, {}).get("programs", {}))}
        try:
            compiled = compile_task(task)
            for variant in chosen:
                options = VARIANTS[variant]
                program = generate(task, compiled.graph, compiled.groups, CodegenOptions(**options))
                (work / "programs" / f"{stem}-{variant}.py").write_text(program)
                entry["programs"][variant] = f"programs/{stem}-{variant}.py"
        except Exception as exc:  # noqa: BLE001 - recorded, the task's row says why
            entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
        manifest.append(entry)
        print(stem, entry.get("error", "ok"), flush=True)
    done = {e["task"] for e in manifest}  # tasks not asked about this time keep their entries
    manifest = [e for e in old.values() if e["task"] not in done] + manifest
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1))


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(path: Path) -> tuple[str, float, str]:
    """Import the program in a process of its own with the GPU hidden: its load_inline calls
    fill the extension cache the timing process then hits."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0")}
    started = time.time()
    done = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(path)!r})"], env=env,
                          capture_output=True, text=True, timeout=900)
    return str(path), time.time() - started, "" if done.returncode == 0 else done.stderr[-600:]


def _time_ms(call, reps: int) -> float:
    import torch

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _flat(out):
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in out if isinstance(t, torch.Tensor)]


CHUNK = 1 << 26  # elements compared at a time: an 8 GB output (L1/63) and its float64 copies fit beside it


def _chunks(o, r):
    o, r = o.reshape(-1), r.reshape(-1)
    return ((o[i:i + CHUNK], r[i:i + CHUNK]) for i in range(0, o.numel(), CHUNK))


def _rel_error(out, ref) -> float:
    worst = 0.0
    for o, r in zip(_flat(out), _flat(ref), strict=True):
        diff = max(((a.double() - b.double()).abs().max().item() for a, b in _chunks(o, r)), default=0.0)
        worst = max(worst, diff / max(max((b.abs().max().item() for _, b in _chunks(o, r)), default=0.0), 1e-30))
    return worst


def _strict(out, ref) -> bool:
    import torch

    return all(o.shape == r.shape and all(torch.allclose(a.float(), b.float(), atol=1e-4, rtol=1e-4)
                                          for a, b in _chunks(o, r))
               for o, r in zip(_flat(out), _flat(ref), strict=True))


def run_task(work: Path, entry: dict, reps: int, compile_limit_s: float, variants: list[str],
             skip_compile: bool = False) -> dict:
    import torch

    from stitchcuda.verify.torch_state import set_tf32

    row = {"task": entry["task"], "error": entry.get("error")}
    if row["error"]:
        return row
    module = _load(work / "tasks" / f"{entry['task']}.py", "ref_" + entry["task"])
    torch.manual_seed(0)
    init = module.get_init_inputs()
    torch.manual_seed(0)
    model = module.Model(*init).cuda()
    torch.manual_seed(1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
    with torch.no_grad():
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False  # torch's defaults
        row["eager_default_ms"] = _time_ms(lambda: model(*inputs), reps)
        set_tf32(False)  # true fp32 from here on: the baseline and the reference
        row["eager_ms"] = _time_ms(lambda: model(*inputs), reps)
        ref32 = model(*inputs)
        ref64 = _load(work / "tasks" / f"{entry['task']}.py", "ref64_" + entry["task"])
        torch.manual_seed(0)
        model64 = ref64.Model(*init).cuda().double()
        model64.load_state_dict(model.state_dict())  # the same draw, in float64
        out64 = model64(*[x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs])
        del model64
        row["eager_err"] = _rel_error(ref32, out64)
        row["eager_strict"] = _strict(ref32, out64)  # False: the reference's own error is above the tolerance
        try:
            if skip_compile:
                raise RuntimeError("skipped (--skip-compile)")
            started = time.time()
            compiled = torch.compile(model)
            compiled(*inputs)
            row["compile_s"] = time.time() - started
            if row["compile_s"] < compile_limit_s:
                row["compile_ms"] = _time_ms(lambda: compiled(*inputs), reps)
            row["compile_err"] = _rel_error(compiled(*inputs), out64)
        except Exception as exc:  # noqa: BLE001
            row["compile_fail"] = f"{type(exc).__name__}: {exc}"[:200]
        for variant, path in entry["programs"].items():
            if variant not in variants:
                continue
            try:
                program = _load(work / path, f"p_{variant}_{entry['task']}")
                torch.manual_seed(0)
                ours = program.ModelNew(*init).cuda()
                out = ours(*inputs)
                row[f"{variant}_err"] = _rel_error(out, out64)
                row[f"{variant}_strict"] = _strict(out, ref32)
                row[f"{variant}_ms"] = _time_ms(lambda ours=ours: ours(*inputs), reps)
            except Exception as exc:  # noqa: BLE001
                row[f"{variant}_fail"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def run(args: argparse.Namespace) -> None:
    import torch

    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((work / "manifest.json").read_text())
    index, count = (int(x) for x in args.shard.split("/"))
    manifest = manifest[index - 1::count]
    if args.only:
        manifest = [e for e in manifest if e["task"] in args.only.split(",")]
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    paths = [work / p for e in manifest for v, p in e.get("programs", {}).items() if v in variants]
    started = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        builds = list(pool.map(_build, paths))
    failed = {p: err for p, _, err in builds if err}
    print(f"built {len(builds)} programs in {time.time() - started:.0f} s, {len(failed)} failed", flush=True)
    for p, err in failed.items():
        print("BUILD FAILED", p, err.splitlines()[-1:] if err else "", flush=True)
    rows = []
    results = out / f"strict-{index}of{count}.jsonl"
    for entry in manifest:
        try:
            row = run_task(work, entry, args.reps, args.compile_limit_s, variants, args.skip_compile)
        except Exception as exc:  # noqa: BLE001
            row = {"task": entry["task"], "error": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    table(rows)


def table(rows: list[dict]) -> None:
    """One line per task; rows of the same task from several runs merge, the later keys winning
    (a run of one variant adds its column to an earlier run of the others)."""
    merged: dict[str, dict] = {}
    for r in rows:
        merged.setdefault(r["task"], {}).update({k: v for k, v in r.items() if v is not None})
    shown = [v for v in VARIANTS if any(f"{v}_ms" in r or f"{v}_fail" in r for r in merged.values())]
    print(f"{'task':44} {'eager':>8} {'eagr dflt':>9} {'compile':>8} " + " ".join(f"{LABELS[v]:>8}" for v in shown)
          + f" {'best x':>7} " + " ".join(f"{'err ' + LABELS[v]:>12}" for v in shown) + " strict")
    speedups = []
    for r in merged.values():
        if r.get("error") and "eager_ms" not in r:
            print(f"{r['task'][:44]:44} {r['error'][:80]}")
            continue
        ours = [r[f"{v}_ms"] for v in shown if f"{v}_ms" in r and r.get(f"{v}_strict")]
        best = r["eager_ms"] / min(ours) if ours else float("nan")
        if ours:
            speedups.append(best)

        def ms(key, r=r):
            return f"{r[key]:8.3f}" if key in r else f"{'-':>8}"

        def err(key, r=r):
            return f"{r[key]:12.1e}" if key in r else f"{'-':>12}"

        strict = "/".join(("yes" if r.get(f"{v}_strict") else "NO") if f"{v}_strict" in r else "-" for v in shown)
        print(f"{r['task'][:44]:44} {ms('eager_ms')} {ms('eager_default_ms'):>9} {ms('compile_ms')} "
              + " ".join(ms(f"{v}_ms") for v in shown)
              + f" {best:7.2f} " + " ".join(err(f"{v}_err") for v in shown) + f" {strict}")
    if speedups:
        print(f"geomean of our best strict variant over eager (true fp32): "
              f"{math.exp(sum(map(math.log, speedups)) / len(speedups)):.2f}x over {len(speedups)} tasks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--tasks", default="")
    p.add_argument("--kernelbench", default="../shared/kernelbench")
    p.add_argument("--pick", default="", help="L1/1,L2/12,...: KernelBench tasks by level and number")
    p.add_argument("--out", required=True)
    p.add_argument("--variants", default="", help="comma-separated: add these to an existing manifest")
    r = sub.add_parser("run")
    r.add_argument("--work", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--shard", default="1/1")
    r.add_argument("--only", default="", help="comma-separated task names")
    r.add_argument("--jobs", type=int, default=14)
    r.add_argument("--reps", type=int, default=20)
    r.add_argument("--compile-limit-s", type=float, default=120.0)
    r.add_argument("--variants", default="", help="comma-separated: time only these of our variants")
    r.add_argument("--skip-compile", action="store_true", help="leave torch.compile out (timed in an earlier run)")
    t = sub.add_parser("table")
    t.add_argument("results", nargs="+")
    args = parser.parse_args()
    if args.cmd == "table":
        table([json.loads(line) for f in args.results for line in Path(f).read_text().splitlines() if line])
    else:
        {"prepare": prepare, "run": run}[args.cmd](args)


if __name__ == "__main__":
    main()
