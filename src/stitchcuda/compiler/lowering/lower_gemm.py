"""Matrix products through cuBLAS: ``linear`` / ``mm`` / ``matmul`` / ``bmm`` / ``addmm`` as a
true-fp32 SGEMM (strided-batched where batched, the row-major trick C^T = B^T A^T), a bias and a
pointwise chain after it as one epilogue kernel, or through cuBLASLt with the bias (and a ReLU or
tanh-GELU) in its own epilogue; or through CUTLASS, or as 3xTF32 by split operands. Also the
strided products attention and recurrent cells build. The calls' host code is in
:mod:`gemm_calls`."""

from __future__ import annotations

from dataclasses import replace

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import (
    VIEWS,
    Expr,
    Leaf,
    Unsupported,
    contiguous_strides,
    numel,
    reshape_strides,
    view_expr,
)
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import SPLITS
from stitchcuda.compiler.lowering.bf16 import bf16_able, plan_bf16
from stitchcuda.compiler.lowering.cost import Estimate, amplifies_error, choose, fixed_path, gemm_paths
from stitchcuda.compiler.lowering.cutlass_gemm import CutlassGemm, split_k_slices
from stitchcuda.compiler.lowering.gemm_calls import tiny
from stitchcuda.compiler.lowering.lower_context import LowerContext
from stitchcuda.compiler.lowering.lower_pointwise import library_call
from stitchcuda.compiler.lowering.lowered import PLAIN_GEMM_OPS, Gemm, Lowered, Lowering
from stitchcuda.compiler.lowering.packing import fits, pack_buffer, parameter
from stitchcuda.compiler.lowering.padded_gemm import padded, staging
from stitchcuda.compiler.lowering.registry import group_lowering
from stitchcuda.compiler.lowering.regroup import common_split
from stitchcuda.compiler.lowering.split_tf32 import plan_split, splittable


@group_lowering("matrix product", 50, lambda g, nodes: any(n.op in PLAIN_GEMM_OPS for n in nodes))
def lower_gemm(cx: LowerContext, g: FusionGroup, nodes: list[Node]) -> Lowered:
    gemms = [n for n in nodes if n.op in PLAIN_GEMM_OPS]
    if len(gemms) != 1:
        raise Unsupported(f"{len(gemms)} matrix products in one group")
    anchor = gemms[0]
    where = f"{anchor.name} ({anchor.op})"
    env: dict[str, Expr] = {}
    before = nodes[:nodes.index(anchor)]
    for n in before:
        if n.op not in VIEWS and n.op not in SPLITS:
            raise Unsupported(f"{n.name} ({n.op}) before the matrix product (only views may feed it)")
        if n.op in SPLITS:
            cx.split(n, env)
        else:
            env[n.name] = view_expr(n, cx.arg(env, n.name)(n.args[0]))
    arg = cx.arg(env, where)
    a = anchor.args
    bias: Expr | None = None
    if anchor.op == "aten.linear":
        x, w = arg(a[0]), arg(a[1])
        bias = arg(a[2]) if len(a) > 2 and a[2] is not None else None
        if len(w.shape) != 2:
            raise Unsupported(f"{where}: weight of shape {list(w.shape)}")
        if w.op != "leaf" or not w.leaf.plain:  # type: ignore[union-attr]
            raise Unsupported(f"{where}: the weight is computed, gathered or concatenated inside the group")
        # W^T, read where W is: a piece of a split weight (a packed Q/K/V projection) starts at its offset
        wt = Leaf(w.leaf.value, (w.shape[1], w.shape[0]), (w.leaf.strides[1], w.leaf.strides[0]),  # type: ignore[union-attr]
                  offset=w.leaf.offset)  # type: ignore[union-attr]
        lhs, rhs = x, Expr("leaf", leaf=wt, shape=wt.shape)
    elif anchor.op == "aten.addmm":
        beta, alpha = anchor.kwargs.get("beta", 1), anchor.kwargs.get("alpha", 1)
        if beta != 1 or alpha != 1:
            raise Unsupported(f"{where}: addmm with alpha/beta")
        bias, lhs, rhs = arg(a[0]), arg(a[1]), arg(a[2])
    else:
        lhs, rhs = arg(a[0]), arg(a[1])
    epilogue = nodes[nodes.index(anchor) + 1:]
    try:
        gemm = gemm_shape(cx, anchor, lhs, rhs)
    except Unsupported:
        if anchor.op not in ("aten.matmul", "aten.bmm", "aten.linear"):
            raise
        return _strided_product(cx, g, anchor, lhs, rhs, epilogue, bias, env)
    value = anchor
    gemm.estimate = gemm_path(cx, gemm, anchor.name)
    split = gemm.estimate.path in ("split", "bf16")
    if split:
        value, epilogue, bias = _lt_fold(cx, gemm, anchor, epilogue, bias)
    elif gemm.estimate.path == "cutlass":
        value, epilogue, bias = _cutlass_epilogue(cx, gemm, anchor, epilogue, bias, env)
    # a TF32 product run padded (padded_gemm.py, as its estimate assumed) adds its bias in a kernel
    elif bias is not None and cx.options.cublaslt and not (cx.options.tf32 and padded(gemm)):
        value, epilogue, bias = _lt_fold(cx, gemm, anchor, epilogue, bias)
        if gemm.epilogue:
            gemm.lt = len(cx.out.lt_gemms)
            cx.out.lt_gemms.append(gemm)
    low, gemm.out = library_call(cx, g, "gemm", value, epilogue, bias, env, "")
    low.gemm = gemm
    if split:
        assign_split(cx.out, gemm, cx.options.pack_weights, bf16=gemm.estimate.path == "bf16")
    elif cx.options.tf32 and gemm.cutlass is None and gemm.lt is None \
            and (staged := staging(gemm, SPLIT_SCRATCH)) is not None:
        gemm.staged = staged  # padded to multiples of 4: cuBLAS's TF32 kernels run 3x faster
        for matrix in staged.matrices():
            reserve_scratch(cx.out, matrix.scratch, matrix.floats)
    elif gemm.cutlass is not None and gemm.split_k > 1:  # assign_cutlass chose the slices
        _slice_k(cx.out, gemm, gemm.split_k)
    low.describe = describe_gemm(anchor, gemm) + low.describe  # after the split or split-K: it names them
    low.describe += gemm.estimate.note(cx.out.machine.table.label)
    return low


def _strided_product(cx: LowerContext, g: FusionGroup, anchor: Node, lhs: Expr, rhs: Expr, epilogue: list[Node],
                     bias: Expr | None, env: dict[str, Expr]) -> Lowered:
    """A product the dense shapes refuse, its left operand a strided view (a window attention's
    query read straight out of its QKV product; a linear over a sequence-first transpose of a
    batch-first value), or of two batch dims: one strided-batched product into a contiguous
    output, its bias and epilogue one pointwise kernel after."""
    where = f"{anchor.name} ({anchor.op})"
    low, out = library_call(cx, g, "gemm", anchor, epilogue, bias, env, "")
    shape = cx.shape(anchor.name)
    try:
        gemm = strided_gemm(cx, where, lhs, rhs, out, shape, contiguous_strides(shape))
    except Unsupported:
        moved, out_shape, out_strides = _rows_by_stride(where, lhs, shape)
        gemm = strided_gemm(cx, where, moved, rhs, out, out_shape, out_strides)
    place_product(cx, gemm)
    low.gemm = gemm
    low.describe = describe_gemm(anchor, gemm) + low.describe + gemm.estimate.note(cx.out.machine.table.label)
    return low


def _rows_by_stride(where: str, lhs: Expr, shape: tuple[int, ...]) -> tuple[Expr, tuple[int, ...], tuple[int, ...]]:
    """(the left operand, the output's shape, its contiguous strides) with the leading dims
    reordered alike so that the left operand's densest one gives the rows and the others the
    batch: ``[S, B, K]`` read from a ``[B, S, K]`` buffer is B products of S rows."""
    lead = len(shape) - 2
    if lhs.op != "leaf" or lead < 1 or len(lhs.shape) != len(shape):
        raise Unsupported(f"{where}: left operand of shape {list(lhs.shape)} for an output of {list(shape)}")
    lf: Leaf = lhs.leaf  # type: ignore[assignment]
    rows = min(range(lead + 1), key=lambda d: (shape[d] == 1, lf.strides[d]))
    order = [d for d in range(lead + 1) if d != rows] + [rows, lead + 1]
    strides = contiguous_strides(shape)
    read = replace(lf, shape=tuple(lf.shape[d] for d in order), strides=tuple(lf.strides[d] for d in order))
    return (Expr("leaf", leaf=read, shape=read.shape), tuple(shape[d] for d in order),
            tuple(strides[d] for d in order))


def gemm_path(cx: LowerContext, gemm: Gemm, value: str | None = None) -> Estimate:
    """The path of ``gemm`` (whose output is ``value``, where it has a node of its own) among those
    the options switch on. Under ``cost_model`` the fastest estimate, except where its output is
    summed straight away (:func:`cost.amplifies_error`: fp32 then); without, the variant's fixed
    order: the split where the model says it beats SGEMM, else CUTLASS, else cuBLAS."""
    table, tf32 = cx.out.machine.table, cx.options.tf32
    if tiny(gemm):
        return choose(value or "", gemm_paths(gemm, table, ["simt"]))
    allowed = ["cublas"] + (["split"] if cx.options.split_tf32 and splittable(gemm) else []) \
        + (["cutlass"] if cx.options.cutlass else []) + (["bf16"] if cx.options.bf16 and bf16_able(gemm) else [])
    packs = [cx.options.pack_weights and parameter(cx.out, buf) is not None
             and fits(cx.out, 3 * gemm.k * (gemm.m if buf == gemm.a else gemm.n)) for buf in (gemm.a, gemm.b)]
    paths = gemm_paths(gemm, table, allowed, *packs, tf32=tf32)
    if cx.options.cost_model:
        why = amplifies_error(cx.graph, value, cx.nodes, cx.users) if value and len(allowed) > 1 else ""
        return choose(value or "", {"cublas": paths["cublas"]} if why else paths, why, tf32)
    path = fixed_path(paths, split=True, cutlass=True)  # `allowed` already holds the variant's paths
    return Estimate(op=value or "", path=path, ms=paths[path], paths=paths, tf32=tf32)


def place_product(cx: LowerContext, gemm: Gemm) -> Gemm:
    """Give ``gemm``, a product with a plain epilogue (attention's, a recurrent cell's, a
    convolution run as a GEMM), the path the cost model or the variant picks, where it is made:
    CUTLASS, the split operands, bf16 copies, or cuBLAS."""
    gemm.estimate = gemm_path(cx, gemm)
    path = gemm.estimate.path
    if path == "cutlass":
        assign_cutlass(cx.out, gemm, "tf32" if cx.options.tf32 else "3xtf32")
    elif path in ("split", "bf16"):
        assign_split(cx.out, gemm, cx.options.pack_weights, bf16=path == "bf16")
    gemm.placed = True
    return gemm


def library_way(gemm: Gemm) -> str:
    """How ``gemm`` runs where that is not cuBLAS or cuBLASLt's fp32 ("" there): CUTLASS, the
    split operands or bf16 copies."""
    if gemm.cutlass is not None:
        return f"CUTLASS {'3xTF32' if gemm.cutlass.math == '3xtf32' else 'TF32'}"
    if gemm.split is not None:
        return BF16_WAY if gemm.split.main.bf16 else SPLIT_WAY
    return ""


def _lt_fold(cx: LowerContext, gemm: Gemm, anchor: Node, epilogue: list[Node],
             bias: Expr | None) -> tuple[Node, list[Node], Expr | None]:
    """Move the bias, and a ReLU or tanh-GELU right after it, into a cuBLASLt epilogue where the
    GEMM is a single one and the bias a packed vector over its columns (``gemm.epilogue`` and
    ``gemm.bias`` say so); returns (the node whose value the GEMM now writes, the rest of the
    epilogue, the bias still to add or None)."""
    lf = bias.leaf if bias is not None and bias.op == "leaf" else None
    if bias is None or gemm.batch != 1 or gemm.outer != 1 or gemm.alpha != 1.0 or lf is None or not lf.plain \
            or bias.shape[-1:] != (gemm.n,) or numel(bias.shape) != gemm.n or lf.strides[-1] != 1:
        return anchor, epilogue, bias
    value, kind = anchor, "BIAS"
    if epilogue:
        first = epilogue[0]
        approx = first.kwargs.get("approximate", first.args[1] if len(first.args) > 1 else "none")
        act = "RELU_BIAS" if first.op == "aten.relu" else "GELU_BIAS" if (
            first.op == "aten.gelu" and approx == "tanh") else None
        alone = cx.users.get(anchor.name, []) == [first.name] and anchor.name not in cx.graph.outputs
        if act and alone and first.args[0] == "%" + anchor.name:
            value, kind, epilogue = first, act, epilogue[1:]
    gemm.epilogue = kind  # type: ignore[assignment]
    gemm.bias = cx.out.storage[lf.value] + (f" + {lf.offset}" if lf.offset else "")
    return value, epilogue, None


def assign_split(low: Lowering, gemm: Gemm, pack: bool = True, bf16: bool = False) -> None:
    """Run ``gemm`` as 3xTF32 by split operands (:mod:`split_tf32`): two cuBLASLt GEMMs on TF32
    tensor cores over the operands' halves; ``bf16``: one cuBLASLt GEMM on bf16 copies of them
    (:mod:`bf16`). An operand that is a parameter is split (converted) once and kept in a buffer of
    its own where ``pack`` and the budget allow (:mod:`packing`); the others' copies go to two
    scratch buffers every such GEMM of the program shares (its launches run in order on one
    stream, each copy read by its GEMMs before the next is written), sized for the largest."""
    planner = plan_bf16 if bf16 else plan_split
    names = list(SPLIT_SCRATCH[:2])
    plan = planner(gemm, *names)
    packed = []
    for i, operand in enumerate((plan.a, plan.b) if pack else ()):
        param = parameter(low, operand.src)
        if param is None:
            continue
        if fits(low, operand.scratch):
            names[i] = pack_buffer(low, param, operand.scratch)
            packed.append(i)
        else:
            low.pack_refused += 4 * operand.scratch
    if packed:
        plan = planner(gemm, *names)
        operands = [replace(op, packed=True) if i in packed else op for i, op in enumerate((plan.a, plan.b))]
        low.pack_launches.extend(operands[i].launch() for i in packed)
        plan = replace(plan, a=operands[0], b=operands[1])
    for operand in (plan.a, plan.b):
        if not operand.packed:
            reserve_scratch(low, operand.dst, operand.scratch)
    for part in (plan.cross, plan.main):
        if part is not None:
            part.lt, part.fast_tf32 = len(low.lt_gemms), not bf16
            low.lt_gemms.append(part)
    gemm.split = plan


SPLIT_SCRATCH = ("x_split_a", "x_split_b", "x_split_c")
BF16_WAY = "bf16 operands on cuBLASLt tensor cores (fp32 accumulate)"
SPLIT_WAY = "3xTF32 split operands on cuBLASLt TF32 tensor cores"


def reserve_scratch(low: Lowering, ident: str, floats: int) -> None:
    """A scratch buffer of at least ``floats`` that every split of the program shares."""
    at = next((i for i, (name, _) in enumerate(low.intermediates) if name == ident), None)
    if at is None:
        low.intermediates.append((ident, [floats]))
    else:
        low.intermediates[at] = (ident, [max(low.intermediates[at][1][0], floats)])


def activation_of(node: Node) -> str | None:
    """The CUTLASS epilogue activation a node is, if it is one."""
    if node.op == "aten.gelu":
        approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        return "gelu_tanh" if approx == "tanh" else "gelu"
    return _ACTIVATIONS.get(node.op)


_ACTIVATIONS = {"aten.relu": "relu", "aten.silu": "silu", "aten.sigmoid": "sigmoid"}


def feeds_only(cx: LowerContext, node: Node, nxt: Node) -> bool:
    """``node``'s value is read by ``nxt`` alone and is no graph output: an epilogue may absorb it."""
    return cx.users.get(node.name, []) == [nxt.name] and node.name not in cx.graph.outputs


def _cutlass_epilogue(cx: LowerContext, gemm: Gemm, anchor: Node, epilogue: list[Node], bias: Expr | None,
                      env: dict[str, Expr]) -> tuple[Node, list[Node], Expr | None]:
    """Fold what CUTLASS's epilogue D = act(alpha * A.B + beta * C) can do into the GEMM, in
    graph order: the bias (a vector over the columns, read as C with ldc 0) or else a residual
    add (C of the output's layout), a constant scale, then one activation. Returns (the node whose
    value the GEMM now writes, the rest of the epilogue, the bias still to add or None)."""
    value = anchor

    def vector_over_n(e: Expr) -> bool:
        lf = e.leaf if e.op == "leaf" else None
        return (lf is not None and lf.plain and e.shape[-1:] == (gemm.n,) and numel(e.shape) == gemm.n
                and lf.strides[-1] == 1)

    def source(e: Expr) -> str:
        lf: Leaf = e.leaf  # type: ignore[assignment]
        return cx.out.storage[lf.value] + (f" + {lf.offset}" if lf.offset else "")

    if bias is not None and vector_over_n(bias) and gemm.outer == 1:
        gemm.c, gemm.ld_c_src, gemm.stride_c_src, gemm.beta, bias = source(bias), 0, 0, 1.0, None
    if bias is None and not gemm.c and epilogue and epilogue[0].op == "aten.add" and feeds_only(cx, value, epilogue[0]) \
            and gemm.outer == 1 and not epilogue[0].kwargs.get("alpha"):
        add = epilogue[0]
        others = [x for x in add.args if x != "%" + value.name]
        other = cx.arg(env, add.name)(others[0]) if len(others) == 1 and len(add.args) == 2 else None
        lf = other.leaf if other is not None and other.op == "leaf" else None
        out_shape = tuple(cx.shape(add.name))
        if other is not None and lf is not None and lf.plain and (
                vector_over_n(other) or (other.shape == out_shape == tuple(cx.shape(value.name))
                                         and lf.strides == contiguous_strides(other.shape))):
            full = not vector_over_n(other)
            gemm.c, gemm.beta = source(other), 1.0
            gemm.ld_c_src, gemm.stride_c_src = (gemm.n, gemm.m * gemm.n) if full else (0, 0)
            value, epilogue = add, epilogue[1:]
    if bias is None and epilogue and epilogue[0].op in ("aten.mul", "aten.div") and feeds_only(cx, value, epilogue[0]):
        op = epilogue[0]
        consts = [x for x in op.args if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if len(op.args) == 2 and op.args[0] == "%" + value.name and len(consts) == 1 and consts[0] != 0:
            scale = float(consts[0]) if op.op == "aten.mul" else 1.0 / float(consts[0])
            gemm.alpha, gemm.beta = gemm.alpha * scale, gemm.beta * scale
            value, epilogue = op, epilogue[1:]
    activation = "identity"
    if bias is None and epilogue and feeds_only(cx, value, epilogue[0]) and epilogue[0].args[:1] == ["%" + value.name]:
        act = activation_of(epilogue[0])
        if act is not None:
            activation, value, epilogue = act, epilogue[0], epilogue[1:]
    assign_cutlass(cx.out, gemm, "tf32" if cx.options.tf32 else "3xtf32", activation, split_k=True)
    return value, epilogue, bias


def _offset(buf: str) -> int:
    return int(buf.split(" + ")[1]) if " + " in buf else 0


def _widest(*extents: int) -> int:
    """The widest access (4, 2 or 1 floats) every extent, stride and offset allows."""
    return next((w for w in (4, 2) if all(x % w == 0 for x in extents)), 1)


SPLIT_K_SCRATCH = "x_split_k"


def _slice_k(low: Lowering, gemm: Gemm, slices: int) -> None:
    """``gemm`` as ``slices`` batched GEMMs over consecutive slices of K into scratch (their
    epilogue moved to the summing pass by :func:`assign_cutlass`)."""
    kc = gemm.k // slices
    lda = gemm.ld_a or (gemm.m if gemm.a_trans else gemm.k)
    ldb = gemm.ld_b or (gemm.k if gemm.b_trans else gemm.n)
    gemm.split_k, gemm.split_k_out = slices, gemm.out
    gemm.batch, gemm.k, gemm.ld_a, gemm.ld_b = slices, kc, lda, ldb
    gemm.stride_a = kc * lda if gemm.a_trans else kc  # A [M, K]: the next columns; A^T [K, M]: the next rows
    gemm.stride_b = kc if gemm.b_trans else kc * ldb
    gemm.out, gemm.ld_c, gemm.stride_c = SPLIT_K_SCRATCH, gemm.n, gemm.m * gemm.n
    reserve_scratch(low, SPLIT_K_SCRATCH, slices * gemm.m * gemm.n)


def assign_cutlass(low: Lowering, gemm: Gemm, math: str, activation: str = "identity", split_k: bool = False) -> None:
    """Run ``gemm`` through a CUTLASS kernel extension: its configuration (layouts, the widest
    accesses its extents, strides and offsets allow, a tile for its size) and launcher slot. With
    ``split_k`` (a caller that then slices it: :func:`lower_gemm`), a deep, small product is split
    along K (:func:`split_k_slices`): its slices' kernel computes the bare product, and C and
    ``activation`` go to the pass that sums them."""
    if split_k and (slices := split_k_slices(gemm)) > 1:
        gemm.split_k, gemm.split_k_act, activation = slices, activation, "identity"
        gemm.split_k_c, gemm.split_k_ld_c, gemm.split_k_beta = gemm.c, gemm.ld_c_src, gemm.beta
        gemm.c, gemm.ld_c_src, gemm.stride_c_src, gemm.beta = "", 0, 0, 0.0
    lda = gemm.ld_a or (gemm.m if gemm.a_trans else gemm.k)
    ldb = gemm.ld_b or (gemm.k if gemm.b_trans else gemm.n)
    ldd = gemm.ld_c or gemm.n
    align_a = _widest(lda, gemm.m if gemm.a_trans else gemm.k, _offset(gemm.a), gemm.stride_a, gemm.outer_a)
    align_b = _widest(ldb, gemm.k if gemm.b_trans else gemm.n, _offset(gemm.b), gemm.stride_b, gemm.outer_b)
    sources = (gemm.ld_c_src, _offset(gemm.c), gemm.stride_c_src) if gemm.c else ()
    align_c = _widest(ldd, gemm.n, _offset(gemm.out), gemm.stride_c, gemm.outer_c, *sources)
    tile, warp, stages = CutlassGemm.tiles_for(gemm.m, gemm.n, gemm.k, gemm.batch)
    gemm.cutlass = CutlassGemm(math=math, a_col=gemm.a_trans, b_col=gemm.b_trans, align_a=align_a,  # type: ignore[arg-type]
                               align_b=align_b, align_c=align_c, tile=tile, warp=warp, stages=stages,
                               activation=activation)  # type: ignore[arg-type]
    gemm.slot = low.cutlass_slot(gemm.cutlass)


def describe_gemm(anchor: Node, gemm: Gemm) -> str:
    if gemm.cutlass is not None:
        c = gemm.cutlass
        sliced = gemm.split_k > 1  # its epilogue is the summing pass's
        source, ld_src, beta = (gemm.split_k_c, gemm.split_k_ld_c, gemm.split_k_beta) if sliced \
            else (gemm.c, gemm.ld_c_src, gemm.beta)
        activation = gemm.split_k_act if sliced else c.activation
        fused = [*(["bias" if ld_src == 0 else "residual"] if source else []),
                 *(["scale"] if beta not in (0.0, 1.0) or gemm.alpha != 1.0 else []),
                 *([activation] if activation != "identity" else [])]
        return (f"{anchor.op} {anchor.module or anchor.name}: {gemm.outer * gemm.batch} x [{gemm.m} x {gemm.k}] . "
                f"[{gemm.k} x {gemm.n}] via {library_way(gemm)} "
                f"{'x'.join(map(str, c.tile))} tile" + (f" (epilogue {' + '.join(fused)})" if fused else "")
                + (f", split-K: K = {gemm.k * gemm.split_k} as {gemm.split_k} slices, summed" if gemm.split_k > 1 else ""))
    if gemm.split is not None:
        fused = f" (epilogue {gemm.epilogue.lower().replace('_', ' + ')})" if gemm.epilogue else ""
        return (f"{anchor.op} {anchor.module or anchor.name}: {gemm.outer * gemm.batch} x [{gemm.m} x {gemm.k}] . [{gemm.k} x "
                f"{gemm.n}] via {library_way(gemm)}{fused}")
    return (f"{anchor.op} {anchor.module or anchor.name}: {gemm.outer * gemm.batch} x [{gemm.m} x {gemm.k}] . "
            f"[{gemm.k} x {gemm.n}] via "
            + (f"cuBLASLt (epilogue {gemm.epilogue.lower().replace('_', ' + ')})" if gemm.lt is not None else
               "one block a product (fp32, operands in shared memory)" if tiny(gemm) else
               f"cublasSgemm{'StridedBatched' if gemm.batch > 1 else ''}")
            + (f" ({gemm.outer} calls)" if gemm.outer > 1 else ""))


def _operand(cx: LowerContext, e: Expr, where: str, what: str) -> tuple[str, tuple[int, ...], bool]:
    """(buffer, logical shape, stored transposed) for a GEMM operand read."""
    if e.op != "leaf":
        raise Unsupported(f"{where}: {what} operand is computed inside the group")
    lf: Leaf = e.leaf  # type: ignore[assignment]
    if not lf.plain:
        raise Unsupported(f"{where}: {what} operand {lf.value} is gathered or concatenated inside the group")
    buf = cx.out.storage[lf.value] + (f" + {lf.offset}" if lf.offset else "")
    if lf.strides == contiguous_strides(lf.shape):
        return buf, lf.shape, False
    if len(lf.shape) >= 2:
        swapped = lf.shape[:-2] + (lf.shape[-1], lf.shape[-2])
        st = lf.strides[:-2] + (lf.strides[-1], lf.strides[-2])
        if st == contiguous_strides(swapped):
            return buf, lf.shape, True
    raise Unsupported(f"{where}: {what} operand {lf.value} is a strided view "
                      f"(shape {list(lf.shape)}, strides {list(lf.strides)})")


def gemm_shape(cx: LowerContext, anchor: Node, lhs: Expr, rhs: Expr) -> Gemm:
    where = f"{anchor.name} ({anchor.op})"
    a_buf, a_shape, a_t = _operand(cx, lhs, where, "left")
    b_buf, b_shape, b_t = _operand(cx, rhs, where, "right")
    if len(a_shape) < 1 or len(b_shape) != 2 and len(b_shape) != 3:
        raise Unsupported(f"{where}: operand shapes {list(a_shape)} and {list(b_shape)}")
    k, n = b_shape[-2], b_shape[-1]
    if a_shape[-1] != k:
        raise Unsupported(f"{where}: inner sizes {a_shape[-1]} and {k} differ")
    if len(b_shape) == 2:
        if a_t and len(a_shape) == 3:  # per-batch transposed rows (a transposed activation): batched, B shared
            batch, m = a_shape[0], a_shape[1]
            return Gemm(batch, m, n, k, a_buf, b_buf, a_t, b_t, out="", stride_a=m * k, stride_b=0,
                        stride_c=m * n)
        if a_t and len(a_shape) > 3:
            raise Unsupported(f"{where}: transposed left operand of rank {len(a_shape)}")
        m = numel(a_shape[:-1])
        return Gemm(1, m, n, k, a_buf, b_buf, a_t, b_t, out="")
    if len(a_shape) != 3 or a_shape[0] != b_shape[0]:
        raise Unsupported(f"{where}: batched product of shapes {list(a_shape)} and {list(b_shape)}")
    batch, m = a_shape[0], a_shape[1]
    return Gemm(batch, m, n, k, a_buf, b_buf, a_t, b_t, out="", stride_a=m * k, stride_b=k * n, stride_c=m * n)


def strided_gemm(cx: LowerContext, where: str, lhs: Expr, rhs: Expr, out: str, out_shape: tuple[int, ...],
                 out_strides: tuple[int, ...]) -> Gemm:
    """A (batched) product of two strided views into a strided output: every matrix must have
    unit stride along its rows or its columns, and the batch dimensions must fold into at most
    two (one strided-batched call, or a host loop of them over the second)."""
    mats: list[Leaf] = []
    for e, what in ((lhs, "left"), (rhs, "right")):
        if e.op != "leaf" or len(e.shape) < 2 or not e.leaf.plain:  # type: ignore[union-attr]
            raise Unsupported(f"{where}: {what} operand is computed inside the group or not a matrix")
        mats.append(e.leaf)  # type: ignore[arg-type]
    a, b = mats
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2 or tuple(out_shape[-2:]) != (m, n):
        raise Unsupported(f"{where}: shapes {list(a.shape)} . {list(b.shape)} -> {list(out_shape)}")

    def layout(strides: tuple[int, ...], rows: int, cols: int, what: str) -> tuple[bool, int]:
        r, c = strides[-2], strides[-1]
        if c == 1 and (r >= cols or rows == 1):
            return False, max(r, cols)
        if r == 1 and (c >= rows or cols == 1):
            return True, max(c, rows)
        raise Unsupported(f"{where}: {what} matrix with strides {list(strides[-2:])} has no unit stride")

    a_t, ld_a = layout(a.strides, m, k, "left")
    b_t, ld_b = layout(b.strides, k, n, "right")
    c_t, ld_c = layout(out_strides, m, n, "output")
    if c_t and m > 1:
        raise Unsupported(f"{where}: the output would be written transposed")
    batch = tuple(out_shape[:-2])
    # an operand read as a regrouping of its batch dims (lower_attention: repeat_kv's heads) keeps
    # its finer dims: the batch runs over dims that split both it and the output's
    finer = [tuple(e.leaf.shape[:-2]) for e in (lhs, rhs) if tuple(e.shape) != e.leaf.shape]  # type: ignore[union-attr]
    split = common_split([batch, *finer]) if finer else batch
    if split is None:
        raise Unsupported(f"{where}: batch dims {[list(f) for f in finer]} do not split {list(batch)}")

    def over_split(dims: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | list[int] | None:
        return tuple(strides) if tuple(dims) == split else reshape_strides(dims, strides, split)

    per = [over_split(x.shape[:-2], x.strides[:-2]) if tuple(e.shape) != x.shape  # a regrouped read
           else over_split(batch, Leaf(x.value, x.shape[:-2], x.strides[:-2]).effective_strides(batch))
           for e, x in ((lhs, a), (rhs, b))]
    per.append(over_split(batch, tuple(out_strides[:-2])))
    if any(p is None for p in per):
        raise Unsupported(f"{where}: batch strides cannot be read over {list(split)}")
    dims = [[d, sa, sb, sc] for d, sa, sb, sc in zip(split, *per, strict=True) if d != 1]
    merged: list[list[int]] = []
    for d in dims:
        if merged and all(merged[-1][i] == d[0] * d[i] for i in (1, 2, 3)):
            merged[-1] = [merged[-1][0] * d[0], *d[1:]]
        else:
            merged.append(d)
    if len(merged) > 2:
        raise Unsupported(f"{where}: batch dimensions {list(batch)} fold into {len(merged)} strided ones")
    inner = merged[-1] if merged else [1, 0, 0, 0]
    outer = merged[0] if len(merged) == 2 else [1, 0, 0, 0]
    buf = cx.out.storage[a.value] + (f" + {a.offset}" if a.offset else "")
    bbuf = cx.out.storage[b.value] + (f" + {b.offset}" if b.offset else "")
    return Gemm(inner[0], m, n, k, buf, bbuf, a_t, b_t, out=out, stride_a=inner[1], stride_b=inner[2],
                stride_c=inner[3], ld_a=ld_a, ld_b=ld_b, ld_c=ld_c, outer=outer[0], outer_a=outer[1],
                outer_b=outer[2], outer_c=outer[3])
