"""Repeated host launches folded into loops (compiler/emit/loops.py): unrolled again, a folded
program's host code is the unfolded program's, statement for statement."""

from __future__ import annotations

import re

import pytest

from stitchcuda.compiler.emit import loops
from stitchcuda.compiler.emit.loops import fold_repeats
from stitchcuda.task.record import Task

_LOOP = re.compile(r"for \(int64_t (sc_rep\d+) = 0; \1 < (\d+); \+\+\1\) \{")


def unfold(text: str) -> list[str]:
    """The code lines of ``text`` with every folded loop written out again (comments dropped,
    whitespace stripped)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("//")]
    out: list[str] = []
    i = 0
    while i < len(lines):
        found = _LOOP.fullmatch(lines[i])
        if not found:
            out.append(lines[i])
            i += 1
            continue
        var, count = found[1], int(found[2])
        depth, j = 1, i + 1
        while depth:  # the loop's closing brace
            depth += lines[j].count("{") - lines[j].count("}")
            j += 1
        body = "\n".join(lines[i + 1:j - 1])
        for k in range(count):
            value = re.sub(rf"\((-?\d+) ([+-]) (\d+) \* {var}\)",
                           lambda m, k=k: str(int(m[1]) + (1 if m[2] == "+" else -1) * int(m[3]) * k), body)
            out.extend(unfold(value))
        i = j
    return out


def test_a_run_of_statements_alike_but_for_affine_offsets_becomes_a_loop():
    steps = [f"launch<<<4, 256, 0, stream>>>(a.h_0 + {1024 * t}, a.w, a.g_1 + {4096 - 512 * t});" for t in range(1, 9)]
    blocks = ["// head", "setup(a.x, 7);", *steps, "finish(a.y);"]
    folded = fold_repeats(blocks)
    assert len(folded) == 4 and "for (int64_t sc_rep0 = 0; sc_rep0 < 8; ++sc_rep0)" in folded[2]
    assert "(1024 + 1024 * sc_rep0)" in folded[2] and "(3584 - 512 * sc_rep0)" in folded[2]
    assert "g_1" in folded[2] and "h_0" in folded[2]  # digits inside names are never offsets
    assert unfold("\n".join(folded)) == unfold("\n".join(blocks))

    pairs = [x for t in range(5) for x in (f"gemm(a.h + {64 * t}, 64);", f"gates(a.gi + {256 * t}, a.h + {64 * t + 64});")]
    folded = fold_repeats(["first(a.h);", *pairs])
    assert len(folded) == 2 and "the 2 launches above, 5 times" in folded[1]
    assert unfold("\n".join(folded)) == unfold("\n".join(["first(a.h);", *pairs]))


def test_what_does_not_repeat_affinely_is_left_alone():
    short = ["k(a.x + 0);", "k(a.x + 8);"]  # two: below MIN_REPEATS
    assert fold_repeats(short) == short
    ragged = ["k(a.x + 0);", "k(a.x + 8);", "k(a.x + 24);", "k(a.x + 32);"]  # strides 8, 16, 8
    assert fold_repeats(ragged) == ragged
    floats = ["k(a.x, 0.5f);", "k(a.x, 1.5f);", "k(a.x, 2.5f);", "k(a.x, 3.5f);"]  # not integer literals
    assert fold_repeats(floats) == floats
    comments = ["// group 1 -- no launch", "// group 2 -- no launch", "// group 3 -- no launch"]
    assert fold_repeats(comments) == comments


LSTM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.LSTM(16, 32, num_layers=2, batch_first=True, bidirectional=True)

    def forward(self, x):
        return self.net(x)[0]


def get_inputs():
    return [torch.randn(2, 12, 16)]


def get_init_inputs():
    return []
'''


def _host(program: str) -> str:
    start = program.index("void launch_all(")
    return program[start:program.index("\n}\n", start)]


@pytest.fixture
def stepped(monkeypatch):
    """Recurrent layers stepped one launch at a time, as where one launch cannot hold them
    (sequence_kernel.plan_recurrence refuses: a batch over 64, a step's state over shared memory)."""
    from stitchcuda.compiler.lowering import lower_sequence

    monkeypatch.setattr(lower_sequence, "plan_recurrence", lambda *args, **kwargs: None)


def test_a_recurrent_layers_steps_are_one_loop_each_and_unfold_to_the_unrolled_program(stepped, monkeypatch):
    from stitchcuda.compiler import compile_task
    from stitchcuda.compiler.emit.codegen import CodegenOptions

    task = Task(name="lstm", source=LSTM)
    compiled = compile_task(task)
    folded = compiled.program(CodegenOptions())
    folding = loops.MIN_REPEATS
    monkeypatch.setattr(loops, "MIN_REPEATS", 10**9)  # nothing folds
    unrolled = compiled.program(CodegenOptions(block=128))  # other options: not a cached program
    monkeypatch.setattr(loops, "MIN_REPEATS", folding)
    compiled.sources.clear()  # a program is emitted once per options: again, with folding back on
    refolded = compiled.program(CodegenOptions(block=128))
    assert len(_LOOP.findall(_host(refolded))) == 4  # 2 layers x 2 directions
    assert len(_host(refolded)) < len(_host(unrolled)) / 2
    assert unfold(_host(refolded)) == unfold(_host(unrolled))
    assert len(_LOOP.findall(_host(folded))) == 4


THREE_WAYS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.both = nn.LSTM(16, 32, num_layers=2, batch_first=True, bidirectional=True)  # one launch a layer
        self.stack = nn.GRU(16, 24, num_layers=2)  # both layers in one launch, a wavefront
        self.wide = nn.RNN(8, 16)  # a batch of 65 rows: stepped, its steps a host loop

    def forward(self, x, y):
        return self.both(x)[0], self.stack(x)[0], self.wide(y)[0]


def get_inputs():
    return [torch.randn(2, 12, 16), torch.randn(5, 65, 8)]


def get_init_inputs():
    return []
'''


@pytest.mark.nvcc
def test_a_program_with_every_way_of_running_a_recurrent_layer_compiles():
    """One nvcc run over the cooperative launches (a layer's, a wavefront's), the barrier's PTX and
    a stepped layer folded into a host loop."""
    from stitchcuda.compiler import compile_task
    from stitchcuda.compiler.check import compile_check
    from stitchcuda.compiler.emit.codegen import CodegenOptions
    from stitchcuda.cuda_headers import NEEDED, HeadersMissing, include_dirs
    from tests.cuda_headers import toolkit

    _, home = toolkit()
    try:
        include_dirs(home, headers=NEEDED)  # the tests may fetch; compile_check never does
    except HeadersMissing as exc:
        pytest.skip(f"no real CUDA library headers for this machine: {exc}")

    program = compile_task(Task(name="recurrent", source=THREE_WAYS)).program(CodegenOptions())
    assert program.count("cudaLaunchKernelEx(") == 3 and "as a wavefront" in program
    assert "for (int64_t sc_rep" in program
    check = compile_check(program)
    assert check.status == "compiled", check.detail
