"""Eager fp32 time of every bundled task on this GPU (the suite's sizes aim at 1-50 ms on an H100).

    python benchmarks/suite_eager_times.py
"""

from __future__ import annotations

import functools
import statistics

import torch
from rich.console import Console
from rich.table import Table

from stitchcuda.task import bundled_tasks
from stitchcuda.task.inspect import import_source
from stitchcuda.verify.timing import Timer, summarize
from stitchcuda.verify.torch_state import set_tf32


def main() -> None:
    device = torch.device("cuda")
    set_tf32(False)
    timer = Timer(device)
    table = Table(title=f"bundled suite, eager fp32 on {torch.cuda.get_device_name()}")
    for col in ("task", "median ms", "spread %", "params M", "peak GiB", "in 1-50 ms"):
        table.add_column(col, justify="right" if col != "task" else "left")
    medians = []
    for task in bundled_tasks():
        module = import_source(task.source, task.name)
        torch.manual_seed(0)
        model = module.Model(*module.get_init_inputs()).to(device)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            for _ in range(3):
                model(*inputs)
            forward = functools.partial(model, *inputs)
            samples = [timer.time_once(forward) for _ in range(20)]
        stats = summarize(samples)
        medians.append(stats.median_ms)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        ok = "yes" if 1.0 <= stats.median_ms <= 50.0 else "NO"
        table.add_row(task.name, f"{stats.median_ms:.2f}", f"{stats.spread_pct:.1f}", f"{params:.1f}",
                      f"{torch.cuda.max_memory_allocated() / 2**30:.2f}", ok)
        model = inputs = forward = None  # free this task's memory before the next one
        torch.cuda.empty_cache()
    Console().print(table)
    print(f"geomean {statistics.geometric_mean(medians):.2f} ms over {len(medians)} tasks")


if __name__ == "__main__":
    main()
