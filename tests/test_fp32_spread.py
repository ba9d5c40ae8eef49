"""benchmarks/fp32_spread.py: how far a task's fp32 reference lands from its fp64 value and from a
channels-last run of itself, counted at a tolerance, on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                 nn.Conv2d(16, 8, 3, padding=1))

    def forward(self, x):
        return self.net(x)


def get_inputs():
    return [torch.randn(2, 3, 12, 12)]


def get_init_inputs():
    return []
'''


def _spread():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "fp32_spread.py"
    spec = importlib.util.spec_from_file_location("fp32_spread", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.spread


def test_counts_the_misses_of_the_exact_answer_and_of_another_order(tmp_path):
    task = tmp_path / "small_convs.py"
    task.write_text(TASK)
    spread = _spread()
    loose, = spread(str(task), "cpu", 1.0, 1)
    cells = [c.strip() for c in loose.strip("|").split("|")]
    assert cells[0] == "small_convs" and cells[1] == "1"
    assert float(cells[3]) < 1e-4  # fp32 lands near fp64 on a shallow network
    assert cells[4] == "0 of 2304" and cells[5] == "0 of 2304"  # nothing misses a tolerance of 1
    exact, = spread(str(task), "cpu", 0.0, 1)
    assert not exact.split("|")[5].strip().startswith("0 of")  # at 0, fp32's rounding shows
    assert len(spread(str(task), "cpu", 1e-4, 2)) == 2  # a row per input draw
