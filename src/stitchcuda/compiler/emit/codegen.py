"""The offline Coder: (task, OpGraph, fusion groups) -> one complete candidate program.

Each fusion group is lowered to the IR of :mod:`stitchcuda.compiler.ir.expr` and then to CUDA:

- ``gemm`` (anchor ``aten.linear`` / ``mm`` / ``matmul`` / ``bmm`` / ``addmm``): a true-fp32
  ``cublasSgemm`` / ``cublasSgemmStridedBatched`` (``CUBLAS_DEFAULT_MATH``, no TF32) with the
  row-major trick (C^T = B^T A^T), then one fused epilogue kernel for bias + the epilogue chain
  (skipped when there is neither);
- ``elementwise`` / ``data_movement``: one pointwise kernel evaluating the fused expression
  (broadcasts, views and transposes are index arithmetic; a float4 path when the shapes allow
  it and the pointers are aligned); a group that only reshapes a contiguous buffer is an alias;
  ``cat`` / ``stack`` are index arithmetic in that kernel (each piece read only over its range of the
  output), ``embedding`` / ``gather`` / ``index.Tensor`` are reads at ``index * stride`` from int64
  index buffers, bounds-checked (an index out of range gives NaN, never a stray read);
- ``row_reduce``: one row kernel (a warp per row for short rows, a block per row otherwise) that
  keeps the row in registers, reduces with warp shuffles in fp32 (two-pass variance) and
  applies the absorbed prologue and epilogue; a ``gather`` of one element per row from a row it
  computes (log_softmax -> gather -> neg) is a pick-by-column reduction in the same kernel;
- ``attention`` (explicit Q.K^T -> scale/mask -> softmax -> P.V): Q.K^T as a strided-batched SGEMM
  over the projection's buffer (split/reshape/transpose views become leading dimensions and batch
  strides; batch dims that do not fold are a host loop of calls) into a scores buffer, one row
  kernel in place over it (a bool mask read by index as 0/1), and P.V as a strided-batched SGEMM
  written straight into the layout of the views after it;
- ``recurrent`` (``aten.lstm_cell`` / ``aten.gru_cell``, one time step): x.W_ih^T and h.W_hh^T as
  SGEMMs into gate buffers (the second skipped for a zero initial state), then one pointwise gate
  kernel writing h' (and c').

Placeholders no node reads are not entry arguments; non-float32 ones (bool masks) are passed with
their own element type and may only feed mask operators. Non-persistent buffers are recreated in
``ModelNew.__init__`` from the reference's values (a fill, a triangle of ones, a short literal).

The host code (``templates/program.cu.j2``) checks the arguments, allocates intermediates once
and caches them, launches everything in graph order on the caller's stream and, with
``CodegenOptions.graph``, replays a CUDA graph: see the template's header comment for how
inputs and outputs stay fresh. Python's ``forward`` only calls the entry point.

This module is the front; the work is split along the pipeline:

- ``lowered.py``: the records lowering produces, and :class:`CodegenOptions`;
- ``lower.py``: groups in order, each to its lowering, every problem collected; ``lower_context.py``:
  the state the lowerings share;
- ``lower_gemm.py``, ``lower_conv.py``, ``lower_pointwise.py``, ``lower_rows.py``,
  ``lower_attention.py``, ``lower_recurrent.py``: the fused lowerings, one per family of groups
  (``gemm_calls.py`` writes the GEMMs' launches);
- ``emit.py``: the IR programs of the fused kernels as CUDA; ``library_calls.py``: the library calls'
  host code (cuDNN, CUTLASS convolutions, cuBLASLt); ``program.py``: the whole program.
"""

from stitchcuda.compiler.emit.program import generate, split_cuda
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.lower import lower, supported
from stitchcuda.compiler.lowering.lowered import CodegenOptions

__all__ = ["CodegenOptions", "Unsupported", "generate", "lower", "supported", "split_cuda"]
