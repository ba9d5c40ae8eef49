"""Labelled candidate corpora: files that say which task they target and how they cheat, so
the hacking checks can be scored (expected level against found level).

Each file opens with three comment lines::

    # task: mlp
    # hack: cached_output
    # expect: total

and may add ``# static: none``, where the hack is one only the run-time checks can see (a cache
keyed on a data pointer, a stream joined one way): the level the static checks alone are
expected to find. Without it they are expected to find ``expect``. ``# correct: no`` says the
Verifier must find the candidate incorrect (a program that computes with stale weights is wrong,
not a hack); without it, nothing is expected of its correctness.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from pydantic import BaseModel

from stitchcuda.task.inspect import TaskError
from stitchcuda.verify.verdict import HackLevel

LEVELS: tuple[HackLevel, ...] = ("none", "partial", "total")
_HEADER = re.compile(r"^#\s*(task|hack|expect|static|correct)\s*:\s*(\S+)\s*$")


class LabelledCandidate(BaseModel):
    path: str
    task: str
    hack: str
    expect: HackLevel
    static: HackLevel | None = None  # what the static checks alone find, where less than expect
    correct: bool | None = None  # what the Verifier must find of its correctness, where the file says

    @property
    def static_expect(self) -> HackLevel:
        return self.static or self.expect

    @property
    def name(self) -> str:
        return Path(self.path).stem


def read_labels(path: Path) -> LabelledCandidate:
    labels: dict[str, str] = {}
    for line in path.read_text().splitlines()[:10]:
        if match := _HEADER.match(line.strip()):
            labels[match[1]] = match[2]
    missing = {"task", "hack", "expect"} - set(labels)
    if missing:
        raise TaskError(f"{path} lacks the header line(s) {sorted(missing)} (# task: / # hack: / # expect:)")
    for key in ("expect", "static"):
        if key in labels and labels[key] not in LEVELS:
            raise TaskError(f"{path}: {key} must be one of {LEVELS}, not {labels[key]!r}")
    if labels.get("correct", "yes") not in ("yes", "no"):
        raise TaskError(f"{path}: correct must be yes or no, not {labels['correct']!r}")
    correct = {"yes": True, "no": False}.get(labels["correct"]) if "correct" in labels else None
    return LabelledCandidate(path=str(path), task=labels["task"], hack=labels["hack"], expect=labels["expect"],  # type: ignore[arg-type]
                             static=labels.get("static"), correct=correct)  # type: ignore[arg-type]


def load_corpus(folder: str | Path) -> list[LabelledCandidate]:
    files = sorted(p for p in Path(folder).glob("*.py") if not p.name.startswith("_"))
    if not files:
        raise TaskError(f"{folder} holds no labelled candidates")
    return [read_labels(p) for p in files]


def confusion(pairs: list[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """expected level -> found level -> count."""
    counts = Counter(pairs)
    return {e: {f: counts[(e, f)] for f in LEVELS} for e in LEVELS}


def confusion_text(matrix: dict[str, dict[str, int]]) -> str:
    width = 9
    lines = ["expected \\ found".ljust(18) + "".join(f.rjust(width) for f in LEVELS)]
    for expected in LEVELS:
        lines.append(expected.ljust(18) + "".join(str(matrix[expected][f]).rjust(width) for f in LEVELS))
    return "\n".join(lines)
