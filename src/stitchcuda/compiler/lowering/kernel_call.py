"""What a family lowering (``families/``) reads and returns: tensors as :class:`Strided` reads of
buffers, the :class:`FamilyContext` it lowers in, and the :class:`KernelCall` it gives back, with
the index arithmetic they share.
"""


from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from stitchcuda.compiler.capture.graph import Node


@dataclass(frozen=True)
class Strided:
    """A tensor read through a view: ``ptr[offset + sum(i_d * strides[d])]``."""

    ptr: str  # the pointer expression in launch code, e.g. "a.b_conv_1"
    ctype: str  # "float", "int64_t", "bool"
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def contiguous(self) -> bool:
        acc = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if size != 1 and stride != acc:
                return False
            acc *= size
        return True


@dataclass
class KernelCall:
    """What a family lowering returns: kernels (name -> source) and the launch statements."""

    kernels: dict[str, str] = field(default_factory=dict)
    launch: str = ""
    describe: str = ""
    library: str = ""  # "cudnn" when the launch calls cuDNN (the program then links it)


class FamilyContext(Protocol):
    """What a family lowering may ask of the lowerer."""

    block: int  # threads per block of the tuning variant

    def read(self, arg: Any) -> Strided:
        """The node's tensor argument (``"%name"``) as a strided read; raises Unsupported otherwise."""

    def write(self, value: str, dtype: str = "float32") -> Strided:
        """A fresh contiguous buffer for one output value (the node's name, or a getitem's name)."""

    def outputs(self, node: Node) -> list[str | None]:
        """The value names of the node's outputs in order (None where an output is never read)."""

    def kernel_name(self, node: Node, what: str) -> str:
        """A kernel name unique to this program, e.g. ``sc1234_max_1_reduce``."""


def index_expr(x: Strided, coords: list[str]) -> str:
    """C++ text of the element offset of ``x`` at the given per-dim coordinate expressions."""
    terms = [f"({c}) * {s}LL" for c, s, n in zip(coords, x.strides, x.shape, strict=True) if n != 1 and s != 0]
    return " + ".join([str(x.offset), *terms]) if terms else str(x.offset)


def unravel(shape: tuple[int, ...] | list[int], flat: str, prefix: str = "c") -> tuple[list[str], str]:
    """C++ statements that split the flat index ``flat`` into coordinates ``{prefix}0..`` of
    ``shape`` (row-major), and the coordinate names."""
    names = [f"{prefix}{d}" for d in range(len(shape))]
    lines = [f"long long {prefix}_rest = {flat};"]
    for d in range(len(shape) - 1, -1, -1):
        lines.append(f"const long long {names[d]} = {prefix}_rest % {shape[d]}LL; {prefix}_rest /= {shape[d]}LL;")
    return names, "\n    ".join(lines)
