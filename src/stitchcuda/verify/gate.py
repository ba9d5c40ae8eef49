"""The GPU gate: who may use a GPU, and how, while others wait.

Timing needs the GPU alone; correctness trials only need it not to be timing for someone else. A
:class:`GpuGate` is a reader-writer lock over the processes of one machine (flocks on files named
after the physical GPU, so it holds across threads, processes and Ray workers of a node):

- ``shared`` sections (a reference's forward, correctness trials, the weights trial, KernelBench's
  correctness) run side by side;
- an ``exclusive`` section (timing, profiling, KernelBench's timing) runs alone.

A second file is the turnstile: a process that asks for the exclusive section holds it while it
waits, so shared sections asked for later queue behind it and timing is never starved by a stream
of correctness trials.

The processes that use the GPU take the gate themselves (the worker, KernelBench's harness), around
exactly their GPU work, through a :class:`GateClient`, which records how long they waited and when
they held it (the bench's "GPU busy" is the union of those intervals per GPU). Nothing here imports
torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel, Field

from stitchcuda import machine

Mode = Literal["shared", "exclusive"]


class GpuGate:
    """The gate of one physical GPU: its lock and turnstile files under ``root``."""

    def __init__(self, device: str, root: Path):
        gpu = machine.physical_gpu(device) if device.startswith("cuda") else None
        key = f"gpu{gpu.index}" if gpu is not None else device.replace(":", "")
        root.mkdir(parents=True, exist_ok=True)
        # absolute: the workers and KernelBench's process open it from folders of their own
        self.path = root.resolve() / f"{key}.lock"

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The GPU alone, in this thread (the orchestrator's own GPU work: none today but tests)."""
        with GateClient(str(self.path)).section("exclusive"):
            yield


class GateUse(BaseModel):
    """How one process used a GPU gate."""

    waited_s: float = Field(0.0, description="waiting to enter a section")
    shared_s: float = Field(0.0, description="inside shared sections (correctness, beside others)")
    exclusive_s: float = Field(0.0, description="inside exclusive sections (timing, alone)")
    intervals: list[tuple[float, float]] = Field([], description="(start, end) unix times of its sections")


class GateClient:
    """One process's sections of a gate, one at a time. ``path`` None: no gate (a lone verification),
    sections still timed. A section asked for inside another gives up the outer one first and takes
    it back after (flock cannot turn shared into exclusive atomically, and waiting for it while
    holding the shared lock would deadlock two such processes)."""

    def __init__(self, path: str | None, alone: bool = False):
        self.path, self.alone = path, alone  # alone: shared sections are exclusive too
        self.use = GateUse()
        self._mode: Mode | None = None
        self._handle: IO[str] | None = None
        self._since = 0.0

    @property
    def held(self) -> Mode | None:
        """The section this process is in, if any."""
        return self._mode

    @contextlib.contextmanager
    def section(self, mode: Mode) -> Iterator[None]:
        outer = self._mode
        if outer == mode or outer == "exclusive":
            yield
            return
        if outer is not None:
            self._release()
        self._acquire(mode)
        try:
            yield
        finally:
            self._release()
            if outer is not None:
                self._acquire(outer)

    def switch(self, mode: Mode | None) -> None:
        """Leave the section held (if any) and enter ``mode`` (None: none); for code that moves
        between sections phase by phase instead of nesting them."""
        if mode == self._mode:
            return
        if self._mode is not None:
            self._release()
        if mode is not None:
            self._acquire(mode)

    def _acquire(self, mode: Mode) -> None:
        asked = time.time()
        if self.path is not None:
            handle = open(self.path, "a+")  # noqa: SIM115 (held across calls)
            exclusive = mode == "exclusive" or self.alone
            try:
                with open(self.path + ".turn", "a+") as turn:
                    fcntl.flock(turn, fcntl.LOCK_EX)  # in line: behind a waiting exclusive section
                    try:
                        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                    finally:
                        fcntl.flock(turn, fcntl.LOCK_UN)
            except BaseException:
                handle.close()
                raise
            self._handle = handle
        self._since = time.time()
        self.use.waited_s += self._since - asked
        self._mode = mode

    def _release(self) -> None:
        ended = time.time()
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
        held = ended - self._since
        if self._mode == "shared":
            self.use.shared_s += held
        else:
            self.use.exclusive_s += held
        self.use.intervals.append((round(self._since, 3), round(ended, 3)))
        self._mode = None


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` (any unit): time in which at least one of them ran."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total
