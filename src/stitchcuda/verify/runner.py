"""The orchestrating side of a verification: a worker process serves each candidate.

The orchestrator never imports candidate code. It writes the sources and a request into a
scratch folder, hands it to a ``python -m stitchcuda.verify.worker`` process in a process group of
its own, watches its phase file against the time limits, kills the whole group on overrun, and
turns whatever came back (a result file, or an exit status and an output tail) into a Verdict.

Builds take minutes and need only CPU cores, so :meth:`Verifier.prebuild` builds many
candidates in parallel worker processes (GPU hidden) before their GPU runs, which then find
every extension in the cache.

A worker's start (Python, torch, the CUDA context: seconds) is paid once: on a GPU the workers are
warm (:mod:`stitchcuda.verify.workers`), each serving one candidate at a time and retiring after
anything that could carry over to the next (a crash, a hacking finding, a changed flag); elsewhere,
and under ``ncu``, every request gets a fresh process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stitchcuda import machine
from stitchcuda.paths import cache_root
from stitchcuda.task.inspect import TaskError, check_candidate_source
from stitchcuda.task.probe import label_of
from stitchcuda.task.record import Candidate, Task
from stitchcuda.verify import nsight, second_opinion
from stitchcuda.verify.config import VerifyConfig
from stitchcuda.verify.feedback import feedback_for
from stitchcuda.verify.judge import judge, judge_static
from stitchcuda.verify.protocol import WorkerRequest, WorkerResult
from stitchcuda.verify.static_checks import static_findings
from stitchcuda.verify.verdict import (
    BaselineTiming,
    BuildReport,
    CounterReport,
    CrashReport,
    ProgramProfile,
    Verdict,
    WallTimes,
)
from stitchcuda.verify.workers import WarmWorker, WorkerPool, WorkersStopped, clear_stale_folders, temp_prefix

_TAIL_CHARS = 4000
# how cached baselines were judged: 2, on every correctness trial's inputs (baselines.baseline_accuracy);
# an entry of another version is not reused
BASELINE_RULES = 2
_POLL_S = 0.05


@dataclass
class WorkerOutcome:
    result: WorkerResult | None
    crash: CrashReport | None
    output_tail: str
    spawned_at: float  # when it asked for a worker: the wait for a ready one counts as its start
    ended_at: float
    warm: bool = False  # served by a worker started ahead, in standby


def classify_exit(returncode: int, tail: str) -> tuple[str, str | None]:
    """(crash kind, signal name) for a worker that died without writing its result."""
    text = tail.lower()
    sig = None
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"signal {-returncode}"
    if "illegal memory access" in text or "illegal address" in text:
        return "illegal_address", sig
    if "out of memory" in text:
        return "oom", sig
    if "cuda error" in text:
        return "cuda_error", sig
    if sig == "SIGSEGV" or "segmentation fault" in text:
        return "segfault", sig
    if sig == "SIGKILL":
        return "killed", sig  # by something other than us: often the kernel's OOM killer
    return "worker_error", sig


def _read_phases(path: Path) -> list[tuple[str, float]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    phases = []
    for line in lines:
        name, _, stamp = line.partition("\t")
        try:
            phases.append((name, float(stamp)))
        except ValueError:
            continue
    return phases


def _build_seconds(phases: list[tuple[str, float]], now: float) -> float:
    """Time spent in the build phase so far: it does not count against the run's time limit."""
    for i, (name, start) in enumerate(phases):
        if name == "build":
            end = phases[i + 1][1] if i + 1 < len(phases) else now
            return max(end - start, 0.0)
    return 0.0


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - _TAIL_CHARS, 0))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@functools.cache
def _clear_stale_once() -> int:
    """A killed run's temporary folders go at the next start (its workers remove them when they can)."""
    return clear_stale_folders()


class DeviceUnavailable(RuntimeError):
    """The configured device does not exist on this machine; the message says what to do."""


class Verifier:
    """Verifies candidates against references under one :class:`VerifyConfig`."""

    def __init__(self, config: VerifyConfig | None = None, cache: Path | None = None):
        self.config = config or VerifyConfig()
        self.cache = Path(cache) if cache else cache_root()
        self.gpu = machine.physical_gpu(self.config.device) if self.config.device.startswith("cuda") else None
        self._pools: dict[bool, WorkerPool] = {}  # warm workers, by whether they hide the GPU
        self._harness_pools: dict[str, WorkerPool] = {}  # warm KernelBench harness processes, by checkout
        self._pools_lock = threading.Lock()
        self._spawned: set[subprocess.Popen] = set()  # workers started for one request, running
        self._stopped = False
        # the GPU gate its workers and KernelBench's harness take around their GPU work (verify/gate.py);
        # None: a lone verification, nobody to share the GPU with
        self.gate_path: str | None = None
        _clear_stale_once()

    def require_device(self) -> None:
        """Raise :class:`DeviceUnavailable` unless the configured device exists here."""
        if self.config.device.startswith("cuda") and self.gpu is None:
            raise DeviceUnavailable(
                f"{self.config.device} is not a GPU on this machine (nvidia-smi lists {len(machine.gpus())}): "
                "running CUDA programs needs a CUDA GPU"
            )

    # -- environment of a worker ----------------------------------------------------------------

    def _env(self, hide_gpu: bool) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the order nvidia-smi uses
        package_parent = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = "" if hide_gpu else str(self.gpu.index)
            env.setdefault("TORCH_CUDA_ARCH_LIST", self.gpu.compute_capability)
        elif hide_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("TORCH_CUDA_ARCH_LIST", os.environ.get("STITCHCUDA_DEFAULT_ARCH", "9.0"))
        split = machine.cpu_split()
        cores = len(split.builds) if split else machine.usable_cores()
        # Builds run inside the worker: bound ninja's parallelism when several build at once.
        env.setdefault("MAX_JOBS", str(max(1, cores // max(1, self._build_jobs()))))
        # A worker's CPU work (a model's random init, input draws) is serial; torch's default of a thread
        # per core in each of dozens of workers only has them contend with the builds.
        env.setdefault("OMP_NUM_THREADS", env["MAX_JOBS"])
        if split is not None:  # builds, and every GPU worker's other work, off the cores timing runs on
            env["STITCHCUDA_WORK_CPUS"] = ",".join(map(str, split.builds))
        if split is not None and not hide_gpu and self.gpu is not None and self.gpu.index in split.timing:
            # the timing thread alone moves there for its rounds: another task's correctness trials,
            # reference runs or torch.compile workers on that core would slow host-bound contenders
            # (eager above all) and not a CUDA graph's replay
            env["STITCHCUDA_TIMING_CPU"] = str(split.timing[self.gpu.index])
        return env

    def _build_jobs(self) -> int:
        return self.config.build_jobs or max(1, machine.usable_cores() // 2)

    def _worker_device(self) -> str:
        return "cuda:0" if self.config.device.startswith("cuda") else self.config.device

    # -- one worker process -----------------------------------------------------------------------

    def _spawn(self, request: WorkerRequest, workdir: Path, hide_gpu: bool, run_limit: float,
               on_phase: Callable[[str], None] | None = None, prefix: Sequence[str] = ()) -> WorkerOutcome:
        request_path = workdir / f"request-{request.mode}.json"
        request_path.write_text(request.model_dump_json())
        phase_path = Path(request.phase_path)
        result_path = Path(request.result_path)
        worker: WarmWorker | None = None
        pool: WorkerPool | None = None
        warm = False
        asked = time.time()  # the wait for a ready worker counts as its start
        if not prefix and request.mode in ("verify", "profile", "build") and self.prewarm:
            pool = self._pool(hide_gpu)
            worker, warm = pool.take()
            pool.warm_up(1)  # the next request finds one ready
        spawned = time.time()
        if worker is not None:
            proc, log_path = worker.proc, worker.log_path
            worker.hand_over(request_path)
        else:
            log_path = workdir / f"worker-{request.mode}.log"
        with contextlib.ExitStack() as stack:
            if worker is None:
                log = stack.enter_context(open(log_path, "wb"))
                with self._pools_lock:
                    self._refuse_if_stopped()
                    proc = subprocess.Popen(
                        [*prefix, sys.executable, "-m", "stitchcuda.verify.worker", str(request_path)],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                        env=self._env(hide_gpu), start_new_session=True,
                    )
                    self._spawned.add(proc)
                stack.callback(self._spawned.discard, proc)
            overrun = None
            reported = None
            # a warm worker stays alive after its result: its result file is the end of the request
            while proc.poll() is None and not (worker is not None and result_path.exists()):
                time.sleep(_POLL_S)
                now = time.time()
                phases = _read_phases(phase_path)
                phase = phases[-1][0] if phases else "start"
                if on_phase is not None and phase != reported:
                    reported = phase
                    on_phase(phase)
                building = _build_seconds(phases, now)
                if phase == "build" and building > self.config.build_timeout_s:
                    overrun = ("build", f"the build ran past its limit of {self.config.build_timeout_s:g} s")
                elif now - spawned - building > run_limit:
                    overrun = (phase, f"the worker ran past its limit of {run_limit:g} s (build time excluded) "
                                      f"during {phase}")
                if overrun:
                    _kill_group(proc)
                    break
        ended = time.time()
        tail = worker.tail(_TAIL_CHARS) if worker is not None else _tail(log_path)
        result = _read_result(result_path)
        if worker is not None and pool is not None:  # kept for the next request only after a clean run
            pool.give_back(worker, overrun is None and result is not None and not result.retiring)
        self._refuse_if_stopped()  # a worker killed by stop(), not by its candidate: no verdict of it
        partial = result is None
        if partial:  # died: keep what its last checkpoint says (build, device, trials so far)
            result = _read_result(Path(request.result_path + ".partial"))
        crash = None
        if overrun is not None:
            crash = CrashReport(kind="timeout", phase=overrun[0], message=overrun[1], output_tail=tail,
                                signal="SIGKILL")
        elif partial:
            phases = _read_phases(phase_path)
            kind, sig = classify_exit(proc.returncode, tail)
            crash = CrashReport(
                kind=kind, phase=phases[-1][0] if phases else "start", exit_code=proc.returncode, signal=sig,
                message=f"the worker died ({sig or f'exit code {proc.returncode}'}) without a result",
                output_tail=tail,
            )
        elif result is not None and result.crash is not None:
            result.crash.output_tail = tail
        return WorkerOutcome(result, crash, tail, asked, ended, warm)

    @property
    def prewarm(self) -> bool:
        """Keep warm workers (verify/workers.py): on a GPU, where torch and the CUDA context are
        most of a start; ``STITCHCUDA_PREWARM=0`` or ``1`` decides instead."""
        setting = os.environ.get("STITCHCUDA_PREWARM", "")
        return setting == "1" if setting in ("0", "1") else self.gpu is not None

    def _pool(self, hide_gpu: bool) -> WorkerPool:
        with self._pools_lock:
            self._refuse_if_stopped()
            if hide_gpu not in self._pools:
                profile = ("--profile",) if self.config.profile and not hide_gpu else ()
                self._pools[hide_gpu] = WorkerPool(self._env(hide_gpu), args=profile)
            return self._pools[hide_gpu]

    def harness_pool(self, checkout: str | None) -> WorkerPool | None:
        """Warm KernelBench harness processes for ``checkout`` where workers are kept warm."""
        if not self.prewarm or not checkout:
            return None
        key = str(Path(checkout).expanduser().resolve())
        with self._pools_lock:
            self._refuse_if_stopped()
            if key not in self._harness_pools:
                self._harness_pools[key] = second_opinion.harness_pool(self._env(hide_gpu=False))
            return self._harness_pools[key]

    def warm_up(self) -> None:
        """Start a worker now, unless one waits: a fresh process (a Ray task, the bench's first job)
        then pays the worker's start and CUDA context while it captures and builds, not at its
        first verification."""
        if self.prewarm:
            self._pool(False).warm_up(1)

    def close(self) -> None:
        """Stop the warm workers (they also exit when this process does: their stdin closes)."""
        with self._pools_lock:
            pools = [*self._pools.values(), *self._harness_pools.values()]
            self._pools, self._harness_pools = {}, {}
        for pool in pools:
            pool.close()

    def stop(self) -> None:
        """Stop for good, as an interrupted bench does: every worker is killed, the busy ones too, and
        none starts again. A verification in flight, and any asked for after, raises
        :class:`WorkersStopped` (a killed worker's verdict would say nothing of its candidate)."""
        with self._pools_lock:
            self._stopped = True
            pools = [*self._pools.values(), *self._harness_pools.values()]
            self._pools, self._harness_pools = {}, {}
            spawned = list(self._spawned)
        for pool in pools:
            pool.stop()
        for proc in spawned:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)

    def _refuse_if_stopped(self) -> None:
        if self._stopped:
            raise WorkersStopped("the workers were stopped (an interrupt): nothing more is verified here")

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _request(self, mode: str, workdir: Path, candidate_path: Path, reference_path: Path | None = None,
                 cached: dict[str, BaselineTiming] | None = None) -> WorkerRequest:
        return WorkerRequest(
            mode=mode,  # type: ignore[arg-type]
            reference_path=str(reference_path) if reference_path else None,
            candidate_path=str(candidate_path),
            config=self.config,
            device=self._worker_device(),
            cache_root=str(self.cache),
            cached_baselines=cached or {},
            result_path=str(workdir / f"result-{mode}.json"),
            phase_path=str(workdir / f"phases-{mode}"),
            gate_path=self.gate_path,
        )

    # -- public API -------------------------------------------------------------------------------

    def build(self, candidate: Candidate) -> BuildReport:
        """Build a candidate's extensions into the cache, GPU hidden; returns its build report."""
        with tempfile.TemporaryDirectory(prefix=temp_prefix("build")) as tmp:
            workdir = Path(tmp)
            path = workdir / "candidate.py"
            path.write_text(candidate.source)
            outcome = self._spawn(self._request("build", workdir, path), workdir, hide_gpu=True,
                                  run_limit=self.config.build_timeout_s)
        # KernelBench's harness loads these same extensions from the cache (verify/second_opinion.py)
        return outcome.result.build if outcome.result else BuildReport()

    def judge_build(self, task: Task, candidate: Candidate, report: BuildReport, seconds: float) -> Verdict:
        """The verdict on a candidate whose build already failed (in :meth:`build`): nothing runs,
        and nvcc is not asked the same question again."""
        wall = WallTimes(build_s=seconds, total_s=seconds)
        verdict = judge(task, candidate, self.config, WorkerResult(build=report), wall=wall,
                        static=static_findings(candidate.source))
        verdict.feedback = feedback_for(verdict)
        return verdict

    def prebuild(self, candidates: Sequence[Candidate]) -> list[BuildReport]:
        """Build many candidates in parallel on CPU cores, before any of them needs the GPU."""
        buildable = []
        for c in candidates:
            try:
                check_candidate_source(c.source)
                buildable.append(c)
            except TaskError:
                continue  # its verdict will say why
        with ThreadPoolExecutor(max_workers=self._build_jobs()) as pool:
            return list(pool.map(self.build, buildable))

    def verify(self, task: Task, candidate: Candidate, on_phase: Callable[[str], None] | None = None,
               alone: bool = False) -> Verdict:
        """Verify one candidate in a fresh worker; ``on_phase`` hears each phase as it starts.
        ``alone``: its trials too take the GPU gate's exclusive section (a second try after it ran
        out of memory beside others)."""
        self.require_device()
        started = time.time()
        try:
            check_candidate_source(candidate.source, label=f"candidate {candidate.name}")
        except TaskError as exc:
            return judge(task, candidate, self.config, None, static_error=str(exc),
                         wall=WallTimes(total_s=time.time() - started))
        checked = time.time()
        static = static_findings(candidate.source)
        checks_s = time.time() - checked
        cached = self._cached_baselines(task)
        cached_profile = self._cached_profile(task)
        with tempfile.TemporaryDirectory(prefix=temp_prefix("verify")) as tmp:
            workdir = Path(tmp)
            ref_path, cand_path = workdir / "reference.py", workdir / "candidate.py"
            ref_path.write_text(task.source)
            cand_path.write_text(candidate.source)
            request = self._request("verify", workdir, cand_path, ref_path, cached)
            request.cached_reference_profile = cached_profile
            request.gate_alone = alone
            outcome = self._spawn(request, workdir, hide_gpu=False, run_limit=self.config.worker_limit_s(cached),
                                  on_phase=on_phase)
            phases = _read_phases(Path(request.phase_path))
            result = outcome.result
            if result is not None and result.reference_error:  # the user's file, not our copy of it
                result.reference_error = result.reference_error.replace(str(ref_path), label_of(task))
            if result is not None and result.measured_baselines:
                self._store_baselines(task, {**cached, **result.measured_baselines})
            if result is not None and result.reference_profile is not None and cached_profile is None:
                self._store_profile(task, result.reference_profile)
            wall = WallTimes()
            if result is not None:
                wall.worker_start_s = max(result.ready_at - outcome.spawned_at, 0.0) if result.ready_at else 0.0
                wall.spawn_s = max(result.started_at - outcome.spawned_at, 0.0) if result.started_at else 0.0
                wall.cuda_init_s = result.cuda_init_s
                wall.warm_start = outcome.warm
                wall.baselines_s = result.baselines_s
                wall.build_s = _build_seconds(phases, outcome.ended_at)
                wall.reference_s = result.reference_s
                wall.construct_s = result.construct_s
                wall.correctness_s = result.correctness_s
                wall.timing_s = result.timing_s
                wall.profile_s = result.profile_s
                wall.weights_trial_s = result.weights_trial_s
                wall.fp64_s = result.fp64_s
                wall.gpu_wait_s = result.gate.waited_s
                wall.gpu_shared_s, wall.gpu_exclusive_s = result.gate.shared_s, result.gate.exclusive_s
                wall.gpu_intervals = list(result.gate.intervals)
            judged = time.time()
            verdict = judge(task, candidate, self.config, result, crash=outcome.crash, wall=wall, static=static)
            wall.checks_s = checks_s + time.time() - judged
            if self.config.ncu and verdict.correct and self.config.device.startswith("cuda"):
                if on_phase is not None:
                    on_phase("ncu")
                verdict.counters = self._counters(workdir, ref_path, cand_path, verdict.profile)
                wall.ncu_s = verdict.counters.seconds
        if verdict.counters.status != "ok" and verdict.timing is not None:
            roof = verdict.reference_profile.roofline if verdict.reference_profile else None
            verdict.counters.estimate = nsight.timing_estimate(verdict.profile, roof, verdict.timing.candidate.median_ms)
        if self.config.kernelbench_harness:  # after ours, in its own process; ours stands whatever it says
            if on_phase is not None:
                on_phase("KernelBench's harness")
            verdict.second_opinion = second_opinion.for_verifier(
                self, task.source, candidate.source, verdict.correct,
                clean=verdict.correct and verdict.hacking.level == "none")
            if verdict.second_opinion.speedup is not None:  # KernelBench's own, beside ours
                verdict.speedup["kernelbench"] = verdict.second_opinion.speedup
            add_second_opinion(wall, verdict.second_opinion)
        verdict.feedback = feedback_for(verdict)
        wall.total_s = time.time() - started
        verdict.wall = wall
        return verdict

    def _counters(self, workdir: Path, ref_path: Path, cand_path: Path,
                  profile: ProgramProfile | None) -> CounterReport:
        """The candidate's top kernels under Nsight Compute, in one more worker run under ``ncu``."""
        ncu = machine.cuda_tool("ncu")
        if ncu is None:
            return CounterReport(status="unavailable", detail="Nsight Compute (ncu) is not installed here; bound "
                                 "labels fall back to timing-based roofline estimates")
        log = workdir / "ncu.csv"
        request = self._request("counters", workdir, cand_path, ref_path)
        started = time.time()
        outcome = self._spawn(request, workdir, hide_gpu=False, run_limit=self.config.ncu_timeout_s,
                              prefix=nsight.ncu_command(ncu, log))
        seconds = round(time.time() - started, 2)
        crash = outcome.crash or (outcome.result.crash if outcome.result else None)
        if crash is not None:
            why = _last_line(crash.message)
            return CounterReport(status="failed", seconds=seconds,
                                 detail=f"the ncu pass ended with {crash.kind} during {crash.phase}: {why}")
        text = log.read_text(errors="replace") if log.exists() else ""
        origin_of = {k.name: k.origin for k in profile.kernels} if profile else {}
        report = nsight.report_from_log(text + "\n" + outcome.output_tail, origin_of, self.config.ncu_kernels)
        report.seconds = seconds
        return report

    def profile(self, task: Task) -> WorkerResult:
        """The reference alone under the profiler (``stitchcuda profile``), in a worker."""
        self.require_device()
        with tempfile.TemporaryDirectory(prefix=temp_prefix("profile")) as tmp:
            workdir = Path(tmp)
            ref_path = workdir / "reference.py"
            ref_path.write_text(task.source)
            request = self._request("profile", workdir, ref_path, ref_path)
            outcome = self._spawn(request, workdir, hide_gpu=False, run_limit=self.config.timeout_s)
        result = outcome.result or WorkerResult()
        if outcome.crash is not None:
            result.crash = outcome.crash
        if result.reference_error:
            result.reference_error = result.reference_error.replace(str(ref_path), label_of(task))
        return result

    def verify_static(self, task: Task, candidate: Candidate) -> Verdict:
        """Only the static hacking checks: no build, no GPU, nothing of the candidate runs."""
        try:
            check_candidate_source(candidate.source, label=f"candidate {candidate.name}")
            error = None
        except TaskError as exc:
            error = str(exc)
        return judge_static(task, candidate, self.config, static_findings(candidate.source), error)

    def verify_many(self, pairs: Sequence[tuple[Task, Candidate]]) -> list[Verdict]:
        """Prebuild all candidates in parallel, then verify one at a time on the GPU."""
        self.prebuild([c for _, c in pairs])
        return [self.verify(task, cand) for task, cand in pairs]

    # -- baseline cache -----------------------------------------------------------------------------

    def _baseline_path(self, task: Task) -> Path | None:
        if not self.config.baseline_cache or self.gpu is None:
            return None
        # the rule's version and the trial count: a cached baseline's pass/fail was judged on the trials' inputs
        key = hashlib.sha256(json.dumps(
            [task.sha256, self.gpu.name, machine.torch_version(), self.config.seed, self.config.trials,
             BASELINE_RULES], sort_keys=True,
        ).encode()).hexdigest()[:24]
        return self.cache / "baselines" / f"{key}.json"

    def _profile_path(self, task: Task) -> Path | None:
        path = self._baseline_path(task)
        return path.parent.parent / "profiles" / path.name if path else None

    def _cached_profile(self, task: Task) -> ProgramProfile | None:
        path = self._profile_path(task)
        try:
            return ProgramProfile.model_validate_json(path.read_text()) if path and path.exists() else None
        except (OSError, ValueError):
            return None

    def _store_profile(self, task: Task, profile: ProgramProfile) -> None:
        path = self._profile_path(task)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(profile.model_dump_json())
        tmp.replace(path)

    def _cached_baselines(self, task: Task) -> dict[str, BaselineTiming]:
        path = self._baseline_path(task)
        if path is None or not path.exists():
            return {}
        try:
            raw = json.loads(path.read_text())
            return {name: BaselineTiming.model_validate(value) for name, value in raw.items()}
        except (OSError, ValueError):
            return {}

    def _store_baselines(self, task: Task, baselines: dict[str, BaselineTiming]) -> None:
        path = self._baseline_path(task)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        usable = {k: v.model_copy(update={"cached": False}).model_dump() for k, v in baselines.items() if v.settled}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(usable, indent=1))
        tmp.replace(path)


def add_second_opinion(wall: WallTimes, opinion: Any) -> None:
    """Count KernelBench's harness run in a verification's (or a task's) wall times."""
    wall.second_opinion = {k: wall.second_opinion.get(k, 0.0) + v for k, v in opinion.stages.items()}
    wall.gpu_wait_s += opinion.stages.get("gpu_wait", 0.0)
    wall.gpu_intervals = [*wall.gpu_intervals, *opinion.gpu_intervals]


def _read_result(path: Path) -> WorkerResult | None:
    try:
        return WorkerResult.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and everything it started (ninja, nvcc, ...)
    proc.wait()
