"""The offline Coder's compile of a task, in a process of its own: the user's code never runs in
ours.

Capturing a model runs its code (its constructor, one forward under torch.export) and is Python
from end to end. In the caller's process a forward that hangs would hang the command and one that
crashes it would crash it; in a bench's threads its tasks would also take turns on one
interpreter. Tasks are compiled instead in a pool of spawned processes, one task each at a time,
and the compiled task (its graph, fusion groups, lowerings and first program: picklable records)
comes back. ``optimize`` asks the same process to check the reference first (its inputs, Model
and one forward: :mod:`stitchcuda.task.probe`), so one torch import serves both, under one time
limit. A process that crashes is that task's refusal, one past its limit is killed; either way the
pool is made anew.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from stitchcuda import machine
from stitchcuda.agents.offline import OfflineCoder
from stitchcuda.compiler import Compiled
from stitchcuda.compiler.capture.graph import CaptureError
from stitchcuda.compiler.emit.codegen import Unsupported
from stitchcuda.task.inspect import TaskError
from stitchcuda.task.record import Task

_POOL: ProcessPoolExecutor | None = None
_PIDS: dict[int, Any] = {}  # id(pool) -> the queue its processes put their PIDs on as they start
_LOCK = threading.Lock()


def _processes() -> int:
    return max(1, min(8, machine.usable_cores() // 2))


def _start(pids: Any) -> None:
    from stitchcuda.torchvision_compat import make_torchvision_importable
    from stitchcuda.verify.workers import die_with_parent

    pids.put(os.getpid())  # so that the command can stop this process mid-task (the executor cannot)
    # Ctrl-C reaches the whole process group: the command stops this process itself (and a killed
    # command's process is gone, so this one goes too)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    machine.keep_off_timing_cores()
    make_torchvision_importable()  # the zoo's tasks import torchvision, a CUDA build beside a CPU torch


def _compile(task_json: str, tolerance: str, check: bool) -> tuple[str, bytes | str]:
    """In the pool's process: ("ok", the pickled Compiled), or ("unusable" | "capture" | "unsupported", why)."""
    task = Task.model_validate_json(task_json)
    if check:
        from stitchcuda.task.probe import check_here, label_of

        found = check_here(task.name, task.source, label_of(task))
        if found.problem:
            return "unusable", found.problem
    try:
        compiled = OfflineCoder.prepare(task, tolerance)
    except CaptureError as exc:
        return "capture", str(exc)
    except Unsupported as exc:
        return "unsupported", str(exc)
    return "ok", pickle.dumps(compiled)


def _discard(pool: ProcessPoolExecutor) -> None:
    """The pool's processes killed (one is stuck in a user's forward) and the pool made anew next time."""
    global _POOL
    with _LOCK:
        if _POOL is pool:
            _POOL = None
        pids = _PIDS.pop(id(pool), None)
    while pids is not None and not pids.empty():  # the executor has no way to stop a running task
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids.get(), signal.SIGKILL)
    pool.shutdown(wait=False, cancel_futures=True)


def stop_compiles() -> None:
    """Kill the compiles in flight (an interrupted bench): each waiting caller gets a CaptureError,
    and a later compile starts a new pool."""
    with _LOCK:
        pool = _POOL
    if pool is not None:
        _discard(pool)


def compile_apart(task: Task, tolerance: str, timeout_s: float | None = None, check: bool = False) -> Compiled:
    """The task compiled in the pool; raises CaptureError or Unsupported as :func:`compile_task`
    does, and TaskError where ``check`` finds the reference unusable or it ran past ``timeout_s``."""
    global _POOL
    with _LOCK:
        if _POOL is None:
            spawn = multiprocessing.get_context("spawn")
            pids = spawn.SimpleQueue()
            _POOL = ProcessPoolExecutor(_processes(), mp_context=spawn, initializer=_start, initargs=(pids,))
            _PIDS[id(_POOL)] = pids
        pool = _POOL
    try:
        kind, value = pool.submit(_compile, task.model_dump_json(), tolerance, check).result(timeout=timeout_s)
    except BrokenProcessPool:
        _discard(pool)
        raise CaptureError("the model crashed the process that captured it") from None
    except KeyboardInterrupt:
        _discard(pool)  # a capture left running would keep the interpreter from exiting
        raise
    except FutureTimeout:
        _discard(pool)
        from stitchcuda.task.probe import TIMEOUT_ENV

        raise TaskError(f"{task.path or task.name}: checking and capturing the reference did not finish within "
                        f"{timeout_s:g} s (its import, Model(...) and forward): a forward that never returns cannot "
                        f"be optimized (raise the limit with {TIMEOUT_ENV}=SECONDS if it is only slow)") from None
    if kind == "unusable":
        raise TaskError(str(value))
    if kind == "capture":
        raise CaptureError(str(value))
    if kind == "unsupported":
        raise Unsupported(str(value))
    return pickle.loads(value)  # noqa: S301 (our own records, from our own child process)
