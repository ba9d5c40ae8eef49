"""The offline compiler's programs, task by task and variant by variant, as SHA-256 digests: a
change meant to leave the compiler's output alone (a refactor) is checked against a file written
before it. CPU only; no build, no GPU (the cost model assumes an H100 where nvidia-smi finds none,
the same on every run).

    python benchmarks/program_digests.py suite zoo/ --out before.json        # before the change
    python benchmarks/program_digests.py suite zoo/ --compare before.json    # after: what changed

Each task compiles in a process of its own (``--jobs`` at a time); a task the compiler refuses is
recorded with its reason, so a refusal that appears or goes away shows too. Exit 1 when
``--compare`` finds a difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from stitchcuda.task import resolve_tasks
from stitchcuda.task.record import Task


def digests(task_json: str, variants: int) -> dict:
    """One task: each of its first ``variants`` tuning variants' program digest (strict, then
    paper), or why the compiler refused it; and its compile time."""
    from stitchcuda.agents.offline import variants as tuning_variants
    from stitchcuda.compiler import compile_task
    from stitchcuda.compiler.capture.graph import CaptureError
    from stitchcuda.compiler.emit.codegen import CodegenOptions, Unsupported
    from stitchcuda.torchvision_compat import make_torchvision_importable

    make_torchvision_importable()
    task = Task.model_validate_json(task_json)
    started = time.perf_counter()
    try:
        compiled = compile_task(task)
        options = tuning_variants("strict")[:variants] + tuning_variants("paper")[:variants]
        programs = {}
        for option in options:
            key = json.dumps(option, sort_keys=True)
            if key not in programs:
                programs[key] = hashlib.sha256(compiled.program(CodegenOptions.model_validate(option)).encode()).hexdigest()
        found: dict = {"programs": list(programs.values())}
    except (CaptureError, Unsupported) as exc:
        found = {"refused": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return found | {"seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="+", help="task specs: suite, a folder, a file")
    parser.add_argument("--variants", type=int, default=3, help="variants per tolerance (default 3)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the digests here")
    parser.add_argument("--compare", type=Path, default=None, help="digests written before: print what changed")
    args = parser.parse_args()
    tasks: list[Task] = [t for spec in args.tasks for t in resolve_tasks(spec)]
    spawn = multiprocessing.get_context("spawn")
    found: dict[str, dict] = {}
    with ProcessPoolExecutor(args.jobs, mp_context=spawn, max_tasks_per_child=1) as pool:
        futures = {t.name: pool.submit(digests, t.model_dump_json(), args.variants) for t in tasks}
        for name, future in futures.items():
            found[name] = future.result()
            print(f"{name:40s} {found[name]['seconds']:6.1f} s  "
                  f"{len(found[name].get('programs', []))} programs {found[name].get('refused', '')[:80]}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(found, indent=1, sort_keys=True))
    total = sum(r["seconds"] for r in found.values())
    print(f"{len(found)} tasks, compile {total:.0f} s in all")
    if args.compare is not None:
        before = json.loads(args.compare.read_text())
        changed = [name for name in sorted(set(before) | set(found))
                   if {k: v for k, v in before.get(name, {}).items() if k != "seconds"}
                   != {k: v for k, v in found.get(name, {}).items() if k != "seconds"}]
        was = sum(r["seconds"] for r in before.values() if "seconds" in r)
        print(f"compile time before {was:.0f} s, now {total:.0f} s; {len(changed)} task(s) changed: "
              + (", ".join(changed) or "none"))
        sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
