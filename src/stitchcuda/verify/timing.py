"""Timing: CUDA events plus a device-wide synchronise, L2 flushed before each call,
contenders interleaved round by round so that clock and thermal drift cancel.

The timed region is ``start event -> call -> torch.cuda.synchronize() -> end event``: the
device-wide synchronise makes work a candidate hides on a side stream count, at the cost of a
few microseconds that every contender pays alike.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from stitchcuda.verify.verdict import TimingStats

Call = Callable[[], object]


@dataclass
class Contender:
    name: str
    call: Call
    before: Callable[[], None] = lambda: None  # e.g. flip TF32 on; not timed
    after: Callable[[], None] = lambda: None
    samples: list[float] = field(default_factory=list)
    optional: bool = False  # a baseline: an exception drops it from the rounds (with ``error``), not the timing
    model: object = None  # the module whose kept state the call reads, where it is not the reference itself
    error: str | None = None
    mode: str | None = None  # a compiled baseline's torch.compile mode, where not the one its name says


def summarize(samples_ms: list[float]) -> TimingStats:
    ordered = sorted(samples_ms)
    n = len(ordered)
    q = statistics.quantiles(ordered, n=4, method="inclusive") if n >= 2 else [ordered[0]] * 3
    median = statistics.median(ordered)
    return TimingStats(
        median_ms=median,
        mean_ms=statistics.fmean(ordered),
        min_ms=ordered[0],
        max_ms=ordered[-1],
        q25_ms=q[0],
        q75_ms=q[2],
        std_ms=statistics.pstdev(ordered) if n > 1 else 0.0,
        spread_pct=100.0 * (q[2] - q[0]) / median if median > 0 else 0.0,
        trials=n,
    )


class Timer:
    """Times zero-argument calls on one device, GPU (events) or CPU (wall clock)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.flush_bytes = 0
        self._flush: torch.Tensor | None = None
        if self.cuda:
            l2 = torch.cuda.get_device_properties(device).L2_cache_size or (50 << 20)
            self.flush_bytes = 2 * l2  # at least twice the L2, so nothing of the last call survives
            self._flush = torch.empty(self.flush_bytes // 4, dtype=torch.int32, device=device)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time_once(self, call: Call) -> float:
        """Milliseconds for one call, L2 flushed first."""
        if not self.cuda:
            start = time.perf_counter()
            call()
            return (time.perf_counter() - start) * 1e3
        assert self._flush is not None
        self._flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        torch.cuda.synchronize(self.device)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def run(self, contenders: list[Contender], warmup: int, min_rounds: int, max_rounds: int,
            budget_s: float, measuring: AbstractContextManager | None = None) -> int:
        """Warm up, then time every contender once per round, rotating the order, inside
        ``measuring`` (entered after the warm-up, which may compile). Returns rounds."""
        per_round_ms = 0.0
        for c in contenders:
            with self._dropping(c):
                for _ in range(warmup):
                    c.call()
                self.sync()
                per_round_ms += self.time_once(c.call)
        rounds = int(budget_s * 1e3 / max(per_round_ms, 1e-3))
        rounds = max(min_rounds, min(max_rounds, rounds))
        with measuring or nullcontext():
            for r in range(rounds):
                timed = [c for c in contenders if c.error is None]
                shift = r % len(timed)
                for c in timed[shift:] + timed[:shift]:
                    with self._dropping(c):
                        c.samples.append(self.time_once(c.call))
        return rounds

    @contextmanager
    def _dropping(self, c: Contender) -> Iterator[None]:
        """``c``'s before and after around the block; an optional contender that raises is dropped
        (torch.compile's CUDA graphs refuse a model that keeps an output as its state, say)."""
        c.before()
        try:
            yield
        except Exception as exc:
            if not c.optional:
                raise
            c.error, c.samples = f"{type(exc).__name__}: {exc}"[:300], []
        finally:
            c.after()


class Pinned:
    """While entered, this thread runs on ``core`` (a timing core, kept free of other work: see
    ``machine.cpu_split``); put back on exit. ``core`` after entering: where it ran, None where it
    could not move there."""

    def __init__(self, core: int | None):
        self.wanted, self.core = core, None
        self._before: set[int] | None = None

    def __enter__(self) -> Pinned:
        if self.wanted is None or not hasattr(os, "sched_setaffinity"):
            return self
        self._before = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, {self.wanted})
            moved = os.sched_getaffinity(0) == {self.wanted}  # a core past the machine's may be taken silently
        except (OSError, ValueError, OverflowError):
            moved = False
        if moved:
            self.core = self.wanted
        else:
            os.sched_setaffinity(0, self._before)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.core is not None and self._before is not None:
            os.sched_setaffinity(0, self._before)


def cuda_graph_call(model: torch.nn.Module, inputs: list[object], warmup: int = 3) -> Call:
    """Capture one forward of ``model`` on static inputs; the returned call replays it and
    returns the graph's (static) output."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            model(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    caller = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph):
            static_output = model(*inputs)
    finally:
        # a forward that cannot be captured (a host sync: nonzero, .item()) fails in the graph's exit,
        # which then never leaves its side stream: the caller's stream is put back here
        if torch.cuda.current_stream() != caller:
            torch.cuda.set_stream(caller)
    torch.cuda.synchronize()

    def replay() -> object:
        graph.replay()
        return static_output

    return replay
