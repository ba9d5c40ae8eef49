"""Checks that a program has the KernelBench shape, statically and once imported.

Static checks read the source only (safe for candidates, cheap for whole suites); the
runtime checks run on an imported module (the reference, or a candidate inside a worker).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from types import ModuleType
from typing import Any

REFERENCE_NAMES = ("Model", "get_inputs", "get_init_inputs")


class TaskError(ValueError):
    """A program that cannot be used as a task (or a candidate); the message says why and how to fix it."""


def parse_source(source: str, label: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        raise TaskError(f"{label} does not parse: line {exc.lineno}: {exc.msg}") from exc


def defined_names(tree: ast.Module) -> set[str]:
    """Top-level classes, functions and assigned names."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def check_reference_source(source: str, label: str = "the reference") -> None:
    missing = [n for n in REFERENCE_NAMES if n not in defined_names(parse_source(source, label))]
    if missing:
        raise TaskError(
            f"{label} lacks {', '.join(missing)}: a KernelBench task defines class Model(nn.Module), "
            "get_inputs() and get_init_inputs()"
        )


def check_candidate_source(source: str, label: str = "the candidate") -> None:
    if "ModelNew" not in defined_names(parse_source(source, label)):
        raise TaskError(f"{label} defines no ModelNew: a candidate must define class ModelNew(nn.Module)")


def check_module(module: ModuleType, class_name: str, needs_inputs: bool = True) -> None:
    """An imported program has the class (and, for a reference, the input functions)."""
    import torch

    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise TaskError(f"{class_name} is missing or is not a torch.nn.Module subclass")
    if needs_inputs:
        for name in ("get_inputs", "get_init_inputs"):
            if not callable(getattr(module, name, None)):
                raise TaskError(f"{name}() is missing or not callable")


def check_inputs(values: Any) -> None:
    """get_inputs() returns a list or tuple of tensors (Python numbers allowed beside them)."""
    import torch

    if isinstance(values, torch.Tensor):
        raise TaskError("get_inputs() returned a single tensor; return a list: [x]")
    if not isinstance(values, (list, tuple)):
        raise TaskError(f"get_inputs() returned {type(values).__name__}; it must return a list of tensors")
    bad = [f"#{i}: {type(v).__name__}" for i, v in enumerate(values)
           if not isinstance(v, (torch.Tensor, bool, int, float))]
    if bad:
        raise TaskError(f"get_inputs() returned non-tensors ({', '.join(bad)}); return a list of tensors")
    if not any(isinstance(v, torch.Tensor) for v in values):
        raise TaskError("get_inputs() returned no tensor")


def check_init_inputs(values: Any) -> None:
    if not isinstance(values, (list, tuple)):
        raise TaskError(f"get_init_inputs() returned {type(values).__name__}; it must return a list")


def draw_inputs(get_inputs: Any, device: Any = None, seed: int | None = None) -> list[Any]:
    """``get_inputs()`` with ``device`` as torch's default, so its random tensors are drawn where they
    are used (a level-1 task's 6 GB input takes seconds to draw on the CPU). One that cannot run
    that way (it calls .numpy(), say) runs as written. ``seed`` reseeds before each attempt."""
    import torch

    if device is not None and torch.device(device).type != "cpu":
        if seed is not None:
            torch.manual_seed(seed)
        try:
            with torch.device(device):
                return list(get_inputs())
        except Exception:
            pass
    if seed is not None:
        torch.manual_seed(seed)
    return list(get_inputs())


def inspect_task_module(module: ModuleType, device: Any = None) -> tuple[Sequence[Any], Sequence[Any]]:
    """Run get_init_inputs() and get_inputs() (drawn on ``device``, see :func:`draw_inputs`) of an
    imported reference and check what they return."""
    check_module(module, "Model")
    try:
        init_inputs = module.get_init_inputs()
        inputs = draw_inputs(module.get_inputs, device)
    except Exception as exc:
        raise TaskError(f"calling get_inputs()/get_init_inputs() failed: {type(exc).__name__}: {exc}") from exc
    check_init_inputs(init_inputs)
    check_inputs(inputs)
    return init_inputs, inputs


def import_source(source: str, label: str, module_name: str = "stitchcuda_task_probe") -> ModuleType:
    """Execute a program's source as a fresh module; any failure becomes a TaskError naming it."""
    import types

    module = types.ModuleType(module_name)
    module.__file__ = label
    try:
        exec(compile(source, label, "exec"), module.__dict__)
    except SyntaxError as exc:
        raise TaskError(f"{label} does not parse: line {exc.lineno}: {exc.msg}") from exc
    except Exception as exc:
        raise TaskError(f"{label} fails to import: {type(exc).__name__}: {exc}") from exc
    return module
