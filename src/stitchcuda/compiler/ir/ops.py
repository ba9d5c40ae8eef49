"""Note: the operator taxonomy of the offline compiler.

Which ATen operators are GEMM-like, convolutions, recurrent cells or sequences, attention, row
reductions and normalisations, elementwise, views (no data moves: the consumer reads through
strides), constants and copies; and the geometry of a row reduction (which dims, what shape the
per-row values take). The fuser (fusion.py) and the offline Planner read operators through these
sets; the lowerings keep their own narrower lists of what each kernel takes.
"""

from __future__ import annotations

from typing import Any, Literal

from stitchcuda.compiler.capture.graph import Node

GEMM_OPS = {"aten.linear", "aten.matmul", "aten.bmm", "aten.mm", "aten.addmm", "aten.baddbmm", "aten.addbmm"}
CONV_OPS = {"aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.conv_transpose1d", "aten.conv_transpose2d",
            "aten.conv_transpose3d", "aten.convolution", "aten._convolution"}
RECURRENT_OPS = {"aten.lstm_cell", "aten.gru_cell", "aten.rnn_tanh_cell", "aten.rnn_relu_cell"}
RECURRENT_SEQUENCE_OPS = {"aten.lstm", "aten.gru", "aten.rnn_tanh", "aten.rnn_relu"}  # whole nn.LSTM/GRU/RNN
SDPA_OPS = {"aten.scaled_dot_product_attention", "aten._scaled_dot_product_flash_attention",
            "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention"}
SOFTMAX_OPS = {"aten.softmax", "aten._softmax", "aten._safe_softmax", "aten.log_softmax", "aten._log_softmax"}
NORM_OPS = {"aten.layer_norm", "aten.rms_norm", "aten.group_norm", "aten.batch_norm"}
SUM_OPS = {"aten.mean", "aten.sum", "aten.amax", "aten.amin", "aten.logsumexp", "aten.var", "aten.std",
           "aten.prod", "aten.linalg_vector_norm", "aten.norm"}
ELEMENTWISE_OPS = {
    "aten.add", "aten.sub", "aten.rsub", "aten.mul", "aten.div", "aten.neg", "aten.abs", "aten.pow", "aten.sqrt",
    "aten.rsqrt", "aten.reciprocal", "aten.square", "aten.exp", "aten.exp2", "aten.expm1", "aten.log",
    "aten.log1p", "aten.log2", "aten.sin", "aten.cos", "aten.erf", "aten.sign", "aten.floor", "aten.ceil",
    "aten.round", "aten.relu", "aten.relu6", "aten.gelu", "aten.silu", "aten.sigmoid", "aten.tanh",
    "aten.hardtanh", "aten.hardswish", "aten.hardsigmoid", "aten.leaky_relu", "aten.elu", "aten.selu",
    "aten.celu", "aten.softplus", "aten.mish", "aten.clamp", "aten.clamp_min", "aten.clamp_max",
    "aten.maximum", "aten.minimum", "aten.where", "aten.masked_fill", "aten.bitwise_not", "aten.bitwise_and",
    "aten.bitwise_or", "aten.logical_not", "aten.logical_and", "aten.logical_or", "aten.eq", "aten.ne",
    "aten.lt", "aten.le", "aten.gt", "aten.ge", "aten.lerp", "aten.addcmul", "aten.addcdiv", "aten.dropout",
    "aten._to_copy", "aten.to", "aten.type_as", "aten.fill", "aten.tan", "aten.asin", "aten.acos", "aten.atan",
    "aten.sinh", "aten.cosh", "aten.asinh", "aten.acosh", "aten.atanh", "aten.log10", "aten.atan2",
}
# Views: no data moves when the consumer reads through strides.
VIEW_OPS = {"aten.reshape", "aten.view", "aten._unsafe_view", "aten.flatten", "aten.unflatten", "aten.transpose",
            "aten.t", "aten.permute", "aten.select", "aten.slice", "aten.narrow", "aten.split",
            "aten.split_with_sizes", "aten.chunk", "aten.unbind", "aten.unsqueeze", "aten.squeeze",
            "aten.expand", "aten.expand_as", "aten.alias", "aten.detach", "aten.view_as", "aten.movedim",
            "aten.as_strided"}
# Views that keep a contiguous tensor contiguous (an epilogue may run through them).
LAYOUT_VIEWS = {"aten.reshape", "aten.view", "aten._unsafe_view", "aten.flatten", "aten.unflatten",
                "aten.unsqueeze", "aten.squeeze", "aten.alias", "aten.detach", "aten.view_as"}
CONST_OPS = {"aten.new_zeros", "aten.new_ones", "aten.new_full", "aten.new_empty", "aten.zeros", "aten.ones",
             "aten.full", "aten.empty", "aten.zeros_like", "aten.ones_like", "aten.full_like", "aten.empty_like",
             "aten.scalar_tensor", "aten.arange"}
COPY_OPS = {"aten.cat", "aten.concat", "aten.stack", "aten.clone", "aten.contiguous", "aten.copy", "aten.index",
            "aten.index_select", "aten.gather", "aten.embedding", "aten.repeat", "aten.roll", "aten.flip",
            "aten.constant_pad_nd", "aten.pad", "aten.tril", "aten.triu", "aten.scatter", "aten.index_put"}

# What the fused lowerings (lower_*.py) take (a family lowering takes the rest, and the cases of
# these they cannot: see row_lowerable).
KNOWN_FUSED = (GEMM_OPS | CONV_OPS | RECURRENT_OPS
               | RECURRENT_SEQUENCE_OPS | SDPA_OPS | SOFTMAX_OPS | NORM_OPS | SUM_OPS | ELEMENTWISE_OPS | VIEW_OPS
               | CONST_OPS | {"aten.max_pool2d", "aten.avg_pool2d", "aten.cat", "aten.stack", "aten.embedding",
                              "aten.gather", "aten.index", "aten.clone", "aten.contiguous"})

Role = Literal["gemm", "conv", "attention", "reduce", "recurrent", "elementwise", "view", "const", "copy", "other"]

# The operators a family lowering (lowering/families/) takes one node at a time, in any instance:
# what scheduling may give a group of its own. The lowering registry registers exactly these (it
# refuses any other, and a test checks that each has its lowering).
FAMILY_OPS = frozenset({
    "aten._adaptive_avg_pool2d", "aten._adaptive_avg_pool3d", "aten._log_softmax", "aten._native_batch_norm_legit",
    "aten._native_batch_norm_legit_functional", "aten._native_batch_norm_legit_no_training", "aten._pad_circular",
    "aten._safe_softmax", "aten._softmax", "aten._to_copy", "aten._unsafe_index", "aten._unsafe_index_put",
    "aten.abs", "aten.adaptive_avg_pool1d", "aten.adaptive_avg_pool2d", "aten.adaptive_avg_pool3d",
    "aten.adaptive_max_pool1d", "aten.adaptive_max_pool2d", "aten.adaptive_max_pool3d", "aten.add", "aten.all",
    "aten.amax", "aten.amin", "aten.any", "aten.arange", "aten.argmax", "aten.argmin", "aten.avg_pool1d",
    "aten.avg_pool2d", "aten.avg_pool3d", "aten.bitwise_and", "aten.bitwise_not", "aten.bitwise_or",
    "aten.bitwise_xor", "aten.ceil", "aten.clamp", "aten.clamp_max", "aten.clamp_min", "aten.clone",
    "aten.constant_pad_nd", "aten.contiguous", "aten.copy", "aten.cumprod", "aten.cumsum", "aten.div", "aten.empty",
    "aten.empty_like", "aten.empty_strided", "aten.eq", "aten.flip", "aten.floor", "aten.floor_divide", "aten.fmod",
    "aten.full", "aten.full_like", "aten.gather", "aten.ge", "aten.group_norm", "aten.gt", "aten.index",
    "aten.index_add", "aten.index_put", "aten.index_select", "aten.instance_norm", "aten.isfinite", "aten.isinf",
    "aten.isnan", "aten.layer_norm", "aten.le", "aten.lift_fresh_copy", "aten.linalg_vector_norm",
    "aten.log_softmax", "aten.logical_and", "aten.logical_not", "aten.logical_or", "aten.logical_xor",
    "aten.logsumexp", "aten.lt", "aten.masked_fill", "aten.max", "aten.max_pool1d", "aten.max_pool1d_with_indices",
    "aten.max_pool2d", "aten.max_pool2d_with_indices", "aten.max_pool3d", "aten.max_pool3d_with_indices",
    "aten.maximum", "aten.mean", "aten.min", "aten.minimum", "aten.mul", "aten.native_batch_norm",
    "aten.native_group_norm", "aten.native_layer_norm", "aten.ne", "aten.neg", "aten.new_empty", "aten.new_full",
    "aten.new_ones", "aten.new_zeros", "aten.norm", "aten.ones", "aten.ones_like", "aten.pad", "aten.pow",
    "aten.prod", "aten.reflection_pad1d", "aten.reflection_pad2d", "aten.reflection_pad3d", "aten.relu",
    "aten.remainder", "aten.repeat", "aten.replication_pad1d", "aten.replication_pad2d", "aten.replication_pad3d",
    "aten.roll", "aten.round", "aten.rsub", "aten.scalar_tensor", "aten.scatter", "aten.scatter_add",
    "aten.scatter_reduce", "aten.select_scatter", "aten.sign", "aten.slice_scatter", "aten.softmax", "aten.sort",
    "aten.std", "aten.std_mean", "aten.sub", "aten.sum", "aten.topk", "aten.tril", "aten.triu", "aten.trunc",
    "aten.var", "aten.var_mean", "aten.where", "aten.zeros", "aten.zeros_like", "stitchcuda.int_add",
})

SPLITS = {"aten.split", "aten.split_with_sizes", "aten.chunk", "aten.unbind"}  # multi-output views
CELLS = {"aten.lstm_cell": 4, "aten.gru_cell": 3}  # recurrent cells -> gates per hidden unit
ZEROS = {"aten.new_zeros", "aten.zeros", "aten.zeros_like", "aten.full"}  # initial states
RESHAPES = {"aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten", "aten.unsqueeze", "aten.squeeze"}
C_TYPES = {"float32": "float", "bool": "bool", "int64": "int64_t", "int32": "int32_t"}  # element types a kernel takes, as C
MAX_ROW = 32768  # the longest row the fused row kernel keeps in registers


def norm_dim(d: int, rank: int) -> int:
    """``d`` counted from the front (a negative dim counts from the back)."""
    return d + rank if d < 0 else d


def dims_of(value: Any, rank: int) -> list[int]:
    """A dim argument (one int or a list) as sorted non-negative dims."""
    if isinstance(value, int):
        return [norm_dim(value, rank)]
    return sorted(norm_dim(int(d), rank) for d in (value or []))


def reduce_geometry(node: Node, in_shape: list[int]) -> tuple[tuple[int, ...], tuple[int, ...], str] | None:
    """(input shape, reduced dims, extra) of a row reduction; equal geometries share rows."""
    rank = len(in_shape)
    op, args = node.op, node.args
    if op in SOFTMAX_OPS:
        dims = dims_of(args[1] if len(args) > 1 else node.kwargs.get("dim", -1), rank)
    elif op in ("aten.layer_norm", "aten.rms_norm"):
        dims = list(range(rank - len(args[1]), rank))
    elif op == "aten.group_norm":
        return tuple(in_shape), tuple(range(1, rank)), f"groups={args[1]}"
    elif op == "aten.batch_norm":
        return tuple(in_shape), tuple(d for d in range(rank) if d != 1), "channels"
    elif op in SUM_OPS:
        at = 2 if op in ("aten.linalg_vector_norm", "aten.norm") else 1  # dims come after ord / p there
        whole = op in ("aten.var", "aten.std") and node.overload == "default"  # (self, unbiased)
        raw = None if whole else args[at] if len(args) > at else node.kwargs.get("dim")
        dims = list(range(rank)) if raw is None or raw == [] else dims_of(raw, rank)
    else:
        return None
    return tuple(in_shape), tuple(dims), ""


def stat_shapes(geometry: tuple[tuple[int, ...], tuple[int, ...], str]) -> list[list[int]]:
    """Shapes of per-row values (the reduced dims kept as 1, or dropped)."""
    shape, dims, extra = geometry
    if extra:
        return []
    kept = [1 if i in dims else s for i, s in enumerate(shape)]
    dropped = [s for i, s in enumerate(shape) if i not in dims]
    return [kept, dropped]


def short(op: str) -> str:
    """``aten.layer_norm`` -> ``layer_norm``."""
    return op.split(".", 1)[-1]
