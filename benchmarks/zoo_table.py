"""The whole-zoo table of docs/benchmarks.md, from the task records of one or two benches: per
model, our verdict, KernelBench's harness, the speedups and the wall time; then the totals.

    python benchmarks/zoo_table.py WORKSPACE [--harness WORKSPACE2]

Each source is a bench workspace (its last bench) or a JSON file of its task records (a list of
TaskResult, as ``BenchStore(ws).result('last').tasks`` dumps them). ``--harness`` names a bench
run with ``--kernelbench-harness`` over the same tasks: its verdicts fill that column; without it
the column comes from the first source.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from stitchcuda.bench.records import TaskResult
from stitchcuda.bench.store import BenchStore


def records(source: str) -> list[TaskResult]:
    path = Path(source)
    if path.is_dir():
        store = BenchStore(path)
        try:
            return store.result(store.resolve("last")).tasks
        finally:
            store.close()
    return [TaskResult.model_validate(t) for t in json.loads(path.read_text())]


def harness_word(task: TaskResult | None) -> str:
    opinion = task.second_opinion if task is not None else None
    if opinion is None or task.status != "done":
        return "not run"
    if opinion.correct:
        return "correct"
    if opinion.correct_true_fp32:
        return "correct against a true-fp32 reference"
    if not opinion.judgeable:
        return f"not judgeable: {opinion.failed_control} fails it too"
    if opinion.correct is None:
        return "not judged: " + (opinion.error or opinion.detail or "no verdict").split(";")[0][:60]
    return "wrong" + (" (also at 1e-2)" if opinion.correct_v01 is False else "")


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("--harness", default=None)
    args = parser.parse_args()
    tasks = records(args.source)
    judged = {t.task: t for t in records(args.harness)} if args.harness else {t.task: t for t in tasks}

    def x(value: float | None) -> str:
        return f"{value:.2f}x" if value else "–"

    print("| model | ours | KernelBench's harness | vs eager fp32 | vs its CUDA graph | vs eager TF32 "
          "| vs best counted | KernelBench's speedup | ms | wall (s) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for t in sorted(tasks, key=lambda t: t.task):
        s = t.speedup or {}
        ours = "correct" if t.correct else (t.status if t.status != "done" else "wrong")
        kb = judged.get(t.task)
        print(f"| {t.task} | {ours} | {harness_word(kb)} | {x(s.get('eager'))} | {x(s.get('cuda_graph'))} "
              f"| {x(s.get('eager_tf32'))} | {x(s.get('best'))} | {x((kb.speedup or {}).get('kernelbench') if kb else None)} "
              f"| {t.milliseconds or 0:.3f} | {t.wall_s:.0f} |")
    correct = [t for t in tasks if t.correct]
    best = [t.speedup["best"] for t in correct if t.speedup and t.speedup.get("best")]
    kb_speedups = [(t.speedup or {}).get("kernelbench") for t in judged.values()]
    print()
    print(f"{len(correct)} of {len(tasks)} correct by ours; hacking: "
          f"{sorted({t.hacking for t in tasks if t.hacking}) or ['none']}; geomean over the best counted baseline "
          f"{geomean(best) or 0:.2f}x, {sum(b < 1 for b in best)} below 1.0x; over eager fp32 "
          f"{geomean([t.speedup['eager'] for t in correct if t.speedup and t.speedup.get('eager')]) or 0:.2f}x; "
          f"KernelBench's speedup {geomean([v for v in kb_speedups if v]) or 0:.2f}x "
          f"({sum(1 for v in kb_speedups if v)} programs); the longest task {max(t.wall_s for t in tasks):.0f} s")


if __name__ == "__main__":
    main()
