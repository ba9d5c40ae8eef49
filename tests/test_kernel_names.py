"""Who wrote a kernel, from its name: a CUTLASS template the candidate instantiated is its own."""

from __future__ import annotations

import pytest

from stitchcuda.verify.kernel_names import guess_origin, is_library_kernel, is_own_cutlass_kernel

OWN = [
    # CUTLASS 2.x GEMM and convolution built from the candidate's source (torch.profiler's demangled names)
    "void cutlass::Kernel2<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::threadblock::MmaMultistage<"
    "cutlass::gemm::GemmShape<128, 64, 16>, float, cutlass::layout::RowMajor>, cutlass::epilogue::threadblock::"
    "Epilogue<...>, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8> > >"
    "(cutlass::gemm::kernel::GemmUniversal<...>::Params)",
    "void cutlass::Kernel<cutlass::conv::kernel::ImplicitGemmConvolution<cutlass::conv::threadblock::"
    "ImplicitGemmMultistage<...>, cutlass::epilogue::threadblock::Epilogue<...>, "
    "cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, (cutlass::conv::Operator)0> >(...::Params)",
    # CUTLASS 3.x entry point
    "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
    "cutlass::gemm::collective::CollectiveMma<...> > >(...::Params)",
    "cutlass::Kernel2<cutlass::gemm::kernel::Gemm<...>>",
]
LIBRARY = [
    # cuBLAS's own CUTLASS kernels: generated, non-namespaced structs
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"
    "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(...::Params)",
    "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4",
    "void cutlass::device_kernel<cutlass3x_sm90_tensorop_s64x128x8tf32gemm_f32_f32_f32_f32_f32_128x128x32_1x2x1>(...)",
    "cutlass3x_sm90_tensorop_gemm_f32_f32_f32_f32_f32_128x128x32_0_tnn_align4_warpspecialized",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel",
    "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4>(...)",
    "ampere_sgemm_128x64_tn",
    "nvjet_tst_128x64_64x8_2x1_v_bz_TNT",
]


@pytest.mark.parametrize("name", OWN)
def test_own_cutlass_instantiations_are_own(name):
    assert is_own_cutlass_kernel(name)
    assert not is_library_kernel(name)
    assert guess_origin(name) == "own"


@pytest.mark.parametrize("name", LIBRARY)
def test_library_kernels_stay_library(name):
    assert not is_own_cutlass_kernel(name)
    assert is_library_kernel(name) and guess_origin(name) == "library"


def test_other_names_unchanged():
    assert guess_origin("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)") \
        == "pytorch"
    assert guess_origin("fused_bias_gelu_kernel") == "own"
    assert guess_origin("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>()") \
        == "library"
