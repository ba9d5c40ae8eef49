"""Where KernelBench's harness and our Verifier part ways on one program (GPU; prints a table).

KernelBench's ``eval_kernel_against_ref`` runs a program differently from our worker: it execs the
reference and the candidate into one namespace (the candidate prefixed with a line setting
``TORCH_EXTENSIONS_DIR``), builds both models under ``torch.no_grad()``, moves them with
``.to(device=..., dtype=float32)`` before every trial, and runs the reference first. Each of those
differences is applied here on its own, each in a fresh process, and the program's largest
difference from the reference (both built under seed 42, TF32 off) is printed per way of running
it. A program right one way and wrong another names the difference that breaks it::

    python benchmarks/harness_probe.py TASK.py PROGRAM.py [--trials 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

WAYS = {
    "ours": "module import, built with grad on, .to(device)",
    "built_without_grad": "as ours, both models built under torch.no_grad()",
    "to_dtype_each_trial": "as ours, .to(device=, dtype=float32) before every trial",
    "one_namespace": "reference and program exec'd into one dict, the program after KernelBench's prefix",
    "kernelbench": "all of the above together (its own eval adds its seeds and default flags)",
}


def _run(way: str, task: str, program: str, trials: int, device_name: str) -> dict:
    import importlib.util
    import os

    import torch
    from torch.utils._pytree import tree_leaves

    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(device_name)
    together = way in ("one_namespace", "kernelbench")
    if together:
        scope: dict = {}
        exec(compile(Path(task).read_text(), task, "exec"), scope)
        Model, get_inputs, get_init = scope["Model"], scope["get_inputs"], scope["get_init_inputs"]
        prefix = f"import os\nos.environ['TORCH_EXTENSIONS_DIR'] = {os.environ.get('TORCH_EXTENSIONS_DIR', '/tmp')!r}\n"
        exec(compile(prefix + Path(program).read_text(), program, "exec"), scope)
        ModelNew = scope["ModelNew"]
    else:
        def load(path: str, name: str):
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        reference, candidate = load(task, "probe_task"), load(program, "probe_program")
        Model, get_inputs, get_init = reference.Model, reference.get_inputs, reference.get_init_inputs
        ModelNew = candidate.ModelNew
    quiet = way in ("built_without_grad", "kernelbench")
    with torch.no_grad() if quiet else torch.enable_grad():
        torch.manual_seed(42)
        model = Model(*get_init())
        torch.manual_seed(42)
        new = ModelNew(*get_init())
    model, new = model.to(device), new.to(device)
    worst = []
    with torch.no_grad():
        for trial in range(trials):
            torch.manual_seed(1000 + trial)
            inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in get_inputs()]
            if way in ("to_dtype_each_trial", "kernelbench"):
                model = model.to(device=device, dtype=torch.float32)
                new = new.to(device=device, dtype=torch.float32)
            expected = model(*inputs)
            got = new(*inputs)
            pairs = zip(tree_leaves(got), tree_leaves(expected), strict=True)
            worst.append(max(float((a.float() - b.float()).abs().max()) for a, b in pairs))
    return {"way": way, "max_abs": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("program")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--way", help=argparse.SUPPRESS)  # the child process's own way
    args = parser.parse_args()
    if args.way:
        print(json.dumps(_run(args.way, args.task, args.program, args.trials, args.device)))
        return
    rows = []
    for way, what in WAYS.items():
        done = subprocess.run([sys.executable, __file__, args.task, args.program, "--trials", str(args.trials),
                               "--device", args.device, "--way", way], capture_output=True, text=True, timeout=900)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1])["max_abs"] if lines else done.stderr.strip().splitlines()[-1:]
        rows.append((way, what, result))
    for way, what, result in rows:
        shown = ", ".join(f"{x:.3g}" for x in result) if result and isinstance(result[0], float) else str(result)
        print(f"{way:22s} {shown:32s} {what}")


if __name__ == "__main__":
    main()
