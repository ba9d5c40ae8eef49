"""A program called with a fresh input every call, by a caller that keeps its outputs (or allocates
between calls), sees new addresses every call: the program host's staged graph
(templates/program_host.cpp, run) reads its own copies of the forward's inputs and writes its own
output buffers, copied in and out. On the CPU: the program names the forward's inputs, and only
them, as what the staged graph may copy. On a GPU: every call's outputs right, each call's outputs
its own tensors (a later call changes none of an earlier call's), and the same once the addresses
repeat."""

from __future__ import annotations

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from stitchcuda.compiler.emit.program import STAGE_BYTES_PER_LAUNCH, program_spec
from tests.test_offline_codegen import task_from

TWO_OUTPUTS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 256)
        self.down = nn.Linear(256, 64)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(x))
        return self.down(h), h.sum(dim=-1)


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def compiled():
    return compile_task(task_from("staged_outputs", TWO_OUTPUTS))


def test_only_the_forwards_inputs_are_staged(compiled):
    spec = program_spec(compiled.program(CodegenOptions()))
    assert [spec.names[i] for i in spec.staged] == ["x"]
    assert len(spec.names) == 5  # x, and the two linears' weights and biases, which are never copied
    assert spec.stage_bytes >= STAGE_BYTES_PER_LAUNCH  # a few launches: its 4 KiB in and 4 KiB out are staged


LARGE_POINTWISE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(2048, 4096)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def large():
    return compile_task(task_from("large_pointwise", LARGE_POINTWISE))


def test_a_memory_bound_program_is_not_staged(large):
    """One launch over 32 MiB in and out: copying them would cost more than the launch saved."""
    spec = program_spec(large.program(CodegenOptions()))
    assert spec.stage_bytes < 2 * 2048 * 4096 * 4


@pytest.mark.gpu
def test_fresh_addresses_every_call_stay_right_and_apart(compiled, tmp_path):
    import torch

    from tests.test_gpu import _reference_and_program

    program = compiled.program(CodegenOptions())
    scope, ref, new = _reference_and_program(compiled.task, program, tmp_path / "staged_outputs.py")
    torch.backends.cuda.matmul.allow_tf32 = False
    kept, expected = [], []
    with torch.no_grad():
        for call in range(12):
            torch.manual_seed(call)
            x = scope["get_inputs"]()[0].cuda()
            got = new(x)  # every output kept: the next call's come at new addresses
            want = ref(x)
            kept.append(got)
            expected.append(tuple(w.clone() for w in want))
        addresses = {out[0].data_ptr() for out in kept}
        assert len(addresses) == len(kept)
        for call, (got, want) in enumerate(zip(kept, expected, strict=True)):
            for g, w in zip(got, want, strict=True):
                err = ((g - w).abs().max() / w.abs().max()).item()
                assert err < 1e-5, f"call {call}: relative error {err:.2e} (or a later call wrote this output)"
        # the addresses repeat once nothing is kept: the graph for them, no copy
        x = scope["get_inputs"]()[0].cuda()
        want = ref(x)
        for _ in range(4):
            got = new(x)
            for g, w in zip(got, want, strict=True):
                assert ((g - w).abs().max() / w.abs().max()).item() < 1e-5
            del got


@pytest.mark.gpu
def test_a_program_launched_directly_at_fresh_addresses_stays_right(large, tmp_path):
    import torch

    from tests.test_gpu import _reference_and_program

    scope, ref, new = _reference_and_program(large.task, large.program(CodegenOptions()), tmp_path / "large.py")
    with torch.no_grad():
        kept = []
        for call in range(4):
            torch.manual_seed(call)
            x = scope["get_inputs"]()[0].cuda()
            kept.append((new(x), ref(x)))
        for got, want in kept:
            assert torch.equal(got, want)
