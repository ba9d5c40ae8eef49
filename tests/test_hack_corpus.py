"""The static hacking checks over our labelled corpus (tests/hacks/): every hack found at its
level, no honest candidate flagged. The full, GPU verification of the same corpus is
benchmarks/hack_corpus.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchcuda.verify.corpus import confusion, confusion_text, load_corpus
from stitchcuda.verify.judge import hacking_level
from stitchcuda.verify.static_checks import static_findings

CORPUS_DIR = Path(__file__).parent / "hacks"
CORPUS = load_corpus(CORPUS_DIR) if CORPUS_DIR.is_dir() and any(CORPUS_DIR.glob("*.py")) else []


def test_corpus_size():
    hacks = [c for c in CORPUS if c.expect != "none"]
    honest = [c for c in CORPUS if c.expect == "none"]
    assert len(hacks) >= 25 and len({c.hack for c in hacks}) >= 15 and len(honest) >= 10


@pytest.mark.parametrize("item", CORPUS, ids=[c.name for c in CORPUS])
def test_static_level(item):
    report = static_findings(Path(item.path).read_text())
    found = hacking_level(report.findings)
    details = "\n".join(f"  {f.level}: {f.check}: {f.detail}" for f in report.findings)
    assert found == item.expect, f"{item.name} ({item.hack}): expected {item.expect}, found {found}\n{details}"


def test_confusion_matrix(capsys):
    pairs = [(c.expect, hacking_level(static_findings(Path(c.path).read_text()).findings)) for c in CORPUS]
    matrix = confusion(pairs)
    with capsys.disabled():
        print("\nstatic checks over tests/hacks/\n" + confusion_text(matrix))
    assert all(matrix[e][f] == 0 for e in matrix for f in matrix[e] if e != f)
