"""The CUTLASS GEMM kernel extensions: configuration keys and tile choice, the generated sources,
nvcc compiles of real instantiations against the nvidia-cutlass wheel's headers (their seconds are
printed: run with -s to see them), and on a GPU the launcher called through its C ABI."""

from __future__ import annotations

import ctypes
import subprocess

import pytest

from stitchcuda import machine
from stitchcuda.compiler.lowering import cutlass_gemm
from stitchcuda.compiler.lowering.cutlass_gemm import (
    ABI,
    BIG,
    SMALL,
    CutlassGemm,
    compile_check_gemm,
    cutlass_include,
    kernel_sources,
    load_inline_kwargs,
)

ROW_COL_RELU = CutlassGemm(math="3xtf32", a_col=False, b_col=True, align_a=4, align_b=4, align_c=4,
                           activation="relu")
# The GPU tests share this one where they can: every configuration is a build of a minute or so.
SMALL_ROW_COL_RELU = ROW_COL_RELU.model_copy(update={"tile": SMALL[0], "warp": SMALL[1], "stages": SMALL[2]})


class ScGemmArgs(ctypes.Structure):
    """Mirror of the C struct in ``ABI`` (its layout is checked against the C compiler below)."""

    _fields_ = ([(f, ctypes.c_int) for f in ("m", "n", "k", "batch")]
                + [(f, ctypes.c_void_p) for f in ("a", "b", "c", "d")]
                + [(f, ctypes.c_int64) for f in ("lda", "ldb", "ldc", "ldd", "stride_a", "stride_b", "stride_c",
                                                   "stride_d")]
                + [("alpha", ctypes.c_float), ("beta", ctypes.c_float)])


GemmFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ScGemmArgs), ctypes.c_void_p)


# ----------------------------------------------------------------------------- CPU

def test_key_is_stable_and_names_follow_it():
    # Pinned: a change here renames every extension, so every program rebuilds its GEMMs.
    assert ROW_COL_RELU.key == CutlassGemm(**ROW_COL_RELU.model_dump()).key == "8005aa6b4a09"
    assert ROW_COL_RELU.symbol == "sc_cutlass_gemm_8005aa6b4a09"
    assert ROW_COL_RELU.extension_name == "stitchcuda_cutlass_8005aa6b4a09"
    assert ROW_COL_RELU.describe == ("CUTLASS 3xTF32 GEMM 128x128x16 tile, 3 stages, A row/B col, "
                                     "align 4/4/4, epilogue alpha.acc + beta.C + relu")


def test_every_field_changes_the_key():
    variants = [ROW_COL_RELU.model_copy(update=u) for u in (
        {"math": "tf32"}, {"a_col": True}, {"b_col": False}, {"align_a": 1}, {"align_b": 2}, {"align_c": 1},
        {"tile": SMALL[0], "warp": SMALL[1], "stages": SMALL[2]}, {"stages": 4}, {"activation": "gelu"})]
    keys = {v.key for v in [ROW_COL_RELU, *variants]}
    assert len(keys) == len(variants) + 1
    assert all(len(k) == 12 and int(k, 16) >= 0 for k in keys)


def test_tiles_for_keeps_to_two_shapes():
    assert CutlassGemm.tiles_for(4096, 4096, 4096) == BIG
    assert CutlassGemm.tiles_for(512, 1024, 768) == SMALL  # 32 tiles of 128x128: a quarter of one wave
    assert CutlassGemm.tiles_for(257, 384, 520) == SMALL
    assert CutlassGemm.tiles_for(2048, 2048, 64) == SMALL  # 256 tiles: just under 2 waves of 132 SMs
    assert CutlassGemm.tiles_for(2048, 2048 + 128, 64) == BIG  # 272 tiles
    assert CutlassGemm.tiles_for(1024, 1024, 64) == SMALL
    assert CutlassGemm.tiles_for(512, 1024, 768, batch=16) == BIG  # batches fill the grid too
    assert CutlassGemm.tiles_for(1, 1, 1) == SMALL
    default = CutlassGemm(math="tf32", a_col=False, b_col=False, align_a=1, align_b=1, align_c=1)
    assert (default.tile, default.warp, default.stages) == BIG


def test_kernel_sources_depend_only_on_the_config():
    cuda, cpp = kernel_sources(ROW_COL_RELU)
    assert (cuda, cpp) == kernel_sources(CutlassGemm(**ROW_COL_RELU.model_dump()))
    assert f'extern "C" int {ROW_COL_RELU.symbol}(const ScGemmArgs* p, cudaStream_t stream)' in cuda
    assert f"reinterpret_cast<int64_t>(&{ROW_COL_RELU.symbol})" in cuda
    assert ABI.strip() in cuda and "#ifndef SC_GEMM_ABI" in ABI
    assert "#include <torch" not in cuda and "ATen" not in cuda  # no torch headers: it must build fast
    assert "cutlass::arch::OpMultiplyAddFastF32" in cuda and "cutlass::arch::Sm80" in cuda
    assert "cutlass::gemm::GemmShape<16, 8, 8>" in cuda and "GemmShape<128, 128, 16>" in cuda
    assert "float, cutlass::layout::RowMajor,\n    float, cutlass::layout::ColumnMajor," in cuda
    assert "LinearCombinationRelu<float, 4, float, float, cutlass::epilogue::thread::ScaleType::Default>" in cuda
    assert "kBatched" in cuda and "get_workspace_size(args) != 0" in cuda
    # its binding: Python's header alone (a build of the binding in a fraction of a second)
    assert "#include <Python.h>" in cpp and "#include <torch" not in cpp and "pybind" not in cpp
    assert '{"launcher_address", sc_launcher_address, METH_NOARGS' in cpp and "workspace_address" not in cpp

    tf32 = kernel_sources(ROW_COL_RELU.model_copy(update={"math": "tf32", "a_col": True, "b_col": False}))[0]
    assert "cutlass::arch::OpMultiplyAdd>" in tf32 and "FastF32" not in tf32
    assert "float, cutlass::layout::ColumnMajor,\n    float, cutlass::layout::RowMajor," in tf32


@pytest.mark.parametrize("activation, functor", [
    ("identity", "LinearCombination<float, 2,"), ("relu", "LinearCombinationRelu<float, 2,"),
    ("gelu", "LinearCombinationGELU<float, 2,"), ("silu", "LinearCombinationSilu<float, 2,"),
    ("sigmoid", "LinearCombinationSigmoid<float, 2,"),
    ("gelu_tanh", "LinearCombinationGeneric<ScGeluTanh, float, 2,")])
def test_each_activation_picks_its_epilogue(activation, functor):
    cfg = CutlassGemm(math="3xtf32", a_col=False, b_col=False, align_a=1, align_b=1, align_c=2,
                      activation=activation)
    cuda = kernel_sources(cfg)[0]
    assert f"using Epilogue = cutlass::epilogue::thread::{functor}" in cuda
    assert ("struct ScGeluTanh" in cuda) == (activation == "gelu_tanh")
    assert f"beta.C + {activation}" in cfg.describe or activation == "identity"


def test_headers_are_found_without_importing_cutlass_library(monkeypatch, tmp_path):
    import sys

    monkeypatch.delenv(cutlass_gemm.INCLUDE_ENV, raising=False)
    sys.modules.pop("cutlass_library", None)
    include = cutlass_include()
    assert include is not None, "pip install nvidia-cutlass"
    assert (include[0] / "cutlass" / "gemm" / "device" / "gemm_universal.h").is_file()
    assert "cutlass_library" not in sys.modules
    kwargs = load_inline_kwargs(ROW_COL_RELU)
    assert kwargs["name"] == ROW_COL_RELU.extension_name and kwargs["no_implicit_headers"] is True
    assert kwargs["extra_include_paths"][0] == str(include[0])

    monkeypatch.setenv(cutlass_gemm.INCLUDE_ENV, str(tmp_path))
    assert cutlass_include() is None
    with pytest.raises(FileNotFoundError, match="nvidia-cutlass"):
        load_inline_kwargs(ROW_COL_RELU)
    assert compile_check_gemm(ROW_COL_RELU).status == "skipped"
    monkeypatch.setenv(cutlass_gemm.INCLUDE_ENV, str(include[0]))
    assert cutlass_include() == [include[0]]


def test_compile_check_skips_without_nvcc(monkeypatch):
    monkeypatch.setattr(machine, "nvcc_path", lambda: None)
    check = compile_check_gemm(ROW_COL_RELU)
    assert check.status == "skipped" and "nvcc" in check.detail


# ----------------------------------------------------------------------------- nvcc

@pytest.mark.nvcc
@pytest.mark.parametrize("cfg", [
    ROW_COL_RELU,
    CutlassGemm(math="tf32", a_col=True, b_col=False, align_a=1, align_b=1, align_c=1,
                tile=SMALL[0], warp=SMALL[1], stages=SMALL[2]),
], ids=["3xtf32-row-col-relu-align4", "tf32-col-row-identity-align1-small"])
def test_instantiation_compiles_with_nvcc(cfg):
    check = compile_check_gemm(cfg, arch="sm_90")
    print(f"\n{cfg.describe}: {check.status} in {check.seconds:.1f} s")
    assert check.status == "compiled", check.detail
    assert check.seconds > 0


@pytest.mark.nvcc
def test_ctypes_mirror_matches_the_c_layout(tmp_path):
    """The GPU test below calls the launcher through ScGemmArgs: its layout must be the C one."""
    asserts = [f"static_assert(offsetof(ScGemmArgs, {name}) == {getattr(ScGemmArgs, name).offset}, \"{name}\");"
               for name, _ in ScGemmArgs._fields_]
    unit = tmp_path / "abi.cu"
    unit.write_text(ABI + "#include <cstddef>\n" + "\n".join(asserts)
                    + f"\nstatic_assert(sizeof(ScGemmArgs) == {ctypes.sizeof(ScGemmArgs)}, \"size\");\n")
    nvcc = machine.nvcc_path()
    done = subprocess.run([nvcc, "-std=c++17", "-c", str(unit), "-o", str(tmp_path / "abi.o")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.nvcc
def test_launcher_links_alone_and_answers_through_the_abi(tmp_path):
    """The CUDA unit alone (no torch, no binding) makes a library whose C symbol takes ScGemmArgs:
    without a GPU it answers with codes instead of launching."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU answers; the GPU tests below cover the launches")
    cfg = CutlassGemm(math="tf32", a_col=False, b_col=False, align_a=4, align_b=4, align_c=4,
                      tile=SMALL[0], warp=SMALL[1], stages=SMALL[2])
    unit, lib = tmp_path / "gemm.cu", tmp_path / "libgemm.so"
    unit.write_text(kernel_sources(cfg)[0])
    nvcc = machine.nvcc_path()
    done = subprocess.run([nvcc, *cutlass_gemm.CUDA_CFLAGS, "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC",
                           *(f"-I{p}" for p in cutlass_include()), str(unit), "-o", str(lib)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    fn = GemmFn(ctypes.cast(getattr(ctypes.CDLL(str(lib)), cfg.symbol), ctypes.c_void_p).value)

    def call(**fields) -> int:
        base = dict(m=64, n=64, k=64, batch=1, a=256, b=256, d=256, lda=64, ldb=64, ldd=64, alpha=1.0)
        return fn(ctypes.byref(ScGemmArgs(**(base | fields))), None)

    assert call(m=0) == 0  # nothing to do: no launch, no error
    assert call(beta=1.0) == 4  # kErrorInvalidProblem: C is read but null
    assert call(lda=63) == 1 and call(a=260) == 1  # kErrorMisalignedOperand
    assert call(n=62, ldb=64, ldd=64) == 1  # can_implement: N is not a multiple of B's access width
    assert call() > 1000  # no device: a CUDA error, offset by 1000


# ----------------------------------------------------------------------------- GPU

def _rel_err(out, ref) -> float:
    """Max error over the largest reference magnitude: elementwise ratios explode near zero."""
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    import torch

    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the kernels are SM80 ones: need compute capability 8.0 or newer")
    from torch.utils.cpp_extension import load_inline

    built = {}

    def get(cfg: CutlassGemm):
        if cfg not in built:
            module = load_inline(**load_inline_kwargs(cfg), build_directory=str(tmp_path_factory.mktemp(cfg.key)))
            built[cfg] = (module, GemmFn(module.launcher_address()))
        return built[cfg][1]

    return get


def _call(fn, **fields) -> int:
    import torch

    args = ScGemmArgs(**{k: (v.data_ptr() if isinstance(v, torch.Tensor) else v) for k, v in fields.items()})
    rc = fn(ctypes.byref(args), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return rc


@pytest.mark.gpu
def test_alignment_one_row_col_bias_relu(launcher):
    """M=257 with every pointer and leading dim odd: only the 1-element access width can serve it."""
    import torch

    m, n, k = 257, 384, 520
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k + 1, device="cuda", generator=g)[:, 1:]  # lda k+1, pointer 4 bytes off
    w = torch.randn(n, k + 1, device="cuda", generator=g)[:, 1:]  # B = w.T, column-major, ldb k+1
    bias = torch.randn(n + 1, device="cuda", generator=g)[1:]
    d = torch.full((m, n + 1), float("nan"), device="cuda")[:, 1:]
    cfg = CutlassGemm(math="3xtf32", a_col=False, b_col=True, align_a=1, align_b=1, align_c=1, activation="relu")
    fields = dict(m=m, n=n, k=k, batch=1, a=a, b=w, c=bias, d=d, lda=k + 1, ldb=k + 1, ldc=0, ldd=n + 1,
                  alpha=1.0, beta=1.0)
    assert _call(launcher(cfg), **fields) == 0
    ref = torch.relu(a.double() @ w.double().T + bias.double())
    err = _rel_err(d, ref)
    print(f"\n3xTF32 align 1 {m}x{n}x{k}: max rel error {err:.2e}")
    assert err < 1e-5

    # An align-4 kernel refuses these operands instead of faulting on them.
    assert _call(launcher(SMALL_ROW_COL_RELU), **fields) == 1  # cutlass::Status::kErrorMisalignedOperand


@pytest.mark.gpu
def test_3xtf32_is_fp32_accurate_and_tf32_is_not(launcher):
    import torch

    m, n, k = 512, 1024, 768
    g = torch.Generator(device="cuda").manual_seed(1)
    a, w = torch.randn(m, k, device="cuda", generator=g), torch.randn(n, k, device="cuda", generator=g)
    bias = torch.randn(n, device="cuda", generator=g)
    ref = torch.relu(0.5 * (a.double() @ w.double().T) + bias.double())
    assert CutlassGemm.tiles_for(m, n, k) == SMALL
    errs = {}
    for math in ("3xtf32", "tf32"):
        cfg = SMALL_ROW_COL_RELU.model_copy(update={"math": math})
        d = torch.full((m, n), float("nan"), device="cuda")
        assert _call(launcher(cfg), m=m, n=n, k=k, batch=1, a=a, b=w, c=bias, d=d, lda=k, ldb=k, ldc=0, ldd=n,
                     alpha=0.5, beta=1.0) == 0
        errs[math] = _rel_err(d, ref)
    print(f"\n{m}x{n}x{k} bias+relu: max rel error 3xTF32 {errs['3xtf32']:.2e}, TF32 {errs['tf32']:.2e}")
    assert errs["3xtf32"] < 1e-5
    assert errs["tf32"] > 1e-4


@pytest.mark.gpu
def test_batched_residual_per_batch_bias_and_beta_zero(launcher):
    import torch

    batch, m, n, k = 3, 96, 160, 200
    g = torch.Generator(device="cuda").manual_seed(2)
    at = torch.randn(batch, k, m, device="cuda", generator=g)  # A column-major: A[i] = at[i].T
    b = torch.randn(batch, k, n, device="cuda", generator=g)
    c = torch.randn(batch, m, n, device="cuda", generator=g)
    bias = torch.randn(batch, n, device="cuda", generator=g)
    cfg = CutlassGemm(math="3xtf32", a_col=True, b_col=False, align_a=4, align_b=4, align_c=4,
                      tile=SMALL[0], warp=SMALL[1], stages=SMALL[2])
    fn, prod = launcher(cfg), at.double().transpose(1, 2) @ b.double()
    common = dict(m=m, n=n, k=k, batch=batch, a=at, b=b, lda=m, ldb=n, ldd=n, stride_a=k * m, stride_b=k * n,
                  stride_d=m * n)

    d = torch.empty(batch, m, n, device="cuda")
    assert _call(fn, **common, c=c, d=d, ldc=n, stride_c=m * n, alpha=2.0, beta=0.5) == 0
    assert _rel_err(d, 2.0 * prod + 0.5 * c.double()) < 1e-5

    assert _call(fn, **common, c=bias, d=d, ldc=0, stride_c=n, alpha=1.0, beta=1.0) == 0
    assert _rel_err(d, prod + bias.double()[:, None, :]) < 1e-5

    # beta = 0: C is never read, so NaNs in it cannot reach D (0 * NaN would be NaN).
    poison = torch.full_like(c, float("nan"))
    assert _call(fn, **common, c=poison, d=d, ldc=n, stride_c=m * n, alpha=1.0, beta=0.0) == 0
    assert torch.isfinite(d).all() and _rel_err(d, prod) < 1e-5


@pytest.mark.gpu
def test_launch_is_captured_by_a_cuda_graph(launcher):
    """The program calls the launcher inside a graph capture: no workspace, no host sync."""
    import torch

    m, n, k = 128, 256, 64
    a, w = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    bias, d = torch.randn(n, device="cuda"), torch.empty(m, n, device="cuda")
    fn = launcher(SMALL_ROW_COL_RELU)
    args = ScGemmArgs(m=m, n=n, k=k, batch=1, a=a.data_ptr(), b=w.data_ptr(), c=bias.data_ptr(), d=d.data_ptr(),
                      lda=k, ldb=k, ldc=0, ldd=n, alpha=1.0, beta=1.0)
    assert fn(ctypes.byref(args), torch.cuda.current_stream().cuda_stream) == 0  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert fn(ctypes.byref(args), torch.cuda.current_stream().cuda_stream) == 0
    a.copy_(torch.randn_like(a))
    d.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_err(d, torch.relu(a.double() @ w.double().T + bias.double())) < 1e-5
