"""The graph simplifications made after capture (schedule/simplify.py) and the safe softmax kept
whole: each program still computes its reference (run on the CPU through the IR evaluator and an
emulation of the library calls), with fewer nodes left to launch."""

from __future__ import annotations

from pathlib import Path

import torch

from stitchcuda.compiler.capture.graph import MAX_CONSTANT, capture
from stitchcuda.compiler.emit.program import _tensor_source
from stitchcuda.compiler.schedule.fusion import fuse
from stitchcuda.compiler.schedule.roles import op_role
from stitchcuda.compiler.schedule.simplify import drop_identity_clones, fold_constants, simplify
from tests.test_offline_codegen import simulate, task_from

MASKED_ATTENTION = (Path(__file__).parent / "fixtures" / "compiler_classes" / "masked_rows_attention.py").read_text()


def _ops(graph):
    return [n.op for n in graph.nodes]


def test_a_masked_attention_keeps_its_safe_softmax_whole_and_a_fully_masked_query_gives_zeros():
    task = task_from("masked_attention", MASKED_ATTENTION)
    graph = capture(task)
    assert "aten._safe_softmax" in _ops(graph)
    assert "aten.any" not in _ops(graph) and "aten.full_like" not in _ops(graph)
    simple = simplify(graph)
    assert "aten.arange" not in _ops(simple), "input-independent index math is folded into constants"
    assert any(p.kind == "constant" for p in simple.placeholders)
    got, expected = simulate(task, simple, fuse(simple))
    assert not torch.isnan(expected[0]).any()
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)


DROPOUT_AND_COPIES = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.1)
        self.eval()  # as a user runs it for inference: the dropout is a clone

    def forward(self, x):
        y = self.drop(self.fc(x))          # eval-mode dropout: a clone of a dense value
        z = y.transpose(0, 1).contiguous()  # a clone of a view: a real copy
        w = y.expand(4, 16) * 2.0           # expand to its own shape: the value itself
        return z, w + 1.0, y.clone()        # a returned clone stays

def get_inputs():
    return [torch.randn(4, 16)]

def get_init_inputs():
    return []
'''


def test_clones_of_dense_values_and_same_shape_views_go_and_real_copies_stay():
    task = task_from("copies", DROPOUT_AND_COPIES)
    graph = capture(task)
    clones = [n for n in graph.nodes if n.op == "aten.clone"]
    simple = drop_identity_clones(graph)
    left = [n for n in simple.nodes if n.op == "aten.clone"]
    assert len(left) == 2 < len(clones), "the transposed copy and the returned clone stay, the dropout goes"
    assert "aten.expand" not in _ops(simple)
    assert set(simple.outputs) == set(graph.outputs)
    got, expected = simulate(task, simple, fuse(simple))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)



STRIDED_CLONES = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.out = nn.Linear(16, 16)
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.eval()

    def forward(self, x):
        h = self.fc(x)
        added = h.transpose(0, 1).contiguous() + 1.0  # a copy only an add reads: the add reads the view
        projected = self.out(h.transpose(0, 1).contiguous())  # a copy a product reads: stays
        doubled = h.transpose(1, 2).contiguous() * 2.0  # its rows transposed: stays, a tiled copy
        return torch.relu(added), projected, self.layer(x), doubled

def get_inputs():
    return [torch.randn(4, 6, 16)]

def get_init_inputs():
    return []
'''


def test_a_copy_of_a_strided_view_that_elementwise_operators_alone_read_goes():
    task = task_from("strided_clones", STRIDED_CLONES)
    graph = capture(task)
    simple = drop_identity_clones(graph)
    users = simple.users()
    left = [n for n in simple.nodes if n.op == "aten.clone"]
    assert len(left) < len([n for n in graph.nodes if n.op == "aten.clone"])
    # every copy left is read by something other than elementwise operators (a product, a view),
    # but for the one whose last dim is transposed
    read_elementwise = [n for n in left if all(op_role(simple.node(r)) == "elementwise" for r in users[n.name])]
    assert [n.out[0].shape for n in read_elementwise] == [[4, 16, 6]]
    assert any(simple.node(r).op == "aten.linear" for n in left for r in users[n.name])
    final = simplify(graph)
    got, expected = simulate(task, final, fuse(final))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)

UNFOLD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):  # convolutions as F.unfold and a product: padded, then not
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(8, 36) / 6)
        self.w2 = nn.Parameter(torch.randn(8, 32) / 6)

    def forward(self, x):
        y = (self.w1 @ F.unfold(x, 3, padding=1)).view(2, 8, 10, 10).relu()
        return self.w2 @ F.unfold(y, 2, stride=2)

def get_inputs():
    return [torch.randn(2, 4, 10, 10)]

def get_init_inputs():
    return []
'''


def test_a_pad_by_nothing_goes_and_a_real_pad_stays():
    task = task_from("unfold_pads", UNFOLD)
    graph = capture(task)
    pads = [n for n in graph.nodes if n.op in ("aten.pad", "aten.constant_pad_nd")]
    assert [n.args[1] for n in pads] == [[1, 1, 1, 1], [0, 0, 0, 0]]
    final = simplify(graph)
    assert [n.args[1] for n in final.nodes if n.op in ("aten.pad", "aten.constant_pad_nd")] == [[1, 1, 1, 1]]
    got, expected = simulate(task, final, fuse(final))
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)


CONSTANTS = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        n = x.shape[-1]
        small = (torch.arange(n, device=x.device) % 3 == 0).float() * float("-inf")
        big = torch.ones(200, 200, device=x.device).triu()
        return x + torch.nan_to_num(small, neginf=-1.0), big.sum() + x.sum()

def get_inputs():
    return [torch.randn(4, 64)]

def get_init_inputs():
    return []
'''


def test_values_of_no_input_are_folded_up_to_the_constant_size_and_rendered_as_python():
    task = task_from("constants", CONSTANTS)
    graph = capture(task)
    folded = fold_constants(graph)
    made = [p for p in folded.placeholders if p.kind == "constant" and p.target.startswith("_folded_")]
    assert made and all(p.meta.numel <= MAX_CONSTANT for p in made)
    assert any(n.op in ("aten.ones", "aten.full", "aten.triu") for n in folded.nodes), \
        "a 40000-element constant is computed by the program, not written into it"
    got, expected = simulate(task, folded, fuse(folded))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-5)
    assert _tensor_source([[1.0, 1.0], [1.0, 1.0]], [2, 2], "float32") == "torch.full([2, 2], 1.0, dtype=torch.float32)"
    assert _tensor_source([float("-inf"), 0.0], [2], "float32") == \
        "torch.tensor([float('-inf'), 0.0], dtype=torch.float32)"


INDEX_RANGES = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fused = nn.Linear(16, 6 * 8)

    def forward(self, x):  # multi-query heads picked out of a fused projection, as Falcon does
        b, s, _ = x.shape
        heads = self.fused(x).view(b, s, 6, 8)
        q = heads[:, :, :-2]
        k = heads[:, :, torch.tensor([-2])]
        v = heads[:, :, torch.tensor([0, 2, 4])]  # every other head: a slice with a step
        shuffled = heads[:, :, torch.tensor([3, 1])]  # not a run: stays a gather
        # the whole of x, indexed as HF's mask making does: a view with a size-1 dim between
        whole = x[torch.arange(b)[:, None, None], torch.arange(s)[None, None, :]]
        out = torch.tanh(q @ k.transpose(-1, -2)) @ v[:, :, :1] + shuffled.sum(-2, keepdim=True)
        return out + whole.transpose(1, 2)[..., :8]


def get_inputs():
    return [torch.randn(2, 5, 16)]


def get_init_inputs():
    return []
'''


def test_an_index_by_a_constant_run_of_positions_is_a_slice():
    from stitchcuda.compiler import compile_task

    task = task_from("index_ranges", INDEX_RANGES)
    assert _ops(capture(task)).count("aten.index") == 4
    compiled = compile_task(task)
    assert _ops(compiled.graph).count("aten.index") == 1  # the shuffle
    steps = [n.args[2:] for n in compiled.graph.nodes if n.op == "aten.slice" and n.args[1] == 2]
    assert [4, 5, 1] in steps and [0, 5, 2] in steps
    got, expected = simulate(task, compiled.graph, compiled.groups)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


NEGATED_PIECES = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        turned = torch.cat([-x[:, 2:], x[:, :2], -y], 1)  # along a middle dim, two pieces negated
        kept = -y  # a negation read elsewhere too stays
        return torch.sin(turned) * 2.0, torch.cat([kept, x[:, :1]], 1) + kept.sum()


def get_inputs():
    return [torch.randn(2, 5, 3), torch.randn(2, 1, 3)]


def get_init_inputs():
    return []
'''


def test_negated_pieces_of_a_concatenation_are_a_constant_sign():
    from stitchcuda.compiler import compile_task

    task = task_from("negated_pieces", NEGATED_PIECES)
    compiled = compile_task(task)
    signs = [p for p in compiled.graph.placeholders if p.name.startswith("_signs_")]
    assert len(signs) == 1 and signs[0].meta.shape == [6, 1]
    assert compiled.graph.constants[signs[0].target] == [[-1.0]] * 3 + [[1.0]] * 2 + [[-1.0]]
    assert _ops(compiled.graph).count("aten.neg") == 1  # the one read twice
    got, expected = simulate(task, compiled.graph, compiled.groups)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-6)


GELU_WRITTEN_OUT = '''
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x):
        h = self.fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        y = self.out(h)  # the other order of every product and sum
        return (torch.tanh((0.044715 * torch.pow(y, 3.0) + y) * math.sqrt(2.0 / math.pi)) + 1.0) * (y * 0.5)


def get_inputs():
    return [torch.randn(3, 7, 16)]


def get_init_inputs():
    return []
'''


def test_gelus_tanh_formula_is_the_operator_a_products_epilogue_takes():
    from stitchcuda.compiler import compile_task

    task = task_from("gelu_written_out", GELU_WRITTEN_OUT)
    compiled = compile_task(task)
    gelus = [n for n in compiled.graph.nodes if n.op == "aten.gelu"]
    assert len(gelus) == 2 and all(n.kwargs == {"approximate": "tanh"} for n in gelus)
    assert not {"aten.tanh", "aten.pow"} & set(_ops(compiled.graph))
    assert all(g.kind == "gemm" for g in compiled.groups if any(n in g.nodes for n in (x.name for x in gelus)))
    got, expected = simulate(task, compiled.graph, compiled.groups)
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)


CHANNEL_SHUFFLES = '''
import torch
import torch.nn as nn


def shuffle(x, groups):
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


class Unit(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.branch = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                    nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        kept, worked = x.chunk(2, dim=1)
        return shuffle(torch.cat([kept, self.branch(worked)], 1), 2)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.units = nn.Sequential(Unit(6), Unit(6), Unit(6))
        self.mix = nn.Conv2d(12, 12, 1)

    def forward(self, x, y, z):
        three = shuffle(torch.cat([y, z, y * 2.0], 1), 3)  # three pieces, read whole
        odd = shuffle(torch.cat([y, z], 1), 2)  # sliced at an odd channel too: the whole shuffle is laid out
        tail = shuffle(torch.cat([z, y], 1), 2)  # sliced to its end (an open slice)
        return (self.units(shuffle(torch.cat([x, x * 0.5], 1), 2)), torch.relu(self.mix(three)),
                odd[:, 4:] + 1.0, odd[:, 3:7] * 2.0, tail[:, 2:] - 1.0)


def get_inputs():
    return [torch.randn(2, 6, 5, 5), torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5)]


def get_init_inputs():
    return []
'''


def test_a_channel_shuffle_is_concatenations_of_the_pieces():
    """ShuffleNet's channel shuffle (cat, view, transpose, contiguous, view) then chunk: each half is
    a concatenation of the pieces' halves, read where they are; a shuffle read whole, one
    concatenation of the permuted pieces. Nothing is lowered on its own (it was: the shuffle's
    permute of the concatenation and the convolution over a strided half did not lower)."""
    from stitchcuda.compiler import compile_task

    task = task_from("channel_shuffles", CHANNEL_SHUFFLES)
    compiled = compile_task(task)
    assert not compiled.isolated
    ops = _ops(compiled.graph)
    assert "aten.clone" not in ops and "aten.transpose" not in ops
    got, expected = simulate(task, compiled.graph, compiled.groups, train=True)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
