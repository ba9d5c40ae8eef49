"""Verifiers sharing GPUs: the GPU gate, a gated Verifier, and a pool of them.

A :class:`GpuGate` is an flock on a file named after the physical GPU, so it holds across
threads, processes and Ray workers of one node: only its holder uses the GPU. A
:class:`GatedVerifier` builds a candidate first, on CPU cores with the GPU hidden, and takes the
gate only for the verification proper (correctness, timing, profile; the build is then a cache
hit), so one job builds while another holds the GPU, and a failed build never takes the gate.
A :class:`VerifierPool` spreads many verifications over ``runs_per_gpu`` gated verifiers per
device, in threads or as Ray tasks. The bench (one job per task) and GRPO's rewards (one
verification per completion) both verify through these.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from stitchcuda import machine
from stitchcuda.task.inspect import TaskError, check_candidate_source
from stitchcuda.task.record import Candidate, Task
from stitchcuda.verify.config import VerifyConfig
from stitchcuda.verify.judge import judge
from stitchcuda.verify.runner import Verifier
from stitchcuda.verify.verdict import Verdict


def default_gpus() -> list[str]:
    """Every GPU this process may use (``CUDA_VISIBLE_DEVICES``, else nvidia-smi's list)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = len([v for v in visible.split(",") if v.strip()]) if visible is not None else len(machine.gpus())
    return [f"cuda:{i}" for i in range(count)]


class GpuGate:
    """Exclusive use of one physical GPU for the timed part of a verification. An flock on a
    file named after the GPU, so jobs in threads, processes and Ray workers of a node share it."""

    def __init__(self, device: str, root: Path):
        gpu = machine.physical_gpu(device) if device.startswith("cuda") else None
        key = f"gpu{gpu.index}" if gpu is not None else device.replace(":", "")
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f"{key}.lock"

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with open(self.path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


class GateStats(BaseModel):
    verifications: int = 0
    build_s: float = 0.0
    wait_s: float = Field(0.0, description="built, waiting for the GPU")
    gpu_s: float = Field(0.0, description="holding the GPU")
    phases: dict[str, float] = Field({}, description="the verifications' wall time by phase (WallTimes.split), summed")


class GatedVerifier:
    """A :class:`~stitchcuda.verify.Verifier` whose GPU work goes through a :class:`GpuGate`;
    everything else is the wrapped verifier's. ``build_first``: build in a separate GPU-hidden
    worker before taking the gate (worth its extra process start only when others share the GPU)."""

    def __init__(self, inner: Any, gate: GpuGate, build_first: bool = True):
        self.inner, self.gate, self.stats, self.build_first = inner, gate, GateStats(), build_first
        self._lock = threading.Lock()
        self.prebuilt: dict[str, Any] = {}  # candidate sha256 -> the BuildReport a build pool already made

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def verify(self, task: Task, candidate: Any, on_phase: Callable[[str], None] | None = None) -> Any:
        started = time.time()
        built_ok = True
        try:
            check_candidate_source(candidate.source)
            report = self.prebuilt.get(candidate.sha256)
            if report is None and self.build_first:
                report = self.inner.build(candidate)
            built_ok = report is None or all(e.ok for e in report.extensions)  # no extension: nothing to build
        except TaskError:
            built_ok = False
        built = time.time()
        if not built_ok:  # it fails in its build phase: no GPU work, no gate
            verdict = self.inner.verify(task, candidate, on_phase)
            self._count(built - started, 0.0, 0.0, verdict)
            return verdict
        with self.gate.hold():
            held = time.time()
            verdict = self.inner.verify(task, candidate, on_phase)
        self._count(built - started, held - built, time.time() - held, verdict)
        return verdict

    def profile(self, task: Task) -> Any:
        with self.gate.hold():
            return self.inner.profile(task)

    def _count(self, build: float, wait: float, gpu: float, verdict: Any = None) -> None:
        split = verdict.wall.split() if getattr(verdict, "wall", None) is not None else {}
        with self._lock:
            self.stats.verifications += 1
            self.stats.build_s += build
            self.stats.wait_s += wait
            self.stats.gpu_s += gpu
            for phase, seconds in split.items():
                self.stats.phases[phase] = self.stats.phases.get(phase, 0.0) + seconds


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
        import ray  # optional (stitchcuda[ray]): only a pool asked to run on Ray needs it

        if not ray.is_initialized():
            ray.init(address=None if self.ray == "local" else self.ray, log_to_driver=False)
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


def _ray_verify(task_json: str, candidate_json: str, config_json: str, workspace: str) -> str:
    config = VerifyConfig.model_validate_json(config_json)
    verifier = GatedVerifier(Verifier(config), GpuGate(config.device, Path(workspace) / "gpu-locks"))
    return verifier.verify(Task.model_validate_json(task_json), Candidate.model_validate_json(candidate_json)) \
        .model_dump_json()
