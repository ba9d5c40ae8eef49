"""Host launch sequences that repeat, folded into loops.

A recurrent layer of T steps lowers to T copies of the same few launches (the step's h.W_hhᵀ
product and its gate kernel) that differ only in the offsets they read and write at. Written out,
a 2-layer LSTM over 256 steps is 1,500 launch statements in one host function, 540 KB of source
that the host compiler takes minutes over. Such a run is folded back into a ``for`` loop whose
varying integer literals become ``base + stride * i``: the same launches in the same order, with
the same arguments, in a function of a few lines.

The rule works on the emitted statements, not on a recurrent lowering, so whatever repeats with
affine offsets (a Python loop of cells, a stack of identical blocks sharing a buffer) folds too.
Comment lines are not compared; the loop keeps the first repeat's comments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# a whole integer literal: not part of a name (g0_1, h0_0), a float (0.5f, 1e-05) or a member
_INT = re.compile(r"(?<![\w.])\d+(?![\w.])")
MIN_REPEATS = 3
MAX_PERIOD = 4


def _code_lines(block: str) -> list[str]:
    return [line for line in block.splitlines() if not line.lstrip().startswith("//")]


@dataclass
class _Block:
    text: str
    skeleton: str
    values: list[int]

    @classmethod
    def of(cls, text: str) -> _Block:
        code = "\n".join(_code_lines(text))
        return cls(text, _INT.sub("#", code), [int(v) for v in _INT.findall(code)])


@dataclass
class _Folder:
    counter: list[int] = field(default_factory=lambda: [0])

    def fold(self, texts: list[str]) -> list[str]:
        blocks = [_Block.of(t) for t in texts]
        out: list[str] = []
        i = 0
        while i < len(blocks):
            period, repeats = _longest_run(blocks, i)
            if repeats >= MIN_REPEATS:
                out.append(self._loop(blocks[i:i + period * repeats], period, repeats))
                i += period * repeats
            else:
                out.append(blocks[i].text)
                i += 1
        return out

    def _loop(self, run: list[_Block], period: int, repeats: int) -> str:
        var = f"sc_rep{self.counter[0]}"
        self.counter[0] += 1
        first = [v for b in run[:period] for v in b.values]
        second = [v for b in run[period:2 * period] for v in b.values]
        strides = [b - a for a, b in zip(first, second, strict=True)]
        code = "\n".join(line for b in run[:period] for line in _code_lines(b.text))
        position = iter(range(len(first)))

        def affine(match: re.Match[str]) -> str:
            j = next(position)
            if strides[j] == 0:
                return match[0]
            sign = "+" if strides[j] > 0 else "-"
            return f"({first[j]} {sign} {abs(strides[j])} * {var})"

        body = _INT.sub(affine, code)
        comments = [line.strip() for b in run[:period] for line in b.text.splitlines() if line.lstrip().startswith("//")]
        head = [*comments, f"// the {'launch' if period == 1 else f'{period} launches'} above, {repeats} times "
                           "with offsets advancing by a fixed stride (folded into a loop)"]
        inner = "\n".join("  " + line for line in body.splitlines())
        return "\n".join(head) + f"\nfor (int64_t {var} = 0; {var} < {repeats}; ++{var}) {{\n{inner}\n}}"


def _repeats(blocks: list[_Block], start: int, period: int) -> int:
    """How many times blocks[start:start + period] repeats from ``start`` on, its integer literals
    advancing by the same stride every time."""
    head = blocks[start:start + period]
    if len(head) < period or any(not b.skeleton.strip() for b in head):  # a comment alone: nothing runs
        return 0
    shape = [b.skeleton for b in head]
    previous = [v for b in head for v in b.values]
    stride: list[int] | None = None
    count = 1
    at = start + period
    while at + period <= len(blocks):
        chunk = blocks[at:at + period]
        if [b.skeleton for b in chunk] != shape:
            break
        values = [v for b in chunk for v in b.values]
        step = [b - a for a, b in zip(previous, values, strict=True)]
        if stride is None:
            stride = step
        elif step != stride:
            break
        previous, count, at = values, count + 1, at + period
    return count


def _longest_run(blocks: list[_Block], start: int) -> tuple[int, int]:
    """(period, repeats) of the run starting at ``start`` that covers the most blocks; the shortest
    period among equals."""
    best = (1, 1)
    for period in range(1, MAX_PERIOD + 1):
        repeats = _repeats(blocks, start, period)
        if repeats >= MIN_REPEATS and period * repeats > best[0] * best[1]:
            best = (period, repeats)
    return best


def fold_repeats(texts: list[str], folder: _Folder | None = None) -> list[str]:
    """``texts`` (host statements in launch order) with every run of at least ``MIN_REPEATS``
    repeats of up to ``MAX_PERIOD`` statements, alike but for affine integer literals, as a loop."""
    return (folder or _Folder()).fold(texts)


def new_folder() -> _Folder:
    """One loop-variable numbering for a whole program (nested folds get distinct names)."""
    return _Folder()
