"""Named size presets of a task file: smaller (or other) sizes for tests and quick runs.

A task file may define a module-level ``PRESETS`` dict beside its size constants::

    batch = 4096
    hidden = 4096

    PRESETS = {"small": {"batch": 2, "hidden": 8}}

Applying a preset rewrites the right-hand side of each named top-level assignment in the
source, so sizes computed from them further down (``d_model = num_heads * head_dim``) follow,
and the task stays one self-contained KernelBench program that any worker can run. A file
without ``PRESETS`` loads as before; asking it for a preset, naming an unknown preset, or a
preset naming a size the file does not assign, is an error rather than a silent no-op.
Everything here reads the source; nothing is executed.
"""

from __future__ import annotations

import ast

from stitchcuda.task.inspect import TaskError, parse_source

PRESETS_NAME = "PRESETS"
Value = int | float | bool | str


def _assignments(tree: ast.Module, name: str) -> list[ast.Assign | ast.AnnAssign]:
    """Top-level statements that bind ``name`` (and nothing else) to a value."""
    found: list[ast.Assign | ast.AnnAssign] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target = node.target
        else:
            continue
        if isinstance(target, ast.Name) and target.id == name:
            found.append(node)
    return found


def presets_of(source: str, label: str = "the task") -> dict[str, dict[str, Value]]:
    """The file's ``PRESETS`` (preset name -> size name -> value); empty when it defines none."""
    nodes = _assignments(parse_source(source, label), PRESETS_NAME)
    if not nodes:
        return {}
    if len(nodes) > 1:
        raise TaskError(f"{label} assigns {PRESETS_NAME} {len(nodes)} times; assign it once")
    try:
        presets = ast.literal_eval(nodes[0].value)
    except ValueError as exc:
        raise TaskError(f"{label}'s {PRESETS_NAME} is not a literal dict of dicts: {exc}") from exc
    shape_ok = isinstance(presets, dict) and all(
        isinstance(k, str) and isinstance(v, dict) and all(isinstance(n, str) for n in v) for k, v in presets.items())
    if not shape_ok:
        raise TaskError(f"{label}'s {PRESETS_NAME} must map preset names to {{size name: value}} dicts")
    return presets


def with_sizes(source: str, values: dict[str, Value], label: str = "the task") -> str:
    """The source with each ``name = ...`` top-level assignment of ``values`` given the new value."""
    tree = parse_source(source, label)
    data = source.encode()
    line_starts = [0]
    for line in data.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    edits: list[tuple[int, int, bytes]] = []
    for name, value in values.items():
        if name == PRESETS_NAME:
            raise TaskError(f"a preset cannot set {PRESETS_NAME} itself ({label})")
        if not isinstance(value, Value):
            raise TaskError(f"{name}={value!r} for {label}: a size is an int, float, bool or str")
        nodes = _assignments(tree, name)
        if len(nodes) != 1:
            how = "does not assign it at top level" if not nodes else f"assigns it {len(nodes)} times"
            raise TaskError(f"cannot set {name} in {label}: the file {how}")
        expr = nodes[0].value
        start = line_starts[expr.lineno - 1] + expr.col_offset  # ast offsets are UTF-8 byte offsets
        end = line_starts[expr.end_lineno - 1] + expr.end_col_offset
        edits.append((start, end, repr(value).encode()))
    for start, end, text in sorted(edits, reverse=True):
        data = data[:start] + text + data[end:]
    return data.decode()


def apply_preset(source: str, preset: str, label: str = "the task") -> str:
    """The source with the sizes of its preset named ``preset``; an error names the known ones."""
    presets = presets_of(source, label)
    if not presets:
        raise TaskError(f"{label} defines no {PRESETS_NAME}, so it has no preset {preset!r}")
    if preset not in presets:
        raise TaskError(f"{label} has no preset {preset!r} (it has: {', '.join(sorted(presets))})")
    return with_sizes(source, presets[preset], label=f"{label} (preset {preset!r})")
