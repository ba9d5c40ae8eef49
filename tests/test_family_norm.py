"""The normalisation family (batch/group/layer/instance norm, softmax and log_softmax over any dim):
small references through capture, fusion and codegen, the lowerings on a fake context, and one
nvcc compile of a program holding every kind of kernel the family emits."""

from __future__ import annotations

import re
from typing import Any

import pytest

from stitchcuda.compiler.capture.graph import Node, TensorMeta
from stitchcuda.compiler.check import cuda_source
from stitchcuda.compiler.driver import compile_task
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.families.norm_kernels import HELPERS_NAME
from stitchcuda.compiler.lowering.kernel_call import Strided
from stitchcuda.compiler.lowering.registry import OPERATORS
from stitchcuda.task.record import Task
from tests.test_offline_codegen import assert_program_compiles

HEAD = "import torch\nimport torch.nn as nn\n\n"


def _task(name: str, body: str, inputs: str, init: str = "[]") -> Task:
    source = (HEAD + "class Model(nn.Module):\n" + body + f"\n\ndef get_inputs():\n    return {inputs}\n\n"
              f"def get_init_inputs():\n    return {init}\n")
    return Task(name=name, source=source)


MODELS: dict[str, tuple[str, str, set[str]]] = {
    "bn2d_train": ("""    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x):
        return self.bn(x)""", "[torch.rand(8, 16, 24, 20)]", {"aten._native_batch_norm_legit_functional"}),
    "bn3d_train": ("""    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm3d(6, momentum=0.3)

    def forward(self, x):
        return self.bn(x) * 2.0""", "[torch.rand(4, 6, 5, 7, 9)]", {"aten._native_batch_norm_legit_functional"}),
    "group_norm_big": ("""    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(4, 32)

    def forward(self, x):
        return self.gn(x)""", "[torch.rand(2, 32, 96, 96)]", {"aten.group_norm"}),
    "instance_norm": ("""    def __init__(self):
        super().__init__()
        self.inorm = nn.InstanceNorm2d(8, affine=True)

    def forward(self, x):
        return self.inorm(x)""", "[torch.rand(4, 8, 33, 17)]", {"aten.instance_norm"}),
    "softmax_dim1": ("""    def forward(self, x):
        return torch.softmax(x, dim=1)""", "[torch.rand(4, 10, 16, 16)]", {"aten.softmax"}),
    "safe_softmax_dim1": ("""    def forward(self, x):
        return torch.ops.aten._safe_softmax(x, 1)""", "[torch.rand(4, 10, 16, 16)]", {"aten._safe_softmax"}),
    "log_softmax_long": ("""    def forward(self, x):
        return torch.log_softmax(x, dim=-1)""", "[torch.rand(3, 100000)]", {"aten.log_softmax"}),
    "layer_norm_long": ("""    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm([64, 40, 40])

    def forward(self, x):
        return self.ln(x)""", "[torch.rand(2, 64, 40, 40)]", {"aten.layer_norm"}),
}


def _program(name: str) -> tuple[Any, str]:
    body, inputs, _ = MODELS[name]
    compiled = compile_task(_task(name, body, inputs))
    return compiled, compiled.program()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reference_generates_with_family_kernels(name):
    compiled, program = _program(name)
    ops = {n.op for n in compiled.graph.nodes}
    assert ops & MODELS[name][2], f"{name}: expected one of {MODELS[name][2]} in {sorted(ops)}"
    node = next(n for n in compiled.graph.nodes if n.op in MODELS[name][2])
    src = cuda_source(program)
    assert "struct ScMoments" in src and src.count("struct ScMoments") == 1
    assert re.search(rf"__global__ void __launch_bounds__\(\d+\) k_{node.name}_stats\(", src)
    apply = re.search(rf"__global__ void __launch_bounds__\(\d+\) k_{node.name}_apply\(", src)
    # training-mode batch norm normalises in a pointwise kernel (schedule/batch_norm_split.py)
    assert (apply is None) == (node.op == "aten._native_batch_norm_legit_functional" and bool(node.args[5]))


def test_batch_norm_training_updates_running_stats():
    compiled, program = _program("bn2d_train")
    src = cuda_source(program)
    assert compiled.graph.mutations, "the capture returns the new running statistics"
    # unbiased variance for the running estimate: n = 8 * 24 * 20 values per channel
    assert "var * 3840.0 / 3839.0" in src
    assert "(1.0 - 0.1)" in src


# ----------------------------------------------------------------------------- lowerings on a fake context

class FakeContext:
    block = 256

    def __init__(self, values: dict[str, tuple[tuple[int, ...], tuple[int, ...], int]],
                 outputs: dict[str, list[str | None]] | None = None, shapes: dict[str, tuple[int, ...]] | None = None):
        self.values, self.outs, self.shapes = values, outputs or {}, shapes or {}
        self.written: dict[str, Strided] = {}

    def read(self, arg: Any) -> Strided:
        if not (isinstance(arg, str) and arg.startswith("%")) or arg[1:] not in self.values:
            raise Unsupported(f"not a tensor: {arg!r}")
        shape, strides, offset = self.values[arg[1:]]
        return Strided(f"a.{arg[1:]}", "float", shape, strides, offset)

    def write(self, value: str, dtype: str = "float32") -> Strided:
        shape = self.shapes[value]
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        self.written[value] = Strided(f"a.{value}", "float", shape, tuple(reversed(strides)))
        return self.written[value]

    def outputs(self, node: Node) -> list[str | None]:
        return self.outs.get(node.name, [node.name])

    def kernel_name(self, node: Node, what: str) -> str:
        return f"k_{node.name}_{what}"


def _contig(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def _node(name: str, op: str, args: list[Any], outs: list[tuple[int, ...]], overload: str = "default") -> Node:
    return Node(name=name, op=op, overload=overload, args=args,
                out=[TensorMeta(shape=list(s), dtype="float32") for s in outs])


def test_softmax_over_a_transposed_read_walks_lanes_across_groups():
    # x is a (64, 4096) view of a contiguous (4096, 64) tensor: dim 0 has stride 1
    ctx = FakeContext({"x": ((64, 4096), (1, 64), 0)}, shapes={"sm": (64, 4096)})
    node = _node("sm", "aten._softmax", ["%x", 1, False], [(64, 4096)])
    call = OPERATORS["aten._softmax"](ctx, node)
    stats = call.kernels["k_sm_stats"]
    assert "tx = threadIdx.x % " in stats  # a lane per row: the rows are adjacent in memory
    assert "ScSoftmax" in stats and "float4" not in stats
    assert "k_sm_stats<<<" in call.launch and "k_sm_apply<<<" in call.launch


def test_a_safe_softmax_gives_a_row_of_minus_inf_zeros_and_keeps_nan():
    ctx = FakeContext({"x": ((8, 4, 32), (128, 32, 1), 0)}, shapes={"ss": (8, 4, 32)})
    call = OPERATORS["aten._safe_softmax"](ctx, _node("ss", "aten._safe_softmax", ["%x", 1], [(8, 4, 32)]))
    assert "ScSoftmax" in call.kernels["k_ss_stats"]  # NaN makes the statistics NaN, so NaN rows stay NaN
    assert "st.x == -INFINITY ? 0.0f : expf(v_x[i] - st.x) * st.y" in call.kernels["k_ss_apply"]


def test_log_softmax_long_rows_split_over_blocks_and_combine():
    ctx = FakeContext({"x": ((2, 1 << 20), (1 << 20, 1), 0)}, shapes={"ls": (2, 1 << 20)})
    node = _node("ls", "aten._log_softmax", ["%x", -1, False], [(2, 1 << 20)])
    call = OPERATORS["aten._log_softmax"](ctx, node)
    stats = call.kernels["k_ls_stats"]
    assert "k_ls_stats_part[" in stats and "atomicAdd(&k_ls_stats_count[tile]" in stats
    assert "logf(acc.s)" in stats and "float4" in stats
    assert "(v_x[i] - st.x) - st.y" in call.kernels["k_ls_apply"]


def test_batch_norm_writes_only_the_outputs_read():
    shape = (4, 3, 10)
    ctx = FakeContext({"x": (shape, _contig(shape), 0), "w": ((3,), (1,), 0), "b": ((3,), (1,), 0),
                       "rm": ((3,), (1,), 0), "rv": ((3,), (1,), 0)},
                      outputs={"bn": [None, None, None, "new_rm", None]}, shapes={"new_rm": (3,)})
    node = _node("bn", "aten._native_batch_norm_legit_functional",
                 ["%x", "%w", "%b", "%rm", "%rv", True, 0.25, 1e-3], [shape, (3,), (3,), (3,), (3,)])
    call = OPERATORS["aten._native_batch_norm_legit_functional"](ctx, node)
    assert set(call.kernels) == {HELPERS_NAME, "k_bn_stats"}  # no normalised output is read
    assert "o_rm[g] = (float)((1.0 - 0.25)" in call.kernels["k_bn_stats"]
    assert "o_rv" not in call.kernels["k_bn_stats"]


def test_native_group_norm_writes_mean_and_rstd():
    shape = (2, 8, 5, 5)
    ctx = FakeContext({"x": (shape, _contig(shape), 0)}, outputs={"gn": ["y", "mean", "rstd"]},
                      shapes={"y": shape, "mean": (2, 2), "rstd": (2, 2)})
    node = _node("gn", "aten.native_group_norm", ["%x", None, None, 2, 8, 25, 2, 1e-5], [shape, (2, 2), (2, 2)])
    call = OPERATORS["aten.native_group_norm"](ctx, node)
    stats = call.kernels["k_gn_stats"]
    assert "o_mean[g] = (float)mean;" in stats and "o_rstd[g] = rstd;" in stats
    assert "__device__ float2 k_gn_stats_st[4];" in stats


def test_eval_batch_norm_uses_running_stats_without_a_statistics_kernel():
    shape = (2, 3, 4, 4)
    ctx = FakeContext({"x": (shape, _contig(shape), 0), "rm": ((3,), (1,), 0), "rv": ((3,), (1,), 0)},
                      outputs={"bn": ["y", None, None]}, shapes={"y": shape})
    node = _node("bn", "aten._native_batch_norm_legit_no_training", ["%x", None, None, "%rm", "%rv", 0.1, 1e-5],
                 [shape, (0,), (0,)])
    call = OPERATORS["aten._native_batch_norm_legit_no_training"](ctx, node)
    assert set(call.kernels) == {HELPERS_NAME, "k_bn_apply"}
    assert "1.0f / sqrtf(v_rv[i] + (float)1e-05)" in call.kernels["k_bn_apply"]


def test_bad_arguments_raise_unsupported():
    ctx = FakeContext({"x": ((2, 6, 4), (24, 4, 1), 0)}, shapes={"gn": (2, 6, 4)})
    with pytest.raises(Unsupported, match="groups"):
        OPERATORS["aten.group_norm"](ctx, _node("gn", "aten.group_norm", ["%x", 4], [(2, 6, 4)]))
    with pytest.raises(Unsupported, match="normalized_shape"):
        OPERATORS["aten.layer_norm"](ctx, _node("ln", "aten.layer_norm", ["%x", [5]], [(2, 6, 4)]))
    with pytest.raises(Unsupported, match="dim"):
        OPERATORS["aten.softmax"](ctx, _node("sm", "aten.softmax", ["%x", 3], [(2, 6, 4)], "int"))


# ----------------------------------------------------------------------------- nvcc

@pytest.mark.nvcc
def test_family_kernels_compile_with_nvcc(tmp_path):
    body = """    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(16)
        self.gn = nn.GroupNorm(2, 16)
        self.inorm = nn.InstanceNorm2d(16, affine=True)

    def forward(self, x, y):
        z = self.inorm(self.gn(self.bn(x)))
        return torch.softmax(z, dim=1), torch.log_softmax(y, dim=-1), torch.softmax(y.t(), dim=0)"""
    compiled = compile_task(_task("norm_all", body, "[torch.rand(4, 16, 64, 64), torch.rand(4, 40000)]"))
    program = compiled.program()
    src = cuda_source(program)
    for what in ("_stats_part[", "tx = threadIdx.x % ", "ScSoftmax acc", "ScMoments acc", "o_rm[g]"):
        assert what in src, what
    assert_program_compiles(program, tmp_path)

