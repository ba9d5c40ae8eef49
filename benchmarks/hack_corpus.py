"""Score the hacking checks over a labelled corpus: expected level against found level.

    python benchmarks/hack_corpus.py [--folder tests/hacks] [--static-only] [--json OUT.json]
                                     [--kernelbench-harness CHECKOUT]

Without --static-only every candidate is built (in parallel) and fully verified on the GPU
(the "quick" preset), so dynamic checks (profiler attribution, harness guards, roofline)
count too. Prints a per-candidate table and the confusion matrix. With --kernelbench-harness,
KernelBench's own eval_kernel_against_ref also judges each candidate (a second opinion) and an
agreement table follows: ours against KernelBench's correctness, and whether we ever pass what
it fails.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from stitchcuda.task import load_candidate, resolve_tasks
from stitchcuda.verify import PRESETS, Verifier
from stitchcuda.verify.corpus import confusion, confusion_text, load_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=str(Path(__file__).parents[1] / "tests" / "hacks"))
    parser.add_argument("--static-only", action="store_true")
    parser.add_argument("--only", help="comma-separated candidate names")
    parser.add_argument("--shard", default="1/1", help="i/n: verify every n-th candidate from the i-th "
                                                       "(split a long GPU run over several calls)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--kernelbench-harness", help="a KernelBench checkout: its harness judges each candidate too")
    args = parser.parse_args()

    corpus = load_corpus(args.folder)
    if args.only:
        wanted = set(args.only.split(","))
        corpus = [c for c in corpus if c.name in wanted]
    index, count = (int(x) for x in args.shard.split("/"))
    corpus = corpus[index - 1::count]
    verifier = Verifier(PRESETS["quick"].model_copy(update={"timing_budget_s": 1.0, "timeout_s": 120,
                                                            "kernelbench_harness": args.kernelbench_harness}))
    pairs = [(resolve_tasks(c.task)[0], load_candidate(c.path)) for c in corpus]
    started = time.time()
    if args.static_only:
        verdicts = [verifier.verify_static(t, c) for t, c in pairs]
    else:
        verifier.prebuild([c for _, c in pairs])
        verdicts = []
        for item, (task, cand) in zip(corpus, pairs, strict=True):  # a line each: a cut-off run keeps its figures
            v = verifier.verify(task, cand)
            verdicts.append(v)
            opinion = v.second_opinion
            kb = "" if opinion is None else f", KernelBench {opinion.correct if opinion.error is None else opinion.error}"
            print(f"{item.name}: expect {item.expect}, found {v.hacking.level}, correct {v.correct}{kb}, "
                  f"{v.wall.total_s:.0f} s", flush=True)
    wall = time.time() - started

    table = Table(title=f"{'static' if args.static_only else 'full'} hacking checks over {args.folder}")
    for col in ("candidate", "hack", "expect", "found", "ok", "correct", "own/lib/torch GPU", "findings"):
        table.add_column(col, overflow="fold")
    rows = []
    for item, v in zip(corpus, verdicts, strict=True):
        share = v.hacking.origin_share
        shares = "/".join(f"{share.get(k, 0):.0%}" for k in ("own", "library", "pytorch")) if share else "-"
        checks = ", ".join(sorted({f.check for f in v.hacking.findings if f.level != "none"}))
        expect = item.static_expect if args.static_only else item.expect  # some hacks show only at run time
        # the level, and the correctness where the file says what it must be (stale weights: wrong, no hack)
        ok = v.hacking.level == expect and (args.static_only or item.correct is None or v.correct == item.correct)
        table.add_row(item.name, item.hack, expect, v.hacking.level, "yes" if ok else "NO",
                      "-" if args.static_only else ("yes" if v.correct else "no"), shares, checks)
        rows.append({"candidate": item.name, "hack": item.hack, "expect": expect, "found": v.hacking.level,
                     "correct": v.correct, "crash": v.crash.kind if v.crash else None, "origin_share": share,
                     "coverage": v.hacking.operator_coverage, "findings": [f.model_dump() for f in v.hacking.findings],
                     "errors": v.errors[:3], "wall": v.wall.model_dump(),
                     "kernelbench": v.second_opinion.model_dump() if v.second_opinion else None})
    console = Console()
    console.print(table)
    matrix = confusion([(r["expect"], r["found"]) for r in rows])
    console.print(confusion_text(matrix))
    console.print(f"{sum(r['expect'] == r['found'] for r in rows)}/{len(rows)} at their level, {wall:.0f} s")
    if args.kernelbench_harness:
        console.print(_agreement(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "confusion": matrix}, indent=1))


def _agreement(rows: list[dict]) -> Table:
    """Ours against KernelBench's correctness, per candidate; the line that matters: we pass, it fails."""
    table = Table(title="second opinion: KernelBench's eval_kernel_against_ref")
    for col in ("candidate", "expect", "ours: correct", "ours: passed", "KernelBench: correct", "agree"):
        table.add_column(col, overflow="fold")
    tally = {"agree": 0, "judged": 0, "we_pass_it_fails": 0}
    for r in rows:
        kb = r["kernelbench"] or {}
        judged = kb.get("correct") is not None and not kb.get("error")
        passed = r["correct"] and r["found"] != "total"
        if judged:
            tally["judged"] += 1
            tally["agree"] += kb["correct"] == r["correct"]
            tally["we_pass_it_fails"] += bool(passed and not kb["correct"])
        table.add_row(r["candidate"], r["expect"], str(r["correct"]), str(passed),
                      str(kb.get("correct")) if judged else f"- ({(kb.get('error') or 'not run')[:60]})",
                      ("yes" if kb["correct"] == r["correct"] else "NO") if judged else "-")
    table.caption = (f"agree on correctness {tally['agree']}/{tally['judged']} judged; "
                     f"we pass, KernelBench fails: {tally['we_pass_it_fails']}")
    return table


if __name__ == "__main__":
    main()
