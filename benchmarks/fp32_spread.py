"""Can a tolerance judge a task in fp32 at all? How far the task's own fp32 reference lands from its
exact value (the same model in float64) and from another, equally valid fp32 order of the same
operations, counted as KernelBench counts a miss (``torch.allclose``'s test, atol = rtol = TOL).

    python benchmarks/fp32_spread.py TASK.py ... [--device cpu|cuda] [--tolerance 1e-4] [--inputs 2]

Per task and input draw: the largest |output|, the largest |fp32 - fp64|, the elements where the
exact answer (fp64 rounded to fp32) misses the fp32 reference, and the elements where the same
fp32 model run channels-last (another order of every convolution's sums) misses it. Where the
exact answer misses, no fp32 program can pass the tolerance against that reference except by
repeating its rounding operation for operation. The model is built under seed 42 and left in the
mode its task leaves it (training, for KernelBench); inputs are drawn under seeds 1, 2, ...
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
from pathlib import Path

import torch
from torch.utils._pytree import tree_leaves


def load(path: str):
    spec = importlib.util.spec_from_file_location(f"spread_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def cast(values: list, dtype: torch.dtype, device: str, channels_last: bool = False) -> list:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            v = v.to(device)
            if v.is_floating_point():
                v = v.to(dtype)
                if channels_last and v.dim() == 4:
                    v = v.contiguous(memory_format=torch.channels_last)
        out.append(v)
    return out


def outputs(model, inputs: list) -> list[torch.Tensor]:
    with torch.no_grad():
        return [t.float() for t in tree_leaves(model(*inputs)) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def misses(a: list[torch.Tensor], b: list[torch.Tensor], tol: float) -> int:
    return sum(int((~torch.isclose(x, y, atol=tol, rtol=tol)).sum()) for x, y in zip(a, b, strict=True))


def spread(path: str, device: str, tol: float, draws: int) -> list[str]:
    task = load(path)
    torch.manual_seed(42)
    model = task.Model(*cast(list(task.get_init_inputs()), torch.float32, "cpu")).to(device)
    exact = copy.deepcopy(model).double()
    reordered = copy.deepcopy(model).to(memory_format=torch.channels_last)
    rows = []
    for seed in range(1, draws + 1):
        torch.manual_seed(seed)
        inputs = list(task.get_inputs())
        state = copy.deepcopy(model.state_dict())  # each run starts from the state the model was built with
        fp32 = outputs(model, cast(inputs, torch.float32, device))
        model.load_state_dict(state)
        fp64 = outputs(exact, cast(inputs, torch.float64, device))
        exact.load_state_dict(state)
        other = outputs(reordered, cast(inputs, torch.float32, device, channels_last=True))
        reordered.load_state_dict(state)
        largest = max(float(t.abs().max()) for t in fp64)
        worst = max(float((x - y).abs().max()) for x, y in zip(fp32, fp64, strict=True))
        count = sum(t.numel() for t in fp32)
        rows.append(f"| {Path(path).stem} | {seed} | {largest:.3g} | {worst:.2e} | {misses(fp64, fp32, tol)} of {count} "
                    f"| {misses(other, fp32, tol)} of {count} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="+")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--inputs", type=int, default=2)
    args = parser.parse_args()
    print(f"| task | inputs | max \\|fp64\\| | max \\|fp32 - fp64\\| | exact answer misses fp32 at {args.tolerance:g} "
          f"| channels-last fp32 misses fp32 |")
    print("|---|---:|---:|---:|---:|---:|")
    for path in args.tasks:
        for row in spread(path, args.device, args.tolerance, args.inputs):
            print(row, flush=True)


if __name__ == "__main__":
    main()
