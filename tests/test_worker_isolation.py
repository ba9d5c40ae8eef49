"""Whole verifications on the CPU: every candidate runs in its own worker process, and
whatever it does (crash, hang, abort, lie) ends in a verdict, never in the caller."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from stitchcuda.task import load_candidate, load_task_file
from stitchcuda.verify import PRESETS, Verifier
from stitchcuda.verify.weights_trial import SAMPLE, sample_positions
from tests.conftest import CPU, share_builds


@pytest.fixture
def verifier(cache):
    return Verifier(PRESETS["tiny-debug"].model_copy(update={"timeout_s": 60}), cache=cache)


@pytest.fixture
def task():
    return load_task_file(CPU / "tiny_mlp.py")


def run(verifier, task, name):
    folder = CPU if (CPU / f"{name}.py").exists() else CPU.parent / "agents"
    return verifier.verify(task, load_candidate(folder / f"{name}.py"))


def test_pure_pytorch_is_correct_but_a_total_hack(verifier, task):
    v = run(verifier, task, "pure_torch")
    assert v.compiled and v.correct and not v.passed
    assert v.hacking.level == "total"
    assert [f.check for f in v.hacking.findings] == ["no_custom_kernels"]
    assert v.correctness.weights == "seeded"  # KernelBench's convention: same seed, nothing copied
    assert len(v.correctness.trials) == 2 and {t.order for t in v.correctness.trials} == {
        "reference-first", "candidate-first"}
    assert v.timing is not None and v.timing.candidate.trials >= 3
    assert "eager" in v.speedup


def test_wrong_output_reports_errors(verifier, task):
    v = run(verifier, task, "wrong")
    assert v.compiled and not v.correct and not v.passed
    trial = v.correctness.trials[0]
    assert not trial.passed and trial.max_abs_error > 1e-4 and trial.mismatched > 0
    assert trial.worst and "reference" in trial.worst
    assert v.timing is None  # a wrong program is not timed
    assert "Wrong result" in v.feedback


def test_wrong_shape(verifier, task):
    v = run(verifier, task, "wrong_shape")
    assert not v.correct
    assert "shape" in v.correctness.trials[0].error


def test_segfault_is_contained_and_next_run_is_unaffected(verifier, task):
    v = run(verifier, task, "segfault")
    assert v.compiled and not v.correct
    assert v.crash is not None and v.crash.kind == "segfault" and v.crash.signal == "SIGSEGV"
    assert v.crash.phase == "correctness"
    assert "about to crash" in v.crash.output_tail
    after = run(verifier, task, "pure_torch")
    assert after.correct and after.crash is None


def test_abort_during_import(verifier, task):
    v = run(verifier, task, "abort_on_import")
    assert not v.compiled
    assert v.crash.signal == "SIGABRT" and v.crash.phase == "build"
    assert "aborting during import" in v.crash.output_tail


def test_hang_is_killed_at_the_limit(cache, task):
    config = PRESETS["tiny-debug"].model_copy(update={"timeout_s": 8})
    v = Verifier(config, cache=cache).verify(task, load_candidate(CPU / "hang.py"))
    assert v.crash.kind == "timeout" and v.crash.phase == "correctness"
    assert v.wall.total_s < 30
    assert "limit of 8 s" in v.errors[0]


def test_input_mutation_is_a_total_hack(verifier, task):
    v = run(verifier, task, "mutates_input")
    assert v.correct and not v.passed
    assert any(f.check == "input_mutation" and f.level == "total" for f in v.hacking.findings)


def test_global_flag_change_is_found_and_restored(verifier, task):
    v = run(verifier, task, "flips_tf32")
    flags = [f for f in v.hacking.findings if f.check == "global_state"]
    assert flags and "allow_tf32" in flags[0].detail and "restored" in flags[0].detail
    assert "cuda.matmul.allow_tf32" in v.precision.flags_changed
    # KernelBench's harness keeps the flag and judges its reference under it: we do not pass it either
    assert v.correct and not v.passed and any("KernelBench's harness does not restore" in e for e in v.errors)


def test_import_error_and_missing_modelnew(verifier, task):
    v = run(verifier, task, "import_error")
    assert not v.compiled and "needs a library that is not installed" in v.errors[0]
    v = run(verifier, task, "no_modelnew")
    assert not v.compiled and "defines no ModelNew" in v.errors[0]
    v = run(verifier, task, "syntax_error")
    assert not v.compiled and "line 4" in v.errors[0]


def test_broken_reference_is_an_unusable_task(verifier):
    v = verifier.verify(load_task_file(CPU / "reference_broken.py"), load_candidate(CPU / "pure_torch.py"))
    assert v.reference_error and "mat1 and mat2" in v.reference_error
    assert not v.passed and v.errors[0].startswith("the reference failed to run")


@pytest.mark.nvcc
def test_cpu_extension_builds_then_hits_the_cache(verifier, task):
    first = run(verifier, task, "cpp_extension")
    assert first.compiled and first.correct and first.passed, first.errors
    assert first.hacking.level == "partial"  # its Linear layers stay in PyTorch: a partial hack still passes
    assert not first.build.cache_hit and first.build.extensions[0].name.startswith("tiny_relu_cpu_")
    second = run(verifier, task, "cpp_extension")
    assert second.build.cache_hit and second.build.seconds < first.build.seconds / 5


@pytest.mark.nvcc
def test_nvcc_error_in_a_source_with_its_own_headers_has_file_and_line(verifier, task):
    v = run(verifier, task, "cuda_compile_error_own_headers")
    assert not v.compiled
    errors = [m for m in v.build.extensions[0].messages if m.severity == "error"]
    assert errors and errors[0].file.endswith("cuda.cu")
    # the closing brace after the statement missing its ";": line 6 of CUDA_SRC and of cuda.cu (no
    # preamble), line 12 of the .py
    assert errors[0].line == 6 and errors[0].source_line == "}" and errors[0].candidate_line == 12
    assert "cuda.cu:6 (candidate line 12)" in v.errors[0]


@pytest.mark.nvcc
@pytest.mark.full  # torch/extension.h and torch/types.h behind load_inline's preamble: over a minute of g++ and nvcc
def test_nvcc_error_has_file_and_line(verifier, task):
    v = run(verifier, task, "cuda_compile_error")
    assert not v.compiled
    ext = v.build.extensions[0]
    errors = [m for m in ext.messages if m.severity == "error"]
    assert errors and errors[0].file.endswith("cuda.cu")
    # nvcc flags the closing brace after the statement missing its ";": source line 6 of
    # CUDA_SRC, line 9 of cuda.cu (load_inline prepends 3 include lines), line 11 of the .py
    assert errors[0].line == 9 and errors[0].source_line == "}" and errors[0].candidate_line == 11
    assert "cuda.cu:9 (candidate line 11)" in v.errors[0]


def test_a_timing_cores_other_hardware_thread_builds_nothing(monkeypatch):
    from stitchcuda import machine

    h200 = machine.Gpu(index=0, name="NVIDIA H200", compute_capability="9.0")
    monkeypatch.setattr(machine, "gpus", lambda: (h200,))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("STITCHCUDA_QUIET_CORES", raising=False)
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    # 8 cores of two threads each, as Linux numbers them: thread i and i + 8 share a core
    monkeypatch.setattr(machine, "smt_siblings", lambda core: {(core + 8) % 16})
    split = machine.cpu_split()
    assert split is not None and split.timing == {0: 15} and split.builds == [c for c in range(15) if c != 7]
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(machine, "smt_siblings", lambda core: {0, 1, 2})
    assert machine.cpu_split().builds == [0, 1, 2]  # too few left: builds keep the siblings


def test_hardware_threads_are_read_from_linux_topology(monkeypatch, tmp_path):
    from stitchcuda import machine

    for core, text in ((3, "3,11\n"), (4, "4-5\n")):
        folder = tmp_path / f"cpu{core}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(text)
    real = Path
    monkeypatch.setattr(machine, "Path", lambda p: real(str(p).replace("/sys/devices/system/cpu", str(tmp_path))))
    assert machine.smt_siblings(3) == {11} and machine.smt_siblings(4) == {5}
    assert machine.smt_siblings(9) == set()  # no topology: no siblings


def test_a_benchs_compile_processes_keep_off_the_timing_cores(monkeypatch):
    """The offline Coder's captures in the bench's compile pool (agents/compiling.py) never run on a
    core timing runs on; without a split they stay where they are."""
    from stitchcuda import machine

    split = machine.CpuSplit(builds=list(range(15)), timing={0: 15})
    monkeypatch.setattr(machine, "cpu_split", lambda: split)
    confined = []
    monkeypatch.setattr(machine, "confine", confined.append)
    machine.keep_off_timing_cores()
    assert confined == [",".join(map(str, range(15)))]
    monkeypatch.setattr(machine, "cpu_split", lambda: None)
    machine.keep_off_timing_cores()
    assert len(confined) == 1


def test_quiet_cores_one_per_gpu(monkeypatch):
    from stitchcuda import machine

    h200 = machine.Gpu(index=0, name="NVIDIA H200", compute_capability="9.0")
    monkeypatch.setattr(machine, "smt_siblings", lambda core: set())  # one hardware thread a core
    monkeypatch.setattr(machine, "gpus", lambda: (h200, h200.model_copy(update={"index": 1})))
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    split = machine.cpu_split()
    assert split is not None and split.timing == {0: 15, 1: 14} and split.builds == list(range(14))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # a bench given one of the two: one quiet core
    split = machine.cpu_split()
    assert split is not None and split.timing == {1: 15} and split.builds == list(range(15))
    assert machine.usable_cores() == 16  # the affinity, not the machine's count
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("STITCHCUDA_QUIET_CORES", "0")
    assert machine.cpu_split() is None
    monkeypatch.delenv("STITCHCUDA_QUIET_CORES")
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6}, raising=False)
    assert machine.cpu_split() is None  # under four cores a GPU: builds keep every core
    monkeypatch.setattr(machine, "gpus", lambda: ())
    assert machine.cpu_split() is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell them apart")
def test_timing_runs_pinned_after_the_warm_up():
    from stitchcuda.verify.timing import Contender, Pinned, Timer

    everywhere = os.sched_getaffinity(0)
    core = max(everywhere)
    seen: list[set[int]] = []
    contender = Contender("c", lambda: seen.append(os.sched_getaffinity(0)))
    Timer(torch.device("cpu")).run([contender], warmup=2, min_rounds=3, max_rounds=3, budget_s=0.01,
                                                 measuring=Pinned(core))
    assert seen[:3] == [everywhere] * 3  # the warm-up (which may compile) on every core
    assert seen[3:] == [{core}] * 3 and len(contender.samples) == 3
    assert os.sched_getaffinity(0) == everywhere  # put back


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell them apart")
def test_build_workers_stay_off_the_timing_cores(cache, tmp_path, monkeypatch):
    """The runner tells a build worker its cores; the worker binds itself before it builds, so
    the compilers it starts inherit them."""
    from stitchcuda import machine
    from stitchcuda.task.record import Candidate

    builds = [min(os.sched_getaffinity(0))]
    monkeypatch.setattr(machine, "cpu_split", lambda: machine.CpuSplit(builds=builds, timing={}))
    out = tmp_path / "affinity.json"
    monkeypatch.setenv("AFFINITY_OUT", str(out))
    source = ("import json, os\n"
              "open(os.environ['AFFINITY_OUT'], 'w').write(json.dumps(sorted(os.sched_getaffinity(0))))\n"
              "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    Verifier(PRESETS["quick"].model_copy(update={"device": "cpu"})).build(Candidate(name="probe", source=source))
    assert json.loads(out.read_text()) == builds


def test_gpu_workers_are_told_their_quiet_core(monkeypatch):
    from stitchcuda import machine

    split = machine.CpuSplit(builds=list(range(14)), timing={0: 15, 1: 14})
    monkeypatch.setattr(machine, "cpu_split", lambda: split)
    verifier = Verifier(PRESETS["quick"].model_copy(update={"device": "cpu"}))
    verifier.gpu = machine.Gpu(index=1, name="NVIDIA H200", compute_capability="9.0")  # as on cuda:1
    gpu_env, build_env = verifier._env(hide_gpu=False), verifier._env(hide_gpu=True)
    # a GPU worker works off every timing core too; only its timing thread moves to its own
    assert gpu_env["STITCHCUDA_TIMING_CPU"] == "14" and gpu_env["STITCHCUDA_WORK_CPUS"] == ",".join(map(str, range(14)))
    assert build_env["STITCHCUDA_WORK_CPUS"] == ",".join(map(str, range(14))) and "STITCHCUDA_TIMING_CPU" not in build_env


def test_the_verdict_names_the_core_it_timed_on(verifier, task, monkeypatch):
    """What the runner hands a GPU worker, end to end through a real worker (on the CPU device)."""
    core = max(os.sched_getaffinity(0))
    monkeypatch.setenv("STITCHCUDA_TIMING_CPU", str(core))
    v = run(verifier, task, "pure_torch")
    assert v.timing is not None and v.timing.method.endswith(f"timed from CPU core {core}, kept free of other work")
    monkeypatch.setenv("STITCHCUDA_TIMING_CPU", "4096")  # not a core of this machine: timed where it runs
    v = run(verifier, task, "pure_torch")
    assert v.timing is not None and "core" not in v.timing.method


def test_warm_workers_serve_clean_runs_again_and_retire_after_anything_else(cache, session_builds, task, monkeypatch):
    """Warm workers (the GPU default) give the same verdicts, crash included; a worker serves the
    next candidate only after a clean run, and any hacking finding or crash retires it."""
    share_builds(cache, session_builds)
    monkeypatch.setenv("STITCHCUDA_PREWARM", "1")
    verifier = Verifier(PRESETS["tiny-debug"].model_copy(update={"timeout_s": 120}), cache=cache)
    def pids() -> set[int]:
        return {w.proc.pid for w in verifier._pool(False)._idle}

    try:
        clean = run(verifier, task, "tiny_mlp_full_cpp")  # built here, then a clean run: its worker stays
        assert clean.passed and clean.hacking.level == "none", clean.errors + clean.hacking.findings
        kept = pids()
        again = run(verifier, task, "tiny_mlp_full_cpp")
        assert again.wall.warm_start and again.wall.spawn_s < clean.wall.spawn_s and again.build.cache_hit
        before = pids()
        hacked = run(verifier, task, "pure_torch")  # a finding: its worker exits
        after_hack = pids()
        crashed = run(verifier, task, "segfault")
        after = run(verifier, task, "tiny_mlp_full_cpp")
    finally:
        verifier.close()
    assert len(kept) == 2  # the one that served, and the one started ahead
    assert hacked.correct and hacked.hacking.level == "total" and hacked.wall.warm_start
    assert len(before - after_hack) == 1  # the worker that served the hack is gone; the other stays
    assert crashed.crash is not None and crashed.crash.signal == "SIGSEGV" and "about to crash" in crashed.crash.output_tail
    assert after.passed and after.wall.warm_start
    split = after.wall.split()
    assert split["correctness"] > 0 and split["timing"] > 0 and sum(split.values()) <= after.wall.total_s


def test_warm_up_serves_a_fresh_verifiers_first_candidate_warm(cache, task, monkeypatch):
    """A Ray task's verifier is fresh: warming it up while the job captures and builds makes its
    first verification a warm one; a second warm-up keeps the worker already waiting."""
    monkeypatch.setenv("STITCHCUDA_PREWARM", "1")
    verifier = Verifier(PRESETS["tiny-debug"].model_copy(update={"timeout_s": 60}), cache=cache)
    try:
        verifier.warm_up()
        waiting = [w.proc for w in verifier._pool(False)._idle]
        verifier.warm_up()
        assert [w.proc for w in verifier._pool(False)._idle] == waiting and len(waiting) == 1
        for _ in range(100):  # ready once torch is imported
            if verifier._pool(False)._idle[0].ready():
                break
            __import__("time").sleep(0.1)
        first = run(verifier, task, "pure_torch")
    finally:
        verifier.close()
    assert first.correct and first.wall.warm_start
    assert waiting[0].poll() is not None  # it retired after the finding (or was closed)
    monkeypatch.setenv("STITCHCUDA_PREWARM", "0")
    cold = Verifier(PRESETS["tiny-debug"], cache=cache)
    cold.warm_up()
    assert cold._pools == {}  # off where prewarming is off (the CPU default)


def test_zero_initialised_candidate_is_incorrect_by_default_and_the_verdict_says_why(cache, task):
    seeded = run(Verifier(PRESETS["tiny-debug"].model_copy(update={"timeout_s": 60}), cache=cache), task, "zero_init")
    assert seeded.correctness.weights == "seeded" and not seeded.correct
    assert seeded.correctness.passes_with_copied_weights is True
    assert any("copied in" in e and "KernelBench" in e for e in seeded.errors)
    assert "With the reference's parameters copied in, it passes" in seeded.feedback
    copied = run(Verifier(PRESETS["tiny-debug"].model_copy(update={"timeout_s": 60, "weights": "copy"}), cache=cache),
                 task, "zero_init")
    assert copied.correctness.weights == "copied" and copied.correct


def test_a_wrong_function_is_not_excused_by_the_weights(verifier, task):
    v = run(verifier, task, "wrong")
    assert not v.correct and v.correctness.passes_with_copied_weights is False
    assert not any("copied in" in e for e in v.errors)


def test_state_carried_across_calls_is_verified_as_one_sequence(verifier):
    """The trials are a sequence of calls from one starting state: a candidate that carries the state
    passes, one that restarts from the initial state every call fails from the second call on."""
    task = load_task_file(CPU / "stateful_rnn.py")
    v = verifier.verify(task, load_candidate(CPU / "stateful_rnn_new.py"))
    assert v.correct and v.correctness.state == ["hidden"]
    assert v.timing is not None and not [f for f in v.hacking.findings if f.check == "output_caching"]
    v = verifier.verify(task, load_candidate(CPU / "stateless_rnn_new.py"))
    assert not v.correct and v.correctness.trials[0].passed and not v.correctness.trials[1].passed


def test_a_task_whose_output_depends_on_its_draws_is_unusable_with_the_measurement(verifier):
    v = verifier.verify(load_task_file(CPU / "dropout_reference.py"), load_candidate(CPU / "pure_torch.py"))
    assert v.reference_error and v.reference_error.startswith("the reference draws random numbers")
    assert "seeds" in v.reference_error and "apart" in v.reference_error
    assert not v.passed and v.errors[0].startswith("the reference draws random numbers")


def test_draws_the_output_forgets_are_verifiable(verifier):
    v = verifier.verify(load_task_file(CPU / "forgotten_draw.py"), load_candidate(CPU / "forgotten_draw_new.py"))
    assert v.correct and v.correctness.random_draws is not None and v.correctness.random_draws.agree


def test_an_ill_conditioned_trial_is_judged_against_fp64_within_the_reference_own_error(verifier):
    """(a * 1e4 + b) - a * 1e4: the fp32 reference misses fp64 by ~5e-4 > 1e-4, so an exact program
    fails against it; judged against fp64 it passes, and a program off by 0.01 still fails."""
    task = load_task_file(CPU / "cancellation.py")
    v = verifier.verify(task, load_candidate(CPU / "cancellation_reordered.py"))
    assert v.correct, [t.error for t in v.correctness.trials]
    check = v.correctness.trials[0].conditioning
    assert check is not None and check.passed and check.candidate_max_abs < check.reference_max_abs
    assert check.reference_max_abs > 1e-4
    assert v.timing is not None and not [f for f in v.hacking.findings if f.check == "output_caching"]  # post-timing too
    v = verifier.verify(task, load_candidate(CPU / "cancellation_wrong.py"))
    assert not v.correct and v.correctness.trials[0].conditioning is not None
    assert not v.correctness.trials[0].conditioning.passed


def test_a_program_that_keeps_stale_weights_is_wrong_and_not_a_hack(verifier, task):
    """New weights are loaded into both models between two calls: a candidate that computes with
    copies made at its first call fails (hacking level none: it is wrong, not cheating); one that
    remakes its copies when the parameters' version counters change passes."""
    v = run(verifier, task, "stale_weights")
    assert all(t.passed for t in v.correctness.trials) and not v.correct
    trial = v.correctness.weights_follow
    assert trial is not None and trial.ran and not trial.passed and trial.stale
    assert trial.output_moved is not None and trial.output_moved > 1e-3
    assert any("new weights were loaded" in e and "copy made before" in e for e in v.errors)
    assert "output_caching" not in {f.check for f in v.hacking.findings}
    v = run(verifier, task, "prepacked_weights")
    assert v.correct and v.correctness.weights_follow.passed and not v.correctness.weights_follow.stale


def test_new_weights_that_leave_the_reference_ill_conditioned_are_judged_against_fp64(verifier):
    """The trials pass exactly; the new weights make the fp32 reference miss fp64 by ~1e-3 (Inception
    v3's logits went to 1e12 so): the trial with them is judged against fp64 too, and a program that
    kept its first weights still fails it."""
    task = load_task_file(CPU / "cancels_after_new_weights.py")
    v = verifier.verify(task, load_candidate(CPU / "cancels_after_new_weights_new.py"))
    trial = v.correctness.weights_follow
    assert all(t.passed for t in v.correctness.trials) and v.correct, v.errors
    assert trial.passed and trial.conditioning is not None and trial.conditioning.passed
    assert trial.conditioning.reference_max_abs > 1e-4 > trial.conditioning.candidate_max_abs
    v = verifier.verify(task, load_candidate(CPU / "cancels_after_new_weights_stale.py"))
    assert not v.correct and not v.correctness.weights_follow.passed and v.correctness.weights_follow.stale


def test_new_weights_keep_the_state_dict_metadata():
    """torchvision's MNASNet refuses a state_dict without its module versions (``_metadata``): the
    perturbed weights and the saved ones keep them."""
    from stitchcuda.verify.weights_trial import perturbed
    from stitchcuda.verify.worker import _snapshot

    class Versioned(torch.nn.Module):
        _version = 2

        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
            if local_metadata.get("version") != 2:
                raise ValueError("version should be set to 1 or 2")
            super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)

    model = torch.nn.Sequential(Versioned())
    model.load_state_dict(perturbed(model.state_dict(), 0))
    model.load_state_dict(_snapshot(model, torch.device("cpu")))


def test_the_trial_with_new_weights_is_skipped_where_the_keys_differ(verifier, task):
    renamed = load_candidate(CPU / "pure_torch.py")
    renamed = renamed.model_copy(update={"source": renamed.source.replace("self.fc1", "self.first")})
    v = verifier.verify(task, renamed)
    trial = v.correctness.weights_follow
    assert v.correct and trial is not None and not trial.ran and "keys" in trial.skipped


@pytest.mark.parametrize("numel", [SAMPLE + 1, 74_342_400, 2**33 + 12345])
def test_sampled_positions_stay_inside_the_output(numel):
    """A float32 linspace put the last position at numel for L1/50's 74M outputs (a device-side
    assert in the weights trial); the int64 positions stay in [0, numel) and reach both ends."""
    positions = sample_positions(numel)
    assert positions.dtype == torch.int64 and len(positions) == SAMPLE
    assert positions[0] == 0 and positions[-1] == numel - 1 and bool((positions[1:] > positions[:-1]).all())


def test_the_candidate_s_construction_is_a_phase_of_its_own(verifier, task):
    """ModelNew's random init on the CPU (seconds for a large model) is timed as `construct`, not left
    to the bench's `other`."""
    v = run(verifier, task, "slow_construct")
    assert v.wall.construct_s >= 1.5 and v.wall.split()["construct"] == v.wall.construct_s
    assert v.wall.reference_s < 1.5 and v.wall.correctness_s < 1.5


@pytest.mark.parametrize("prewarm", ["0", "1"])  # a worker for the one request, or a warm one
def test_stop_ends_a_verification_in_flight_without_a_verdict(cache, task, monkeypatch, prewarm):
    """An interrupted bench stops its verifiers: the verification in flight (a candidate that hangs)
    ends within seconds, as WorkersStopped rather than a crash verdict blamed on the candidate, and
    nothing is verified after."""
    import threading
    import time

    from stitchcuda.verify.workers import WorkersStopped

    monkeypatch.setenv("STITCHCUDA_PREWARM", prewarm)
    verifier = Verifier(PRESETS["tiny-debug"].model_copy(update={"timeout_s": 120}), cache=cache)
    outcome: list[object] = []

    def verify():
        try:
            outcome.append(verifier.verify(task, load_candidate(CPU / "hang.py")))
        except WorkersStopped as exc:
            outcome.append(exc)

    thread = threading.Thread(target=verify)
    thread.start()
    time.sleep(6)  # in its correctness trial by now: the candidate's forward never returns
    stopped = time.time()
    verifier.stop()
    thread.join(timeout=30)
    assert not thread.is_alive() and time.time() - stopped < 10
    assert len(outcome) == 1 and isinstance(outcome[0], WorkersStopped), outcome
    with pytest.raises(WorkersStopped):
        verifier.verify(task, load_candidate(CPU / "hang.py"))
