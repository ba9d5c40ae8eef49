"""The CUTLASS implicit-GEMM convolution extension: configs and their keys, the generated sources,
nvcc compile checks of two instantiations, the launcher's host-side checks (its library built with
nvcc and called through ctypes on the CPU: it refuses bad arguments before any CUDA call), and on
a GPU the convolution against torch in float64, directly and replayed from a CUDA graph."""

from __future__ import annotations

import ctypes
import functools
import re
import subprocess

import pytest
from pydantic import ValidationError

from stitchcuda import machine
from stitchcuda.compiler.lowering.cutlass_conv import (
    CONV_ABI,
    CutlassConv,
    compile_check_conv,
    conv_supported,
    kernel_sources,
)
from stitchcuda.compiler.lowering.cutlass_gemm import CUDA_CFLAGS, cutlass_include


class ScConvArgs(ctypes.Structure):
    """Mirror of the ABI's ScConvArgs (ctypes lays it out as the C compiler does)."""

    _fields_ = [*((name, ctypes.c_int) for name in
                  ("n", "h", "w", "c", "k", "r", "s", "p", "q",
                   "pad_h", "pad_w", "stride_h", "stride_w", "dil_h", "dil_w")),
                ("x", ctypes.c_void_p), ("weight", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("y", ctypes.c_void_p), ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_int64)]


LAUNCHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ScConvArgs), ctypes.c_void_p)
WORKSPACE = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.POINTER(ScConvArgs))

# cutlass::Status values the launcher returns
MISALIGNED, INVALID_PROBLEM, WORKSPACE_NULL = 1, 4, 6


def out_extent(size: int, pad: int, dil: int, k: int, stride: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def conv_args(n, c, h, w, k, r, s, pad=0, stride=1, dil=1, **pointers) -> ScConvArgs:
    p, q = out_extent(h, pad, dil, r, stride), out_extent(w, pad, dil, s, stride)
    return ScConvArgs(n, h, w, c, k, r, s, p, q, pad, pad, stride, stride, dil, dil, **pointers)


ALIGNED = CutlassConv(math="3xtf32", align=4, bias=True, activation="relu")
UNALIGNED = CutlassConv(math="3xtf32", align=1, bias=False)


# ---- configs and sources (CPU) ----

def test_key_is_stable_and_distinguishes_configs():
    same = CutlassConv(math="3xtf32", align=4, bias=True, activation="relu")
    assert same.key == ALIGNED.key and len(ALIGNED.key) == 12 and int(ALIGNED.key, 16) >= 0
    assert ALIGNED.symbol == f"sc_cutlass_conv_{ALIGNED.key}"
    assert ALIGNED.extension_name == f"stitchcuda_cutlass_conv_{ALIGNED.key}"
    variants = [ALIGNED, UNALIGNED, ALIGNED.model_copy(update={"math": "tf32"}),
                ALIGNED.model_copy(update={"bias": False}), ALIGNED.model_copy(update={"activation": "gelu"}),
                ALIGNED.model_copy(update={"stages": 4}), ALIGNED.model_copy(update={"warp": (64, 32, 16)})]
    assert len({v.key for v in variants}) == len(variants)
    assert "3xtf32" in ALIGNED.describe and "bias + relu" in ALIGNED.describe


def test_config_rejects_shapes_cutlass_cannot_tile():
    with pytest.raises(ValidationError):
        CutlassConv(math="tf32", align=4, bias=False, tile=(128, 128, 16), warp=(48, 64, 16))
    with pytest.raises(ValidationError):
        CutlassConv(math="tf32", align=4, bias=False, stages=1)
    with pytest.raises(ValidationError):
        CutlassConv(math="tf32", align=2, bias=False)


def test_sources_carry_symbol_math_and_abi():
    cuda, cpp = kernel_sources(ALIGNED)
    assert f'extern "C" int {ALIGNED.symbol}(const ScConvArgs* a, cudaStream_t stream)' in cuda
    assert f'extern "C" int64_t {ALIGNED.symbol}_workspace(const ScConvArgs* a)' in cuda
    assert "cutlass::arch::OpMultiplyAddFastF32" in cuda and "IteratorAlgorithm::kOptimized" in cuda
    assert CONV_ABI in cuda and not re.search(r"#include\s*[<\"](torch|ATen|c10)/", cuda)
    assert "v < 0.0f ? 0.0f : v" in cuda and "kHasBias = true" in cuda
    # its binding: Python's header alone, the two addresses
    assert "#include <Python.h>" in cpp and "#include <torch" not in cpp and "pybind" not in cpp
    assert '{"launcher_address", sc_launcher_address, METH_NOARGS' in cpp
    assert '{"workspace_address", sc_workspace_address, METH_NOARGS' in cpp

    cuda1, _ = kernel_sources(UNALIGNED)
    assert "IteratorAlgorithm::kAnalytic" in cuda1 and "kHasBias = false" in cuda1
    tf32, _ = kernel_sources(UNALIGNED.model_copy(update={"math": "tf32"}))
    assert "cutlass::arch::OpMultiplyAdd," in tf32 and "FastF32" not in tf32
    assert kernel_sources(ALIGNED) == (cuda, cpp)  # the extension cache keys on the text


def test_conv_supported_reasons():
    assert conv_supported(1, False, 2, "float32") is None
    assert conv_supported(1, False, 2, "torch.float32") is None
    assert "groups=2" in conv_supported(2, False, 2, "float32")
    assert "transposed" in conv_supported(1, True, 2, "float32")
    assert "3-d" in conv_supported(1, False, 3, "float32")
    assert "float16" in conv_supported(1, False, 2, "torch.float16")


def test_include_override(tmp_path, monkeypatch):
    (tmp_path / "cutlass").mkdir()
    (tmp_path / "cutlass" / "cutlass.h").write_text("")
    monkeypatch.setenv("STITCHCUDA_CUTLASS_INCLUDE", str(tmp_path))
    assert (cutlass_include() or [])[:1] == [tmp_path]
    monkeypatch.setenv("STITCHCUDA_CUTLASS_INCLUDE", str(tmp_path / "missing"))
    assert (cutlass_include() or []) == []
    assert compile_check_conv(ALIGNED).status == "skipped"


# ---- nvcc on the CPU machine ----

def _need_headers():
    assert cutlass_include(), "CUTLASS headers not found: nvidia-cutlass is a dependency (pip install -e .)"


@pytest.mark.nvcc
@pytest.mark.parametrize("cfg", [ALIGNED, UNALIGNED], ids=["align4-bias-relu", "align1-identity"])
def test_instantiation_compiles_for_sm90(cfg):
    _need_headers()
    result = compile_check_conv(cfg)
    print(f"\n{cfg.describe}: {result.status} in {result.seconds:.1f} s")
    assert result.status == "compiled", result.detail


@pytest.mark.nvcc
def test_launcher_refuses_bad_arguments_before_any_cuda_call(tmp_path):
    """The launcher's checks and the workspace size are host code: built as a shared library they
    run here without a GPU, since every refusal returns before the first CUDA call."""
    _need_headers()
    cuda, _ = kernel_sources(ALIGNED)
    (tmp_path / "conv.cu").write_text(cuda)
    lib = tmp_path / "libconv.so"
    cmd = [machine.nvcc_path(), "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC",
           *CUDA_CFLAGS, *(f"-I{d}" for d in (cutlass_include() or [])), str(tmp_path / "conv.cu"), "-o", str(lib)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    so = ctypes.CDLL(str(lib))
    launch = LAUNCHER((ALIGNED.symbol, so))
    workspace = WORKSPACE((f"{ALIGNED.symbol}_workspace", so))

    fake = {"x": 1 << 20, "weight": 2 << 20, "bias": 3 << 20, "y": 4 << 20, "workspace": 5 << 20}
    args = conv_args(8, 64, 56, 56, 128, 3, 3, pad=1, **fake)
    x_bytes, w_bytes, y_bytes = 8 * 64 * 56 * 56 * 4, 128 * 64 * 9 * 4, 8 * 128 * 56 * 56 * 4
    need = workspace(ctypes.byref(args))
    assert need == x_bytes + w_bytes + y_bytes  # each a multiple of 256 here; no split-K workspace

    args.workspace_bytes = need - 1
    assert launch(ctypes.byref(args), None) == WORKSPACE_NULL
    args.workspace_bytes, args.workspace = need, fake["workspace"] + 4
    assert launch(ctypes.byref(args), None) == MISALIGNED
    args.workspace, args.bias = fake["workspace"], None
    assert launch(ctypes.byref(args), None) == INVALID_PROBLEM  # a bias extension needs its bias
    args.bias, args.p = fake["bias"], args.p + 1
    assert launch(ctypes.byref(args), None) == INVALID_PROBLEM  # P disagrees with the geometry
    assert workspace(ctypes.byref(args)) == 0

    odd = conv_args(4, 3, 65, 65, 17, 5, 5, pad=2, stride=2, **fake)  # C=3: no 128-bit accesses
    odd.workspace_bytes = workspace(ctypes.byref(odd))
    assert odd.workspace_bytes % 256 == 0
    assert launch(ctypes.byref(odd), None) == INVALID_PROBLEM  # can_implement's verdict


# ---- on a GPU ----

@functools.cache
def _extension(cfg: CutlassConv):
    from torch.utils.cpp_extension import load_inline

    cuda, cpp = kernel_sources(cfg)
    ext = load_inline(name=cfg.extension_name, cuda_sources=[cuda], cpp_sources=[cpp],
                      extra_include_paths=[str(d) for d in (cutlass_include() or [])], extra_cuda_cflags=list(CUDA_CFLAGS),
                      no_implicit_headers=True)
    return LAUNCHER(ext.launcher_address()), WORKSPACE(ext.workspace_address())


def _problem(n, c, hw, k, rs, stride, pad):
    """A conv's config, its launch arguments, its output, its float64 reference, and the input tensors
    the arguments point into: the caller holds them, or the allocator hands their memory on (to the
    workspace, say) while the kernel still reads it."""
    import torch

    cfg = CutlassConv(math="3xtf32", align=4 if c % 4 == 0 and k % 4 == 0 else 1, bias=True, activation="relu")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, c, hw, hw, device="cuda", generator=gen)
    weight = torch.randn(k, c, rs, rs, device="cuda", generator=gen) / (c * rs * rs) ** 0.5
    bias = torch.randn(k, device="cuda", generator=gen)
    args = conv_args(n, c, hw, hw, k, rs, rs, pad=pad, stride=stride)
    y = torch.full((n, k, args.p, args.q), float("nan"), device="cuda")
    args.x, args.weight, args.bias, args.y = x.data_ptr(), weight.data_ptr(), bias.data_ptr(), y.data_ptr()
    ref = torch.relu(torch.nn.functional.conv2d(x.double(), weight.double(), bias.double(), stride=stride,
                                                padding=pad))
    return cfg, args, y, ref, (x, weight, bias)


def _rel_error(y, ref) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


GPU_CASES = {"c64-k128-3x3": (8, 64, 56, 128, 3, 1, 1), "c3-k17-5x5-s2": (4, 3, 65, 17, 5, 2, 2)}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_conv_matches_torch_in_float64(case):
    import torch

    cfg, args, y, ref, _inputs = _problem(*GPU_CASES[case])
    launch, workspace = _extension(cfg)
    need = workspace(ctypes.byref(args))
    assert need > 0
    buffer = torch.empty(need, dtype=torch.uint8, device="cuda")
    args.workspace, args.workspace_bytes = buffer.data_ptr(), need
    status = launch(ctypes.byref(args), torch.cuda.current_stream().cuda_stream)
    assert status == 0, f"{cfg.describe}: status {status}"
    torch.cuda.synchronize()
    err = _rel_error(y, ref)
    print(f"\n{case} ({cfg.describe}): max relative error {err:.2e}")
    assert err < 1e-5


@pytest.mark.gpu
def test_conv_replays_from_a_cuda_graph():
    """No allocation and no synchronisation in the launcher: it can be captured and replayed."""
    import torch

    cfg, args, y, ref, _inputs = _problem(*GPU_CASES["c64-k128-3x3"])
    launch, workspace = _extension(cfg)
    need = workspace(ctypes.byref(args))
    buffer = torch.empty(need, dtype=torch.uint8, device="cuda")
    args.workspace, args.workspace_bytes = buffer.data_ptr(), need
    # a first launch outside the capture, as the generated programs do (they capture on the second
    # call): CUTLASS sets the kernel's shared-memory attribute on its first launch
    assert launch(ctypes.byref(args), torch.cuda.current_stream().cuda_stream) == 0
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        status = launch(ctypes.byref(args), torch.cuda.current_stream().cuda_stream)
    assert status == 0
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_error(y, ref) < 1e-5


def test_ctypes_mirror_follows_the_abi_text():
    body = CONV_ABI[CONV_ABI.index("struct ScConvArgs {"):CONV_ABI.index("};")]
    code = re.sub(r"//[^\n]*", "", body.split("{", 1)[1])
    names = [re.sub(r"[*\s]|const|float|void|int64_t|int", "", d) for d in code.replace(";", ",").split(",")]
    assert [n for n in names if n] == [name for name, _ in ScConvArgs._fields_]
    assert ctypes.sizeof(ScConvArgs) == 15 * 4 + 4 + 5 * 8 + 8  # 4 bytes of padding before x
