"""The one-launch recurrent layer (templates/kernels/recurrence.cu.j2): every step of both
directions, or of a stack of layers as a wavefront, its blocks meeting at the group barriers, run on the CPU through the CUDA emulation
(tests/fixtures/cuda_on_cpu/: every block at once, warps exchanging through __shfl_xor_sync) and
held to a float64 numpy recurrence for each cell, gate layout, initial state and W_hh placement,
on sizes that leave the last block short of units."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stitchcuda.compiler.lowering.cuda_files import TEMPLATES
from stitchcuda.compiler.lowering.sequence_kernel import (
    plan_recurrence,
    recurrence_kernel,
)
from tests.cuda_on_cpu import run_on_cpu

T, B, H, UNITS, BLOCK = 5, 3, 40, 8, 64  # 5 blocks a direction, the last with 8 of 8 units; 2 warps a block
GATES = {"lstm": 4, "gru": 3, "tanh": 1, "relu": 1}


@dataclasses.dataclass(frozen=True)
class Case:
    cell: str
    dirs: int
    time_major: bool
    h0_given: bool  # else a constant initial state
    w_place: str
    bias: bool = True
    hidden: int = H
    layers: int = 1  # more than one: a wavefront (one direction)
    direction: int = 0  # the reference's: set per direction

    @property
    def gates(self) -> int:
        return GATES[self.cell]


CASES = [
    Case("lstm", 2, True, True, "registers"),
    Case("lstm", 1, False, False, "global"),
    Case("gru", 2, False, True, "shared", hidden=37),  # 5 blocks of 8 units, the last with 5
    Case("gru", 1, True, False, "registers", bias=False, hidden=37),
    Case("tanh", 2, True, False, "shared"),
    Case("relu", 1, False, True, "global"),
    Case("lstm", 1, False, True, "registers", layers=3),  # a wavefront: each layer a step behind
    Case("tanh", 1, True, False, "registers", layers=2, hidden=37),
    Case("gru", 1, False, False, "registers", layers=2, bias=False),
]

CALL = r"""
  {
    const int groups = %(groups)d, G = %(G)d, H = %(H)d;
    std::vector<std::vector<float>> gi(groups), w(groups), wi(groups), bi(groups), bh(groups), h0(groups), c0(groups),
        hs(groups), cs(groups);
    %(name)s_args p = {};
    for (int g = 0; g < groups; ++g) {
      const std::string at = dir + "/%(name)s_" + std::to_string(g) + "_";
      gi[g] = get(at + "gi"); w[g] = get(at + "w"); wi[g] = get(at + "wi"); bi[g] = get(at + "bi");
      bh[g] = get(at + "bh"); h0[g] = get(at + "h0"); c0[g] = get(at + "c0");
      hs[g].assign((%(T)d + 2) * %(B)d * H, -7.f); cs[g].assign((%(T)d + 2) * %(B)d * H, -7.f);
      p.gi[g] = gi[g].data(); p.w[g] = w[g].data(); p.wi[g] = wi[g].data(); p.bi[g] = bi[g].data();
      p.bh[g] = bh[g].data(); p.h0[g] = h0[g].data(); p.c0[g] = c0[g].data(); p.hs[g] = hs[g].data();
      p.cs[g] = cs[g].data();
    }
    std::vector<unsigned> sync(groups, 0);
    p.sync = sync.data();
    launch_cooperative(groups * %(blocks)d, %(block)d, %(shared)d, [&] { %(name)s(p); });
    for (int g = 0; g < groups; ++g) {
      put(dir + "/%(name)s_" + std::to_string(g) + "_hs", hs[g]);
      put(dir + "/%(name)s_" + std::to_string(g) + "_cs", cs[g]);
    }
  }
"""

MAIN_HEAD = r"""
#include <cstdio>
std::string dir;
std::vector<float> get(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  std::vector<float> v;
  float x;
  while (std::fread(&x, 4, 1, f) == 1) v.push_back(x);
  std::fclose(f);
  return v;
}
void put(const std::string& path, const std::vector<float>& v) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(v.data(), 4, v.size(), f);
  std::fclose(f);
}
int main(int, char** argv) {
  dir = argv[1];
"""


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _reference(case: Case, gi, w, bi, bh, h0, c0):
    """A direction's h (and c) after every step, indexed by time: [T, B, H]; ``gi``: x.W_ihᵀ, [T, B, G H]."""
    Hh = case.hidden
    hs, cs = np.zeros((T, B, Hh)), np.zeros((T, B, Hh))
    h, c = h0.astype(np.float64), c0.astype(np.float64)
    for s in range(T):
        t = s if case.direction == 0 else T - 1 - s
        x = gi[t] + bi
        g = h @ w.T.astype(np.float64) + bh
        if case.cell == "lstm":
            i, f, gg, o = (x[:, k * Hh:(k + 1) * Hh] + g[:, k * Hh:(k + 1) * Hh] for k in range(4))
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(gg)
            h = _sigmoid(o) * np.tanh(c)
        elif case.cell == "gru":
            r = _sigmoid(x[:, :Hh] + g[:, :Hh])
            z = _sigmoid(x[:, Hh:2 * Hh] + g[:, Hh:2 * Hh])
            n = np.tanh(x[:, 2 * Hh:] + r * g[:, 2 * Hh:])
            h = (1 - z) * n + z * h
        else:
            pre = x + g
            h = np.tanh(pre) if case.cell == "tanh" else np.maximum(pre, 0)
        hs[t], cs[t] = h, c
    return hs, cs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("recurrence")
    rng = np.random.default_rng(0)
    kernels, calls, expected = [], [], {}
    for n, case in enumerate(CASES):
        G, Hh = case.gates, case.hidden
        plan = plan_recurrence(B, Hh, G, case.dirs, sms=132, units=UNITS, block=BLOCK, w_place=case.w_place,
                               layers=case.layers)
        assert plan is not None and plan.w_place == case.w_place
        name = f"k_case{n}"
        gi_step, gi_row = (B * G * Hh, G * Hh) if case.time_major else (G * Hh, T * G * Hh)
        h0_value = None if case.h0_given else 0.25
        kernels.append(recurrence_kernel(name, plan, case.cell, T, B, Hh, G, case.dirs, gi_step, gi_row, case.bias,
                                         (h0_value, Hh, 1), (None if case.h0_given else -0.5, Hh, 1),
                                         layers=case.layers))
        calls.append(CALL % {"name": name, "groups": case.layers * case.dirs, "G": G, "H": Hh, "T": T, "B": B,
                             "blocks": plan.blocks, "block": BLOCK, "shared": plan.shared_bytes})
        below = None
        for g in range(case.layers * case.dirs):
            layer, d = divmod(g, case.dirs)
            w, wi = (rng.standard_normal((2, G * Hh, Hh)) / np.sqrt(Hh)).astype(np.float32)
            if layer == 0:
                gi = rng.standard_normal((T, B, G * Hh)).astype(np.float32)
            else:  # the layer below's h, through this layer's W_ih
                gi = below @ wi.T.astype(np.float64)
            flat = gi.reshape(-1) if case.time_major else gi.transpose(1, 0, 2).reshape(-1)
            bi, bh = (rng.standard_normal((2, G * Hh)) * 0.1 * case.bias).astype(np.float32)
            h0, c0 = rng.standard_normal((2, B, Hh)).astype(np.float32)
            if not case.h0_given:
                h0, c0 = np.full((B, Hh), 0.25, np.float32), np.full((B, Hh), -0.5, np.float32)
            for key, value in {"gi": flat, "w": w, "wi": wi, "bi": bi, "bh": bh, "h0": h0, "c0": c0}.items():
                value.astype(np.float32).tofile(root / f"{name}_{g}_{key}")
            expected[(n, g)] = _reference(dataclasses.replace(case, direction=d), gi, w, bi, bh, h0, c0)
            below = expected[(n, g)][0]
    run_on_cpu(root, (TEMPLATES / "prelude.cu.j2").read_text(), *kernels, MAIN_HEAD, *calls, "}\n")
    return root, expected


@pytest.mark.parametrize("n", range(len(CASES)), ids=[f"{c.cell}-{c.layers}x{c.dirs}dir-{'tm' if c.time_major else 'bm'}-"
                                                        f"{'h0' if c.h0_given else 'const'}-"
                                                        f"{c.w_place}" for c in CASES])
def test_every_step_of_a_layer_in_one_launch_matches_the_recurrence(runs, n):
    root, expected = runs
    case = CASES[n]
    Hh = case.hidden
    for g in range(case.layers * case.dirs):
        hs = np.fromfile(root / f"k_case{n}_{g}_hs", np.float32).reshape(T + 2, B, Hh)
        cs = np.fromfile(root / f"k_case{n}_{g}_cs", np.float32).reshape(T + 2, B, Hh)
        want_h, want_c = expected[(n, g)]
        np.testing.assert_allclose(hs[1:T + 1], want_h, rtol=0, atol=2e-5)  # row t + 1 holds time t
        if case.cell == "lstm":
            np.testing.assert_allclose(cs[1:T + 1], want_c, rtol=0, atol=2e-5)
        untouched = [0, T + 1]
        assert (hs[untouched] == -7.0).all(), "a step wrote outside its row"
