"""Where one call of a generated program goes, timed as the Verifier times it.

Builds ModelNew from a program file (``stitchcuda optimize TASK -o PROGRAM``), or writes one with
the offline compiler where none is given, and the reference from its task file. On one GPU it
times, with the Verifier's own timer (L2 flushed, the device synchronised, the median of 50):
the program alone; the program interleaved with eager and eager's CUDA graph, as a verification
times them; then the host time per call when calls are queued, and the program's Python prologue
alone (its host's ``forward`` replaced by a no-op). Prints a table last::

    python benchmarks/call_overhead.py TASK.py [PROGRAM.py]

A program slower interleaved than alone pays for a host path that runs cold after eager's call;
one whose host time per call passes its GPU time is bound by its launches.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from stitchcuda.verify.timing import Contender, Timer, cuda_graph_call
from stitchcuda.verify.worker import import_from_path


def host_us(call: Callable[[], object], calls: int = 200) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        call()
    spent = (time.perf_counter() - began) / calls * 1e6
    torch.cuda.synchronize()
    return spent


def median_us(contender: Contender) -> float:
    ordered = sorted(contender.samples)
    return ordered[len(ordered) // 2] * 1e3


def main(task_path: str, program_path: str | None) -> None:
    if program_path is None:
        from stitchcuda.compiler.driver import compile_task
        from stitchcuda.task.load import load_task_file

        program_path = str(Path(tempfile.mkdtemp(prefix="stitchcuda-overhead-")) / "program.py")
        Path(program_path).write_text(compile_task(load_task_file(task_path)).program())
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    reference = import_from_path(task_path, "stitchcuda_task")
    generated = import_from_path(program_path, "stitchcuda_program")
    torch.manual_seed(0)
    eager = reference.Model(*reference.get_init_inputs()).cuda()
    torch.manual_seed(0)
    model = generated.ModelNew(*reference.get_init_inputs()).cuda()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in reference.get_inputs()]
    timer = Timer(torch.device("cuda"))
    rows: list[tuple[str, float]] = []
    with torch.no_grad():
        alone = [Contender("program", lambda: model(*inputs))]
        timer.run(alone, warmup=5, min_rounds=50, max_rounds=50, budget_s=1)
        together = [Contender("program", lambda: model(*inputs)), Contender("eager", lambda: eager(*inputs)),
                    Contender("eager's CUDA graph", cuda_graph_call(eager, inputs))]
        timer.run(together, warmup=5, min_rounds=50, max_rounds=50, budget_s=1)
        rows.append(("program alone", median_us(alone[0])))
        rows += [(f"{c.name}, interleaved", median_us(c)) for c in together]
        rows.append(("program: host time per call, queued", host_us(lambda: model(*inputs))))
        host = generated._host
        real = host.forward
        host.forward = lambda program, args: None
        try:
            rows.append(("program: Python prologue alone", host_us(lambda: model(*inputs))))
        finally:
            host.forward = real
    print(f"{task_path} on {torch.cuda.get_device_name()}")
    for name, us in rows:
        print(f"  {name:<40} {us:10.1f} us")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None)
