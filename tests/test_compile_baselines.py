"""torch.compile's baselines (verify/baselines.py): the default mode, and max-autotune on request,
each compiled within a limit; a compile over it is recorded as such, kept, and not waited for again."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch

from stitchcuda.verify import baselines
from stitchcuda.verify.baselines import OverLimit, baseline_contender, time_limit
from stitchcuda.verify.config import VerifyConfig
from stitchcuda.verify.verdict import BaselineTiming, TimingStats


def test_a_compile_past_its_limit_is_stopped_and_its_time_kept(monkeypatch):
    modes = []

    def slow_compile(model, mode=None):  # a stand-in for Inductor's autotuning: Python that takes its time
        modes.append(mode)
        return lambda *inputs: time.sleep(30)

    monkeypatch.setattr(torch, "compile", slow_compile)
    compile_s: dict[str, float] = {}
    started = time.perf_counter()
    with pytest.raises(OverLimit, match="still compiling after 0.3 s"):
        baseline_contender("torch_compile_max_autotune", torch.nn.Identity(), [], limit_s=0.3, compile_s=compile_s)
    assert time.perf_counter() - started < 5
    assert modes == ["max-autotune"] and 0.25 < compile_s["torch_compile_max_autotune"] < 5
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_default_mode_is_torch_compiles_own(monkeypatch):
    modes = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: modes.append(mode) or model)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    compile_s: dict[str, float] = {}
    contender = baseline_contender("torch_compile", torch.nn.Identity(), [torch.ones(2)], compile_s=compile_s)
    assert modes == [None] and contender.name == "torch_compile" and compile_s["torch_compile"] < 5


class _Cell(torch.nn.Module):
    """A cell that keeps its output as its state, as a user's stateful RNN cell does."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.zeros(2)

    def forward(self, x):
        self.hidden = torch.tanh(x + self.hidden)
        return self.hidden


def test_max_autotune_whose_cuda_graphs_overwrite_the_models_state_runs_without_them(monkeypatch):
    modes = []

    def compile_like_inductor(model, mode=None):  # CUDA-graph trees replay from the third call
        modes.append(mode)  # and a model that reads its last output back fails there
        calls = []

        def call(*inputs):
            calls.append(1)
            if mode == "max-autotune" and len(calls) >= 3 and hasattr(model, "hidden"):
                raise RuntimeError("Error: accessing tensor output of CUDAGraphs that has been overwritten by a "
                                   "subsequent run.")
            return model(*inputs)
        return call

    monkeypatch.setattr(torch, "compile", compile_like_inductor)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    cell, compile_s = _Cell(), {}
    contender = baseline_contender("torch_compile_max_autotune", cell, [torch.ones(2)], compile_s=compile_s)
    assert modes == ["max-autotune", "max-autotune-no-cudagraphs"] and contender.mode == "max-autotune-no-cudagraphs"
    assert contender.model is not cell and torch.equal(cell.hidden, torch.zeros(2))  # the reference's state untouched
    for _ in range(5):
        contender.call()
    assert compile_s["torch_compile_max_autotune"] < 5
    modes.clear()
    plain = baseline_contender("torch_compile_max_autotune", torch.nn.Identity(), [torch.ones(2)])
    assert modes == ["max-autotune"] and plain.mode is None  # a model CUDA graphs can serve keeps them


def test_an_error_of_max_autotunes_compile_is_the_baselines_error(monkeypatch):
    modes = []

    def broken(model, mode=None):
        modes.append(mode)
        return lambda *inputs: (_ for _ in ()).throw(RuntimeError("an Inductor lowering failed"))

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with pytest.raises(RuntimeError, match="lowering failed"):
        baseline_contender("torch_compile_max_autotune", _Cell(), [torch.ones(2)])
    assert modes == ["max-autotune"]  # its first call failed: no replay was tried, so no other mode


def test_replays_that_fail_in_any_way_are_tried_again_without_cuda_graphs(monkeypatch):
    modes = []

    def asserting(model, mode=None):  # CUDA-graph trees' own bare assertion, where the state came from outside
        modes.append(mode)
        calls = []

        def call(*inputs):
            calls.append(1)
            assert mode != "max-autotune" or len(calls) < 3
            return model(*inputs)
        return call

    monkeypatch.setattr(torch, "compile", asserting)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    contender = baseline_contender("torch_compile_max_autotune", _Cell(), [torch.ones(2)])
    assert modes == ["max-autotune", "max-autotune-no-cudagraphs"] and contender.mode == "max-autotune-no-cudagraphs"


def test_the_limit_holds_only_in_the_main_thread_and_leaves_no_timer():
    done = []

    def elsewhere():
        with time_limit(0.05):
            time.sleep(0.2)  # no signal can land here: the worker's own limit covers it
        done.append(True)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert done == [True]
    with time_limit(5):
        pass
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_max_autotune_is_asked_for_and_its_compile_widens_the_workers_limit():
    assert "torch_compile_max_autotune" not in VerifyConfig().baselines
    config = VerifyConfig(compile_max_autotune=True, timeout_s=100, compile_limit_s=300)
    assert config.baselines == ["eager_tf32", "cuda_graph", "torch_compile", "torch_compile_max_autotune"]
    assert config.worker_limit_s({}) == 700
    stats = TimingStats(median_ms=1.0, mean_ms=1.0, min_ms=1.0, max_ms=1.0, q25_ms=1.0, q75_ms=1.0, std_ms=0.0,
                        spread_pct=0.0, trials=3)
    timed = BaselineTiming(name="torch_compile", stats=stats, compile_s=20.0)
    over = BaselineTiming(name="torch_compile_max_autotune", error="OverLimit: still compiling after 300 s",
                          compile_s=300.1)
    assert config.worker_limit_s({"torch_compile": timed}) == 400
    assert config.worker_limit_s({"torch_compile": timed, "torch_compile_max_autotune": over}) == 100
    assert VerifyConfig(compile_baseline=False, timeout_s=100).worker_limit_s({}) == 100
    assert {"torch_compile", "torch_compile_max_autotune"} == baselines.REUSED


def test_a_baseline_that_raises_while_timed_is_dropped_and_the_candidate_still_timed():
    from stitchcuda.verify.timing import Contender, Timer

    calls = {"n": 0}

    def overwritten():  # torch.compile's CUDA graphs on a model that keeps an output as its state
        calls["n"] += 1
        if calls["n"] > 4:
            raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten")

    flips = []
    candidate, eager = Contender("candidate", lambda: None), Contender("eager", lambda: None)
    compiled = Contender("torch_compile_max_autotune", overwritten, before=lambda: flips.append("on"),
                         after=lambda: flips.append("off"), optional=True)
    rounds = Timer(torch.device("cpu")).run([candidate, eager, compiled], 2, 5, 10, 0.01)
    assert rounds >= 5 and len(candidate.samples) == rounds == len(eager.samples)
    assert compiled.samples == [] and "overwritten" in compiled.error
    assert flips == ["on", "off"] * (len(flips) // 2)  # its after ran each time, the last one too
    with pytest.raises(RuntimeError, match="overwritten"):  # the candidate's own exception is the timing's
        Timer(torch.device("cpu")).run([Contender("candidate", overwritten)], 2, 3, 3, 0.01)


def test_compiles_hold_no_timing_section_and_the_timing_gets_the_gpu_alone(monkeypatch):
    """The default mode's compile holds no section of the GPU gate (another task's timing does not
    wait on Inductor's builds), max-autotune's the shared one (it times kernel choices on the GPU),
    and the timing that follows is exclusive; a compile over its limit is kept, also where Inductor
    wrapped the limit's exception in its own."""
    from torch._inductor.exc import InductorError

    from stitchcuda.verify.protocol import WorkerResult

    class RecordingGate:
        def __init__(self):
            self.mode, self.log = "exclusive", []

        def switch(self, mode):
            if mode != self.mode:
                self.mode = mode
                self.log.append(mode)

    gate, held = RecordingGate(), {}

    def compile_in(model, mode=None):
        held[mode or "default"] = gate.mode
        if mode != "max-autotune":
            return model

        def first_call(*inputs):  # what stops the compile, raised again by Inductor as its own
            held[mode] = gate.mode
            try:
                raise OverLimit("still compiling after 300 s")
            except OverLimit as exc:
                raise InductorError(exc, None) from None
        return first_call

    monkeypatch.setattr(torch, "compile", compile_in)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(baselines, "cuda_graph_call", lambda model, inputs: lambda: None)  # no capture on a CPU
    config = VerifyConfig(compile_max_autotune=True)
    found, result = {}, WorkerResult()
    contenders = baselines.set_up_baselines(config, {}, torch.nn.Identity(), [torch.ones(2)], gate, found, result,
                                            {}, "now")
    assert held == {"default": None, "max-autotune": "shared"}
    assert [c.name for c in contenders] == ["eager_tf32", "cuda_graph", "torch_compile"]
    assert gate.log == [None, "shared", "exclusive"]  # eager TF32 and the graph set up in the exclusive one
    assert found["torch_compile_max_autotune"].error == "over its limit: still compiling after 300 s"
    assert result.measured_baselines["torch_compile_max_autotune"].settled  # not waited for again


class _ZooCell(torch.nn.Module):
    """The zoo's stateful cell: its state starts on the CPU and is moved to the input's device."""

    def __init__(self, inputs=64, hidden=128, batch=8):
        super().__init__()
        self.i2h = torch.nn.Linear(inputs + hidden, hidden)
        self.h2o = torch.nn.Linear(hidden, 32)
        self.hidden = torch.randn(batch, hidden)

    def forward(self, x):
        self.hidden = torch.tanh(self.i2h(torch.cat((x, self.hidden.to(x.device)), dim=1)))
        return self.h2o(self.hidden)


@pytest.mark.gpu
@pytest.mark.parametrize("state_on", ["cpu", "cuda"])  # fresh, or as the verifier's reference runs leave it
def test_a_stateful_cell_gets_a_max_autotune_figure_on_the_gpu(state_on):
    """On the GPU, max-autotune's CUDA graphs overwrite the hidden state this cell feeds back (torch
    raises once they replay); the baseline runs without them and gives the eager cell's values."""
    from torch._inductor.cudagraph_trees import reset_cudagraph_trees

    torch._dynamo.reset()  # one process, as a worker: the other parameter's compile and graphs start fresh
    reset_cudagraph_trees()
    torch.manual_seed(0)
    eager = _ZooCell().cuda()
    eager.hidden = eager.hidden.to(state_on)
    x = torch.randn(8, 64, device="cuda")
    compile_s: dict[str, float] = {}
    with torch.no_grad():  # as the worker times every contender (with autograd on, the graphs keep their outputs)
        contender = baseline_contender("torch_compile_max_autotune", eager, [x], compile_s=compile_s)
        assert contender.mode == "max-autotune-no-cudagraphs", compile_s
        contender.model.hidden = eager.hidden.clone()
        for _ in range(4):
            want, got = eager(x), contender.call()
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
