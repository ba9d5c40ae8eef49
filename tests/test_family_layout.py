"""The layout/indexing family (triangles, flips, rolls, pads, repeats, index selects, gathers,
advanced indexing, scatters, sort/topk, typed elementwise work, casts and constants): small
references through capture, fusion and codegen, checks of the generated kernels' text, and one
nvcc compile of a program holding most kinds of kernel the family emits."""

from __future__ import annotations

import re

import pytest

from stitchcuda.compiler.capture.graph import capture
from stitchcuda.compiler.check import cuda_source
from stitchcuda.compiler.driver import compile_task
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.families.layout_typed import promote
from stitchcuda.compiler.lowering.registry import OPERATORS
from stitchcuda.compiler.schedule.fusion import fuse
from stitchcuda.task.record import Task
from tests.test_offline_codegen import assert_program_compiles

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def model_source(forward: str, inputs: str, args: str = "x") -> str:
    """A reference whose forward returns ``forward`` (an expression, or statements ending in a return)."""
    body = forward if "return" in forward else f"return {forward}"
    body = "\n".join("        " + line for line in body.splitlines())
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
            f"    def forward(self, {args}):\n{body}\n\n\ndef get_inputs():\n    return {inputs}\n\n\n"
            "def get_init_inputs():\n    return []\n")


def rows_perm(rows: int, n: int, k: int) -> str:
    """Source of a [rows, k] int64 tensor of distinct indices per row (unique scatter targets)."""
    return f"torch.stack([torch.randperm({n})[:{k}] for _ in range({rows})])"


# name -> (forward, inputs, forward args, kernels of this family the program must launch)
CASES: dict[str, tuple[str, str, str, set[str]]] = {
    "triu_matmul": ("torch.triu(x, 1) @ y", "[torch.randn(64, 64), torch.randn(64, 64)]", "x, y", {"tri"}),
    "tril_batched": ("torch.tril(x.transpose(1, 2), -2)", "[torch.randn(3, 17, 33)]", "x", {"tri"}),
    "flip": ("torch.flip(x, [0, 2])", "[torch.randn(4, 5, 6)]", "x", {"flip"}),
    "roll_dims": ("torch.roll(x, (2, -3), (1, 2))", "[torch.randn(2, 7, 9)]", "x", {"roll"}),
    "roll_flat": ("torch.roll(x[:, 1:], 5)", "[torch.randn(4, 9)]", "x", {"roll"}),
    "pad_constant_crop": ("F.pad(x, (1, 2, -1, 0), value=0.5)", "[torch.randn(2, 3, 4, 5)]", "x", {"pad"}),
    "pad_reflect": ("F.pad(x, (2, 2, 1, 3), mode='reflect')", "[torch.randn(2, 3, 6, 5)]", "x", {"pad"}),
    "pad_replicate_3d": ("F.pad(x, (1, 2, 0, 1, 2, 0), mode='replicate')", "[torch.randn(1, 2, 3, 4, 5)]", "x",
                         {"pad"}),
    "pad_circular": ("F.pad(x, (2, 3), mode='circular')", "[torch.randn(2, 3, 7)]", "x", {"pad"}),
    "reflection_pad_module": ("nn.ReflectionPad1d(3)(x) * 2.0", "[torch.randn(2, 4, 8)]", "x", {"pad"}),
    "repeat": ("x.repeat(2, 1, 3)", "[torch.randn(3, 4)]", "x", {"repeat"}),
    "index_select_view": ("torch.index_select(x.t(), 1, i)", "[torch.randn(6, 5), torch.tensor([0, 4, 4, 1])]",
                          "x, i", {"index_select"}),
    "gather_long_table": ("torch.gather(k, 1, i).float() * x",
                          "[torch.randn(4, 3), torch.randint(0, 9, (4, 7)), torch.randint(0, 7, (4, 3))]", "x, k, i",
                          {"gather", "typed"}),
    "scatter_src": ("x.scatter(1, i, s)", f"[torch.randn(4, 8), {rows_perm(4, 8, 3)}, torch.randn(4, 5)]",
                    "x, i, s", {"copy", "scatter"}),
    "scatter_value": ("x.scatter(1, i, 2.5)", f"[torch.randn(4, 8), {rows_perm(4, 8, 3)}]", "x, i",
                      {"copy", "scatter"}),
    "scatter_add": ("x.scatter_add(0, i, s)", "[torch.randn(3, 5), torch.randint(0, 3, (6, 5)), torch.randn(6, 5)]",
                    "x, i, s", {"copy", "scatter"}),
    "scatter_reduce_amax": ("x.scatter_reduce(1, i, s, 'amax', include_self=False)",
                            "[torch.randn(3, 6), torch.randint(0, 6, (3, 10)), torch.randn(3, 10)]", "x, i, s",
                            {"copy", "reset", "scatter"}),
    "index_add": ("x.index_add(1, i, s, alpha=2.0)",
                  "[torch.randn(3, 5), torch.tensor([0, 4, 0, 2]), torch.randn(3, 4)]", "x, i, s", {"index_put"}),
    "index_put": ("x.index_put((i,), v)", "[torch.randn(6, 3), torch.tensor([4, 1]), torch.randn(2, 3)]", "x, i, v",
                  {"copy", "index_put"}),
    "index_put_accumulate": ("x.index_put((i, j), v, accumulate=True)",
                             "[torch.randn(4, 5), torch.tensor([0, 3, 0]), torch.tensor([1, 1, 1]), torch.randn(3)]",
                             "x, i, j, v", {"copy", "index_put"}),
    "index_split_dims": ("x[i, :, j]", "[torch.randn(4, 5, 6), torch.tensor([[0, 3], [-1, 2]]), torch.tensor([5, 0])]",
                         "x, i, j", {"index"}),
    "slice_assign": ("y = x.clone()\ny[:, 1:6:2] = z\nreturn y", "[torch.randn(3, 7), torch.randn(3, 3)]", "x, z",
                     {"slice_scatter"}),
    "masked_fill": ("x.masked_fill(x > 0.5, -1.0)", "[torch.randn(4, 6)]", "x", {"typed"}),  # its fill is folded
    # constants past MAX_CONSTANT elements: smaller ones are folded at capture (schedule/simplify.py)
    "constants": ("x + torch.arange(20000, device=x.device) + torch.full((3, 20000), 2.0, device=x.device) "
                  "+ torch.ones_like(x)", "[torch.randn(3, 20000)]", "x", {"arange", "fill"}),
    "casts": ("((x * 10).long() % 3).float() + (x > 0).float() + x.to(torch.bool).float()", "[torch.randn(4, 6)]",
              "x", {"typed"}),
    "index_math": ("x[:, (torch.arange(20000, device=x.device) * 3) % 7]", "[torch.randn(2, 7)]", "x",
                   {"arange", "typed"}),
    "sort": ("torch.sort(x, dim=1, descending=True)", "[torch.randn(5, 37, 3)]", "x", {"sort"}),
    "sort_long_line": ("torch.sort(x)[0]", "[torch.randn(3, 1500)]", "x", {"sort"}),
    "topk": ("torch.topk(x, 3, dim=1)", "[torch.randn(6, 50)]", "x", {"sort"}),
    "topk_long_line": ("torch.topk(x, 5, largest=False)[1]", "[torch.randn(2, 10000)]", "x", {"sort"}),
}


def task_of(name: str) -> Task:
    forward, inputs, args, _ = CASES[name]
    return Task(name=name, source=model_source(forward, inputs, args))


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_generates_with_layout_kernels(name):
    compiled = compile_task(task_of(name))
    program = compiled.program()
    source = cuda_source(program)
    missing = [w for w in CASES[name][3] if not re.search(rf"__global__ void __launch_bounds__\(\d+\) k_\w+_{w}\(",
                                                           source)]
    assert not missing, (missing, re.findall(r"__global__ void \S+ (\w+)\(", source))


def test_transposed_matmuls_stay_one_gemm():
    """``x.T @ y`` (KernelBench 16-18): numpy_T is a permute view the GEMM reads transposed."""
    task = Task(name="t", source=model_source("torch.matmul(x.T, y.T)", "[torch.randn(8, 5), torch.randn(6, 8)]",
                                              "x, y"))
    compiled = compile_task(task)
    assert [g.kind for g in compiled.groups] == ["gemm"]
    assert "cublas" in compiled.program().lower()


def test_int_index_math_goes_to_typed_kernels():
    """Decompositions' int64 arithmetic and float constants leave the fused float kernels."""
    graph = capture(task_of("index_math"))
    groups = fuse(graph)
    kinds = {graph.node(n).op: g.kind for g in groups for n in g.nodes}
    assert kinds["aten.arange"] == "other" and kinds["aten.remainder"] == "other"
    masked = capture(task_of("masked_fill"))
    kinds = {masked.node(n).op: g.kind for g in fuse(masked) for n in g.nodes}
    assert kinds["aten.gt"] == "other" and kinds["aten.scalar_tensor"] == "other" and kinds["aten.where"] == \
        "elementwise"


def test_kernel_text():
    program = compile_task(task_of("pad_reflect")).program()
    src = cuda_source(program)
    assert "s2 = s2 < 0 ? -s2 : s2;" in src  # reflect: the edge element is not repeated
    src = cuda_source(compile_task(task_of("sort")).program())
    assert "isnan(av)" in src and "__shared__ float sv[" in src
    src = cuda_source(compile_task(task_of("scatter_add")).program())
    assert "atomicAdd(" in src


def test_promotion():
    assert promote(["int64_t"], [1.5]) == "float"
    assert promote(["int32_t"], [7]) == "int32_t"
    assert promote(["bool"], [2]) == "int64_t"
    assert promote(["bool", "int32_t", "int64_t"], []) == "int64_t"
    assert promote(["float", "int64_t"], []) == "float"


def test_registered_ops():
    for op in ("aten.tril", "aten.triu", "aten.flip", "aten.roll", "aten.constant_pad_nd", "aten.pad",
               "aten.reflection_pad2d", "aten.replication_pad3d", "aten.repeat", "aten.index_select", "aten.gather",
               "aten.scatter", "aten.scatter_add", "aten.index_add", "aten.index", "aten.index_put", "aten.arange",
               "aten.full", "aten.full_like", "aten.scalar_tensor", "aten.zeros_like", "aten.sort", "aten.topk",
               "aten._to_copy", "aten.where"):
        assert OPERATORS[op].__module__.startswith("stitchcuda.compiler.lowering.families.layout"), op


def test_refusals_name_the_node():
    task = Task(name="bad", source=model_source("torch.sort(x)[0]", "[torch.randn(2, 9000)]"))
    with pytest.raises(Unsupported, match="sort"):
        compile_task(task).program()


@pytest.mark.nvcc
def test_layout_kernels_compile_with_nvcc(tmp_path):
    """One program with a triangle, a reflect pad, a flip, a gather, a scatter_add, an index_put,
    typed casts and comparisons, constants and a sort: nvcc compiles all of them."""
    forward = ("a = torch.triu(x, 1) @ y\n"
               "b = F.pad(a.unsqueeze(0), (2, 2, 1, 1), mode='reflect').flip(2)\n"
               "c = torch.gather(b[0], 1, i).repeat(1, 4) + x.scatter_add(1, i % 16, x[:, :4])\n"
               "d = c.index_put((i[0],), c[:4] * 2.0, accumulate=True)\n"
               "e = (d > 0).long() * 3 + torch.arange(16, device=x.device)\n"
               "v, k = torch.sort(d + e.float(), dim=1, descending=True)\n"
               "return v, k, torch.roll(d, 1, 0), torch.topk(x, 2)[1]")
    task = Task(name="layout_nvcc", source=model_source(
        forward, "[torch.randn(16, 16), torch.randn(16, 16), torch.randint(0, 16, (16, 4))]", "x, y, i"))
    program = compile_task(task).program()
    assert_program_compiles(program, tmp_path)



def test_masks_and_rounding_leave_the_fused_kernels():
    """A negated mask read by a cast, and a floor division, go to typed kernels (the fused kernels
    keep masks in registers and have no rounding division)."""
    task = Task(name="m", source=model_source("(~torch.isnan(x)).float() + torch.div(x, 0.3, rounding_mode='floor')",
                                              "[torch.randn(4, 5)]"))
    compiled = compile_task(task)
    kinds = {compiled.graph.node(n).op: g.kind for g in compiled.groups for n in g.nodes}
    assert kinds["aten.bitwise_not"] == "other" and kinds["aten.div"] == "other"
    assert "floorf(" in cuda_source(compiled.program())


def test_the_ir_names_exactly_the_operators_a_family_lowers():
    """Scheduling gives an operator a group of its own by the IR's table; the registry lowers it."""
    from stitchcuda.compiler.ir.ops import FAMILY_OPS
    from stitchcuda.compiler.lowering.registry import lowering

    assert set(OPERATORS) == FAMILY_OPS
    with pytest.raises(ValueError, match="FAMILY_OPS does not name it"):
        lowering("aten.not_an_operator")(lambda ctx, node: None)
