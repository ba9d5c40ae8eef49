"""The pooling family (any rank, ceil mode, padding, dilation, indices, adaptive windows) and
convolutions of any rank through cuDNN: geometry against PyTorch, generated programs, the
pooling kernels' semantics run on the CPU (the one-thread-per-output kernels compiled as C++),
and one nvcc run over a program with a 3-d convolution and several pooling kernels."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest
import torch

from stitchcuda.compiler.capture.graph import Node, TensorMeta, capture
from stitchcuda.compiler.check import cuda_source
from stitchcuda.compiler.emit.codegen import Unsupported, generate, lower
from stitchcuda.compiler.lowering.families.pool import POOLS, lower_pool, out_size, windows
from stitchcuda.compiler.lowering.kernel_call import Strided
from stitchcuda.compiler.lowering.lower_conv import conv_geometry
from stitchcuda.compiler.lowering.registry import OPERATORS
from stitchcuda.compiler.schedule.fusion import fuse, op_role
from stitchcuda.task.record import Task

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


def model(body: str, inputs: str) -> str:
    return (HEAD + "class Model(nn.Module):\n" + body + f"\n\ndef get_inputs():\n    return [{inputs}]\n\n\n"
            "def get_init_inputs():\n    return []\n")


MODELS = {
    "conv3d_relu": model('''
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, (3, 2, 3), stride=(1, 2, 1), padding=(1, 0, 2), dilation=(2, 1, 1))

    def forward(self, x):
        return torch.relu(self.conv(x))''', "torch.randn(2, 3, 9, 10, 11)"),
    "conv_transpose3d": model('''
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose3d(4, 6, (3, 3, 2), stride=(2, 2, 3), padding=(1, 0, 1),
                                       output_padding=(1, 1, 2), groups=2)

    def forward(self, x):
        return torch.sigmoid(self.conv(x))''', "torch.randn(2, 4, 5, 6, 7)"),
    "conv1d_dilated": model('''
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=3, groups=2, bias=False)

    def forward(self, x):
        return self.conv(x) * 2.0''', "torch.randn(2, 4, 37)"),
    "conv_same_valid": model('''
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose1d(4, 3, 5, stride=3, padding=2, output_padding=1, dilation=2)
        self.same = nn.Conv1d(3, 5, 4, padding="same")
        self.valid = nn.Conv2d(3, 2, 3, padding="valid")

    def forward(self, x, img):
        return torch.tanh(self.same(self.up(x))), self.valid(img)''', "torch.randn(2, 4, 11), torch.randn(3, 8, 9)"),
    "max_pool3d_ceil": model('''
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool3d(3, stride=2, padding=1, dilation=2, ceil_mode=True)

    def forward(self, x):
        return self.pool(x) + 1.0''', "torch.randn(2, 3, 9, 10, 11)"),
    "avg_pool1d_no_pad_count": model('''
    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool1d(4, stride=3, padding=2, ceil_mode=True, count_include_pad=False)

    def forward(self, x):
        return self.pool(x) * 2.0''', "torch.randn(2, 3, 17)"),
    "adaptive_avg_pool3d": model('''
    def __init__(self):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool3d((2, 3, 1))

    def forward(self, x):
        return self.pool(x) - 1.0''', "torch.randn(2, 3, 9, 10, 11)"),
    "pools_2d": model('''
    def __init__(self):
        super().__init__()
        self.ceil = nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)
        self.plain = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(3, stride=2, padding=1, divisor_override=4)
        self.amax = nn.AdaptiveMaxPool2d((3, 2))
        self.gap = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return (self.ceil(x) * 1.0, self.plain(x) * 1.0, self.avg(x) * 1.0, self.amax(x) * 1.0,
                self.gap(x) * 1.0)''', "torch.randn(2, 3, 16, 16)"),
}


def generated(name: str) -> tuple[str, list]:
    task = Task(name=name, source=MODELS[name])
    graph = capture(task)
    groups = fuse(graph)
    return generate(task, graph, groups), lower(graph, groups).convs


def test_every_pooling_op_is_registered():
    assert set(POOLS) <= set(OPERATORS)
    for op in POOLS:  # the argument names follow each op's schema
        schema = getattr(torch.ops.aten, op.removeprefix("aten.")).default._schema
        assert [a.name for a in schema.arguments[1:]] == POOLS[op][2]


@pytest.mark.parametrize("size,kernel,stride,pad,dilation", [
    (17, 3, 2, 1, 1), (17, 4, 3, 2, 1), (10, 3, 2, 1, 2), (11, 2, 2, 0, 1), (9, 5, 4, 2, 1), (7, 3, 3, 1, 2),
    (16, 3, 2, 1, 1), (5, 2, 3, 1, 1),
])
def test_output_sizes_follow_pytorch_with_and_without_ceil_mode(size, kernel, stride, pad, dilation):
    x = torch.empty(1, 1, size, device="meta")
    for ceil in (False, True):
        want = torch.ops.aten.max_pool1d(x, [kernel], [stride], [pad], [dilation], ceil).shape[-1]
        assert out_size(size, kernel, stride, pad, dilation, ceil) == want


def test_generated_programs_for_convolutions_and_pools():
    source, convs = generated("conv3d_relu")
    cuda = cuda_source(source)
    assert "cudnnSetConvolutionNdDescriptor" in cuda and "cudnnSetTensorNdDescriptor" in cuda
    assert convs[0].size == (9, 10, 11) and convs[0].out_size == (7, 5, 13) and convs[0].pad == (1, 0, 2)
    source, convs = generated("conv_transpose3d")
    assert "cudnnConvolutionBackwardData" in cuda_source(source) and convs[0].groups == 2
    assert convs[0].out_size == (10, 14, 20)
    source, convs = generated("conv1d_dilated")  # as 2-d with H = 1, through the 4-d descriptors
    assert convs[0].size == (1, 37) and convs[0].kernel == (1, 3) and convs[0].dilation == (1, 3)
    assert "cudnnSetConvolution2dDescriptor" in cuda_source(source)
    source, convs = generated("conv_same_valid")
    same = next(c for c in convs if c.k == 5)  # kernel 4: 'same' pads 1 left, 2 right: cuDNN pads 2, one more row
    assert same.pad == (0, 2) and same.out_size == (1, 36 + 1) and "__wide" in cuda_source(source)
    valid = next(c for c in convs if c.k == 2)  # an input without its batch dim
    assert valid.n == 1 and valid.pad == (0, 0) and valid.out_size == (6, 7)
    for name, kernel in (("max_pool3d_ceil", "maxpool"), ("avg_pool1d_no_pad_count", "avgpool"),
                         ("adaptive_avg_pool3d", "adaptive_avgpool")):
        assert re.search(rf"__global__ void __launch_bounds__\(\d+\) k_\w+_{kernel}\(", cuda_source(generated(name)[0]))


def test_pool_expr_keeps_the_plain_2d_pools_and_the_family_takes_the_rest():
    task = Task(name="pools_2d", source=MODELS["pools_2d"])
    graph = capture(task)
    shapes = {p.name: p.meta.shape for p in graph.placeholders if p.meta}
    roles = {n.name: (n.op, n.args[1:], op_role(n, in_shape=shapes.get(n.args[0][1:])))
             for n in graph.nodes if "pool" in n.op}
    assert len(roles) == 5 and all(role == "other" for _, _, role in roles.values())
    cuda = cuda_source(generate(task, graph, fuse(graph)))
    kernels = re.findall(r"__global__ void __launch_bounds__\(\d+\) (k_\w+)\(", cuda)
    # the plain 2x2 max pool is a strided-read pointwise kernel; the ceil-mode one, the divisor
    # override and the adaptive ones go to the family
    assert len([k for k in kernels if "pool" in k]) == 4
    assert any(k.endswith("adaptive_maxpool") for k in kernels) and any(k.endswith("avgpool") for k in kernels)


def _node(op: str, args: list, x_shape: tuple[int, ...]) -> Node:
    out = getattr(torch.ops.aten, op.removeprefix("aten."))(torch.empty(x_shape, device="meta"), *args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return Node(name="pool", op=op, args=["%x", *args],
                out=[TensorMeta(shape=list(o.shape), dtype=str(o.dtype).removeprefix("torch.")) for o in outs])


def test_windows_name_what_they_cannot_take():
    node = _node("aten.max_pool2d", [[2, 2]], (1, 4, 4))
    node.out[0].shape = [1, 3, 3]
    with pytest.raises(Unsupported, match="expected"):
        windows(node, (1, 4, 4))
    node = _node("aten.avg_pool3d", [[2, 2, 2], [], [0, 0, 0], False, True, None], (1, 4, 4, 4))
    assert windows(node, (1, 4, 4, 4))[0] == "avg"


def test_conv_geometry_refuses_what_cudnn_cannot_run():
    node = Node(name="ct", op="aten.conv_transpose1d", args=["%x", "%w", None, [2], [0], [2], 1, [3]],
                out=[TensorMeta(shape=[1, 2, 14], dtype="float32")])  # output padding 2 >= stride 2 (dilation 3)
    with pytest.raises(Unsupported, match="output padding"):
        conv_geometry(node, (1, 3, 4), (3, 2, 2), (1, 2, 14))
    big = Node(name="c", op="aten.conv2d", args=["%x", "%w"], out=[TensorMeta(shape=[16, 128, 1024, 1024],
                                                                             dtype="float32")])
    geo = conv_geometry(big, (16, 64, 1024, 1024), (128, 64, 1, 1), (16, 128, 1024, 1024))
    assert geo.chunks == 2  # two calls of 8 samples: fewer than 2^31 elements each


# -- the one-thread-per-output kernels, compiled as C++ and run on the CPU ---------------------

SHIM = """#include <cmath>
#include <cstdint>
using std::isnan;
struct sc_dim3 { unsigned x = 0, y = 0, z = 0; };
static sc_dim3 blockIdx, threadIdx, blockDim;
#define __global__
#define __launch_bounds__(n)
"""

SERIAL_CASES = [  # (op, args after the input, input shape, layout, values)
    ("aten.max_pool1d", [[3], [2], [1], [2], True], (2, 3, 17), "", "ties"),
    ("aten.max_pool1d_with_indices", [[3], [2], [1], [1], True], (2, 3, 18), "", "nan"),
    ("aten.max_pool2d", [[3, 2], [2, 1], [1, 1], [2, 1], True], (2, 3, 13, 11), "", "ties"),
    ("aten.max_pool2d_with_indices", [[3, 3], [2, 2], [1, 1], [1, 1], True], (2, 3, 12, 12), "permute", "nan"),
    ("aten.max_pool2d_with_indices", [[2, 2], [2, 2], [0, 0], [1, 1], False], (3, 9, 9), "", "ninf"),
    ("aten.max_pool3d_with_indices", [[3, 2, 2], [2, 2, 2], [1, 1, 1], [1, 2, 1], True], (2, 2, 7, 8, 9), "",
     "nan"),
    ("aten.avg_pool1d", [[4], [3], [2], True, False], (2, 3, 17), "", ""),
    ("aten.avg_pool2d", [[3, 3], [2, 2], [1, 1], True, True, None], (2, 3, 13, 11), "permute", ""),
    ("aten.avg_pool2d", [[3, 2], [2, 3], [1, 1], False, True, 5], (2, 3, 13, 11), "", ""),
    ("aten.avg_pool3d", [[3, 3, 3], [2, 2, 2], [1, 1, 1], True, False, None], (2, 2, 9, 8, 7), "", ""),
    ("aten.adaptive_avg_pool2d", [[4, 3]], (2, 3, 13, 11), "", ""),
    ("aten.adaptive_max_pool1d", [[5]], (2, 3, 17), "", "nan"),
    ("aten.adaptive_max_pool2d", [[4, 3]], (2, 3, 13, 11), "", "ties"),
]


class _Ctx:
    block = 64

    def __init__(self, x: Strided, outs: list[list[int]]):
        self.x, self.outs = x, outs

    def read(self, arg):
        return self.x

    def write(self, value, dtype="float32"):
        shape = tuple(self.outs[0 if value == "values" else 1])
        return Strided("a.y" if value == "values" else "a.ind", "float", shape, tuple(torch.empty(shape).stride()))

    def outputs(self, node):
        return ["values", "indices"][: len(node.out)]

    def kernel_name(self, node, what):
        return f"k_{what}"


def _values(shape: tuple[int, ...], kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 2).round() / 2 if kind else torch.randn(shape, generator=g)
    flat = x.view(-1)
    picks = torch.randint(0, flat.numel(), (max(1, flat.numel() // 40),), generator=g)
    if kind == "nan":
        flat[picks] = float("nan")
    if kind == "ninf":
        flat[: flat.numel() // 3] = float("-inf")
        flat[picks] = float("-inf")
    return x


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_serial_pool_kernels_match_pytorch_on_the_cpu(tmp_path):
    units, runs = [SHIM], []
    for i, (op, args, shape, layout, kind) in enumerate(SERIAL_CASES):
        stored = (*shape[:-2], shape[-1], shape[-2]) if layout == "permute" else shape
        st = torch.empty(stored).stride()
        strides = (*st[:-2], st[-1], st[-2]) if layout == "permute" else st
        node = _node(op, args, shape)
        call = lower_pool(_Ctx(Strided("a.x", "float", shape, strides), [o.shape for o in node.out]), node)
        (name, source), = call.kernels.items()
        assert "one thread per output" in call.describe
        blocks, block = re.search(r"<<<(\d+), (\d+), 0, stream>>>", call.launch).groups()
        units.append(source.replace(name, f"{name}_{i}"))
        units.append(f'extern "C" void run_{i}(const float* x, float* y, int64_t* ind) {{\n'
                     f"  blockDim.x = {block};\n  for (unsigned b = 0; b < {blocks}; ++b)\n"
                     f"    for (unsigned t = 0; t < {block}; ++t) {{ blockIdx.x = b; threadIdx.x = t; "
                     f"{name}_{i}(x, y, ind); }}\n}}\n")
        runs.append((i, op, args, stored, layout, kind))
    (tmp_path / "pools.cpp").write_text("\n".join(units))
    lib = tmp_path / "pools.so"
    done = subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "pools.cpp")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    so = ctypes.CDLL(str(lib))
    for i, op, args, stored, layout, kind in runs:
        base = _values(stored, kind, i).contiguous()
        x = base.transpose(-1, -2) if layout == "permute" else base
        want = getattr(torch.ops.aten, op.removeprefix("aten."))(x, *args)
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        y = torch.full(want[0].shape, 123.0)
        ind = torch.full(want[-1].shape, -5, dtype=torch.int64)
        getattr(so, f"run_{i}")(ctypes.c_void_p(base.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                                ctypes.c_void_p(ind.data_ptr()))
        torch.testing.assert_close(y, want[0], atol=1e-5, rtol=1e-5, equal_nan=True, msg=f"{op} {args}")
        if len(want) > 1:
            assert torch.equal(ind, want[1]), f"{op} {args}: indices"


@pytest.mark.nvcc
def test_conv3d_and_pool_kernels_compile_for_sm90(tmp_path):
    """One program with 3-d convolutions (Nd descriptors) and pooling kernels of every kind (one
    thread, a warp and a block per output), with the body of one with 1-d and 2-d convolutions (4-d
    descriptors, an uneven 'same' padding's wider output), in one nvcc run."""
    from tests.test_offline_codegen import _compile_together

    body = '''
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 3, padding=1)
        self.up = nn.ConvTranspose3d(4, 2, 2, stride=2, output_padding=1, dilation=2)
        self.mp = nn.MaxPool3d(3, stride=2, padding=1, ceil_mode=True)
        self.ap = nn.AvgPool1d(4, stride=3, padding=2, ceil_mode=True, count_include_pad=False)
        self.big = nn.MaxPool2d(16, stride=16)
        self.gap = nn.AdaptiveAvgPool3d(1)

    def forward(self, x, s, img):
        y = torch.relu(self.conv(x))
        return (self.mp(y) * 1.0, self.up(y), self.gap(y) * 1.0, self.ap(s) * 2.0, self.big(img) * 1.0,
                F.adaptive_max_pool2d(img, 1, return_indices=True)[0] * 1.0)'''
    MODELS["compile_mix"] = model(body, "torch.randn(2, 3, 6, 7, 8), torch.randn(2, 3, 17), torch.randn(2, 2, 64, 64)")
    try:
        sources = [cuda_source(generated("compile_mix")[0]), cuda_source(generated("conv_same_valid")[0])]
    finally:
        del MODELS["compile_mix"]
    for kind in ("maxpool", "avgpool", "adaptive_avgpool", "adaptive_maxpool"):
        assert re.search(rf"k_\w+_{kind}\(", sources[0]), kind
    _compile_together(sources, tmp_path)
