"""The offline Coder's compile of a bench's tasks, in processes of their own.

A bench runs its jobs in threads of one process, and capturing a model is Python from end to end
(torch.export, then our IR): in threads its tasks would take turns on the interpreter, and
captures are serialised anyway (torch's default device is process-wide). A bench's tasks are
compiled instead in a pool of spawned processes, one task each at a time, and the compiled task
(its graph, fusion groups and lowerings, picklable records) comes back to the job's thread. A
capture that crashes its process (the user's model) is that task's refusal; the pool is made anew.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from stitchcuda.agents.offline import OfflineCoder
from stitchcuda.compiler import Compiled
from stitchcuda.compiler.capture.graph import CaptureError
from stitchcuda.compiler.emit.codegen import Unsupported
from stitchcuda.task.record import Task

_POOL: ProcessPoolExecutor | None = None
_LOCK = threading.Lock()


def _processes() -> int:
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def _start() -> None:
    from stitchcuda.torchvision_compat import make_torchvision_importable

    make_torchvision_importable()  # the zoo's tasks import torchvision, a CUDA build beside a CPU torch


def _compile(task_json: str, tolerance: str) -> tuple[str, bytes | str]:
    """In the pool's process: ("ok", the pickled Compiled), or ("capture" | "unsupported", why)."""
    task = Task.model_validate_json(task_json)
    try:
        compiled = OfflineCoder.prepare(task, tolerance)
    except CaptureError as exc:
        return "capture", str(exc)
    except Unsupported as exc:
        return "unsupported", str(exc)
    return "ok", pickle.dumps(compiled)


def compile_apart(task: Task, tolerance: str) -> Compiled:
    """The task compiled in the pool; raises CaptureError or Unsupported as :func:`compile_task` does."""
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = ProcessPoolExecutor(_processes(), mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_start)
        pool = _POOL
    try:
        kind, value = pool.submit(_compile, task.model_dump_json(), tolerance).result()
    except BrokenProcessPool:
        with _LOCK:
            if _POOL is pool:
                _POOL = None
        raise CaptureError("the model crashed the process that captured it") from None
    if kind == "capture":
        raise CaptureError(str(value))
    if kind == "unsupported":
        raise Unsupported(str(value))
    return pickle.loads(value)  # noqa: S301 (our own records, from our own child process)
