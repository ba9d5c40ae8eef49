"""The operator table: every ATen operator the offline compiler knows, once.

Each row gives an operator (its overload packet, ``aten.name``) one **role**, what kind of work it
is for fusion (schedule/roles.py), and **what lowers it**:

- ``GROUPS``: the group lowerings (lowering/lower_*.py) take it inside a fused group;
- ``FAMILY``: a family lowering (lowering/families/) takes it alone, in any instance;
- ``GROUPS_THEN_FAMILY``: a group where the group lowering takes its instance, else its family;
- ``DECOMPOSED``: capture's decompositions replace it before anything lowers it;
- ``"refused: why"``: a core-ATen operator no lowering takes, and why.

Its **tags** say what else a stage needs to know (a stage's operator set is a query of them):

- reductions: ``softmax``, ``norm``, ``sum`` (its kind), ``row`` (the fused row kernel's formulas);
- recurrence: ``cell`` (one timestep), ``sequence`` (a whole nn.LSTM/GRU/RNN);
- views: ``strided`` (the expression lowering reads through it), ``layout`` (it keeps a contiguous
  tensor contiguous, so an epilogue may run through it), ``reshape``, ``split`` (several
  outputs), ``identity`` (its output is its input), ``same_shape`` (its input, where it keeps
  the shape), ``dense`` (it keeps a dense value dense, its element order unchanged);
- data: ``gather``, ``cat``, ``pool`` (the expression lowering's data operators), ``zeros`` (an
  initial recurrent state);
- ``plain_gemm``: a GEMM the GEMM lowering takes (the batched-add forms decompose first);
- ``fusable``: the scheduler may put it in a fused group (else a family takes it, alone);
- ``quiet``: it only describes or moves a tensor (left out of what the Planner reads).

Nothing here imports anything: every stage reads the table, and the table knows no stage.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Role = Literal["gemm", "conv", "attention", "reduce", "recurrent", "elementwise", "view", "const", "copy", "other"]
GROUPS = "groups"
FAMILY = "family"
GROUPS_THEN_FAMILY = "groups, else family"
DECOMPOSED = "decomposed at capture"
TAGS = frozenset({"softmax", "norm", "sum", "row", "cell", "sequence", "strided", "layout", "reshape", "split",
                  "identity", "same_shape", "dense", "gather", "cat", "pool", "zeros", "plain_gemm", "fusable",
                  "quiet"})


class OpInfo(NamedTuple):
    role: Role
    lowering: str
    tags: frozenset[str]


def _op(role: Role, lowering: str, *tags: str) -> OpInfo:
    return OpInfo(role, lowering, frozenset(tags))


OPERATORS: dict[str, OpInfo] = {
    "aten._adaptive_avg_pool2d": _op("other", FAMILY),
    "aten._adaptive_avg_pool3d": _op("other", FAMILY),
    "aten._convolution": _op("conv", GROUPS, "fusable"),
    "aten._log_softmax": _op("reduce", GROUPS_THEN_FAMILY, "softmax", "row", "fusable"),
    "aten._native_batch_norm_legit": _op("other", FAMILY),
    "aten._native_batch_norm_legit_functional": _op("other", FAMILY),
    "aten._native_batch_norm_legit_no_training": _op("other", FAMILY),
    "aten._pad_circular": _op("other", FAMILY),
    "aten._safe_softmax": _op("reduce", GROUPS_THEN_FAMILY, "softmax", "row", "fusable"),
    "aten._scaled_dot_product_cudnn_attention": _op("attention", DECOMPOSED, "fusable"),
    "aten._scaled_dot_product_efficient_attention": _op("attention", DECOMPOSED, "fusable"),
    "aten._scaled_dot_product_flash_attention": _op("attention", DECOMPOSED, "fusable"),
    "aten._softmax": _op("reduce", GROUPS_THEN_FAMILY, "softmax", "row", "fusable"),
    "aten._to_copy": _op("elementwise", FAMILY, "fusable", "quiet"),
    "aten._unsafe_index": _op("other", FAMILY),
    "aten._unsafe_index_put": _op("other", FAMILY),
    "aten._unsafe_view": _op("view", GROUPS, "layout", "reshape", "strided", "fusable", "same_shape", "dense", "quiet"),
    "aten.abs": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.acos": _op("elementwise", GROUPS, "fusable"),
    "aten.acosh": _op("elementwise", GROUPS, "fusable"),
    "aten.adaptive_avg_pool1d": _op("other", FAMILY),
    "aten.adaptive_avg_pool2d": _op("other", FAMILY),
    "aten.adaptive_avg_pool3d": _op("other", FAMILY),
    "aten.adaptive_max_pool1d": _op("other", FAMILY),
    "aten.adaptive_max_pool2d": _op("other", FAMILY),
    "aten.adaptive_max_pool3d": _op("other", FAMILY),
    "aten.add": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.addbmm": _op("gemm", DECOMPOSED, "fusable"),
    "aten.addcdiv": _op("elementwise", DECOMPOSED, "fusable"),
    "aten.addcmul": _op("elementwise", DECOMPOSED, "fusable"),
    "aten.addmm": _op("gemm", GROUPS, "plain_gemm", "fusable"),
    "aten.alias": _op("view", GROUPS, "layout", "identity", "fusable", "same_shape", "dense", "quiet"),
    "aten.all": _op("other", FAMILY),
    "aten.amax": _op("reduce", GROUPS_THEN_FAMILY, "sum", "row", "fusable"),
    "aten.amin": _op("reduce", FAMILY, "sum", "fusable"),
    "aten.any": _op("other", FAMILY),
    "aten.arange": _op("const", FAMILY, "fusable"),
    "aten.argmax": _op("other", FAMILY),
    "aten.argmin": _op("other", FAMILY),
    "aten.as_strided": _op("view", "refused: strides over raw storage", "fusable", "quiet"),
    "aten.asin": _op("elementwise", GROUPS, "fusable"),
    "aten.asinh": _op("elementwise", GROUPS, "fusable"),
    "aten.atan": _op("elementwise", GROUPS, "fusable"),
    "aten.atan2": _op("elementwise", GROUPS, "fusable"),
    "aten.atanh": _op("elementwise", GROUPS, "fusable"),
    "aten.avg_pool1d": _op("other", FAMILY),
    "aten.avg_pool2d": _op("other", GROUPS_THEN_FAMILY, "pool", "fusable"),
    "aten.avg_pool3d": _op("other", FAMILY),
    "aten.baddbmm": _op("gemm", DECOMPOSED, "fusable"),
    "aten.batch_norm": _op("reduce", GROUPS, "norm", "fusable"),
    "aten.bitwise_and": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.bitwise_not": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.bitwise_or": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.bitwise_xor": _op("other", FAMILY),
    "aten.bmm": _op("gemm", GROUPS, "plain_gemm", "fusable"),
    "aten.cat": _op("copy", GROUPS, "cat", "fusable"),
    "aten.ceil": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.celu": _op("elementwise", GROUPS, "fusable"),
    "aten.chunk": _op("view", GROUPS, "split", "fusable"),
    "aten.clamp": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.clamp_max": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.clamp_min": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.clone": _op("copy", GROUPS_THEN_FAMILY, "identity", "fusable", "quiet"),
    "aten.concat": _op("copy", DECOMPOSED),
    "aten.constant_pad_nd": _op("copy", FAMILY),
    "aten.contiguous": _op("copy", GROUPS_THEN_FAMILY, "identity", "fusable", "quiet"),
    "aten.conv1d": _op("conv", GROUPS, "fusable"),
    "aten.conv2d": _op("conv", GROUPS, "fusable"),
    "aten.conv3d": _op("conv", GROUPS, "fusable"),
    "aten.conv_transpose1d": _op("conv", GROUPS, "fusable"),
    "aten.conv_transpose2d": _op("conv", GROUPS, "fusable"),
    "aten.conv_transpose3d": _op("conv", GROUPS, "fusable"),
    "aten.convolution": _op("conv", GROUPS, "fusable"),
    "aten.copy": _op("copy", FAMILY),
    "aten.cos": _op("elementwise", GROUPS, "fusable"),
    "aten.cosh": _op("elementwise", GROUPS, "fusable"),
    "aten.cumprod": _op("other", FAMILY),
    "aten.cumsum": _op("other", FAMILY),
    "aten.detach": _op("view", GROUPS, "layout", "identity", "fusable", "quiet"),
    "aten.div": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.dropout": _op("elementwise", GROUPS, "fusable"),
    "aten.elu": _op("elementwise", GROUPS, "fusable"),
    "aten.embedding": _op("copy", GROUPS, "gather", "fusable"),
    "aten.empty": _op("const", FAMILY, "fusable"),
    "aten.empty_like": _op("const", FAMILY, "fusable"),
    "aten.empty_strided": _op("other", FAMILY),
    "aten.eq": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.erf": _op("elementwise", GROUPS, "fusable"),
    "aten.exp": _op("elementwise", GROUPS, "fusable"),
    "aten.exp2": _op("elementwise", DECOMPOSED, "fusable"),
    "aten.expand": _op("view", GROUPS, "strided", "fusable", "same_shape", "dense", "quiet"),
    "aten.expand_as": _op("view", DECOMPOSED, "fusable"),
    "aten.expm1": _op("elementwise", GROUPS, "fusable"),
    "aten.fill": _op("elementwise", DECOMPOSED, "fusable"),
    "aten.flatten": _op("view", GROUPS, "layout", "reshape", "strided", "fusable", "dense"),
    "aten.flip": _op("copy", FAMILY),
    "aten.floor": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.floor_divide": _op("other", FAMILY),
    "aten.fmod": _op("other", FAMILY),
    "aten.full": _op("const", FAMILY, "zeros", "fusable"),
    "aten.full_like": _op("const", FAMILY, "fusable"),
    "aten.gather": _op("copy", GROUPS_THEN_FAMILY, "gather", "fusable"),
    "aten.ge": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.gelu": _op("elementwise", GROUPS, "fusable"),
    "aten.group_norm": _op("reduce", GROUPS_THEN_FAMILY, "norm", "fusable"),
    "aten.gru": _op("recurrent", GROUPS, "sequence", "fusable"),
    "aten.gru_cell": _op("recurrent", GROUPS, "cell", "fusable"),
    "aten.gt": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.hardsigmoid": _op("elementwise", GROUPS, "fusable"),
    "aten.hardswish": _op("elementwise", GROUPS, "fusable"),
    "aten.hardtanh": _op("elementwise", GROUPS, "fusable"),
    "aten.index": _op("copy", GROUPS_THEN_FAMILY, "gather", "fusable"),
    "aten.index_add": _op("other", FAMILY),
    "aten.index_put": _op("copy", FAMILY),
    "aten.index_select": _op("copy", FAMILY),
    "aten.instance_norm": _op("other", FAMILY),
    "aten.isfinite": _op("other", FAMILY),
    "aten.isinf": _op("other", FAMILY),
    "aten.isnan": _op("other", GROUPS_THEN_FAMILY),
    "aten.layer_norm": _op("reduce", GROUPS_THEN_FAMILY, "norm", "row", "fusable"),
    "aten.le": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.leaky_relu": _op("elementwise", GROUPS, "fusable"),
    "aten.lerp": _op("elementwise", DECOMPOSED, "fusable"),
    "aten.lift_fresh_copy": _op("other", GROUPS_THEN_FAMILY, "identity", "quiet"),
    "aten.linalg_vector_norm": _op("reduce", FAMILY, "sum", "fusable"),
    "aten.linear": _op("gemm", GROUPS, "plain_gemm", "fusable"),
    "aten.log": _op("elementwise", GROUPS, "fusable"),
    "aten.log10": _op("elementwise", GROUPS, "fusable"),
    "aten.log1p": _op("elementwise", GROUPS, "fusable"),
    "aten.log2": _op("elementwise", GROUPS, "fusable"),
    "aten.log_softmax": _op("reduce", GROUPS_THEN_FAMILY, "softmax", "row", "fusable"),
    "aten.logsigmoid": _op("other", GROUPS),
    "aten.logical_and": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.logical_not": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.logical_or": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.logical_xor": _op("other", FAMILY),
    "aten.logsumexp": _op("reduce", FAMILY, "sum", "fusable"),
    "aten.lstm": _op("recurrent", GROUPS, "sequence", "fusable"),
    "aten.lstm_cell": _op("recurrent", GROUPS, "cell", "fusable"),
    "aten.lt": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.masked_fill": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.matmul": _op("gemm", GROUPS, "plain_gemm", "fusable"),
    "aten.max": _op("other", FAMILY),
    "aten.max_pool1d": _op("other", FAMILY),
    "aten.max_pool1d_with_indices": _op("other", FAMILY),
    "aten.max_pool2d": _op("other", GROUPS_THEN_FAMILY, "pool", "fusable"),
    "aten.max_pool2d_with_indices": _op("other", FAMILY),
    "aten.max_pool3d": _op("other", FAMILY),
    "aten.max_pool3d_with_indices": _op("other", FAMILY),
    "aten.maximum": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.mean": _op("reduce", GROUPS_THEN_FAMILY, "sum", "row", "fusable"),
    "aten.min": _op("other", FAMILY),
    "aten.minimum": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.mish": _op("elementwise", GROUPS, "fusable"),
    "aten.mm": _op("gemm", GROUPS, "plain_gemm", "fusable"),
    "aten.movedim": _op("view", DECOMPOSED, "fusable"),
    "aten.mul": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.narrow": _op("view", DECOMPOSED, "fusable"),
    "aten.native_batch_norm": _op("other", FAMILY),
    "aten.native_group_norm": _op("other", FAMILY),
    "aten.native_layer_norm": _op("other", FAMILY),
    "aten.ne": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.neg": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.new_empty": _op("const", FAMILY, "fusable"),
    "aten.new_full": _op("const", FAMILY, "fusable"),
    "aten.new_ones": _op("const", FAMILY, "fusable"),
    "aten.new_zeros": _op("const", FAMILY, "zeros", "fusable"),
    "aten.norm": _op("reduce", FAMILY, "sum", "fusable"),
    "aten.ones": _op("const", FAMILY, "fusable"),
    "aten.ones_like": _op("const", FAMILY, "fusable"),
    "aten.pad": _op("copy", FAMILY),
    "aten.permute": _op("view", GROUPS, "strided", "fusable", "quiet"),
    "aten.pow": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.prod": _op("reduce", FAMILY, "sum", "fusable"),
    "aten.reciprocal": _op("elementwise", GROUPS, "fusable"),
    "aten.reflection_pad1d": _op("other", FAMILY),
    "aten.reflection_pad2d": _op("other", FAMILY),
    "aten.reflection_pad3d": _op("other", FAMILY),
    "aten.relu": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.relu6": _op("elementwise", DECOMPOSED, "fusable"),
    "aten.remainder": _op("other", FAMILY),
    "aten.repeat": _op("copy", FAMILY),
    "aten.replication_pad1d": _op("other", FAMILY),
    "aten.replication_pad2d": _op("other", FAMILY),
    "aten.replication_pad3d": _op("other", FAMILY),
    "aten.reshape": _op("view", GROUPS, "layout", "reshape", "strided", "fusable", "same_shape", "dense", "quiet"),
    "aten.rms_norm": _op("reduce", GROUPS, "norm", "row", "fusable"),
    "aten.rnn_relu": _op("recurrent", GROUPS, "sequence", "fusable"),
    "aten.rnn_relu_cell": _op("recurrent", DECOMPOSED, "cell", "fusable"),
    "aten.rnn_tanh": _op("recurrent", GROUPS, "sequence", "fusable"),
    "aten.rnn_tanh_cell": _op("recurrent", DECOMPOSED, "cell", "fusable"),
    "aten.roll": _op("copy", FAMILY),
    "aten.round": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.rsqrt": _op("elementwise", GROUPS, "fusable"),
    "aten.rsub": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.scalar_tensor": _op("const", GROUPS_THEN_FAMILY, "fusable"),
    "aten.scaled_dot_product_attention": _op("attention", DECOMPOSED, "fusable"),
    "aten.scatter": _op("copy", FAMILY),
    "aten.scatter_add": _op("other", FAMILY),
    "aten.scatter_reduce": _op("other", FAMILY),
    "aten.select": _op("view", GROUPS, "strided", "fusable", "quiet"),
    "aten.select_scatter": _op("other", FAMILY),
    "aten.selu": _op("elementwise", GROUPS, "fusable"),
    "aten.sigmoid": _op("elementwise", GROUPS, "fusable"),
    "aten.sign": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.silu": _op("elementwise", GROUPS, "fusable"),
    "aten.sin": _op("elementwise", GROUPS, "fusable"),
    "aten.sinh": _op("elementwise", GROUPS, "fusable"),
    "aten.slice": _op("view", GROUPS, "strided", "fusable", "quiet"),
    "aten.slice_scatter": _op("other", FAMILY),
    "aten.softmax": _op("reduce", GROUPS_THEN_FAMILY, "softmax", "row", "fusable"),
    "aten.softplus": _op("elementwise", GROUPS, "fusable"),
    "aten.sort": _op("other", FAMILY),
    "aten.split": _op("view", GROUPS, "split", "fusable"),
    "aten.split_with_sizes": _op("view", GROUPS, "split", "fusable"),
    "aten.sqrt": _op("elementwise", GROUPS, "fusable"),
    "aten.square": _op("elementwise", GROUPS, "fusable"),
    "aten.squeeze": _op("view", GROUPS, "layout", "reshape", "strided", "fusable", "dense", "quiet"),
    "aten.stack": _op("copy", GROUPS, "cat", "fusable"),
    "aten.std": _op("reduce", FAMILY, "sum", "fusable"),
    "aten.std_mean": _op("other", FAMILY),
    "aten.sub": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.sum": _op("reduce", GROUPS_THEN_FAMILY, "sum", "row", "fusable"),
    "aten.t": _op("view", GROUPS, "strided", "fusable", "quiet"),
    "aten.tan": _op("elementwise", GROUPS, "fusable"),
    "aten.tanh": _op("elementwise", GROUPS, "fusable"),
    "aten.to": _op("elementwise", DECOMPOSED, "fusable"),
    "aten.topk": _op("other", FAMILY),
    "aten.transpose": _op("view", GROUPS, "strided", "fusable", "quiet"),
    "aten.tril": _op("copy", FAMILY),
    "aten.triu": _op("copy", FAMILY),
    "aten.trunc": _op("other", FAMILY),
    "aten.type_as": _op("elementwise", DECOMPOSED, "fusable"),
    "aten.unbind": _op("view", GROUPS, "split", "fusable"),
    "aten.unflatten": _op("view", DECOMPOSED, "layout", "fusable"),
    "aten.unfold": _op("view", GROUPS, "strided", "fusable", "quiet"),
    "aten.unsqueeze": _op("view", GROUPS, "layout", "reshape", "strided", "fusable", "dense", "quiet"),
    "aten.var": _op("reduce", FAMILY, "sum", "fusable"),
    "aten.var_mean": _op("other", FAMILY),
    "aten.view": _op("view", GROUPS, "layout", "reshape", "strided", "fusable", "same_shape", "dense", "quiet"),
    "aten.view_as": _op("view", DECOMPOSED, "layout", "fusable"),
    "aten.where": _op("elementwise", GROUPS_THEN_FAMILY, "fusable"),
    "aten.zeros": _op("const", FAMILY, "zeros", "fusable"),
    "aten.zeros_like": _op("const", FAMILY, "zeros", "fusable"),
    "aten._local_scalar_dense": _op("other", "refused: a data-dependent scalar"),
    "aten.sym_numel": _op("other", "refused: a symbolic shape"),
    "aten.sym_storage_offset": _op("other", "refused: a symbolic shape"),
    "stitchcuda.int_add": _op("other", FAMILY),
    # strides over a computed value's own buffer (schedule/copy_reads.py): (value, size, stride, offset)
    "stitchcuda.buffer_view": _op("view", GROUPS, "strided", "fusable", "quiet"),
}


def tagged(*tags: str) -> frozenset[str]:
    """The operators with any of ``tags``."""
    unknown = set(tags) - TAGS
    assert not unknown, f"no such tag: {unknown}"
    return frozenset(op for op, info in OPERATORS.items() if info.tags & set(tags))


def with_role(*roles: Role) -> frozenset[str]:
    """The operators of any of ``roles``."""
    return frozenset(op for op, info in OPERATORS.items() if info.role in roles)


def lowered_by(*lowerings: str) -> frozenset[str]:
    """The operators whose lowering is one of ``lowerings``."""
    return frozenset(op for op, info in OPERATORS.items() if info.lowering in lowerings)


def refusal(op: str) -> str | None:
    """Why no lowering takes ``op``, where the table says so."""
    lowering = OPERATORS[op].lowering if op in OPERATORS else ""
    return lowering.removeprefix("refused: ") if lowering.startswith("refused: ") else None
