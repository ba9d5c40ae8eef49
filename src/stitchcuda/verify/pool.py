"""Verifiers sharing GPUs: a gated Verifier, and a pool of them.

The GPU gate (:mod:`stitchcuda.verify.gate`) is taken by the processes that use the GPU, around
exactly their GPU work: a worker's trials in its shared section, beside other workers' trials; its
timing and profile in the exclusive section, alone. A :class:`GatedVerifier` builds a candidate
first, on CPU cores with the GPU hidden (the worker's own build is then a cache hit), and hands
its workers the gate; a failed build never reaches the GPU. A :class:`VerifierPool` spreads many
verifications over ``runs_per_gpu`` gated verifiers per device, in threads or as Ray tasks. The
bench (one job per task) and GRPO's rewards (one verification per completion) both verify through
these.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from stitchcuda import machine
from stitchcuda.task.inspect import TaskError, check_candidate_source
from stitchcuda.task.record import Candidate, Task
from stitchcuda.verify.config import VerifyConfig
from stitchcuda.verify.gate import GpuGate, busy_seconds
from stitchcuda.verify.judge import judge
from stitchcuda.verify.runner import Verifier
from stitchcuda.verify.verdict import Verdict

__all__ = ["GatedVerifier", "GateStats", "GpuGate", "RayStartError", "VerifierPool", "busy_seconds", "default_gpus",
           "start_ray"]


def default_gpus() -> list[str]:
    """Every GPU this process may use (``CUDA_VISIBLE_DEVICES``, else nvidia-smi's list)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = len([v for v in visible.split(",") if v.strip()]) if visible is not None else len(machine.gpus())
    return [f"cuda:{i}" for i in range(count)]


class RayStartError(ValueError):
    """Ray could not start its local cluster or join the one named: the machine's setting, not a bug."""


def start_ray(address: str) -> None:
    """Start Ray's local cluster (``address`` "local") or join the cluster at ``address``, once per
    process; :class:`RayStartError` with Ray's own reason where it cannot."""
    try:
        import ray  # optional (stitchcuda[ray]): only work asked to run on Ray needs it
    except ImportError:
        raise RayStartError("--ray needs Ray: pip install 'stitchcuda[ray]'") from None
    if ray.is_initialized():
        return
    where = "start its local cluster" if address == "local" else f"join the cluster at {address}"
    try:
        ray.init(address=None if address == "local" else address, ignore_reinit_error=True, log_to_driver=False)
    except Exception as exc:  # a binary it cannot run, a port in use, an address nobody answers at
        raise RayStartError(f"Ray could not {where}: {type(exc).__name__}: {str(exc)[:400]}") from None


class GateStats(BaseModel):
    verifications: int = 0
    builds: int = Field(0, description="extensions the builds loaded or made")
    builds_cached: int = Field(0, description="of which the build cache already held")
    build_s: float = 0.0
    wait_s: float = Field(0.0, description="waiting at the GPU gate (the second opinion's waits included)")
    gpu_s: float = Field(0.0, description="inside the gate's sections, shared or exclusive")
    profile_s: float = Field(0.0, description="the Planner's profile of the reference, its worker's start included")
    phases: dict[str, float] = Field({}, description="the verifications' wall time by phase (WallTimes.split), summed")
    second_opinion: dict[str, float] = Field({}, description="KernelBench's harness runs by stage, summed")
    gpu_intervals: list[tuple[float, float]] = Field([], description="(start, end) unix times its work used the GPU")


class GatedVerifier:
    """A :class:`~stitchcuda.verify.Verifier` whose workers take ``gate`` around their GPU work;
    everything else is the wrapped verifier's. ``build_first``: build in a separate GPU-hidden
    worker before the verification (worth its extra process start only when others share the GPU).
    A candidate that ran out of GPU memory while it shared the GPU is verified again alone: the
    memory may have been another's."""

    def __init__(self, inner: Any, gate: GpuGate, build_first: bool = True):
        self.inner, self.gate, self.stats, self.build_first = inner, gate, GateStats(), build_first
        inner.gate_path = str(gate.path)
        self._lock = threading.Lock()
        self.prebuilt: dict[str, Any] = {}  # candidate sha256 -> the BuildReport a build pool already made

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def verify(self, task: Task, candidate: Any, on_phase: Callable[[str], None] | None = None) -> Any:
        started = time.time()
        report = None
        try:
            check_candidate_source(candidate.source)
            report = self.prebuilt.get(candidate.sha256)
            if report is None and self.build_first:
                report = self.inner.build(candidate)
        except TaskError:
            pass  # its verdict says why
        built = time.time()
        if report is not None and report.extensions and not report.ok:  # nothing to run, nothing to rebuild
            verdict = self.inner.judge_build(task, candidate, report, built - started)
            self._count(built - started, report, verdict)
            return verdict
        verdict = self.inner.verify(task, candidate, on_phase)
        if _ran_out_of_memory(verdict):
            verdict = self.inner.verify(task, candidate, on_phase, alone=True)
        if getattr(verdict, "wall", None) is not None:  # the build worker's time is the verification's build
            verdict.wall.build_s += built - started
            verdict.wall.total_s += built - started
        self._count(built - started, report, verdict)
        return verdict

    def profile(self, task: Task) -> Any:
        started = time.time()
        result = self.inner.profile(task)
        with self._lock:
            self.stats.profile_s += time.time() - started - result.gate.waited_s  # the wait is gpu_wait's
            self.stats.wait_s += result.gate.waited_s
            self.stats.gpu_s += result.gate.shared_s + result.gate.exclusive_s
            self.stats.gpu_intervals += result.gate.intervals
        return result

    def _count(self, build: float, report: Any, verdict: Any) -> None:
        wall = getattr(verdict, "wall", None)
        split = wall.split() if wall is not None else {}
        extensions = (report.extensions if report is not None else []) or (
            verdict.build.extensions if getattr(verdict, "build", None) is not None else [])
        with self._lock:
            self.stats.verifications += 1
            self.stats.build_s += build
            self.stats.builds += len(extensions)
            self.stats.builds_cached += sum(e.cache_hit for e in extensions)
            if wall is not None:
                self.stats.wait_s += wall.gpu_wait_s
                self.stats.gpu_s += wall.gpu_shared_s + wall.gpu_exclusive_s
                self.stats.gpu_intervals += wall.gpu_intervals
            for phase, seconds in split.items():
                self.stats.phases[phase] = self.stats.phases.get(phase, 0.0) + seconds
            for stage, seconds in (wall.second_opinion if wall is not None else {}).items():
                self.stats.second_opinion[stage] = self.stats.second_opinion.get(stage, 0.0) + seconds

    def count_second_opinion(self, opinion: Any) -> None:
        """A second opinion asked outside a verification (an optimize run's best program)."""
        with self._lock:
            for stage, seconds in opinion.stages.items():
                self.stats.second_opinion[stage] = self.stats.second_opinion.get(stage, 0.0) + seconds
            self.stats.wait_s += opinion.stages.get("gpu_wait", 0.0)
            self.stats.gpu_intervals += opinion.gpu_intervals


def _ran_out_of_memory(verdict: Any) -> bool:
    crash = getattr(verdict, "crash", None)
    return crash is not None and crash.kind == "oom"


class VerifierPool:
    """Verifies candidates concurrently: ``runs_per_gpu`` at a time per device, one on the GPU;
    or, with ``ray`` set (an address, or ``local`` for a fresh cluster), as Ray tasks with a share
    of one GPU each (``max_retries=0``: a crash is a verdict, never retried)."""

    def __init__(self, config: VerifyConfig, workspace: Path, devices: list[str] | None = None,
                 runs_per_gpu: int = 2, ray: str | None = None):
        devices = devices or default_gpus() or ["cpu"]
        self.base, self.workspace, self.runs_per_gpu, self.ray = config, workspace, runs_per_gpu, ray
        self.ray_device = "cpu" if devices == ["cpu"] else "cuda:0"  # a Ray task sees its own GPU as 0
        self.slots: list[GatedVerifier] = []
        for device in devices:
            verifier = Verifier(config.model_copy(update={"device": device}))
            gate = GpuGate(device, workspace / "gpu-locks")
            self.slots += [GatedVerifier(verifier, gate, build_first=runs_per_gpu > 1) for _ in range(runs_per_gpu)]
        self._next = 0
        self._lock = threading.Lock()
        self.executor = ThreadPoolExecutor(max_workers=len(self.slots))

    def verify_all(self, pairs: list[tuple[Task, Candidate]]) -> list[Verdict]:
        if self.ray:
            return self._on_ray(pairs)

        def one(i: int) -> Verdict:
            with self._lock:
                slot = self.slots[self._next % len(self.slots)]
                self._next += 1
            return slot.verify(*pairs[i])

        return list(self.executor.map(one, range(len(pairs))))

    def _on_ray(self, pairs: list[tuple[Task, Candidate]]) -> list[Verdict]:
        start_ray(self.ray)  # Ray missing or unable to start: a clear message, before anything runs
        import ray
        remote = ray.remote(num_gpus=1.0 / self.runs_per_gpu, num_cpus=1, max_retries=0)(_ray_verify)
        config = self.base.model_copy(update={"device": self.ray_device}).model_dump_json()
        refs = [remote.remote(t.model_dump_json(), c.model_dump_json(), config, str(self.workspace)) for t, c in pairs]
        out = []
        for (task, cand), ref in zip(pairs, refs, strict=True):
            try:
                out.append(Verdict.model_validate_json(ray.get(ref)))
            except Exception as exc:  # the worker process died: a verdict that says so, worth nothing
                out.append(judge(task, cand, self.base, None, static_error=f"the Ray worker died: {exc}"))
        return out


_RAY_VERIFIERS: dict[str, Verifier] = {}  # one per configuration in a Ray worker process: its workers stay warm


def _ray_verify(task_json: str, candidate_json: str, config_json: str, workspace: str) -> str:
    config = VerifyConfig.model_validate_json(config_json)
    if config_json not in _RAY_VERIFIERS:
        _RAY_VERIFIERS[config_json] = Verifier(config)
    inner = _RAY_VERIFIERS[config_json]
    verifier = GatedVerifier(inner, GpuGate(config.device, Path(workspace) / "gpu-locks"))
    return verifier.verify(Task.model_validate_json(task_json), Candidate.model_validate_json(candidate_json)) \
        .model_dump_json()
