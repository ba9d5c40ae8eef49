"""The offline Coder's CUTLASS variant (``CodegenOptions(cutlass=True)``): which GEMMs and
convolutions it routes through CUTLASS and what their epilogues absorb, what the program's Python
module carries, and (nvcc) that the programs and their kernel extensions compile for sm_90
against the nvidia-cutlass wheel's headers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.check import cuda_source, host_source
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate, lower
from stitchcuda.compiler.emit.program import program_spec
from stitchcuda.compiler.lowering.cutlass_conv import CutlassConv, compile_check_conv
from stitchcuda.compiler.lowering.cutlass_gemm import CutlassGemm, compile_check_gemm, cutlass_include
from stitchcuda.task import resolve_tasks
from tests.program_stub import exec_program

CUTLASS = CodegenOptions(cutlass=True)


def _lowered(name: str, options: CodegenOptions = CUTLASS):
    task = resolve_tasks(name)[0]
    compiled = compile_task(task)
    return task, compiled, lower(compiled.graph, compiled.groups, options)


def _gemms(low):
    return [x.gemm for g in low.groups for x in g.launches() if x.gemm is not None]


def test_mlp_gemms_take_bias_and_activation_into_cutlass_epilogue():
    _, _, low = _lowered("mlp")
    gemms = _gemms(low)
    assert gemms and all(g.cutlass is not None and g.cutlass.math == "3xtf32" for g in gemms)
    assert all(g.ld_c_src == 0 and g.beta == 1.0 and g.c for g in gemms)  # the bias, broadcast over rows
    assert [g.cutlass.activation for g in gemms][:2] == ["gelu", "gelu"]
    assert not low.uses_blas and not low.lt_gemms  # nothing left for cuBLAS
    assert len(low.cutlass) == len({g.cutlass for g in gemms})  # one extension per distinct configuration


def test_residual_and_tf32_under_paper():
    _, _, low = _lowered("swiglu_ffn")
    residual = [g for g in _gemms(low) if g.c and g.ld_c_src == g.n]
    assert residual, "down_proj (no bias) takes the residual add as C in its epilogue"
    _, _, low = _lowered("transformer_block")
    assert all(g.cutlass is not None for g in _gemms(low))  # attention's products too
    _, _, paper = _lowered("transformer_block", CodegenOptions(cutlass=True, tf32=True))
    assert {g.cutlass.math for g in _gemms(paper)} == {"tf32"}


def test_convolutions_run_as_cutlass_implicit_gemm_where_it_applies():
    _, _, graphed = _lowered("unet_tiny")
    assert not graphed.cutlass_convs  # a CUDA graph keeps cuDNN (see lower_conv: a replay bug)
    _, _, low = _lowered("unet_tiny", CodegenOptions(cutlass=True, graph=False))
    assert low.cutlass_convs and all(isinstance(c.cutlass, CutlassConv) for c in low.cutlass_convs)
    assert all(c.cutlass.bias and c.cutlass.activation in ("relu", "identity") for c in low.cutlass_convs)
    assert low.convs and all(c.transposed for c in low.convs)  # transposed ones stay with cuDNN
    slots = [c.slot for c in low.cutlass_convs]
    assert low.cutlass_slot_count == sum(2 if isinstance(c, CutlassConv) else 1 for c in low.cutlass)
    assert max(slots) + 2 <= low.cutlass_slot_count  # the launcher and its workspace function


def test_the_program_module_builds_and_binds_its_kernel_extensions(monkeypatch):
    task, compiled, low = _lowered("mlp")
    program = generate(task, compiled.graph, compiled.groups, CUTLASS)
    # run: each kernel extension's launcher bound to the program's kernel library, slot by slot
    stub = exec_program(program, monkeypatch).extensions
    assert [slot for slot, _ in stub.bound] == list(range(low.cutlass_slot_count)) and stub.programs
    assert "CUTLASS_KERNELS = [" in program and "_kernels.bind_cutlass(_slot, _address)" in program
    assert program.count("stitchcuda_cutlass_") >= len(low.cutlass)
    assert "OpMultiplyAddFastF32" in program  # the kernel sources travel inside the program
    # CUTLASS's 16-byte operands: every argument checked (a misaligned view copied) by the host
    assert program_spec(program).realign and "realigned_.push_back(t->clone());" in host_source(program)
    assert "importlib" not in program  # the static checks read it as a way to reach the reference
    assert "via CUTLASS 3xTF32" in program
    cuda = cuda_source(program)
    assert "sc_cutlass_check(sc_cutlass_gemm(" in cuda and "cublasSgemm" not in cuda


def test_the_default_variant_is_unchanged():
    task, compiled, low = _lowered("mlp", CodegenOptions())
    assert not low.cutlass and all(g.cutlass is None for g in _gemms(low))
    program = generate(task, compiled.graph, compiled.groups, CodegenOptions())
    assert not any(mark in program for mark in ("CUTLASS_KERNELS", "sc_cutlass", "cutlass/", "SC_GEMM_ABI"))
    assert not program_spec(program).realign


@pytest.mark.nvcc
@pytest.mark.parametrize("part", ["sample", pytest.param("rest", marks=pytest.mark.full)])
def test_cutlass_programs_and_their_kernels_compile_for_sm90(tmp_path, part):
    """mlp's, transformer_block's and unet_tiny's CUTLASS variants (whole programs, one nvcc run),
    and every distinct kernel extension they use, against the wheel's headers: by default the
    programs and one GEMM and one convolution extension, the other extensions under ``full``."""
    import time

    from tests.test_offline_codegen import _compile_together

    assert cutlass_include(), "CUTLASS headers not found: nvidia-cutlass is a dependency (pip install -e .)"
    sources, configs = [], []
    for name, options in (("mlp", CUTLASS), ("transformer_block", CUTLASS),
                          ("unet_tiny", CodegenOptions(cutlass=True, graph=False))):
        task, compiled, low = _lowered(name, options)
        sources.append(cuda_source(generate(task, compiled.graph, compiled.groups, options)))
        configs += [c for c in low.cutlass if c not in configs]
    assert any(isinstance(c, CutlassGemm) for c in configs) and any(isinstance(c, CutlassConv) for c in configs)
    first = [next(c for c in configs if isinstance(c, CutlassGemm)), next(c for c in configs if isinstance(c, CutlassConv))]
    if part == "sample":
        _compile_together(sources, tmp_path)
    for config in first if part == "sample" else [c for c in configs if c not in first]:
        started = time.perf_counter()
        check = compile_check_conv(config) if isinstance(config, CutlassConv) else compile_check_gemm(config)
        assert check.status == "compiled", check.detail
        print(f"{config.describe}: {time.perf_counter() - started:.1f} s")


def test_a_folded_bias_keeps_c_so_a_residual_after_it_stays_in_the_epilogue_kernel():
    """C holds one operand: a linear's bias taken as C leaves the residual add after it to the
    epilogue kernel (a GPU run of transformer_block lost the bias when the residual replaced it)."""
    _, _, low = _lowered("transformer_block")
    for lowered in (x for g in low.groups for x in g.launches() if x.gemm is not None and x.gemm.c):
        gemm = lowered.gemm
        if gemm.ld_c_src == gemm.n:  # a residual as C: only where the product had no bias of its own
            assert "bias" not in lowered.describe.split("epilogue", 1)[-1]
    described = " ".join(g.describe for g in low.groups)
    assert "(epilogue bias) + epilogue" in described and "aten.add" in described


def test_a_deep_small_product_runs_as_slices_of_k_summed_after():
    """L1/6 (M = N = 256, K = 524288) fills 16 of 132 SMs as one GEMM: 32 batched slices of K
    into scratch, then one pass sums them; what the slices read is the product's own operands."""
    from stitchcuda.compiler.lowering.lower_gemm import split_k_slices

    kb = Path(__file__).resolve().parents[2] / "shared" / "kernelbench" / "KernelBench" / "level1"
    if not kb.exists():
        pytest.skip("no KernelBench checkout beside the project")
    task, compiled, low = _lowered(str(kb / "6_Matmul_with_large_K_dimension_.py"))
    (g,) = _gemms(low)
    assert (g.split_k, g.batch, g.k, g.out, g.split_k_out) == (32, 32, 16384, "x_split_k", "o_matmul")
    assert (g.ld_a, g.stride_a, g.ld_b, g.stride_b, g.stride_c) == (524288, 16384, 256, 16384 * 256, 256 * 256)
    assert ("x_split_k", [32 * 256 * 256]) in low.intermediates
    program = generate(task, compiled.graph, compiled.groups, CUTLASS)
    # no C, no activation: the summing pass only sums
    assert ("sc_sum_slices<<<256, 256, 0, stream>>>(a.x_split_k, a.o_matmul, 65536LL, 32, nullptr, 0LL, 256LL, "
            "0.0f, 0);") in cuda_source(program)
    assert "split-K: K = 524288 as 32 slices" in program
    # the slices, read through the record's strides as CUTLASS reads them, sum to the product
    from stitchcuda.compiler.lowering.lower_gemm import _slice_k
    from stitchcuda.compiler.lowering.lowered import Gemm, Lowering

    rng = np.random.default_rng(0)
    for a_trans, b_trans in ((False, False), (True, True)):
        m, n, k = 3, 5, 64
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        sa, sb = (a.T if a_trans else a).copy().ravel(), (b.T if b_trans else b).copy().ravel()
        small = Gemm(1, m, n, k, "a", "b", a_trans, b_trans, out="o")
        _slice_k(Lowering(graph=None), small, 4)  # type: ignore[arg-type]

        def view(buf, at, rows, cols, ld, trans):
            shape, strides = ((cols, rows), (ld * 8, 8)) if trans else ((rows, cols), (ld * 8, 8))
            v = np.lib.stride_tricks.as_strided(buf[at:], shape, strides)
            return v.T if trans else v

        total = sum(view(sa, i * small.stride_a, m, small.k, small.ld_a, a_trans)
                    @ view(sb, i * small.stride_b, small.k, n, small.ld_b, b_trans) for i in range(small.batch))
        assert np.allclose(total, a @ b)
    for name in ("mlp", "transformer_block"):  # wide products fill the machine as they are
        assert all(split_k_slices(x) == 1 and x.split_k == 1 for x in _gemms(_lowered(name)[2]))
