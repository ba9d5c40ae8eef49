"""Lowerings by operator family: one module per family, each registered per operator in the one
registry (lowering/registry.py).

A family lowering takes one node of the core-ATen graph and returns the CUDA that computes it: the
``__global__`` kernels (emitted once per program, deduplicated by name) and the host statements
that launch them inside ``launch_all`` (pointers are ``a.<ident>``, the stream is ``stream``).
Its tensor arguments arrive as ``Strided`` reads (``lowering/kernel_call.py``) of buffers (views already folded into
shapes, strides and an element offset), its outputs as fresh contiguous buffers.

The fused lowerings in ``stitchcuda/compiler/lowering/lower_*.py`` (GEMM/convolution epilogues, row
kernels, pointwise chains) take the common shapes fast; a family lowering is the general case
of an operator: any rank, any dims, any layout, with indices where the operator returns them.

Importing this package registers every family lowering.
"""

from stitchcuda.compiler.lowering.families import (  # noqa: F401  (importing a family registers it)
    layout,
    layout_scatter,
    layout_sort,
    layout_typed,
    norm,
    norm_kernels,
    pool,
    reduce,
    scan,
    state,
)
