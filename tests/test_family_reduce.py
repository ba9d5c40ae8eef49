"""The reduction and scan families: small references through capture, fusion and codegen, the
lowerings on a fake context (layouts, split extents, argument forms), and one nvcc compile of a
program holding every kind of kernel the two families emit."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from stitchcuda.compiler.capture.graph import Node, TensorMeta, capture
from stitchcuda.compiler.check import cuda_source
from stitchcuda.compiler.emit.codegen import generate
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.families.reduce import split_dims
from stitchcuda.compiler.lowering.kernel_call import KernelCall, Strided
from stitchcuda.compiler.lowering.registry import OPERATORS
from stitchcuda.compiler.schedule.fusion import fuse
from stitchcuda.task.load import load_task_file
from tests.test_offline_codegen import assert_program_compiles

HEAD = "import torch\nimport torch.nn as nn\n\n\n"


def _source(forward: str, inputs: str) -> str:
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
            f"    def forward(self, x):\n        return {forward}\n\n\n"
            f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return []\n")


def _generate(tmp_path: Path, name: str, source: str) -> tuple[Any, str]:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    task = load_task_file(path)
    graph = capture(task)
    return graph, generate(task, graph, fuse(graph))


# forward, inputs, the family ops the graph must hold, text every program must contain
MODELS: dict[str, tuple[str, str, set[str], list[str]]] = {
    "sum_middle_dim": ("torch.sum(x, dim=1, keepdim=True)", "[torch.rand(4, 300, 70)]", {"aten.sum"},
                       ["k_sum_1_reduce", "double s"]),
    "max_dim_values_indices": ("torch.max(x, dim=1)", "[torch.rand(4, 300, 70)]", {"aten.max"},
                               ["int64_t* __restrict__ y1", "0x7fffffffffffffffLL"]),
    "argmin_flattened": ("torch.argmin(x)", "[torch.rand(64, 3000)]", {"aten.argmin"}, ["_combine", "_p_i["]),
    "mean_all_dims": ("x.mean()", "[torch.rand(256, 4096)]", {"aten.mean"}, ["_combine", "/ 1048576.0"]),
    "var_mean_rows": ("torch.var_mean(x, dim=0, correction=0)", "[torch.rand(500, 64)]", {"aten.var_mean"},
                      ["const double K = ", "y1[out]"]),
    "std_unbiased_tail": ("torch.std(x, dim=(1, 2))", "[torch.rand(8, 30, 50)]", {"aten.var"},  # var -> sqrt
                          ["/ 1499.0"]),
    "amin_channels": ("torch.amin(x, dim=1)", "[torch.rand(2, 16, 9, 9)]", {"aten.amin"}, ["m = a;"]),
    "norms": ("(torch.linalg.vector_norm(x, dim=0), torch.linalg.vector_norm(x, ord=float('inf'), dim=1), "
              "torch.linalg.vector_norm(x, ord=3, dim=(0, 1)))", "[torch.rand(40, 30, 20)]",
              {"aten.linalg_vector_norm"}, ["fabs(v)", "pow(s, 0.3333333333333333)", "sqrt(s)"]),
    "prod_middle": ("torch.prod(x, dim=1)", "[torch.rand(6, 5, 7)]", {"aten.prod"}, ["s *= v;"]),
    "cumsum_rows": ("torch.cumsum(x, dim=1)", "[torch.rand(16, 5000)]", {"aten.cumsum"},
                    ["k_cumsum_scan", "__shfl_up_sync", "float4"]),
    "cumprod_columns": ("torch.cumprod(x, dim=0)", "[torch.rand(20, 40000)]", {"aten.cumprod"},
                        ["a = a * (double)x[ib + j * 40000LL]"]),
    "cumsum_exclusive_view": ("torch.cumsum(x[:, :-1], dim=-1)", "[torch.rand(8, 777)]", {"aten.cumsum"},
                              ["y + ob"]),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reference_generates_with_family_kernels(tmp_path, name):
    forward, inputs, ops, texts = MODELS[name]
    graph, program = _generate(tmp_path, name, _source(forward, inputs))
    assert ops <= {n.op for n in graph.nodes}
    src = cuda_source(program)
    for text in texts:
        assert text in src, text
    assert "SC_CUDA_CHECK(cudaGetLastError());" in src


# -- the lowerings on a fake context -------------------------------------------------------------------

class FakeContext:
    block = 256

    def __init__(self, inputs: dict[str, Strided], reads: list[str | None] | None = None):
        self.inputs, self.reads, self.written = inputs, reads, {}

    def read(self, arg: Any) -> Strided:
        if not (isinstance(arg, str) and arg[1:] in self.inputs):
            raise Unsupported(f"not a tensor: {arg!r}")
        return self.inputs[arg[1:]]

    def write(self, value: str, dtype: str = "float32") -> Strided:
        self.written[value] = dtype
        return Strided(f"a.{value}", {"float32": "float", "int64": "int64_t", "bool": "bool"}[dtype], (1,), (1,))

    def outputs(self, node: Node) -> list[str | None]:
        if self.reads is not None:
            return self.reads
        return [node.name] if len(node.out) == 1 else [f"{node.name}_{i}" for i in range(len(node.out))]

    def kernel_name(self, node: Node, what: str) -> str:
        return f"k_{node.name}_{what}"


def _node(name: str, op: str, args: list[Any], outs: list[tuple[list[int], str]], overload: str = "default",
          kwargs: dict[str, Any] | None = None) -> Node:
    return Node(name=name, op=op, overload=overload, args=args, kwargs=kwargs or {},
                out=[TensorMeta(shape=s, dtype=d) for s, d in outs])


def _contig(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def _lower(node: Node, shape: tuple[int, ...], strides: tuple[int, ...] | None = None, offset: int = 0,
           ctype: str = "float", reads: list[str | None] | None = None) -> tuple[KernelCall, FakeContext]:
    ctx = FakeContext({"x": Strided("a.x", ctype, shape, strides or _contig(shape), offset)}, reads)
    return OPERATORS[node.op](ctx, node), ctx


def test_split_dims_merges_neighbours_of_one_kind():
    x = Strided("a.x", "float", (4, 5, 6, 7), _contig((4, 5, 6, 7)))
    kept, red = split_dims(x, [1, 2])
    assert [(d.size, d.stride, d.out) for d in kept] == [(4, 210, 7), (7, 1, 1)]
    assert [(d.size, d.stride) for d in red] == [(30, 7)]
    t = Strided("a.x", "float", (6, 4), (1, 6))  # a transposed read: nothing merges
    kept, red = split_dims(t, [0, 1])
    assert kept == [] and [(d.size, d.stride) for d in red] == [(6, 1), (4, 6)]


def test_kept_innermost_dim_gives_coalesced_lanes_and_reduced_innermost_a_team():
    node = _node("s", "aten.sum", ["%x", [1]], [([64, 512], "float32")], "dim_IntList")
    call, _ = _lower(node, (64, 1000, 512))
    assert "neighbouring outputs coalesced" in call.describe
    node = _node("s", "aten.sum", ["%x", [-1]], [([64], "float32")], "dim_IntList")
    call, _ = _lower(node, (64, 100000))
    assert "a block per output" in call.describe and "slices" in call.describe
    assert "__syncthreads()" in call.kernels["k_s_reduce"]
    node = _node("s", "aten.sum", ["%x", [-1]], [([4096], "float32")], "dim_IntList")
    call, _ = _lower(node, (4096, 200))
    assert "a warp per output" in call.describe and "slices" not in call.describe


def test_full_reduction_splits_into_slices_and_a_combine_kernel():
    node = _node("m", "aten.max", ["%x"], [([], "float32")])
    call, ctx = _lower(node, (1 << 24,))
    assert set(call.kernels) == {"k_m_reduce", "k_m_combine"}
    assert "__device__ float k_m_reduce_p_m[" in call.kernels["k_m_reduce"]
    assert call.launch.count("SC_CUDA_CHECK(cudaGetLastError());") == 2
    assert ctx.written == {"m": "float32"}


def test_max_dim_writes_only_the_outputs_read_and_keeps_the_first_index():
    node = _node("mx", "aten.max", ["%x", 0, True], [([1, 8], "float32"), ([1, 8], "int64")], "dim")
    call, ctx = _lower(node, (300, 8), reads=[None, "idx"])
    src = call.kernels["k_mx_reduce"]
    assert ctx.written == {"idx": "int64"}
    assert "int64_t* __restrict__ y1" in src and "y0" not in src
    assert "(o_i) < (i)" in src  # across threads, ties (and NaNs) go to the smaller index
    assert "if (v > m || (v != v && m == m)) { m = v; i = r; }" in src  # in order within one: the first


def test_max_values_alone_carry_no_index_and_far_strided_walks_cap_their_occupancy():
    node = _node("mx", "aten.max", ["%x", 1], [([128, 4095], "float32"), ([128, 4095], "int64")], "dim")
    call, ctx = _lower(node, (128, 4096, 4095), reads=["vals", None])
    src = call.kernels["k_mx_reduce"]
    assert ctx.written == {"vals": "float32"} and "long long i" not in src
    assert "2 threads per output" in call.describe and ", 256, 46080, stream>>>" in call.launch
    call, _ = _lower(node, (128, 4096, 4095), reads=["vals", "idx"])
    assert ", 256, 0, stream>>>" in call.launch  # index reductions pace themselves: no cap


def test_argmax_of_a_strided_view_with_an_offset_indexes_logically():
    node = _node("am", "aten.argmax", ["%x"], [([], "int64")], kwargs={"dim": None})
    call, _ = _lower(node, (10, 20), strides=(1, 30), offset=7)
    src = call.kernels["k_am_reduce"]
    assert "7LL" in src and "30LL" in src


def test_var_overloads_and_corrections():
    for node, divisor in (
            (_node("v", "aten.var", ["%x", False], [([], "float32")]), "/ 100.0"),
            (_node("v", "aten.var", ["%x", [0], True, True], [([1], "float32")], "dim"), "/ 99.0"),
            (_node("v", "aten.var", ["%x", [0]], [([], "float32")], "correction", {"correction": 3}), "/ 97.0"),
            (_node("v", "aten.var", ["%x"], [([], "float32")], "correction", {"correction": 200}), "/ 0.0")):
        call, _ = _lower(node, (100,))
        assert divisor in call.kernels["k_v_reduce"], node


def test_integer_sums_accumulate_as_integers():
    node = _node("s", "aten.sum", ["%x", [1]], [([8], "int64")], "dim_IntList")
    call, ctx = _lower(node, (8, 100), ctype="bool")
    assert "long long s = 0;" in call.kernels["k_s_reduce"] and ctx.written == {"s": "int64"}
    node = _node("c", "aten.cumsum", ["%x", 1], [([8, 100], "int64")])
    call, _ = _lower(node, (8, 100), ctype="bool")
    assert "long long carry = 0;" in call.kernels["k_c_scan"]


def test_scan_picks_a_block_per_line_or_a_thread_per_line():
    node = _node("c", "aten.cumsum", ["%x", -1], [([4, 32768], "float32")])
    call, _ = _lower(node, (4, 32768))
    assert "a block of 256 per line" in call.describe and "float4" in call.kernels["k_c_scan"]
    node = _node("c", "aten.cumsum", ["%x", 0], [([100, 50000], "float32")])
    call, _ = _lower(node, (100, 50000))
    assert "a thread per line" in call.describe
    node = _node("p", "aten.cumprod", ["%x", 0], [([50000, 100], "float32")], kwargs={"dtype": None})
    call, _ = _lower(node, (50000, 100), strides=(1, 50000))  # transposed: the scanned dim is innermost
    src = call.kernels["k_p_scan"]
    assert "a block of" in call.describe and "const float4" in src  # vector loads, scalar strided stores
    assert "make_float4" not in src and "y[ob + j * 100LL]" in src


def test_bad_arguments_raise_unsupported():
    with pytest.raises(Unsupported, match="dim"):
        _lower(_node("s", "aten.sum", ["%x", [3]], [([2], "float32")], "dim_IntList"), (2, 3))
    with pytest.raises(Unsupported, match="not a tensor"):
        _lower(_node("s", "aten.sum", [1.0], [([], "float32")]), (2, 3))
    with pytest.raises(Unsupported, match="only the full reduction"):
        _lower(_node("mx", "aten.max", ["%x", "%x"], [([2, 3], "float32")], "other"), (2, 3))
    with pytest.raises(Unsupported, match="norm order"):
        _lower(_node("n", "aten.linalg_vector_norm", ["%x", "fro"], [([], "float32")]), (2, 3))
    with pytest.raises(Unsupported, match="dim"):
        _lower(_node("c", "aten.cumsum", ["%x", 2], [([2, 3], "float32")]), (2, 3))
    with pytest.raises(Unsupported, match="float64"):
        _lower(_node("s", "aten.sum", ["%x"], [([], "float64")], kwargs={"dtype": "torch.float64"}), (2, 3))


def test_unread_outputs_emit_nothing():
    node = _node("vm", "aten.var_mean", ["%x", [0]], [([3], "float32"), ([3], "float32")], "correction")
    call, ctx = _lower(node, (2, 3), reads=[None, None])
    assert call.kernels == {} and call.launch == "" and ctx.written == {}


# ----------------------------------------------------------------------------- nvcc

NVCC_MODEL = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y, m):
        v, i = torch.max(x, dim=1)
        vm, mu = torch.var_mean(x, dim=(0, 2))
        return (v, i, torch.argmin(x), vm, mu, torch.logsumexp(x, dim=0), torch.sum(m, dim=0),
                torch.linalg.vector_norm(y, ord=float("inf")), torch.prod(x, dim=0), torch.mean(y, dim=0),
                torch.cumsum(y, dim=1), torch.cumprod(y, dim=0), torch.cumsum(m, dim=1))


def get_inputs():
    return [torch.rand(8, 300, 70), torch.rand(64, 40000), torch.rand(16, 300) > 0.5]


def get_init_inputs():
    return []
"""


@pytest.mark.nvcc
def test_family_kernels_compile_with_nvcc(tmp_path):
    _, program = _generate(tmp_path, "reduce_all", NVCC_MODEL)
    src = cuda_source(program)
    kernels = re.findall(r"__global__ void __launch_bounds__\(\d+\) (k_\w+)\(", src)
    assert {"k_max_1_reduce", "k_argmin_reduce", "k_argmin_combine", "k_var_mean_reduce", "k_cumsum_scan",
            "k_cumprod_scan"} <= set(kernels), kernels
    assert_program_compiles(program, tmp_path)

