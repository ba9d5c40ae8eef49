"""A free baseline passes a tolerance policy only where it passes on every input a candidate's
correctness trials use (verify/baselines.py), not on the timing inputs alone."""

from __future__ import annotations

import torch

from stitchcuda.verify.baselines import baseline_accuracy
from stitchcuda.verify.correctness import distribution_for_trial, make_trial_inputs
from stitchcuda.verify.timing import Contender


class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 2.0


def _inputs(seed: int, distribution: str) -> list:
    return make_trial_inputs(lambda: [torch.randn(64, 64)], seed, distribution, "cpu")


def test_a_baseline_that_drifts_on_large_inputs_fails_where_the_trials_reach_them():
    model, inputs = Scale(), _inputs(0, "given")
    # a stand-in for a low-precision path: exact on the timing inputs (|x| < 5), off beyond them
    drifting = Contender("eager_tf32", lambda: torch.where(inputs[0].abs() > 5, inputs[0] * 2.001, inputs[0] * 2.0))
    exact = Contender("cuda_graph", lambda: model(*inputs))
    given = inputs[0].clone()
    alone = baseline_accuracy(model, inputs, [drifting, exact])
    assert alone["eager_tf32"]["passes"]["strict"]  # the timing inputs stay under 5
    trials = [lambda i=i: _inputs(1 + i, distribution_for_trial(i)) for i in range(3)]  # given, uniform, scaled x3
    found = baseline_accuracy(model, inputs, [drifting, exact], trials)
    assert not found["eager_tf32"]["passes"]["strict"] and found["eager_tf32"]["passes"]["paper"]
    assert found["eager_tf32"]["max_abs_error"] > 1e-3
    assert found["cuda_graph"]["passes"] == {"strict": True, "paper": True}
    assert torch.equal(inputs[0], given)  # the timing inputs are back as they were


def test_trial_inputs_of_another_shape_are_skipped():
    model, inputs = Scale(), _inputs(0, "given")
    exact = Contender("cuda_graph", lambda: model(*inputs))
    found = baseline_accuracy(model, inputs, [exact], [lambda: [torch.randn(3, 3)]])
    assert found["cuda_graph"]["passes"]["strict"]
