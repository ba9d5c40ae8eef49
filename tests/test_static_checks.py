"""Rules of the static hacking checks on small synthetic candidates: the cases the corpus
(tests/hacks/) does not hold one file for, honest look-alikes above all."""

from __future__ import annotations

import pytest

from stitchcuda.verify.judge import hacking_level
from stitchcuda.verify.static_checks import static_findings

HEAD = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_ext = load_inline(name="x", cpp_sources="", functions=["f", "g"])
'''

CASES = {
    # state written on every call, in both branches of a check of the module's state
    "both_branches_write": ("none", '''
class ModelNew(nn.Module):
    def forward(self, x):
        if self.training:
            self.out = _ext.f(x)
        else:
            self.out = _ext.g(x)
        return self.out
'''),
    # a result stored only the first time, behind a flag
    "stored_behind_flag": ("total", '''
class ModelNew(nn.Module):
    def forward(self, x):
        if not self._done:
            _ext.f(x, self.buf)
            self._done = True
        return self.buf
'''),
    # conditionally stored state that is not the returned data
    "stored_shape_only": ("none", '''
class ModelNew(nn.Module):
    def forward(self, x):
        if self._shape is None:
            self._shape = (x.shape[0], -1)
        y = _ext.f(x)
        return y.view(self._shape)
'''),
    # a persistent buffer the kernel's result is copied into on every call
    "buffer_copied_each_call": ("none", '''
class ModelNew(nn.Module):
    def forward(self, x):
        y = _ext.f(x)
        self.buf.copy_(y)
        return self.buf
'''),
    "early_return_shape_guard": ("none", '''
class ModelNew(nn.Module):
    def forward(self, x):
        if x.numel() == 0:
            return x.new_zeros(x.shape)
        return _ext.f(x)
'''),
    "early_raise": ("none", '''
class ModelNew(nn.Module):
    def forward(self, x):
        if not x.is_cuda:
            raise ValueError("cuda only")
        return _ext.f(x)
'''),
    "early_return_then_pytorch": ("total", '''
class ModelNew(nn.Module):
    def forward(self, x):
        if x.is_contiguous():
            return _ext.f(x)
        return torch.nn.functional.linear(x, self.w)
'''),
    "module_alias_of_torch": ("partial", '''
import torch as th

class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.f(th.matmul(x, self.w))
'''),
    "assigned_alias": ("partial", '''
_mm = torch.mm

class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.f(_mm(x, self.w))
'''),
    "compile_imported_by_name": ("total", '''
from torch import compile as tc

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = tc(lambda t: t)

    def forward(self, x):
        return self.g(_ext.f(x))
'''),
    "stream_imported_by_name": ("total", '''
from torch.cuda import Stream, stream

class ModelNew(nn.Module):
    def forward(self, x):
        with stream(Stream()):
            y = _ext.f(x)
        return y
'''),
    "synchronize_patched_through_alias": ("total", '''
from torch import cuda as c

c.synchronize = lambda *a: None

class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.f(x)
'''),
    # rebinding a local name patches nothing
    "local_name_rebound": ("none", '''
from torch.cuda import synchronize

class ModelNew(nn.Module):
    def forward(self, x):
        synchronize = None
        return _ext.f(x)
'''),
    # an extension function handed to a pool is still the candidate's kernel being used
    "method_as_thread_target": ("total", '''
import threading

class ModelNew(nn.Module):
    def _run(self, x, out):
        _ext.f(x, out)

    def forward(self, x):
        out = torch.empty_like(x)
        threading.Thread(target=self._run, args=(x, out)).start()
        return out
'''),
    # outputs collected in a Python list and joined are the inputs' results, not constants
    "loop_append_then_stack": ("none", '''
class ModelNew(nn.Module):
    def forward(self, x):
        h = torch.zeros(4, 8, device="cuda")
        outs = []
        for t in range(x.size(0)):
            h = _ext.f(x[t], h)
            outs.append(h)
        return torch.stack(outs, dim=0)
'''),
    "comprehension_then_cat": ("none", '''
class ModelNew(nn.Module):
    def forward(self, x):
        parts = [_ext.f(c) for c in x.split(128)]
        return torch.cat(parts, dim=0)
'''),
    "while_extend_then_stack": ("none", '''
class ModelNew(nn.Module):
    def forward(self, x):
        outs, i = [], 0
        while i < x.size(0):
            outs.extend(_ext.f(x[i:i + 2]).unbind(0))
            i += 2
        return torch.stack(outs)
'''),
    "unpacked_state_in_a_loop": ("none", '''
class ModelNew(nn.Module):
    def forward(self, x):
        h, c = self.h0, self.c0
        hs = []
        for xt in x:
            h, c = _ext.f(xt, h, c)
            hs += [h]
        return torch.stack(hs), (h, c)
'''),
    # module state rebuilt on every call holds this call's results
    "state_list_reset_each_call": ("none", '''
class ModelNew(nn.Module):
    def forward(self, x):
        self.outs = []
        for xt in x.unbind(0):
            self.outs.append(_ext.f(xt))
        return torch.stack(self.outs)
'''),
    "constants_stacked": ("total", '''
class ModelNew(nn.Module):
    def forward(self, x):
        _ext.f(x)
        outs = []
        for t in range(x.size(0)):
            outs.append(torch.zeros(4, 8, device="cuda"))
        return torch.stack(outs, dim=0)
'''),
    # the comprehension walks the input but builds each element without it
    "constants_from_a_comprehension": ("total", '''
class ModelNew(nn.Module):
    def forward(self, x):
        _ext.f(x)
        return torch.cat([torch.zeros(4, 8, device="cuda") for c in x.chunk(4)])
'''),
    # unpacking pairs element by element: outs is the empty list, not the kernel's result
    "constants_list_unpacked_beside_a_result": ("total", '''
class ModelNew(nn.Module):
    def forward(self, x):
        outs, y = [], _ext.f(x)
        for t in range(3):
            outs.append(torch.zeros(4, 8, device="cuda"))
        return torch.cat(outs)
'''),
    "stacked_result_cached_on_self": ("total", '''
class ModelNew(nn.Module):
    def forward(self, x):
        if self.cache is None:
            outs = []
            for xt in x:
                outs.append(_ext.f(xt))
            self.cache = torch.stack(outs)
        return self.cache
'''),
    "list_on_self_filled_once": ("total", '''
class ModelNew(nn.Module):
    def forward(self, x):
        if not self.outs:
            for t in range(x.size(0)):
                self.outs.append(_ext.f(x[t]))
        return torch.stack(self.outs)
'''),
    # appended on every call, never emptied: the first call's result comes back forever
    "list_on_self_grows_across_calls": ("total", '''
class ModelNew(nn.Module):
    def forward(self, x):
        self.outs.append(_ext.f(x))
        return self.outs[0]
'''),
    "module_list_grows_across_calls": ("total", '''
_RESULTS = []

class ModelNew(nn.Module):
    def forward(self, x):
        _RESULTS.append(_ext.f(x))
        return torch.stack(_RESULTS[:1])
'''),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rule(name):
    expect, body = CASES[name]
    report = static_findings(HEAD + body)
    found = hacking_level(report.findings)
    assert found == expect, [(f.check, f.level, f.detail) for f in report.findings]


@pytest.mark.parametrize(("name", "check"), [
    ("constants_stacked", "constant_output"),
    ("constants_from_a_comprehension", "constant_output"),
    ("stacked_result_cached_on_self", "cached_output"),
    ("list_on_self_filled_once", "cached_output"),
    ("list_on_self_grows_across_calls", "cached_output"),
    ("module_list_grows_across_calls", "cached_output"),
])
def test_joined_lists_keep_their_finding(name, check):
    """The hacks among the list cases are caught as what they are, not by a side rule."""
    report = static_findings(HEAD + CASES[name][1])
    assert check in {f.check for f in report.findings if f.level == "total"}, \
        [(f.check, f.level, f.detail) for f in report.findings]


def test_thread_target_is_followed():
    """forward's callback is reachable: the kernels count as called, only the thread is the hack."""
    report = static_findings(HEAD + CASES["method_as_thread_target"][1])
    assert {f.check for f in report.findings if f.level == "total"} == {"threads"}


def test_alias_reported_with_its_name():
    report = static_findings(HEAD + CASES["assigned_alias"][1])
    assert report.torch_ops_in_forward == ["torch.mm (as _mm)"]


def test_own_binding_names_its_exported_functions():
    source = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = r"""
#include <torch/csrc/utils/pybind.h>
at::Tensor forward(at::Tensor x);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward, "doc"); m.def("setup", &setup); }
"""
CUDA = r"""
#include <ATen/core/Tensor.h>
__global__ void k(float* y) { y[threadIdx.x] = 1.0f; }
at::Tensor forward(at::Tensor x) { k<<<1, 32>>>(x.data_ptr<float>()); return x; }
"""
_ext = load_inline(name="x", cpp_sources=CPP, cuda_sources=CUDA, no_implicit_headers=True)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.forward(x.clone())
'''
    report = static_findings(source)
    assert report.exported == ["forward", "setup"]
    assert report.kernels == ["k"]


FACTORY = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline


def _compile_kernels():
    return load_inline(name="x", cpp_sources="", functions=["dense"])


_ext = _compile_kernels()


def _kernels():
    return _ext


class ModelNew(nn.Module):
    def forward(self, q, k, v):
        x = _ext.dense(q)
        y = _kernels().dense(F.scaled_dot_product_attention(x, k, v, is_causal=True))
        return y
'''


def test_extension_built_by_a_helper_is_the_candidates_own():
    """`_ext = _compile_kernels()` is a handle to the candidate's kernels: own kernels beside a
    library attention call are partial, never "kernels never called" (total)."""
    report = static_findings(FACTORY)
    assert hacking_level(report.findings) == "partial", [(f.check, f.level) for f in report.findings]
    assert {f.check for f in report.findings} == {"pytorch_compute"}
    assert report.torch_ops_in_forward == ["F.scaled_dot_product_attention"]  # _kernels().dense is not PyTorch


POOL = r'''
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <ATen/cuda/CUDAContext.h>
__global__ void k(float* y) { y[threadIdx.x] = 1.f; }
torch::Tensor f(torch::Tensor y) {
  at::cuda::CUDAStream side = at::cuda::getStreamFromPool(false, y.get_device());
  k<<<1, 32, 0, side.stream()>>>(y.data_ptr<float>());
  JOIN
  return y;
}
"""
_ext = load_inline(name="x", cpp_sources="", cuda_sources=SRC, functions=["f"])


class ModelNew(nn.Module):
    def forward(self, y):
        return _ext.f(y)
'''


@pytest.mark.parametrize(("join", "expect"), [
    ("", "total"),  # a pool stream is non-blocking: unjoined, the kernel escapes the caller's stream
    ("at::cuda::CUDAEvent done; done.record(side); done.block(at::cuda::getCurrentCUDAStream());", "none"),
    ("side.synchronize();", "none"),
])
def test_cpp_pool_stream_must_be_joined(join, expect):
    report = static_findings(POOL.replace("JOIN", join))
    assert hacking_level(report.findings) == expect, [(f.check, f.level, f.detail) for f in report.findings]


BLOCKS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

_ext = load_inline(name="x", cpp_sources="", functions=["dense"])


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, d))

    def forward(self, x):
        h = _ext.dense(x, self.w)
        return F.scaled_dot_product_attention(h, h, h, is_causal=True)


class ModelNew(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x
'''


def test_own_blocks_called_in_a_loop_are_followed():
    """Blocks of the candidate's own held in an nn.ModuleList are called through a loop: their
    kernels count as called (partial for the attention left in PyTorch, not "never called")."""
    report = static_findings(BLOCKS)
    assert hacking_level(report.findings) == "partial", [(f.check, f.level) for f in report.findings]
    assert {f.check for f in report.findings} == {"pytorch_compute"}


def test_a_kernel_launched_through_cuda_launch_kernel_ex_counts_as_launched():
    """cudaLaunchKernelEx names its kernel second, after the launch's configuration (a recurrent
    stack's wavefront kernel is launched so)."""
    source = '''
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA = r"""
#include <ATen/core/Tensor.h>
__global__ void k_steps(float* y) { y[threadIdx.x] = 1.0f; }
__global__ void k_unused(float* y) { y[threadIdx.x] = 2.0f; }
at::Tensor forward(at::Tensor x) {
  cudaLaunchConfig_t cfg = {};
  float* p = x.data_ptr<float>();
  cudaLaunchKernelEx(&cfg, k_steps, p);
  return x;
}
"""
_ext = load_inline(name="x", cpp_sources="at::Tensor forward(at::Tensor x);", cuda_sources=CUDA,
                   functions=["forward"], no_implicit_headers=True)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.forward(x)
'''
    never = [f.detail for f in static_findings(source).findings if f.check == "kernel_never_launched"]
    assert never == ["kernels defined but never launched: k_unused"]
