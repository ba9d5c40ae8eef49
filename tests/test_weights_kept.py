"""A generated forward gathers its weights once and keeps them while no module of the model changes
its parameters, buffers or submodules (templates/module.py.j2: ``_Watched``, ``_stitchcuda_gather``):
a call compares one count instead of walking the module tree, and still follows everything a user
does to the weights. Run on the CPU with the program's builds stubbed (tests/program_stub.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from tests.program_stub import ProgramExtensions, exec_program
from tests.test_offline_codegen import task_from

BLOCK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, x):
        return self.net(x)


def get_inputs():
    return [torch.randn(16, 8)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def source() -> str:
    return compile_task(task_from("weights_kept", BLOCK)).program(CodegenOptions())


@pytest.fixture
def model(source, monkeypatch):
    stub = ProgramExtensions(on_call=lambda args: torch.empty(16, 4))
    module = exec_program(source, monkeypatch, stub)
    gathers = []
    gather = module.ModelNew._stitchcuda_gather

    def counted(self):
        gathers.append(self)
        return gather(self)

    monkeypatch.setattr(module.ModelNew, "_stitchcuda_gather", counted)
    torch.manual_seed(0)
    made = module.ModelNew()
    made.stub, made.gathers = stub, gathers
    return made




def _held(model) -> list[torch.Tensor]:
    net = model.net
    return [net[0].weight, net[0].bias, net[1].weight, net[1].bias, net[1].running_mean, net[1].running_var,
            net[1].num_batches_tracked,
            net[3].weight, net[3].bias]


def _call(model) -> list[torch.Tensor]:
    """The tensors a call handed the program, its input left out."""
    x = torch.randn(16, 8)
    model(x)
    return [a for a in model.stub.calls[-1] if a is not x]


def test_the_weights_are_gathered_once_while_nothing_changes(model):
    first = _call(model)
    second = _call(model)
    assert len(model.gathers) == 1
    assert all(a is b for a, b in zip(first, second, strict=True))
    held = {id(t) for t in _held(model)}
    assert held >= {id(t) for t in first} and len(first) >= 6  # the model's own tensors, nothing copied


def test_load_state_dict_and_an_optimizer_step_write_the_same_tensors(model):
    before = _call(model)
    state = {k: v + 1 if v.is_floating_point() else v for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    after = _call(model)
    assert len(model.gathers) == 1
    assert all(a is b for a, b in zip(before, after, strict=True))
    assert torch.equal(model.net[0].weight, state["net.0.weight"] + 0.5)


@pytest.mark.parametrize("change", ["parameter", "submodule", "buffer", "to", "child_to", "assign"])
def test_every_change_to_a_module_is_followed(model, change):
    _call(model)
    net = model.net
    if change == "parameter":
        net[0].weight = nn.Parameter(torch.randn(8, 8))
    elif change == "submodule":
        net[3] = nn.Linear(8, 4)
    elif change == "buffer":
        net[1].running_mean = torch.full((8,), 3.0)
    elif change == "to":
        model.to(torch.float64)  # the buffers are new tensors in the same dicts
    elif change == "child_to":
        net[1].to(torch.float64)
    else:
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    got = _call(model)
    assert len(model.gathers) == 2
    held = _held(model)
    by_id = {id(t) for t in held}
    assert {id(t) for t in got} <= by_id, f"{change}: the call used a tensor the model no longer holds"
    # and it stays kept after the change
    _call(model)
    assert len(model.gathers) == 2


def test_a_copy_calls_with_its_own_tensors(model):
    _call(model)
    twin = copy.deepcopy(model)
    twin.stub = model.stub
    got = _call(twin)
    assert {id(t) for t in got} <= {id(t) for t in _held(twin)}
    assert not {id(t) for t in got} & {id(t) for t in _held(model)}
