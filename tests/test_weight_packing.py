"""Weights split once (compiler/lowering/packing.py): a parameter's 3xTF32 halves kept between
calls, remade when its data_ptr or version counter moves. Run on the GPU: tests/test_gpu.py."""

from __future__ import annotations

import re

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.check import host_source
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
from stitchcuda.compiler.emit.program import program_spec, split_cuda
from stitchcuda.compiler.lowering import packing
from stitchcuda.compiler.lowering.lower import lower
from stitchcuda.task import resolve_tasks
from tests.test_offline_codegen import _compile_together, cuda_source

SPLIT = CodegenOptions(split_tf32=True)


def _lowered(name: str, options: CodegenOptions = SPLIT):
    (task,) = resolve_tasks(name)
    compiled = compile_task(task)
    return task, compiled, lower(compiled.graph, compiled.groups, options)


def test_weights_are_split_once_and_activations_every_call():
    task, compiled, low = _lowered("mlp")
    gemms = [x.gemm for g in low.groups for x in g.launches() if x.gemm is not None]
    assert all(g.split.b.packed and not g.split.a.packed for g in gemms)  # x . W^T: the weight is B
    assert len(low.pack_launches) == len(low.pack_params) == 3 and low.pack_bytes > 0
    program = generate(task, compiled.graph, compiled.groups, SPLIT)
    head, entry = split_cuda(cuda_source(program))
    per_call = head[head.index("void launch_all("):head.index("void pack_weights(")]
    # the activations split every call, the weights only in pack_weights
    assert not re.search(r"sc_split_tf32\w*<<<[^;]*\(a\.p_fc\d_weight", per_call) and "(a.x, a.x_split_a" in per_call
    assert len(re.findall(r"sc_split_tf32\w*<<<[^;]*\(a\.p_fc\d_weight", head[head.index("void pack_weights("):])) == 3
    # the host remakes the packs when a weight's storage or version moves, and holds the weights
    spec = program_spec(program)
    assert sorted(spec.names[i] for i in spec.packed) == ["p_fc1_weight", "p_fc2_weight", "p_fc3_weight"]
    host = host_source(program)
    assert "t._version()" in host and "d.pack_held.push_back(t)" in host and "&sc_pack" in entry
    assert "Weights split once: 3 packed" in program


def test_without_packing_or_beyond_the_budget_weights_split_every_call(monkeypatch):
    _, _, low = _lowered("mlp", CodegenOptions(split_tf32=True, pack_weights=False))
    assert not low.pack_launches and not low.pack_bytes
    monkeypatch.setattr(packing, "gpu_bytes", lambda: 1 << 20)  # a quarter of 1 MiB: nothing fits
    task, compiled, low = _lowered("mlp")
    assert not low.pack_launches and low.pack_refused > 0
    program = generate(task, compiled.graph, compiled.groups, SPLIT)
    assert "did not fit the budget: those weights split on every call" in program


def test_convolution_weights_pack_too():
    _, _, low = _lowered("diffusion_resblock")
    assert [c.split.w_packed for c in low.convs] == [True, True]
    assert all("sc_split3_weight" in launch for launch in low.pack_launches)


@pytest.mark.nvcc
def test_a_packing_program_compiles_for_sm90(tmp_path):
    sources = []
    for name in ("mlp", "diffusion_resblock"):
        task, compiled, _ = _lowered(name)
        sources.append(cuda_source(generate(task, compiled.graph, compiled.groups, SPLIT)))
    _compile_together(sources, tmp_path)


def test_forward_reads_the_weights_held_now():
    """The generated forward reaches each submodule once a call through its parent's _modules and
    the tensors through _parameters/_buffers (get_parameter per tensor cost MobileNetV2 about 2 ms
    a call on an H100 host): a reassigned submodule, a reassigned parameter and a replaced buffer
    are all read as they are at the call."""
    import torch
    from torch import nn

    from stitchcuda.compiler.emit.program import StateReads

    reads = StateReads()
    keys = [("net.0.weight", "parameter"), ("net.1.running_mean", "buffer"), ("net.0.bias", "parameter"),
            ("scale", "buffer")]
    exprs = [reads.read(k, kind) for k, kind in keys]
    assert sum(line.count("_modules['net']") for line in reads.lines) == 1  # each submodule once
    source = "def tensors(self):\n" + "".join(f"    {line}\n" for line in reads.lines) + \
        f"    return [{', '.join(exprs)}]\n"
    scope: dict = {}
    exec(source, scope)
    model = nn.Module()
    model.net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model.register_buffer("scale", torch.ones(1))
    got = scope["tensors"](model)
    assert got[0] is model.net[0].weight and got[1] is model.net[1].running_mean and got[3] is model.scale
    model.net[0] = nn.Linear(4, 4)  # a new submodule
    model.net[1].running_mean = torch.full((4,), 2.0)  # a replaced buffer
    model.net[0].bias = nn.Parameter(torch.zeros(4))  # a reassigned parameter
    got = scope["tensors"](model)
    assert got[0] is model.net[0].weight and got[2] is model.net[0].bias and bool((got[1] == 2).all())
