"""Escaped work: GPU work a candidate leaves running where the caller's stream never waits for it.

A program that queues its kernels on a stream of its own (created in C++, taken from PyTorch's
pool, or fed by a thread it started) and never orders the caller's stream after them returns
from forward before its work is done. An event recorded on the caller's stream right after the
call then completes at once, so an event-based timer (KernelBench's, and most users') measures
the launches only. Our own timer adds a device-wide synchronise and so times the work anyway;
the program must still be called out, since it cheats every other caller.

The probe, run once correctness has passed: call forward, record an event on the caller's
stream, wait for that event alone, then time a device-wide synchronise. Whatever that
synchronise still waits for ran outside the caller's stream. On an idle device it costs a few
microseconds; the median of a few calls keeps one slow wake-up from deciding.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, Field

from stitchcuda.verify.correctness import make_trial_inputs
from stitchcuda.verify.verdict import Finding

# Pending work counts as escaped above a quarter of the event-timed call (an honest program
# leaves none: its last kernel is ordered before the caller's event) and above 50 us, so that a
# tiny program's timing noise (a synchronise that takes 30 us to wake up) is never a finding.
ESCAPE_SHARE = 0.25
ESCAPE_FLOOR_MS = 0.05
PROBE_CALLS = 5


class EscapeProbe(BaseModel):
    """What the probe measured, medians over ``calls`` forwards."""

    call_ms: float = Field(description="the forward timed by events on the caller's stream")
    pending_ms: float = Field(description="a device-wide synchronise after the caller's stream was done")
    idle_ms: float = Field(description="the same synchronise on an idle device")
    calls: int = PROBE_CALLS

    @property
    def escaped_ms(self) -> float:
        return max(self.pending_ms - self.idle_ms, 0.0)


def escaped_work_finding(probe: EscapeProbe) -> Finding | None:
    """A total finding when the caller's stream was done long before the device was."""
    bar = max(ESCAPE_SHARE * probe.call_ms, ESCAPE_FLOOR_MS)
    if probe.escaped_ms <= bar:
        return None
    return Finding(
        check="escaped_work", level="total",
        detail=f"after forward returned and the caller's stream was done ({probe.call_ms:.3f} ms by events on it), "
               f"the GPU still had {probe.escaped_ms:.3f} ms of work (median of {probe.calls} calls): work ran on a "
               "stream or thread the caller's stream never waits for, so it escapes an event-based timer",
    )


def probe_escape(call: Callable[[], Any], device: Any, calls: int = PROBE_CALLS) -> EscapeProbe:
    """Measure, on a CUDA device, how much work ``call`` leaves pending beyond the caller's stream."""
    def sync_ms() -> float:
        started = time.perf_counter()
        torch.cuda.synchronize(device)
        return (time.perf_counter() - started) * 1e3

    torch.cuda.synchronize(device)
    idle = [sync_ms() for _ in range(calls)]
    call()  # once untimed: lazy initialisation (handles, workspaces, modules) is not escaped work
    torch.cuda.synchronize(device)
    timed, pending = [], []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = call()
        end.record()
        end.synchronize()  # the caller's stream only
        pending.append(sync_ms())
        timed.append(start.elapsed_time(end))
        del out  # after the device is idle: its memory may still be written by escaped kernels before
    return EscapeProbe(call_ms=statistics.median(timed), pending_ms=statistics.median(pending),
                       idle_ms=statistics.median(idle), calls=calls)


def escaped_work(model: Any, get_inputs: Callable[[], Any], seed: int, device: Any) -> list[Finding]:
    """The worker's step: the probe on the timing inputs (CUDA only: a CPU call has no streams)."""
    if getattr(device, "type", str(device)) != "cuda":
        return []
    inputs = make_trial_inputs(get_inputs, seed, "given", device)
    finding = escaped_work_finding(probe_escape(lambda: model(*inputs), device))
    return [finding] if finding else []
