"""Named size presets of task files (task/preset.py): every bundled task has a "tiny" one that
really changes its sizes and runs on a CPU; unknown presets and sizes are errors, never no-ops."""

from __future__ import annotations

import pytest
import torch

from stitchcuda.task import TaskError, bundled_task_names, load_task_file, resolve_tasks
from stitchcuda.task.inspect import import_source
from stitchcuda.task.preset import apply_preset, presets_of, with_sizes
from tests.conftest import CPU

SOURCE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * 2

batch = 64
width: int = 32
area = batch * width
PRESETS = {"tiny": {"batch": 2, "width": 3}, "odd": {"depth": 4}}

def get_inputs():
    return [torch.randn(batch, width)]

def get_init_inputs():
    return []
'''


def _globals(source: str) -> dict:
    return vars(import_source(source, "preset test"))


def test_preset_sets_the_sizes_and_what_is_computed_from_them():
    module = _globals(apply_preset(SOURCE, "tiny"))
    assert (module["batch"], module["width"], module["area"]) == (2, 3, 6)
    assert tuple(module["get_inputs"]()[0].shape) == (2, 3)
    assert presets_of(SOURCE)["tiny"] == {"batch": 2, "width": 3}


def test_unknown_preset_or_size_is_an_error():
    with pytest.raises(TaskError, match=r"no preset 'huge' \(it has: odd, tiny\)"):
        apply_preset(SOURCE, "huge")
    with pytest.raises(TaskError, match="cannot set depth.*does not assign it"):
        apply_preset(SOURCE, "odd")
    with pytest.raises(TaskError, match="cannot set area.*assigns it 2 times"):
        with_sizes(SOURCE + "\narea = 1\n", {"area": 5})
    with pytest.raises(TaskError, match="an int, float, bool or str"):
        with_sizes(SOURCE, {"batch": [1, 2]})


def test_a_file_without_presets_loads_as_before():
    """KernelBench files have no PRESETS: they load unchanged, and asking one for a preset says so."""
    plain = load_task_file(CPU / "tiny_mlp.py")
    assert plain.source == (CPU / "tiny_mlp.py").read_text() and presets_of(plain.source) == {}
    with pytest.raises(TaskError, match="defines no PRESETS, so it has no preset 'tiny'"):
        load_task_file(CPU / "tiny_mlp.py", preset="tiny")


def test_resolve_tasks_applies_the_preset_to_each_task():
    full, tiny = resolve_tasks("mlp,lm_head_nll"), resolve_tasks("mlp,lm_head_nll", preset="tiny")
    assert [t.name for t in tiny] == [t.name for t in full]
    assert all(a.sha256 != b.sha256 for a, b in zip(full, tiny, strict=True))
    with pytest.raises(TaskError, match="task mlp has no preset 'nope'"):
        resolve_tasks("mlp", preset="nope")


@pytest.mark.parametrize("name", bundled_task_names())
def test_every_bundled_task_runs_at_its_tiny_preset(name):
    """The preset's every value lands in the module, and the tiny Model runs forward on the CPU."""
    full = resolve_tasks(name)[0]
    task = resolve_tasks(name, preset="tiny")[0]
    sizes = presets_of(full.source, name)["tiny"]
    module = _globals(task.source)
    assert {k: module[k] for k in sizes} == sizes
    assert any(_globals(full.source)[k] != v for k, v in sizes.items())
    torch.manual_seed(0)
    model = module["Model"](*module["get_init_inputs"]())
    with torch.no_grad():
        out = model(*module["get_inputs"]())
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    assert outs and all(o.numel() > 0 and torch.isfinite(o).all() for o in outs)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000  # CPU-sized (embedding_mlp keeps its fixed 512- and 1024-wide MLPs)
