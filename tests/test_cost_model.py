"""The cost model that gives each product and convolution its path (compiler/lowering/cost.py)."""

from __future__ import annotations

import glob

import pytest

from stitchcuda.agents.offline import variant_estimates, variants
from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.cost import (
    TABLES,
    amplifies_error,
    choose,
    conv_paths,
    gemm_paths,
    this_machine,
)
from stitchcuda.compiler.lowering.lower import lower
from stitchcuda.compiler.lowering.lowered import Conv, Gemm
from stitchcuda.compiler.lowering.split_tf32 import worth_splitting
from stitchcuda.records import CostEstimate
from stitchcuda.task import resolve_tasks
from stitchcuda.task.load import load_task_file

H100 = TABLES["H100"]
AUTO = CodegenOptions(split_tf32=True, cutlass=True, cost_model=True, gpu="H100")
LEVEL2 = "../shared/kernelbench/KernelBench/level2"


def _linear(m: int, n: int, k: int) -> Gemm:
    return Gemm(1, m, n, k, "x", "w", a_trans=False, b_trans=True, out="y")


def test_a_wide_mlp_at_batch_128_is_not_split_on_every_call():
    """KernelBench's 1_MLP shape: each weight element serves 128 rows, so splitting the 1-GB
    weight every call (read it, write two halves, read them again) costs more than the tensor cores
    save; CUTLASS's 3xTF32, which splits inside the kernel, does not pay that traffic."""
    wide = _linear(128, 16384, 16384)
    paths = gemm_paths(wide, H100, ["cublas", "split", "cutlass"])
    assert paths["split"] > paths["cublas"] > paths["cutlass"]
    assert not worth_splitting(wide)  # the fixed split variant leaves it on SGEMM
    assert choose("fc", paths).path == "cutlass"
    # a weight split once and kept (packed) would pay: its traffic per call is two reads
    packed = gemm_paths(wide, H100, ["split"], packed_b=True)["split"]
    assert packed < paths["cutlass"]
    # a square product at 4096 reuses each weight 4096 times: the split pays
    assert choose("fc", gemm_paths(_linear(4096, 4096, 4096), H100, ["cublas", "split", "cutlass"])).path == "split"


def test_small_products_stay_on_sgemm():
    """A GRU decoder's 32 x 512 x 8000 step ran slower split on an H100; a product within 10% of
    SGEMM's estimate keeps SGEMM (each CUTLASS configuration costs the build time)."""
    for g in (_linear(32, 8000, 512), _linear(128, 512, 512)):
        assert choose("x", gemm_paths(g, H100, ["cublas", "split", "cutlass"])).path == "cublas"
    assert worth_splitting(Gemm(1, 32768, 32768, 32, "a", "b", False, False, out="c"))  # shallow: one GEMM of 3K


def test_a_grid_smaller_than_the_gpu_costs_cutlass_its_idle_sms():
    """hf_bert's 1024 x 256 products are 64 of CUTLASS's 64 x 64 tiles: half an H100's 132 SMs
    (on an H200 they ran no faster in its 3xTF32 than eager's SGEMM), so SGEMM keeps them; a deep
    narrow one (small_cnn's fc1, 256 x 512 x 16384: 32 tiles, 0.31 ms measured in CUTLASS) is
    estimated as the slices of K it would run as, and a big one fills the machine."""
    from stitchcuda.compiler.lowering.cutlass_gemm import grid_fill, split_k_slices

    bert, fc1, big = _linear(1024, 256, 256), _linear(256, 512, 16384), _linear(4096, 4096, 4096)
    assert grid_fill(bert, 132) == pytest.approx(64 / 132)
    assert split_k_slices(fc1) == 16 and grid_fill(fc1, 132) == pytest.approx(512 / 528)
    assert grid_fill(big, 132) > 0.95
    assert choose("x", gemm_paths(bert, H100, ["cublas", "split", "cutlass"])).path == "cublas"
    alone = gemm_paths(bert, H100, ["cutlass"])["cutlass"]
    assert alone > gemm_paths(_linear(1024, 1024, 256), H100, ["cutlass"])["cutlass"] * 0.5  # a quarter of the work
    assert choose("x", gemm_paths(fc1, H100, ["cublas", "cutlass"])).path == "cutlass"


def test_a_product_with_odd_dimensions_keeps_to_sgemm_or_runs_tf32_padded():
    """L1/8, 8205 x 5921 x 2949: tensor cores at a third of their rate on it (H200), so its split
    3xTF32 (8.2 ms) lost to eager's SGEMM (6.5 ms); the model now keeps it on SGEMM, and a TF32
    variant runs it on copies padded to multiples of 4."""
    odd, even = Gemm(1, 8205, 5921, 2949, "a", "b", False, False, out="c"), Gemm(1, 8208, 5924, 2952, "a", "b", False,
                                                                                  False, out="c")
    h200 = TABLES["H200"]
    strict = gemm_paths(odd, h200, ["cublas", "split", "cutlass"])
    assert choose("mm", strict).path == "cublas" and strict["split"] > strict["cublas"]
    assert choose("mm", gemm_paths(even, h200, ["cublas", "split", "cutlass"])).path == "split"
    padded = gemm_paths(odd, h200, ["cublas"], tf32=True)["cublas"]
    assert gemm_paths(even, h200, ["cublas"], tf32=True)["cublas"] < padded < 1.3 * gemm_paths(
        even, h200, ["cublas"], tf32=True)["cublas"]  # the copies cost a little
    small = Gemm(1, 1021, 1021, 509, "a", "b", False, False, out="c")  # too small to pad: the slow rate
    assert gemm_paths(small, h200, ["cublas"], tf32=True)["cublas"] > 2 * gemm_paths(
        Gemm(1, 1024, 1024, 512, "a", "b", False, False, out="c"), h200, ["cublas"], tf32=True)["cublas"]


def test_the_table_comes_from_the_gpu_or_says_it_was_assumed(monkeypatch):
    monkeypatch.delenv("STITCHCUDA_GPU", raising=False)
    monkeypatch.setattr("stitchcuda.compiler.lowering.cost.physical_gpu", lambda device: None)
    here = this_machine()
    assert here.assumed and here.table.label == "H100 SXM" and "assumed" in here.label
    assert this_machine("H200").table.hbm_tbps > this_machine("H100").table.hbm_tbps
    assert this_machine("NVIDIA A100-SXM4-80GB").table.label == "A100"
    monkeypatch.setenv("STITCHCUDA_GPU", "H200")
    assert this_machine().table.label == "H200 SXM" and not this_machine().assumed
    with pytest.raises(ValueError, match="no cost table for GPU 'V100'"):
        this_machine("V100")
    (task,) = resolve_tasks("mlp")
    compiled = compile_task(task)
    with pytest.raises(Unsupported, match="no cost table"):
        lower(compiled.graph, compiled.groups, CodegenOptions(gpu="V100"))


def _conv3x3(n: int, c: int, k: int, size: int, stride: int = 1) -> Conv:
    out = (size + 2 - 3) // stride + 1
    return Conv(0, n, c, k, (size, size), (out, out), (3, 3), (1, 1), (stride, stride), (1, 1), 1, False, "x", "w")


def test_convolutions_split_where_a_resnet_profile_found_it_faster():
    """Fitted to ResNet-18 at batch 10 on an H200 (docs/compiler.md): its 128- and 256-channel 3x3
    convolutions ran faster split, its 64-channel ones no faster; a batch-128 64-channel block
    (the suite's conv_residual_block) measured slower split on an H100."""
    table = TABLES["H200"]

    def path(conv: Conv) -> str:
        return choose("c", conv_paths(conv, table, ["cublas", "split"], packed_w=True)).path

    assert path(_conv3x3(10, 128, 128, 28)) == path(_conv3x3(10, 256, 256, 14)) == "split"
    assert path(_conv3x3(10, 128, 256, 28, stride=2)) == "split"
    assert path(_conv3x3(10, 64, 64, 56)) == "cublas"
    assert path(_conv3x3(128, 64, 64, 56)) == "cublas"


def test_the_table_changes_the_choice():
    """An A100 has a third of an H100's TF32 rate against 60% of its bandwidth: a product the split
    wins on the H100 can lose on the A100, and the program says which table it assumed."""
    g = _linear(512, 4096, 1024)
    on = {name: choose("x", gemm_paths(g, TABLES[name], ["cublas", "split"])) for name in ("H100", "A100")}
    assert on["H100"].ms < on["A100"].ms
    (task,) = resolve_tasks("mlp")
    compiled = compile_task(task)
    program = generate(task, compiled.graph, compiled.groups, AUTO)
    assert "Cost model, H100 SXM table (H100)" in program


def test_each_operator_gets_its_own_path_and_the_program_says_so():
    (task,) = resolve_tasks("transformer_block")
    compiled = compile_task(task)
    low = lower(compiled.graph, compiled.groups, AUTO)
    chosen = {e.path for e in low.estimates}
    assert {"split", "cutlass"} <= chosen  # per operator, not per program
    program = generate(task, compiled.graph, compiled.groups, AUTO)
    estimate = CostEstimate.from_source(program)
    assert estimate is not None and estimate.table == "H100 SXM" and estimate.operators == len(low.estimates)
    assert estimate.ms == pytest.approx(sum(e.ms for e in low.estimates), abs=1e-3)
    assert "[cost model, H100 SXM: 3xTF32 split" in program and "ms est.; fp32 (cuBLAS/cuDNN)" in program
    # each variant's estimate: the model's own is the least, the forced paths as they would run
    opts = variants("strict")
    totals = variant_estimates({(False, False): low.estimates}, opts)
    assert totals[0] == min(totals) and totals[0] < totals[4]  # vs plain cuBLAS


@pytest.mark.skipif(not glob.glob(f"{LEVEL2}/18_*.py"), reason="KernelBench level 2 is not beside the checkout")
def test_a_product_summed_over_its_columns_keeps_to_fp32():
    """L2/18 (Linear 8192 -> 8192, then a sum over the features) and L2/62 (then a GroupNorm) failed
    1e-4 under both 3xTF32 paths and passed in fp32 on an H100; L2/12 (then a scale and LeakyReLU)
    is not summed and keeps the fastest path."""
    for number, amplified in ((18, True), (62, True), (12, False)):
        task = load_task_file(glob.glob(f"{LEVEL2}/{number}_*.py")[0])
        compiled = compile_task(task)
        first = next(n for n in compiled.graph.nodes if n.op == "aten.linear")
        assert bool(amplifies_error(compiled.graph, first.name)) is amplified
        low = lower(compiled.graph, compiled.groups, AUTO)
        assert (low.estimates[0].path == "cublas") is amplified, number
        if amplified:
            assert "adds up every output's error" in low.estimates[0].why


_CONVS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = {conv}

    def forward(self, x):
        return torch.tanh(self.conv(x))


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("conv, shape, split", [
    ("nn.ConvTranspose2d(64, 64, 4, stride=2, padding=1, output_padding=1)", "32, 64, 256, 256", True),
    ("nn.Conv3d(32, 64, 3)", "16, 32, 32, 64, 64", True),
    ("nn.Conv2d(64, 128, 3, padding=1)", "32, 64, 128, 128", False),
])
def test_transposed_and_3d_convolutions_keep_the_channels_last_split_under_tf32(conv, shape, split):
    """Under TF32 (paper's first variant) cuDNN's NCHW TF32 kernels ran KernelBench's transposed and
    3-d convolutions no faster than fp32 (L1/57 31.3 ms against the split's 12.8 on an H200): the
    model rates them as fp32 there and gives them the split, as under strict; a 2-d convolution
    keeps plain TF32, and a variant that fixes its paths never splits under TF32."""
    from stitchcuda.task.record import Task

    task = Task(name="conv_tf32", source=_CONVS.format(conv=conv, shape=shape))
    compiled = compile_task(task)
    first = CodegenOptions(**{**variants("paper")[0], "gpu": "H200"})
    (estimate,) = lower(compiled.graph, compiled.groups, first).estimates
    assert estimate.tf32 and (estimate.path == "split") is split, estimate.paths
    fixed = CodegenOptions(tf32=True, gpu="H200")
    assert all(e.path != "split" for e in lower(compiled.graph, compiled.groups, fixed).estimates)
    if split:
        assert "3xTF32 (split channels)" in generate(task, compiled.graph, compiled.groups, first)
