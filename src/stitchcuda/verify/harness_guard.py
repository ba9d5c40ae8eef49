"""Run-time guards around candidate code: the harness's own functions stay the harness's own,
and no thread the candidate starts keeps working behind the timer's back.

Identities are taken before the candidate is imported; every check compares and puts the
originals back, so a patch never reaches a measurement even when it is reported.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch

from stitchcuda.verify.verdict import Finding


def _guarded() -> dict[str, tuple[Any, str]]:
    """name -> (owner object, attribute) of everything timing and checking relies on."""
    return {
        "torch.cuda.synchronize": (torch.cuda, "synchronize"),
        "torch.cuda.Event": (torch.cuda, "Event"),
        "torch.cuda.Event.record": (torch.cuda.Event, "record"),
        "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
        "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
        "torch.cuda.current_stream": (torch.cuda, "current_stream"),
        "torch.cuda.Stream.synchronize": (torch.cuda.Stream, "synchronize"),
        "torch.cuda.empty_cache": (torch.cuda, "empty_cache"),
        "torch.allclose": (torch, "allclose"),
        "torch.equal": (torch, "equal"),
        "torch.isclose": (torch, "isclose"),
        "torch.Tensor.to": (torch.Tensor, "to"),
        "torch.Tensor.clone": (torch.Tensor, "clone"),
        "torch.Tensor.cpu": (torch.Tensor, "cpu"),
        "torch.nn.Module.__call__": (torch.nn.Module, "__call__"),
        "time.perf_counter": (time, "perf_counter"),
        "time.time": (time, "time"),
    }


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


class HarnessGuard:
    def __init__(self) -> None:
        self.originals = {name: getattr(owner, attr) for name, (owner, attr) in _guarded().items()}
        self.threads = {t.ident for t in threading.enumerate()}
        self.native_threads = _native_threads()
        self.reported: set[str] = set()

    def check(self, where: str, threads: bool = True) -> list[Finding]:
        """Findings for replaced functions and new threads since construction; restores functions.
        ``threads=False`` once our own baselines (torch.compile's workers) may have started some."""
        found = []
        for name, (owner, attr) in _guarded().items():
            if getattr(owner, attr) is not self.originals[name]:
                setattr(owner, attr, self.originals[name])
                if name not in self.reported:
                    self.reported.add(name)
                    found.append(Finding(check="harness_patching", level="total",
                                         detail=f"{name} was replaced ({where}); the original was put back"))
        if not threads:
            return found
        alive = [t for t in threading.enumerate() if t.ident not in self.threads and t.is_alive()]
        if alive and "threads" not in self.reported:
            self.reported.add("threads")
            names = ", ".join(t.name for t in alive[:3])
            found.append(Finding(check="threads", level="total",
                                 detail=f"{len(alive)} Python thread(s) of the candidate still running ({where}): {names}"))
        native = _native_threads() - self.native_threads
        if native > 0 and "native_threads" not in self.reported and not alive:
            self.reported.add("native_threads")
            found.append(Finding(check="native_threads", level="none",
                                 detail=f"{native} more OS thread(s) than before the candidate ran ({where}); "
                                        "drivers and libraries start some, so this alone is not a hack"))
        return found
