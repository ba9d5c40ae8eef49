"""The check every command makes of a reference before anything else runs: it imports, its input
functions return tensors, its Model builds and its forward runs, all on the meta device where its
code allows (no memory, no compute) and within a time limit.

The reference is the user's own code, so it runs in a child process: a forward that hangs is
killed at the limit, and one that crashes the interpreter is a message, not our crash. A child
probes many tasks in one interpreter (one torch import for its share of a KernelBench level) and
reports each on a line of its own; the parent runs a few children side by side and restarts one
past a task that hung or crashed it.

Errors name the user's file and line and show only the user's frames, never ours.
"""

from __future__ import annotations

import copy
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import traceback
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from stitchcuda import machine
from stitchcuda.task.inspect import TaskError, check_init_inputs, check_inputs, check_reference_source
from stitchcuda.task.record import Task

DEFAULT_TIMEOUT_S = 120.0
_IMPORT_TIMEOUT_S = 300.0
TIMEOUT_ENV = "STITCHCUDA_REFERENCE_TIMEOUT"
_THREADS_ENV = "STITCHCUDA_PROBE_THREADS"
# where the forward could not run on the meta device, it runs on the CPU only when that is cheap
_CPU_FORWARD_NUMEL = 1 << 24


class ReferenceCheck(BaseModel):
    """One reference's check: ``problem`` is None when it is usable."""

    task: str
    label: str = Field(description="the user's file (or the task's name where it has none)")
    problem: str | None = None
    forward: str = Field("meta", description="where the forward ran: meta, cpu, or not run (too large for "
                                             "the CPU after the meta device refused it)")
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.problem is None


def reference_timeout() -> float:
    """The time limit of one reference's check, in seconds (``$STITCHCUDA_REFERENCE_TIMEOUT``)."""
    try:
        return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def label_of(task: Task) -> str:
    return task.path or task.name


def user_error(exc: BaseException, label: str) -> str:
    """The error on one line, where in the user's file ``label`` it happened, then the user's
    frames (innermost last, as Python prints them); our frames and torch's are left out."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == label]
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    first, *more = message.splitlines() or [type(exc).__name__]
    if not frames:
        return message
    last = frames[-1]
    stack = "".join(f"\n  {f.filename}, line {f.lineno}, in {f.name}" + (f"\n    {f.line.strip()}" if f.line else "")
                    for f in frames[-4:])
    return f"{first} ({last.filename}, line {last.lineno}, in {last.name})" + "".join(f"\n{m}" for m in more) + stack


def check_references(tasks: list[Task], timeout_s: float | None = None) -> list[ReferenceCheck]:
    """Check each task's reference in a child process, ``timeout_s`` each (default
    :func:`reference_timeout`); the results come in the tasks' order. Children run side by side, one
    per two cores (at most eight): a bench of a hundred models checked them one after another for
    about 100 s before its first task started."""
    limit = reference_timeout() if timeout_s is None else timeout_s
    results: dict[int, ReferenceCheck] = {}
    pending: list[int] = []
    for i, task in enumerate(tasks):  # what needs no import is said without starting a process
        try:
            check_reference_source(task.source, label_of(task))
            pending.append(i)
        except TaskError as exc:
            results[i] = ReferenceCheck(task=task.name, label=label_of(task), problem=str(exc), forward="not run")

    def probe(part: list[int]) -> dict[int, ReferenceCheck]:
        out: dict[int, ReferenceCheck] = {}
        while part:  # a child that hung or died is replaced for the rest of its part
            done = _run_child([tasks[i] for i in part], limit, threads)
            out.update(zip(part, done, strict=False))
            part = part[len(done):]
        return out

    children = max(1, min(len(pending), machine.usable_cores() // 2, 8))
    threads = max(1, machine.usable_cores() // children)  # each child's share: torch takes every core by default
    with ThreadPoolExecutor(max_workers=children) as pool:
        for part in pool.map(probe, [pending[k::children] for k in range(children)]):
            results.update(part)
    return [results[i] for i in range(len(tasks))]


def check_reference(task: Task, timeout_s: float | None = None) -> ReferenceCheck:
    return check_references([task], timeout_s)[0]


def _run_child(tasks: list[Task], limit: float, threads: int = 0) -> list[ReferenceCheck]:
    """Probe ``tasks`` in one child until it finishes, hangs or dies; return the checks it
    completed, plus a failed check for the task it was on when it hung or died."""
    payload = json.dumps([{"name": t.name, "source": t.source, "label": label_of(t)} for t in tasks])
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="",  # the probe needs no GPU
               **({_THREADS_ENV: str(threads)} if threads else {}),
               PYTHONPATH=os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p))
    done: list[ReferenceCheck] = []
    # a chatty reference writes to a file, never into a pipe it could fill and stall on
    with tempfile.TemporaryFile(mode="w+") as errors:
        child = subprocess.Popen([sys.executable, "-m", "stitchcuda.task.probe"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(payload)
        child.stdin.close()
        selector = selectors.DefaultSelector()
        selector.register(child.stdout, selectors.EVENT_READ)
        # the clock of the first task starts once the child has imported torch (its "ready" line)
        ready = selector.select(_IMPORT_TIMEOUT_S) and child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + limit
        while ready and len(done) < len(tasks):
            task = tasks[len(done)]
            line = child.stdout.readline() if selector.select(max(0.0, deadline - time.monotonic())) else None
            if line:
                done.append(ReferenceCheck.model_validate_json(line))
                deadline = time.monotonic() + limit
                continue
            child.kill()
            child.wait()
            if line is None:
                problem = (f"the reference did not finish within {limit:g} s (import, Model(...) and one forward "
                           "on the meta device): a forward that never returns cannot be verified (raise the "
                           f"limit with {TIMEOUT_ENV}=SECONDS if it is only slow)")
            else:  # the child died: a segfault in the reference's own code, say
                errors.seek(0)
                tail = errors.read().strip().splitlines()
                problem = (f"the reference crashed the Python process (exit code {child.returncode})"
                           + (f": {tail[-1]}" if tail else ""))
            done.append(ReferenceCheck(task=task.name, label=label_of(task), forward="not run",
                                       problem=f"{label_of(task)}: {problem}"))
            return done
        if not ready:  # torch itself did not import: nothing about the references can be said
            child.kill()
            child.wait()
            errors.seek(0)
            raise TaskError("checking the references needs `import torch` in a fresh process, which failed: "
                            + (errors.read().strip().splitlines() or ["no output"])[-1])
        child.wait()
    return done


# -- the child -----------------------------------------------------------------------------------

def check_here(name: str, source: str, label: str) -> ReferenceCheck:
    """The check, in this process: a child's (this module's own, or the compile process of
    :mod:`stitchcuda.agents.compiling`), never the command's."""
    import torch

    started = time.perf_counter()
    check = ReferenceCheck(task=name, label=label, forward="not run")

    def failed(what: str, exc: BaseException) -> ReferenceCheck:
        check.seconds = time.perf_counter() - started
        if _needs_cuda(exc):  # `device="cuda"` in the user's code: the worker on the GPU will tell
            check.forward = "not run (its code asks for CUDA)"
            return check
        check.problem = f"{label}: {what} {user_error(exc, label)}"
        return check

    module = types.ModuleType("stitchcuda_reference_probe")
    module.__file__ = label
    try:
        exec(compile(source, label, "exec"), module.__dict__)
    except SyntaxError as exc:
        check.problem = f"{label}: does not parse: line {exc.lineno}: {exc.msg}"
        return check
    except BaseException as exc:  # noqa: BLE001 - SystemExit from the user's module is theirs to report
        return failed("importing it failed", exc)
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not callable(getattr(module, attr, None)):
            check.problem = f"{label}: {attr} is missing or not callable"
            return check
    if not (isinstance(module.Model, type) and issubclass(module.Model, torch.nn.Module)):
        check.problem = f"{label}: Model is not a torch.nn.Module subclass"
        return check

    for device in ("meta", "cpu"):  # the model is built on the meta device where its code allows
        try:
            with torch.device(device):
                init_inputs = module.get_init_inputs()
                inputs = module.get_inputs()
        except BaseException as exc:  # noqa: BLE001
            if device == "cpu":
                return failed("get_inputs()/get_init_inputs() raised", exc)
            continue
        try:
            check_init_inputs(init_inputs)
            check_inputs(inputs)
        except TaskError as exc:
            check.problem = f"{label}: {exc}"
            return check
        try:
            with torch.device(device):
                torch.manual_seed(0)
                model = module.Model(*init_inputs)
        except BaseException as exc:  # noqa: BLE001
            if device == "cpu":
                return failed("Model(*get_init_inputs()) raised", exc)
            continue
        break
    cheap = _numel(inputs) + sum(p.numel() for p in model.parameters()) <= _CPU_FORWARD_NUMEL
    if device == "cpu":
        # a model whose constructor computes with tensors (torchvision's RegNet) still runs its forward on
        # the meta device; a large one moves there in place (its CPU forward could take minutes)
        meta_model = (copy.deepcopy(model) if cheap else model).to("meta")
        meta_inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs]
        tries = [("meta", meta_model, meta_inputs)] + ([("cpu", model, inputs)] if cheap else [])
    else:
        tries = [("meta", model, inputs)]
        if cheap:  # a forward the meta device refuses (data-dependent shapes, say) runs on the CPU if cheap
            tries.append(("cpu", None, None))
    for where, runner, args in tries:
        try:
            if runner is None:
                with torch.device("cpu"):
                    torch.manual_seed(0)
                    runner = module.Model(*init_inputs)
                    args = module.get_inputs()
            with torch.no_grad():
                output = runner(*args)
        except BaseException as exc:  # noqa: BLE001
            if where == "cpu":
                return failed("its forward raised", exc)
            continue
        if problem := _output_problem(output):
            check.problem = f"{label}: its forward {problem}"
            return check
        check.forward = where
        break
    check.seconds = time.perf_counter() - started  # forward "not run": too large for the CPU; the GPU will tell
    return check


def _needs_cuda(exc: BaseException) -> bool:
    """The reference asked for a GPU by name (``.cuda()``, ``device="cuda"``), which the probe
    hides on purpose: not a fault of the reference."""
    text = str(exc)
    return any(w in text for w in ("not compiled with CUDA", "no NVIDIA driver", "No CUDA GPUs", "CUDA driver",
                                   "no CUDA-capable", "CUDA is not available"))


def _numel(values: list[Any]) -> int:
    return sum(v.numel() for v in values if hasattr(v, "numel"))


def _output_problem(output: Any) -> str | None:
    """A forward returns tensors: one, or any nesting of tuples, lists and dicts of them (LSTM's
    ``output, (h_n, c_n)``), compared leaf by leaf."""
    import torch
    from torch.utils._pytree import tree_leaves

    leaves = tree_leaves(output)
    if leaves and all(isinstance(x, torch.Tensor) for x in leaves):
        return None
    other = next((type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)), type(output).__name__)
    return (f"returned {type(output).__name__} holding {other}, not tensors that can be compared (a tensor, or "
            "tuples, lists and dicts of tensors)")


def _child_main() -> None:
    import warnings

    import torch  # imported before the clock starts, so a slow import is not a slow reference

    warnings.simplefilter("ignore")  # torch's notes are not the user's business here
    if threads := int(os.environ.get(_THREADS_ENV, "0") or 0):
        torch.set_num_threads(threads)
    records = sys.stdout
    records.write("ready\n")
    records.flush()
    sys.stdout = sys.stderr  # the user's prints must not interleave with our records
    for job in json.loads(sys.stdin.read()):
        records.write(check_here(job["name"], job["source"], job["label"]).model_dump_json() + "\n")
        records.flush()


if __name__ == "__main__":
    _child_main()
