"""Warm worker processes, kept between verifications.

A worker's start is a Python interpreter, torch and the CUDA context: seconds, paid per candidate
when every candidate gets a fresh process. A :class:`WorkerPool` keeps its workers instead: each
serves one candidate at a time and, after a clean run, forgets it (modules, models, cached GPU
memory) and waits for the next. Isolation holds as it did for fresh processes: a worker retires
(exits) after any crash, CUDA error, hacking finding, changed torch flag or failed build, after
keeping GPU memory alive past its candidate, and after serving ``MAX_SERVED`` candidates (see
:mod:`stitchcuda.verify.worker`); a worker that overran its limit is killed with its process group.

A worker says it is ready by writing how many requests it has served to its ready file; the pool
hands it a request only then, so no request ever goes to a worker that is still cleaning up or
about to exit. A pool is one environment (GPU shown or hidden, the profiler's warm-up or not): the
orchestrator keeps one per kind of worker it starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

WORKER = "stitchcuda.verify.worker"
# a warm process serves this many requests, then a fresh one takes over (what leaks, leaks for a while only)
MAX_SERVED = 40
# GPU memory still allocated after a request and its models are gone: kept alive by the candidate
LEFT_BEHIND_BYTES = 256 << 20
_POLL_S = 0.02
READY_LIMIT_S = 180.0  # a worker not ready this long after its start or its last request is stopped


@dataclass
class WarmWorker:
    """One worker process, its folder (cwd, log, ready file) and how many requests it was handed."""

    proc: subprocess.Popen
    folder: Path
    handed: int = 0
    log_offsets: list[int] = field(default_factory=list)
    since: float = field(default_factory=time.time)  # started, or given back after a request

    @property
    def log_path(self) -> Path:
        return self.folder / "worker.log"

    @property
    def ready_path(self) -> Path:
        return self.folder / "ready"

    @classmethod
    def start(cls, env: dict[str, str], module: str = WORKER, args: tuple[str, ...] = ()) -> WarmWorker:
        """``python -m MODULE --standby --ready FILE ARGS...``: a process that reads request paths
        from stdin, writes each result where its request says, and its count to FILE when ready."""
        folder = Path(tempfile.mkdtemp(prefix=temp_prefix("worker")))
        command = [sys.executable, "-m", module, "--standby", "--ready", str(folder / "ready"), *args]
        with open(folder / "worker.log", "wb") as log:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, cwd=folder,
                                    env=env, start_new_session=True)
        return cls(proc, folder)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        """Waiting for a request: alive, and done with every request it was handed."""
        try:
            served = int(self.ready_path.read_text())
        except (OSError, ValueError):
            return False
        return served == self.handed and self.alive()

    def hand_over(self, request_path: Path) -> None:
        assert self.proc.stdin is not None
        self.handed += 1
        try:
            self.log_offsets.append(self.log_path.stat().st_size)
        except OSError:
            self.log_offsets.append(0)
        with contextlib.suppress(BrokenPipeError, OSError):  # it died: the caller sees the exit status
            self.proc.stdin.write(f"{request_path}\n".encode())
            self.proc.stdin.flush()

    def tail(self, chars: int) -> str:
        """The end of what it printed for its current request."""
        start = self.log_offsets[-1] if self.log_offsets else 0
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(size - chars, start))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and whatever it started
        self.proc.wait()
        self.discard()

    def discard(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class WorkersStopped(RuntimeError):
    """A request to a pool whose workers were stopped (its bench was interrupted)."""


class WorkerPool:
    """Warm workers of one environment and one kind (``module``: the verification worker, or
    KernelBench's harness process). :meth:`take` gives a ready worker (or starts one, warm from
    then on); :meth:`give_back` keeps it for the next request when it can serve one."""

    def __init__(self, env: dict[str, str], module: str = WORKER, args: tuple[str, ...] = ()):
        self.env, self.module, self.args = env, module, args
        self._idle: list[WarmWorker] = []  # ready, or starting, or cleaning up after a request
        self._waiting = 0  # callers of take() not served yet
        self._busy: dict[int, WarmWorker] = {}  # taken, not given back yet, by id
        self._lock = threading.Lock()
        self._stopped = False
        self.started = 0

    def take(self) -> tuple[WarmWorker, bool]:
        """(a ready worker, whether it was warm: started before this request). Every caller waiting
        has a worker starting for it: jobs that ask at once (a bench's first tasks, each profiling
        its reference) wait for one start each, side by side, not for one start after another."""
        asked = time.time()
        with self._lock:
            self._waiting += 1
        served = False
        try:
            while True:
                with self._lock:
                    if self._stopped:
                        raise WorkersStopped("the workers were stopped: nothing more is verified here")
                    for worker in list(self._idle):
                        if not worker.alive():
                            self._idle.remove(worker)
                            worker.stop()
                        elif worker.ready():
                            self._idle.remove(worker)
                            self._waiting -= 1  # with the worker, under one lock: no start for a caller served
                            self._busy[id(worker)] = worker
                            served = True
                            return worker, worker.since < asked
                        elif time.time() - worker.since > READY_LIMIT_S:  # stuck starting or cleaning up
                            self._idle.remove(worker)
                            worker.stop()
                    if len(self._idle) < self._waiting:
                        self._idle.append(WarmWorker.start(self.env, self.module, self.args))
                        self.started += 1
                time.sleep(_POLL_S)
        finally:
            if not served:
                with self._lock:
                    self._waiting -= 1

    def give_back(self, worker: WarmWorker, reusable: bool) -> None:
        with self._lock:
            self._busy.pop(id(worker), None)
            keep = reusable and not self._stopped and worker.alive()
            if keep:
                worker.since = time.time()
                self._idle.append(worker)
        if not keep:
            worker.stop()

    def warm_up(self, count: int = 1) -> None:
        """Start workers until ``count`` are idle (ready or getting ready)."""
        with self._lock:
            if self._stopped:
                return
            missing = count - len([w for w in self._idle if w.alive()])
            self._idle += [WarmWorker.start(self.env, self.module, self.args) for _ in range(max(missing, 0))]
            self.started += max(missing, 0)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()

    def stop(self) -> None:
        """Kill every worker, the busy ones too, and start none again: a request in flight ends as
        if its worker had died, and :meth:`take` raises :class:`WorkersStopped` from now on."""
        with self._lock:
            self._stopped = True
            busy = list(self._busy.values())
        for worker in busy:  # its caller sees it die, and gives it back to be cleared
            with contextlib.suppress(OSError):
                os.killpg(worker.proc.pid, signal.SIGKILL)
        self.close()


# --- the warm process's side -------------------------------------------------------------------


def temp_prefix(kind: str) -> str:
    """The prefix of a temporary folder this process owns: its PID in the name lets a later start
    tell a dead owner's folder (:func:`clear_stale_folders`)."""
    return f"stitchcuda-{kind}-{os.getpid()}-"


def _ours(folder: Path) -> bool:
    return folder.name.startswith("stitchcuda-") and folder.parent == Path(tempfile.gettempdir())


def clear_stale_folders() -> int:
    """Remove the temporary folders whose owner process is gone (a killed run's); how many."""
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob("stitchcuda-*-*-*"):
        owner = folder.name.split("-")[2]
        if not owner.isdigit() or not folder.is_dir():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        except OSError:  # alive, another user's
            pass
    return removed


def die_with_parent() -> None:
    """End this process, its process group (ninja, nvcc) and its temporary folders once the process
    that started it is gone: a worker of a killed run used to finish its build as an orphan and
    leave its folders behind. A thread polls the parent's PID (the parent-death signal would follow
    the thread that started the worker, and a bench starts them from threads that come and go)."""
    parent, home = os.getppid(), Path.cwd()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        for folder in {home, Path.cwd()}:
            if _ours(folder):
                shutil.rmtree(folder, ignore_errors=True)
        if os.getpgrp() == os.getpid():  # a session of its own: everything it started goes too
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def write_ready(path: str | None, served: int) -> None:
    """It has served ``served`` requests and waits for the next."""
    if path is not None:
        tmp = Path(path + ".tmp")
        tmp.write_text(str(served))
        tmp.replace(path)


def serve_requests(serve: Callable[[str, bool], bool], forget: Callable[[], bool], ready_path: str | None,
                   max_served: int = MAX_SERVED) -> None:
    """A warm process's loop: ``serve(request_path, last)`` for each path read from stdin (EOF:
    exit), then ``forget()`` what the request left, then say it is ready. It exits as soon as
    either says it must not serve another (``serve`` returned False: the request retired it;
    ``forget`` returned False: something stayed behind), and after ``max_served`` requests."""
    die_with_parent()
    served = 0
    write_ready(ready_path, served)
    while True:
        line = sys.stdin.readline().strip()
        if not line:
            os._exit(0)
        os.chdir(Path(line).parent)
        served += 1
        if not serve(line, served >= max_served or ready_path is None) or not forget():
            os._exit(0)
        write_ready(ready_path, served)


def gpu_memory_returned() -> bool:
    """The cached GPU memory given back after a request; True when almost none is left allocated."""
    import gc

    import torch

    gc.collect()
    if not torch.cuda.is_initialized():
        return True
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated() < LEFT_BEHIND_BYTES
