"""Reads the consuming kernel makes itself instead of a kernel laying them out first: BERT's
embedding lookups summed before its first norm are gathered inside the norm's row kernel."""

from __future__ import annotations

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from tests.test_offline_codegen import simulate, task_from

EMBEDDINGS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, vocab=50, width=32, positions=16):
        super().__init__()
        self.words = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(positions, width)
        self.norm = nn.LayerNorm(width)
        self.register_buffer("position_ids", torch.arange(positions)[None, :])

    def forward(self, ids):
        embedded = self.words(ids) + self.positions(self.position_ids[:, : ids.shape[1]])
        return self.norm(embedded)


def get_inputs():
    return [torch.randint(0, 50, (3, 12))]


def get_init_inputs():
    return []
'''


def test_embedding_lookups_are_read_in_the_norms_row_kernel():
    compiled = compile_task(task_from("embeddings", EMBEDDINGS))
    (norm,) = [g for g in compiled.groups if g.kind == "row_reduce"]
    ops = {n.op for n in compiled.graph.nodes if n.name in set(norm.nodes)}
    assert {"aten.embedding", "aten.layer_norm"} <= ops
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions())
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5
