"""Naming the arithmetic a candidate computes in, and the roofline peak that goes with it."""

from __future__ import annotations

import pytest

from stitchcuda.compiler.lowering.cutlass_conv import CutlassConv
from stitchcuda.compiler.lowering.cutlass_conv import kernel_sources as conv_sources
from stitchcuda.compiler.lowering.cutlass_gemm import CutlassGemm
from stitchcuda.compiler.lowering.cutlass_gemm import kernel_sources as gemm_sources
from stitchcuda.gpu_specs import nominal_peaks
from stitchcuda.task.record import Candidate, Task
from stitchcuda.verify.config import VerifyConfig
from stitchcuda.verify.feedback import feedback_for
from stitchcuda.verify.judge import judge
from stitchcuda.verify.nsight import timing_estimate
from stitchcuda.verify.peaks import arithmetic_peak, with_arithmetic
from stitchcuda.verify.precision import arithmetic_of, assess, describe, source_hints, tf32_split
from stitchcuda.verify.protocol import WorkerResult
from stitchcuda.verify.timing import summarize
from stitchcuda.verify.verdict import (
    BuildReport,
    CorrectnessReport,
    DeviceInfo,
    ExtensionBuild,
    Peaks,
    ProgramProfile,
    Roofline,
    TimingReport,
    TrialResult,
)

X3, TF32 = "3xTF32 (fp32 accumulate)", "TF32 (fp32 accumulate)"
BF16A, FP16A = "bf16 (fp32 accumulate)", "fp16 (fp32 accumulate)"


def _program(cuda: str) -> str:
    """A candidate as the verifier sees it: the extension's CUDA is a string constant of the .py."""
    return f'import torch\nfrom torch.utils.cpp_extension import load_inline\nCUDA = r"""\n{cuda}\n"""\n' \
           'ext = load_inline(name="e", cpp_sources="", cuda_sources=CUDA)\n'


def _gemm(math: str) -> str:
    return gemm_sources(CutlassGemm(math=math, a_col=False, b_col=True, align_a=4, align_b=4, align_c=4))[0]


# --- CUTLASS ---------------------------------------------------------------------------------------

def test_cutlass_gemm_and_conv_extensions_are_named_exactly():
    assert arithmetic_of(_program(_gemm("3xtf32"))) == [X3]
    assert arithmetic_of(_program(_gemm("tf32"))) == [TF32]
    assert arithmetic_of(_program(_gemm("3xtf32") + _gemm("tf32"))) == [X3, TF32]
    for math, name in (("3xtf32", X3), ("tf32", TF32)):
        assert arithmetic_of(_program(conv_sources(CutlassConv(math=math, align=4, bias=True))[0])) == [name]


def test_cutlass_element_types_and_fast_operators():
    half = ("using Gemm = cutlass::gemm::device::Gemm<cutlass::half_t, cutlass::layout::RowMajor, cutlass::half_t, "
            "cutlass::layout::ColumnMajor, float, cutlass::layout::RowMajor, float, cutlass::arch::OpClassTensorOp, "
            "cutlass::arch::Sm80>;")
    assert arithmetic_of(half) == [FP16A]
    assert arithmetic_of(half.replace("float", "cutlass::half_t")) == ["fp16"]
    assert arithmetic_of(half.replace("half_t", "bfloat16_t")) == [BF16A]
    # operand types through aliases
    aliased = ("using ElementA = cutlass::half_t; using ElementAcc = float;\nusing Gemm = cutlass::gemm::device::Gemm<"
               "ElementA, LayoutA, ElementA, LayoutB, ElementAcc, LayoutC, ElementAcc, cutlass::arch::OpClassTensorOp, "
               "cutlass::arch::Sm80>;")
    assert arithmetic_of(aliased) == [FP16A]
    # the math operator through an alias defined elsewhere
    alias_op = ("using MathOp = cutlass::arch::OpMultiplyAddFastF32;\nusing Gemm = GemmUniversal<float, RowMajor, float, "
                "RowMajor, float, RowMajor, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, T, W, I, E, S, "
                "3, 4, 4, MathOp>;")
    assert arithmetic_of(alias_op) == [X3]
    assert arithmetic_of("cutlass::arch::OpMultiplyAddFastBF16") == [BF16A]
    assert arithmetic_of("cutlass::arch::OpMultiplyAddFastF16") == [FP16A]
    # SIMT (CUDA cores) on float is fp32
    assert arithmetic_of("using G = cutlass::gemm::device::Gemm<float, R, float, R, float, R, float, "
                         "cutlass::arch::OpClassSimt, cutlass::arch::Sm80>;") == []


# --- hand-written tensor-core code ------------------------------------------------------------------

def test_ptx_and_wmma():
    assert arithmetic_of('asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1}, ...");') == [TF32]
    assert arithmetic_of('asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ...");') == [BF16A]
    assert arithmetic_of('asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 ...");') == [FP16A]
    assert arithmetic_of('asm("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 ...");') == ["fp16"]
    assert arithmetic_of('asm("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 ...");') == [TF32]
    assert arithmetic_of('asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 ...");') == ["fp8"]
    wmma_tf32 = ("wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a;\n"
                 "wmma::fragment<wmma::accumulator, 16, 16, 8, float> c;\n"
                 "for (int i = 0; i < a.num_elements; i++) a.x[i] = wmma::__float_to_tf32(a.x[i]);")
    assert arithmetic_of(wmma_tf32) == [TF32]
    wmma_half = ("wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a;\n"
                 "wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;")
    assert arithmetic_of(wmma_half) == [FP16A]  # the half operands are the tensor cores', not a second fp16
    assert arithmetic_of(wmma_half.replace("16, float>", "16, half>")) == ["fp16"]


def test_hand_written_3xtf32_split_is_recognised():
    split = ("float v = a_frag.x[i];\n"
             "a_big.x[i] = wmma::__float_to_tf32(v);\n"
             "a_small.x[i] = wmma::__float_to_tf32(v - a_big.x[i]);\n")
    assert tf32_split(split) and arithmetic_of(split) == [X3]
    helper = ("uint32_t hi = f2tf32(x);\nuint32_t lo = f2tf32(x - __uint_as_float(hi));\n"
              'asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 ...");')
    assert arithmetic_of(helper) == [X3]
    # two conversions without the subtraction: plain TF32
    assert arithmetic_of("a = wmma::__float_to_tf32(x);\nb = wmma::__float_to_tf32(y);") == [TF32]
    assert arithmetic_of('asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));') == [TF32]


# --- libraries, torch flags, dtypes -------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F);", [TF32]),
    ("cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH);", [TF32]),
    ("cudnnSetConvolutionMathType(desc, CUDNN_TENSOR_OP_MATH);", [TF32]),
    ("cudnnSetConvolutionMathType(desc, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);", [FP16A]),
    ("cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F_FAST_16BF, CUDA_R_32F);", [BF16A]),
    ("cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F_FAST_16F, CUDA_R_32F);", [FP16A]),
    ("cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);\ncudnnSetConvolutionMathType(d, CUDNN_FMA_MATH);", []),
    ("torch.backends.cuda.matmul.allow_tf32 = True", [TF32]),
    ("torch.set_float32_matmul_precision('high')", [TF32]),
    ("torch.set_float32_matmul_precision('medium')", [BF16A]),
    ("with torch.autocast('cuda'):\n    y = x @ w", [FP16A]),
    ("x = x.half()", ["fp16"]),
    ("__global__ void k(const __nv_bfloat16* x) {}", ["bf16"]),
    ("__global__ void k(const __nv_fp8_e4m3* x) {}", ["fp8"]),
])
def test_library_switches_flags_and_types(text, expected):
    assert arithmetic_of(text) == expected


def test_comments_and_words_are_no_evidence():
    fp32 = ("// no TF32 here: CUBLAS_COMPUTE_32F, never CUBLAS_COMPUTE_32F_FAST_TF32\n"
            "/* OpMultiplyAddFastF32 would be 3xTF32 */\n"
            "# torch.backends.cuda.matmul.allow_tf32 = True is not set\n"
            "#include <cuda_runtime.h>\n#pragma unroll\n"
            '"""splits the rows in half; a half speed clock"""\n')
    assert arithmetic_of(fp32) == [] and source_hints(fp32) == []


def test_runtime_evidence_flags_and_outputs():
    assert arithmetic_of("", flags_changed=["cuda.matmul.allow_tf32"]) == [TF32]
    assert arithmetic_of("", flags_changed=["autocast.cuda"]) == [FP16A]
    assert arithmetic_of("", output_dtypes=["float16"]) == ["fp16"]
    assert arithmetic_of("", output_dtypes=["bfloat16"]) == ["bf16"]
    assert arithmetic_of("", output_dtypes=["float32"]) == []


def test_assess_keeps_hints_and_names_the_arithmetic():
    p = assess(_program(_gemm("3xtf32")), ["float32"], [], 3e-7)
    assert p.arithmetic == X3 and p.source_hints == [] and p.error_suggests == "fp32"
    assert source_hints(_program(_gemm("tf32"))) == ["tf32"]  # TF32 without the word: a disclosure all the same
    assert p.summary.startswith(f"computes in {X3}; outputs float32")
    tf = assess("cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH);", [], ["cuda.matmul.allow_tf32"], None)
    assert tf.arithmetic == TF32 and tf.source_hints == ["tf32"] and tf.flags_changed == ["cuda.matmul.allow_tf32"]
    assert assess("", [], [], None).arithmetic == "fp32"
    assert describe([X3, "fp16"]) == f"{X3} + fp16" and describe([]) == "fp32"


# --- peaks and the roofline ---------------------------------------------------------------------------

H100 = Peaks(gpu="NVIDIA H100 80GB HBM3", fp32_tflops=51.0, tf32_tflops=378.0, bf16_tflops=720.0, copy_gbps=2800)
ROOF = Roofline(flops=2 * 4096**3, min_bytes=3 * 4096**2 * 4, floor_ms=0.19, compute_floor_ms=0.19,
                memory_floor_ms=0.07, peaks=H100)


def test_nominal_peaks_by_name_then_capability():
    assert nominal_peaks("NVIDIA H100 80GB HBM3").label == "H100 SXM"
    assert nominal_peaks("NVIDIA H100 PCIe").fp32 == 51.0
    assert nominal_peaks("NVIDIA H200").tf32 == 495.0 and nominal_peaks("NVIDIA H200").bf16 == 989.0
    assert nominal_peaks("NVIDIA A100-SXM4-80GB").tf32 == 156.0
    guessed = nominal_peaks("some GPU", "9.0")
    assert guessed.fp32 == 67.0 and "compute capability 9.0" in guessed.label
    assert nominal_peaks("some GPU", "7.5") is None


def test_arithmetic_peaks():
    assert arithmetic_peak("fp32", H100) == (51.0, "measured fp32")
    assert arithmetic_peak(TF32, H100) == (378.0, "measured TF32")
    assert arithmetic_peak(X3, H100) == (126.0, "measured TF32 / 3")
    assert arithmetic_peak(BF16A, H100) == (720.0, "measured bf16")
    assert arithmetic_peak(FP16A, H100) == (989.0, "nominal dense H100 SXM fp16")
    assert arithmetic_peak(f"{X3} + {TF32}", H100)[0] == 378.0  # a mixture: the fastest
    unmeasured = H100.model_copy(update={"tf32_tflops": 0.0})
    assert arithmetic_peak(X3, unmeasured) == (pytest.approx(165.0), "nominal dense H100 SXM TF32 / 3")
    assert arithmetic_peak("fp8", Peaks(gpu="x", fp32_tflops=1, tf32_tflops=1, bf16_tflops=1, copy_gbps=1)) is None


def test_roofline_uses_the_arithmetic_peak_and_says_which():
    roof = with_arithmetic(ROOF, X3)
    assert roof.arithmetic == X3 and roof.arithmetic_tflops == 126.0 and roof.arithmetic_peak == "measured TF32 / 3"
    assert roof.arithmetic_floor_ms == pytest.approx(2 * 4096**3 / 126e12 * 1e3)
    assert roof.floor_ms == ROOF.floor_ms  # the best-peak floor (impossible-speedup check) is unchanged
    assert ROOF.arithmetic is None  # a copy
    text = timing_estimate(ProgramProfile(gpu_time_us=2000, launches=1), roof, candidate_ms=2.18)
    assert f"at the {X3} peak (126 TFLOP/s, measured TF32 / 3)" in text and "50% of the floor's speed" in text
    assert with_arithmetic(ROOF, "fp32").arithmetic_floor_ms == pytest.approx(2 * 4096**3 / 51e12 * 1e3)


def test_judge_names_the_arithmetic_and_its_roofline():
    task = Task(name="t", source="class Model: pass\ndef get_inputs(): pass\ndef get_init_inputs(): pass\n")
    cand = Candidate(name="c", source=_program(_gemm("3xtf32")))
    trials = CorrectnessReport(trials=[TrialResult(index=i, seed=i, distribution="given", order="reference-first",
                                                   passed=True) for i in range(2)], rel_l2_error=1e-7)
    result = WorkerResult(ready_at=1.0, build=BuildReport(extensions=[ExtensionBuild(
        requested_name="e", name="e_0", build_dir="/tmp/x", ok=True, cache_hit=False, seconds=1.0)]),
        correctness=trials, device=DeviceInfo(name=H100.gpu, capability="9.0"),
        timing=TimingReport(method="test", candidate=summarize([2.18] * 5), baselines={}),
        reference_profile=ProgramProfile(roofline=ROOF), profile=ProgramProfile(gpu_time_us=2180, launches=1),
        output_dtypes=["float32"])
    v = judge(task, cand, VerifyConfig(trials=2), result)
    assert v.passed and v.precision.arithmetic == X3
    assert v.reference_profile.roofline.arithmetic_tflops == 126.0
    assert result.reference_profile.roofline.arithmetic is None  # the worker's (cacheable) profile is untouched
    assert f"at the {X3} peak of 126 TFLOP/s" in v.feedback


def test_wrong_tf32_result_points_to_3xtf32():
    task = Task(name="t", source="class Model: pass\ndef get_inputs(): pass\ndef get_init_inputs(): pass\n")
    cand = Candidate(name="c", source=_program(_gemm("tf32")))
    bad = CorrectnessReport(trials=[TrialResult(index=0, seed=0, distribution="given", order="reference-first",
                                                passed=False, error="output: 9 of 9 elements outside atol")])
    v = judge(task, cand, VerifyConfig(trials=1), WorkerResult(ready_at=1.0, correctness=bad))
    assert v.precision.arithmetic == TF32
    assert "cutlass-3xtf32" in feedback_for(v)
