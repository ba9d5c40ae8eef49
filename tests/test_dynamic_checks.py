"""The run-time hacking checks' decisions, as pure functions on the CPU: escaped work (verify/escape.py),
output caching by any key (verify/caching.py) and partial-versus-total from the profile
(verify/profile_checks.py). What they measure on a GPU is tests/test_gpu.py's."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from stitchcuda.verify.caching import (
    PostTimingTrial,
    TrialPrint,
    fingerprint,
    post_timing_trial,
    repeated_output,
    repeated_output_finding,
    same_output,
    stale_output_finding,
    stale_outputs,
)
from stitchcuda.verify.config import VerifyConfig
from stitchcuda.verify.correctness import compare_outputs
from stitchcuda.verify.escape import EscapeProbe, escaped_work, escaped_work_finding
from stitchcuda.verify.profile_checks import profile_findings
from stitchcuda.verify.verdict import KernelStat, OpStat, ProgramProfile

# --- escaped work ---------------------------------------------------------------------------


@pytest.mark.parametrize(("call_ms", "pending_ms", "idle_ms", "escaped"), [
    (12.0, 0.012, 0.010, False),   # honest: the caller's stream held all the work
    (0.06, 40.0, 0.010, True),     # side stream: forward timed the launches, the GEMMs ran after
    (0.01, 0.045, 0.008, False),   # a tiny program's slow wake-up stays under the 50 us floor
    (10.0, 2.0, 0.01, False),      # under a quarter of the call: not worth a total finding
    (10.0, 3.0, 0.01, True),       # a third of the work left running beyond the caller's stream
])
def test_escape_decision(call_ms, pending_ms, idle_ms, escaped):
    finding = escaped_work_finding(EscapeProbe(call_ms=call_ms, pending_ms=pending_ms, idle_ms=idle_ms))
    assert (finding is not None) == escaped
    if finding:
        assert finding.check == "escaped_work" and finding.level == "total" and "caller's stream" in finding.detail


def test_escape_probe_needs_a_gpu():
    assert escaped_work(nn.Linear(4, 4), lambda: [torch.randn(2, 4)], 0, torch.device("cpu")) == []


# --- fingerprints and repeated outputs -------------------------------------------------------


def test_fingerprint_is_exact_and_cheap():
    x = torch.randn(300, 7)
    assert same_output(fingerprint(x), fingerprint(x.clone()))
    y = x.clone()
    y[123, 4] += 1.0  # off the sampled positions, caught by the sum
    assert not same_output(fingerprint(x), fingerprint(y))
    (p,) = fingerprint(x)
    assert p.shape == (300, 7) and p.dtype == "float32" and len(p.samples) == 16
    assert p.samples[0] == x.flatten()[0].item() and p.samples[-1] == x.flatten()[-1].item()


def test_fingerprint_of_structures_and_odd_dtypes():
    nan = torch.full((3,), float("nan"))
    assert same_output(fingerprint(nan), fingerprint(nan.clone()))  # NaN outputs repeat too
    out = (torch.arange(5), [torch.tensor([True, False]), torch.zeros(0)], 3)
    prints = fingerprint(out)
    assert [p.dtype for p in prints] == ["int64", "bool", "float32"] and prints[2].samples == ()
    assert same_output(prints, fingerprint((torch.arange(5), [torch.tensor([True, False]), torch.zeros(0)], 3)))
    assert not same_output(prints, prints[:2])
    assert not same_output(fingerprint(torch.zeros(2, 3)), fingerprint(torch.zeros(3, 2)))
    assert fingerprint(torch.ones(2, 2, dtype=torch.complex64))[0].total == 4.0  # real and imaginary parts


def _trial(index, cand, ref, passed):
    return TrialPrint(index=index, candidate=fingerprint(torch.tensor(cand)), reference=fingerprint(torch.tensor(ref)),
                      passed=passed)


def test_a_stored_result_is_found_by_its_repetition():
    cached = [_trial(0, [1.0, 2.0], [1.0, 2.0], True), _trial(1, [1.0, 2.0], [5.0, 6.0], False)]
    assert repeated_output(cached) == (0, 1)
    finding = repeated_output_finding(cached)
    assert finding.check == "output_caching" and finding.level == "total" and "trial 0" in finding.detail


@pytest.mark.parametrize("trials", [
    # honest: every trial right
    [_trial(0, [1.0], [1.0], True), _trial(1, [2.0], [2.0], True)],
    # zero weights: the same wrong output every time, never a result it computed right
    [_trial(0, [0.0], [1.0], False), _trial(1, [0.0], [2.0], False)],
    # an input-independent task: the references repeat as well
    [_trial(0, [3.0], [3.0], True), _trial(1, [3.0], [3.0], False)],
    # wrong, but not the earlier output
    [_trial(0, [1.0], [1.0], True), _trial(1, [9.0], [2.0], False)],
])
def test_no_caching_without_a_stored_result(trials):
    assert repeated_output(trials) is None and repeated_output_finding(trials) is None


# --- the post-timing trial -------------------------------------------------------------------


class Honest(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


class CallCount(Honest):
    """Returns the third call's output from then on."""

    def __init__(self):
        super().__init__()
        self.calls, self.frozen = 0, None

    def forward(self, x):
        self.calls += 1
        if self.frozen is not None:
            return self.frozen
        y = self.fc(x)
        if self.calls >= 3:
            self.frozen = y
        return y


class KeyedCache(Honest):
    """Remembers outputs per input, keyed on the input's id() or its data pointer."""

    def __init__(self, key):
        super().__init__()
        self.key, self.seen = key, {}

    def forward(self, x):
        out = self.seen.get(self.key(x))
        if out is None:
            out = self.seen[self.key(x)] = self.fc(x)
        return out


def _post_timing(model, calls_before=300):
    reference = Honest()  # the same weights: seeded alike
    inputs = torch.randn(16, 8)
    for _ in range(calls_before):  # the timed calls: one input over and over
        model(inputs)

    def draw(k):
        return [torch.randn(16, 8, generator=torch.Generator().manual_seed(100 + k))]

    strict = VerifyConfig(device="cpu").tol
    return post_timing_trial(lambda a: model(*a).detach().clone(), lambda a: reference(*a).detach().clone(), draw,
                             lambda r, c: compare_outputs(r, c, strict))


@pytest.mark.parametrize(("make", "fresh", "refill", "repeats"), [
    (Honest, True, True, False),
    (CallCount, False, True, False),  # stale after three calls: fails on fresh inputs
    (lambda: KeyedCache(id), True, False, True),  # the same objects refilled: the previous output comes back
    (lambda: KeyedCache(lambda x: x.data_ptr()), True, False, True),
    (lambda: KeyedCache(lambda x: tuple(x.shape)), False, True, False),  # the timed input's output, any input
], ids=["honest", "call_count", "id", "data_ptr", "shape"])
def test_post_timing_trial(make, fresh, refill, repeats):
    trial = _post_timing(make())
    assert (trial.fresh_passed, trial.refill_passed, trial.refill_repeats_fresh) == (fresh, refill, repeats)
    finding = stale_output_finding(trial)
    assert (finding is None) == (fresh and refill)
    if finding:
        assert finding.check == "output_caching" and finding.level == "total"


def test_stale_output_details():
    stale = stale_output_finding(PostTimingTrial(fresh_passed=False, fresh_error="max abs error 3.1"))
    assert "went stale after repeated calls" in stale.detail and "3.1" in stale.detail
    keyed = stale_output_finding(PostTimingTrial(fresh_passed=True, refill_passed=False, refill_repeats_fresh=True))
    assert "exactly the previous call's output" in keyed.detail and "not on its values" in keyed.detail
    assert stale_output_finding(PostTimingTrial(fresh_passed=True)) is None


def test_the_worker_step_on_the_cpu():
    """stale_outputs draws from the task's get_inputs with seeds of its own and judges with the
    config's tolerance."""
    config = VerifyConfig(device="cpu", trials=2)
    reference, cpu = Honest(), torch.device("cpu")
    assert stale_outputs(Honest(), reference, lambda: [torch.randn(16, 8)], config, cpu) == []
    cache = KeyedCache(id)
    found = stale_outputs(cache, reference, lambda: [torch.randn(16, 8)], config, cpu)
    assert [(f.check, f.level) for f in found] == [("output_caching", "total")]


# --- partial versus total from the profile ---------------------------------------------------


def _profile(gpu_us, own=0.0, library=0.0, ops=()):
    pytorch = 1.0 - own - library
    return ProgramProfile(
        gpu_time_us=gpu_us,
        origin_share={k: v for k, v in (("own", own), ("library", library), ("pytorch", pytorch)) if v},
        kernels=[KernelStat(name="k", origin="own", calls=1, total_us=own * gpu_us, share=own)] if own else [],
        ops=[OpStat(name=name, calls=1, gpu_us=share * gpu_us, share=share) for name, share in ops],
    )


@pytest.mark.parametrize(("profile", "level", "check"), [
    # a decoy kernel (2 us) beside PyTorch doing everything: total
    (_profile(10_000, own=0.0002, ops=[("aten::mm", 0.9998)]), "total", "no_own_gpu_time"),
    # no kernel of its own ran at all: total
    (_profile(10_000, ops=[("aten::mm", 1.0)]), "total", "no_own_gpu_time"),
    # a real bias + GELU pass (90 us) beside three big torch GEMMs: under 1%, but of substance
    (_profile(10_000, own=0.009, ops=[("aten::mm", 0.991)]), "partial", "pytorch_gpu_time"),
    # own projections beside PyTorch's fused attention: partial
    (_profile(8_000, own=0.6, ops=[("aten::_efficient_attention_forward", 0.4)]), "partial", "pytorch_gpu_time"),
    # cuBLAS called from the candidate's own C++ is its own work
    (_profile(5_000, own=0.1, library=0.88, ops=[("aten::add", 0.02)]), "none", "pytorch_gpu_time_light"),
])
def test_partial_or_total_by_own_work(profile, level, check):
    findings = profile_findings(profile, built_extensions=True)
    worst = max((f.level for f in findings), key=["none", "partial", "total"].index, default="none")
    assert worst == level and check in {f.check for f in findings}, findings
