"""The forward's buffer updates in one launch per element type (families/state.py): a model in
training mode (KernelBench never calls ``.eval()``) writes every BatchNorm's running statistics
back and steps its ``num_batches_tracked``; ResNet-18 did so in 80 launches of a few bytes each."""

from __future__ import annotations

import importlib.util

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.check import cuda_source
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
from stitchcuda.compiler.lowering.families.state import STATE_SEGMENTS, BufferUpdate, write_backs
from stitchcuda.compiler.lowering.kernel_call import Strided
from stitchcuda.task import resolve_tasks

TRAINING_BN_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(8, 8, 3, padding=1) for _ in range(3))
        self.bns = nn.ModuleList(nn.BatchNorm2d(8) for _ in range(3))

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns):
            x = torch.relu(bn(conv(x)))
        return x


def get_inputs():
    return [torch.randn(4, 8, 16, 16)]


def get_init_inputs():
    return []
'''


def _program(tmp_path) -> tuple[str, str]:
    path = tmp_path / "training_bn.py"
    path.write_text(TRAINING_BN_TASK)
    (task,) = resolve_tasks(str(path))
    compiled = compile_task(task)
    return str(path), generate(task, compiled.graph, compiled.groups, CodegenOptions())


def test_every_buffer_update_is_one_launch_per_element_type(tmp_path):
    _, program = _program(tmp_path)
    source = cuda_source(program)
    launches = [line for line in source.splitlines() if "<<<" in line]
    assert sum("k_state_update_float<<<dim3(1, 6)" in line for line in launches) == 1  # 3 means, 3 variances
    assert sum("k_state_update_int64<<<dim3(1, 3)" in line for line in launches) == 1  # 3 counters
    assert not any("write_back" in line or "int_add" in line for line in launches)
    # the counters step in place, read nowhere else: no launch of their own
    assert source.count("t.step[0] = 1LL;") == 1 and "+= 1, in the state update at the end" in program


def test_more_buffers_than_one_launch_carries_take_several():
    def buffer(i: int) -> Strided:
        return Strided(f"a.b{i}", "float", (4,), (1,))

    updates = [BufferUpdate(buffer(i), f"b{i}", value=Strided(f"a.v{i}", "float", (4,), (1,)))
               for i in range(STATE_SEGMENTS + 3)]
    calls = write_backs(updates)
    assert len(calls) == 2 and f"dim3(1, {STATE_SEGMENTS})" in calls[0].launch and "dim3(1, 3)" in calls[1].launch
    with pytest.raises(Exception, match="buffer write-back"):
        write_backs([BufferUpdate(buffer(0), "b0", value=Strided("a.v", "float", (5,), (1,)))])


@pytest.mark.nvcc
def test_the_state_update_compiles_for_sm90(tmp_path):
    from tests.test_offline_codegen import _compile_together

    _compile_together([cuda_source(_program(tmp_path)[1])], tmp_path)


@pytest.mark.gpu
def test_running_statistics_and_counters_follow_the_reference_over_calls(tmp_path):
    import torch

    task_path, program = _program(tmp_path)
    (tmp_path / "program.py").write_text(program)

    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    torch.manual_seed(0)
    ref = load(task_path, "training_bn_ref").Model().cuda()
    torch.manual_seed(0)
    new = load(tmp_path / "program.py", "training_bn_new").ModelNew().cuda()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 8, 16, 16, device="cuda")
            assert torch.allclose(new(x), ref(x), atol=1e-4, rtol=1e-4)
    theirs, ours = ref.state_dict(), new.state_dict()
    for name, value in theirs.items():
        if "running" in name or "num_batches" in name:
            assert torch.allclose(ours[name].double(), value.double(), atol=1e-6), name
    assert int(ours["bns.0.num_batches_tracked"]) == 3
