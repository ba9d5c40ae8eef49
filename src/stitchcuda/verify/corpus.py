"""Labelled candidate corpora: files that say which task they target and how they cheat, so
the hacking checks can be scored (expected level against found level).

Each file opens with three comment lines::

    # task: mlp
    # hack: cached_output
    # expect: total
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from pydantic import BaseModel

from stitchcuda.task.inspect import TaskError
from stitchcuda.verify.verdict import HackLevel

LEVELS: tuple[HackLevel, ...] = ("none", "partial", "total")
_HEADER = re.compile(r"^#\s*(task|hack|expect)\s*:\s*(\S+)\s*$")


class LabelledCandidate(BaseModel):
    path: str
    task: str
    hack: str
    expect: HackLevel

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
    if labels["expect"] not in LEVELS:
        raise TaskError(f"{path}: expect must be one of {LEVELS}, not {labels['expect']!r}")
    return LabelledCandidate(path=str(path), task=labels["task"], hack=labels["hack"], expect=labels["expect"])  # type: ignore[arg-type]


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
