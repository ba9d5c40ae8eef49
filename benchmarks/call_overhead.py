"""Where one call of a generated program goes: its host prologue (the Python forward, the
extension's argument checks and graph lookup) against the GPU work it replays.

Builds ModelNew from a program file (``stitchcuda optimize TASK -o PROGRAM``) and the reference
from its task file, then times on one GPU, warm caches, the median of 200 synchronised calls:
the whole call; the host time per call when calls are queued; the Python prologue alone (the
extension replaced by a recorder); the extension called directly; the program replayed from a
torch CUDA graph; eager replayed from one. Prints a table last::

    python benchmarks/call_overhead.py TASK.py PROGRAM.py

The Verifier's timing (L2 flushed before each call) is colder than this; the gap between the
whole call and the graph replay is what the prologue costs a user either way.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

from stitchcuda.verify.worker import import_from_path


def latency_ms(fn: Callable[[], object], calls: int = 200) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[calls // 2]


def host_ms(fn: Callable[[], object], calls: int = 200) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    spent = (time.perf_counter() - began) / calls * 1e3
    torch.cuda.synchronize()
    return spent


class _Recorder:
    def __init__(self):
        self.args: tuple = ()

    def forward(self, *args):
        self.args = args


def main(task: str, program: str) -> None:
    reference, generated = import_from_path(task, "stitchcuda_task"), import_from_path(program, "stitchcuda_program")
    torch.manual_seed(0)
    model = generated.ModelNew(*reference.get_init_inputs()).cuda()
    eager = reference.Model(*reference.get_init_inputs()).cuda()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in reference.get_inputs()]
    rows: list[tuple[str, float]] = []
    with torch.no_grad():
        for _ in range(20):
            model(*inputs)
        rows.append(("whole call (synchronised)", latency_ms(lambda: model(*inputs))))
        rows.append(("host time per call (queued)", host_ms(lambda: model(*inputs))))
        ext, recorder = generated._ext, _Recorder()
        generated._ext = recorder
        try:
            rows.append(("Python prologue alone", host_ms(lambda: model(*inputs))))
        finally:
            generated._ext = ext
        args = recorder.args
        rows.append(("extension called directly", latency_ms(lambda: ext.forward(*args))))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ext.forward(*args)
        rows.append(("program replayed from a torch CUDA graph", latency_ms(graph.replay)))
        eager(*inputs)
        torch.cuda.synchronize()
        eager_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(eager_graph):
            eager(*inputs)
        rows.append(("eager replayed from a torch CUDA graph", latency_ms(eager_graph.replay)))
    print(f"{task} ({len(args)} arguments) on {torch.cuda.get_device_name()}")
    for name, ms in rows:
        print(f"  {name:<42} {ms:8.4f} ms")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
