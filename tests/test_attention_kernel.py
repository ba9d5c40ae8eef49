"""Attention as one kernel (lowering/attention_kernel.py, templates/kernels/attention.cu.j2): which
groups take it, that the record it lowers to computes the reference model (CPU simulation), and
that the kernel's CUDA computes the record (run on the CPU through the CUDA emulation, on the
buffers the simulation reached it with), over heads of 16 to 80, masks that blank whole rows, a
shifted-window mask added through a view of the scores, repeated key and value heads and outputs
written through strides."""

from __future__ import annotations

import re

import numpy as np
import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from stitchcuda.compiler.emit.emit import Emitter
from stitchcuda.compiler.lowering.cuda_files import TEMPLATES
from stitchcuda.compiler.lowering.lower import lower
from tests.cuda_on_cpu import run_on_cpu
from tests.test_offline_codegen import assert_program_compiles, simulate, simulate_attention, task_from

FUSED = CodegenOptions(fused_attention=True)

HEAD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
'''
TAIL = '''

def get_init_inputs():
    return []
'''

MODELS = {
    # nn.MultiheadAttention as users write it: heads of 16 read out of its in-projection
    "mha": HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x):
        return self.net(x, x, x, need_weights=False)[0]


def get_inputs():
    return [torch.randn(2, 70, 64)]
''' + TAIL,
    # a boolean mask that blanks whole rows: _safe_softmax gives them 0
    "masked": HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(128, 384)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, 64).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, 128)


def get_inputs():
    mask = torch.rand(2, 1, 40, 40) > 0.3
    mask[:, :, :3] = False
    return [torch.randn(2, 40, 128), mask]
''' + TAIL,
    # causal, heads of 80: the widest tile, sequences not a multiple of it
    "causal_wide": HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(160, 160)
        self.kv = nn.Linear(160, 320)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 2, 80).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, 2, 80).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    return [torch.randn(2, 70, 160)]
''' + TAIL,
    # repeated key and value heads (grouped-query attention), an additive bias, plain softmax
    "gqa": HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(64, 128)
        self.kv = nn.Linear(64, 128)
        self.bias = nn.Parameter(torch.randn(1, 1, 75, 75))

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 4, 32).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, 2, 32).permute(2, 0, 3, 1, 4)
        k = k[:, :, None].expand(b, 2, 2, s, 32).reshape(b, 4, s, 32)
        v = v[:, :, None].expand(b, 2, 2, s, 32).reshape(b, 4, s, 32)
        att = torch.softmax(q @ k.transpose(-2, -1) * 32 ** -0.5 + self.bias, dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, s, 128)


def get_inputs():
    return [torch.randn(3, 75, 64)]
''' + TAIL,
    # shifted windows: a mask per window added through a view that splits the batch of windows
    "shifted_windows": HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.bias = nn.Parameter(torch.randn(1, 2, 16, 16))
        mask = torch.zeros(4, 16, 16)
        mask[1:, :8, 8:] = -100.0
        mask[1:, 8:, :8] = -100.0
        self.register_buffer("mask", mask)

    def forward(self, x):
        bw, n, c = x.shape
        q, k, v = self.qkv(x).view(bw, n, 3, 2, 16).permute(2, 0, 3, 1, 4)
        att = (q * 16 ** -0.5) @ k.transpose(-2, -1) + self.bias
        att = att.view(bw // 4, 4, 2, n, n) + self.mask[None, :, None]
        att = torch.softmax(att.view(-1, 2, n, n), dim=-1)
        return (att @ v).transpose(1, 2).reshape(bw, n, c)


def get_inputs():
    return [torch.randn(8, 16, 32)]
''' + TAIL,
    # values wider than the keys, a division for the scale, the output left head-major
    "wide_values": HEAD + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qk = nn.Linear(48, 96)
        self.v = nn.Linear(48, 80)

    def forward(self, x):
        b, s, _ = x.shape
        q, k = self.qk(x).view(b, s, 2, 2, 24).permute(2, 0, 3, 1, 4)
        v = self.v(x).view(b, s, 2, 40).transpose(1, 2)
        att = torch.softmax((q @ k.transpose(-2, -1)) / 24 ** 0.5, dim=-1)
        return att @ v


def get_inputs():
    return [torch.randn(2, 19, 48)]
''' + TAIL,
}


@pytest.fixture(scope="module")
def compiled():
    return {name: compile_task(task_from(f"attention_{name}", source)) for name, source in MODELS.items()}


@pytest.fixture(scope="module")
def runs(compiled, tmp_path_factory):
    """Each model simulated with the one kernel emulated from its record; each kernel the program
    emits then run on the CPU on the buffers it met there, its output beside the record's."""
    root = tmp_path_factory.mktemp("attention")
    results, kernels, calls, met = {}, [], [], []
    for name, c in compiled.items():
        def record(rec, low, flat, name=name):
            before = {ident: t.clone() for ident, t in flat.items()}
            simulate_attention(rec, low, flat)
            met.append((name, rec, low, before, flat[low.storage[rec.out.value]].clone()))

        results[name] = simulate(c.task, c.graph, c.groups, FUSED, train=True, attention=record)
    for n, (_, rec, low, flat, _) in enumerate(met):
        kernel = Emitter(low, FUSED, f"m{n}").attention(rec)
        kernels.append(f"namespace m{n} {{\n{kernel.source}}}\n")  # kernel names repeat across models
        loads, args = [], []
        for k, decl in enumerate(kernel.params):
            ctype, ident = re.match(r"(?:const )?(\w+)\* __restrict__ (\w+)", decl).groups()
            flat[ident].numpy().tofile(root / f"{n}_{ident}")
            loads.append(f'  auto p{k} = load(root + "/{n}_{ident}");')
            args.append(f"reinterpret_cast<{'' if k == len(kernel.params) - 1 else 'const '}{ctype}*>(p{k}.data())")
        grid, block, shared = (int(x) for x in re.search(r"<<<(\d+), (\d+), (\d+),", kernel.launch).groups())
        calls.append("  {\n" + "\n".join(loads) + f"\n  launch_shared({grid}, {block}, {shared}, [&] {{ m{n}::{rec.name}("
                     + ", ".join(args) + f"); }});\n  save(root + \"/{n}_out\", p{len(args) - 1});\n  }}")
    main = '''#include <fstream>
#include <iterator>
static std::vector<unsigned char> load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}
static void save(const std::string& path, const std::vector<unsigned char>& data) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), data.size());
}
int main(int, char** argv) {
  const std::string root = argv[1];
'''
    run_on_cpu(root, (TEMPLATES / "prelude.cu.j2").read_text(), *kernels, main, *calls, "}\n")
    ran = [(name, rec, np.fromfile(root / f"{n}_out", dtype=np.float32), want.numpy())
           for n, (name, rec, _, _, want) in enumerate(met)]
    return results, ran


def test_every_attention_takes_one_kernel_where_asked(compiled):
    for name, c in compiled.items():
        low = lower(c.graph, c.groups, FUSED)
        fused = [lg for lg in low.groups if lg.attention is not None]
        assert len(fused) == 1, name
        assert not [lg for lg in lower(c.graph, c.groups, CodegenOptions()).groups if lg.attention is not None]
        source = c.program(FUSED)
        assert source.count("_attention<<<") == 1, name
    tiles = {name: lower(c.graph, c.groups, FUSED) for name, c in compiled.items()}
    widths = {name: next(lg.attention for lg in low.groups if lg.attention is not None).tile.bk
              for name, low in tiles.items()}
    assert widths == {"mha": 64, "masked": 32, "causal_wide": 16, "gqa": 64, "shifted_windows": 64, "wide_values": 32}
    # the windows' mask is read over [images, windows, heads], the batch the scores are viewed through
    windows = next(lg.attention for lg in tiles["shifted_windows"].groups if lg.attention is not None)
    assert windows.shape == (2, 4, 2, 16, 16)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_one_kernel_record_computes_the_model(runs, name):
    got, expected = runs[0][name]
    for g, e in zip(got, expected, strict=True):
        e = e.float()
        assert ((g - e).abs().max() / e.abs().max()).item() < 1e-5, name


def test_the_safe_softmax_blanks_the_rows_with_every_key_masked(runs):
    got, _ = runs[0]["masked"]
    assert got[0][:, :3].abs().max().item() == 0.0  # heads of queries 0..2: no key left


@pytest.mark.parametrize("name", list(MODELS))
def test_the_kernel_computes_its_record_on_the_cpu(runs, name):
    ran = [(rec, out, want) for model, rec, out, want in runs[1] if model == name]
    assert ran, name
    for rec, out, want in ran:
        written = ~np.isnan(want)
        assert written.any() and not np.isnan(out[written]).any(), name
        scale = np.abs(want[written]).max()
        assert np.abs(out[written] - want[written]).max() / scale < 1e-5, (name, rec.tile)


def test_a_head_wider_than_the_widest_tile_keeps_the_products():
    source = MODELS["wide_values"].replace("self.v = nn.Linear(48, 80)", "self.v = nn.Linear(48, 272)") \
        .replace("view(b, s, 2, 40)", "view(b, s, 2, 136)")
    c = compile_task(task_from("attention_too_wide", source))
    low = lower(c.graph, c.groups, FUSED)
    assert not [lg for lg in low.groups if lg.attention is not None]
    got, expected = simulate(c.task, c.graph, c.groups, FUSED)
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


@pytest.mark.nvcc
def test_programs_with_one_attention_kernel_compile(compiled, tmp_path):
    assert_program_compiles(compiled["masked"].program(FUSED), tmp_path)


@pytest.mark.gpu
def test_the_one_kernel_follows_float64_on_the_gpu(compiled, tmp_path):
    """Each model's program with the one kernel and without: both within 1e-5 of the float64
    reference (relative to its largest output) call after call, and their times printed."""
    from tests.test_gpu import _option_off_and_on

    for name, c in compiled.items():
        (tmp_path / name).mkdir()
        times = _option_off_and_on(c, "fused_attention", tmp_path / name)
        print(f"{name}: products {times[False]:.4f} ms, one kernel {times[True]:.4f} ms")
