"""Convolutions through cuDNN: 1-, 2- and 3-d, transposed ones as cuDNN's backward-data, float32
NC(D)HW (channels-last TF32 halves where the split variant splits them, :mod:`split_tf32`), a bias
and a pointwise chain after them as one epilogue kernel; the geometry cuDNN takes, and the
descriptors, algorithm choice and calls of the host program."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import (
    VIEWS,
    Expr,
    Leaf,
    Program,
    Step,
    Unsupported,
    contiguous_strides,
    leaf,
    numel,
    ref,
    view_expr,
)
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import CONV_OPS
from stitchcuda.compiler.lowering.bf16 import bf16_conv_able, plan_conv_bf16
from stitchcuda.compiler.lowering.cost import Estimate, choose, conv_paths, nchw_tf32_slow
from stitchcuda.compiler.lowering.cutlass_conv import CutlassConv, conv_supported
from stitchcuda.compiler.lowering.lower_context import LowerContext
from stitchcuda.compiler.lowering.lower_gemm import (
    SPLIT_SCRATCH,
    activation_of,
    feeds_only,
    place_product,
    reserve_scratch,
)
from stitchcuda.compiler.lowering.lower_pointwise import (
    apply_epilogue,
    epilogue_text,
    library_call,
    lower_pointwise,
)
from stitchcuda.compiler.lowering.lowered import Conv, Gemm, Lowered, to_ident
from stitchcuda.compiler.lowering.packing import fits, pack_buffer, parameter
from stitchcuda.compiler.lowering.registry import group_lowering
from stitchcuda.compiler.lowering.split_tf32 import plan_conv_split, splittable_conv, worth_splitting_conv

# Past this many convolutions a network stays in fp32 (cuDNN FMA): 3xTF32's error, about 1e-5 of a
# convolution's output (fp32's: about 1e-6), compounds over depth; measured on an H200 with
# training-mode batch norms, ResNet-18 (20 convolutions) passed 1e-4 split, ResNet-101 (104) missed it
# by 2e-4.
DEEP_CONVS = 64


def _deep(cx: LowerContext) -> bool:
    return sum(n.op in CONV_OPS for n in cx.graph.nodes) > DEEP_CONVS


@group_lowering("convolution", 40, lambda g, nodes: any(n.op in CONV_OPS for n in nodes))
def lower_conv(cx: LowerContext, g: FusionGroup, nodes: list[Node]) -> Lowered:
    """A 1-, 2- or 3-d convolution (or transposed convolution) through cuDNN into the group's
    output buffer, then one pointwise kernel for bias + the epilogue (eval batch norm,
    activations, residual adds) in place."""
    convs = [n for n in nodes if n.op in CONV_OPS]
    if len(convs) != 1:
        raise Unsupported(f"{len(convs)} convolutions in one group")
    anchor = convs[0]
    where = f"{anchor.name} ({anchor.op})"
    env: dict[str, Expr] = {}
    for n in nodes[:nodes.index(anchor)]:
        if n.op not in VIEWS:
            raise Unsupported(f"{n.name} ({n.op}) before the convolution (only views may feed it)")
        env[n.name] = view_expr(n, cx.arg(env, n.name)(n.args[0]))
    arg = cx.arg(env, where)
    x, w = arg(anchor.args[0]), arg(anchor.args[1])
    for e, what in ((x, "input"), (w, "weight")):
        if e.op != "leaf" or not e.leaf.contiguous or not e.leaf.plain:  # type: ignore[union-attr]
            raise Unsupported(f"{where}: the {what} is not a contiguous buffer (shape {list(e.shape)})")
    out_shape = cx.shape(anchor.name)
    geo = conv_geometry(anchor, x.shape, w.shape, out_shape)

    def buf(e: Expr) -> str:
        lf: Leaf = e.leaf  # type: ignore[assignment]
        return cx.out.storage[lf.value] + (f" + {lf.offset}" if lf.offset else "")

    conv = Conv(index=len(cx.out.convs), n=geo.n, c=geo.c, k=geo.k, size=geo.size, out_size=geo.out_size,
                kernel=geo.kernel, pad=geo.pad, stride=geo.stride, dilation=geo.dilation, groups=geo.groups,
                transposed=geo.transposed, x=buf(x), weight=buf(w), chunks=geo.chunks)
    bias_arg = anchor.args[2] if len(anchor.args) > 2 else anchor.kwargs.get("bias")
    bias: Expr | None = None
    spatial = len(out_shape) - (2 if geo.batched else 1)
    if bias_arg is not None:
        b = arg(bias_arg)
        if b.op != "leaf" or b.shape != (geo.k,):
            raise Unsupported(f"{where}: bias of shape {list(b.shape)}")
        lf: Leaf = b.leaf  # type: ignore[assignment]
        bias = leaf(lf.value, (geo.k,) + (1,) * spatial, (lf.strides[0],) + (0,) * spatial, lf.offset)
    epilogue = nodes[nodes.index(anchor) + 1:]
    dims = len(geo.kernel) - (1 if geo.one_d else 0)
    text = (f"{'transposed ' if geo.transposed else ''}conv{dims}d {anchor.module or anchor.name}: "
            f"{list(x.shape)} -> {list(out_shape)}, {'x'.join(map(str, w.shape[2:]))} filter, "
            f"stride {list(geo.stride[-dims:])}, padding {geo.padding_text}"
            + (f", dilation {list(geo.dilation[-dims:])}" if set(geo.dilation) != {1} else "")
            + (f", groups {geo.groups}" if geo.groups > 1 else ""))
    if pointwise(geo):
        return _as_gemm(cx, g, anchor, geo, buf(x), buf(w), bias, epilogue, env, text)
    if depthwise(geo, w.shape):
        return _depthwise(cx, g, anchor, geo, x.leaf, w.leaf, bias, epilogue, env, text)  # type: ignore[arg-type]
    if patchify(geo):
        return _patches_as_gemm(cx, g, anchor, geo, x.leaf, buf(w), bias, epilogue, env, text)  # type: ignore[arg-type]
    plain_bias = bias is None or (bias.leaf.plain and bias.leaf.strides[0] == 1)  # type: ignore[union-attr]
    largest = max(numel((geo.n, geo.c, *geo.size)), numel((geo.n, geo.k, *geo.out_size)), numel(w.shape))
    # not under a CUDA graph: the conv launcher's replay from a captured graph hit an illegal address
    # on an H100 (tests/test_cutlass_conv.py::test_conv_replays_from_a_cuda_graph), not yet found
    if cx.options.cutlass and not cx.options.graph and plain_bias and not any(geo.trim) and conv_supported(
            geo.groups, geo.transposed, len(geo.size), "float32") is None and geo.chunks == 1 \
            and largest < CUTLASS_CONV_MAX_ELEMENTS:
        return _cutlass_conv(cx, g, anchor, conv, bias, epilogue, env, text)
    cx.out.convs.append(conv)
    # under TF32 the split is the cost model's to give, and only where NCHW TF32 is slow (cost.nchw_tf32_slow):
    # its channels-last layout is what is fast there, its 3xTF32 arithmetic more accurate than TF32's
    split_ok = cx.options.split_tf32 or (cx.options.tf32 and cx.options.cost_model and nchw_tf32_slow(conv))
    allowed = ["cublas"] + (["split"] if split_ok and splittable_conv(conv) and not _deep(cx) else []) \
        + (["bf16"] if cx.options.bf16 and bf16_conv_able(conv) else [])
    param = parameter(cx.out, conv.weight) if cx.options.pack_weights else None
    table, tf32 = cx.out.machine.table, cx.options.tf32
    paths = conv_paths(conv, table, allowed, packed_w=param is not None, tf32=tf32)
    if cx.options.cost_model or "bf16" in allowed:  # another path than cuDNN's only where it saves choose()'s margin
        conv.estimate = choose(anchor.name, paths, tf32=tf32)
    else:  # the variant's fixed path: the split wherever the model says it beats cuDNN at all
        path = "split" if "split" in allowed and worth_splitting_conv(conv, table) else "cublas"
        conv.estimate = Estimate(op=anchor.name, path=path, ms=paths[path], paths=paths, tf32=tf32)
    path = conv.estimate.path
    if path in ("split", "bf16"):
        planner = plan_conv_bf16 if path == "bf16" else plan_conv_split
        conv.split = split = planner(conv, *SPLIT_SCRATCH)
        if param is not None and fits(cx.out, split.w_scratch):  # the weight's copies made once (packing.py)
            names = (SPLIT_SCRATCH[0], pack_buffer(cx.out, param, split.w_scratch), SPLIT_SCRATCH[2])
            conv.split = split = replace(planner(conv, *names), w_packed=True)
            cx.out.pack_launches.append(split.weight_launch())
        elif param is not None:
            cx.out.pack_refused += 4 * split.w_scratch
        for ident, floats in ((split.x3, split.x_scratch), (split.w3, 0 if split.w_packed else split.w_scratch),
                              (split.y, split.y_scratch)):
            if floats:
                reserve_scratch(cx.out, ident, floats)
        text += (" via cuDNN on bf16 tensor cores (fp32 accumulate; channels-last bf16 copies)" if path == "bf16"
                 else " via cuDNN on TF32 tensor cores as 3xTF32 (split channels)")
    else:
        text += " via cuDNN"
    text += conv.estimate.note(cx.out.machine.table.label)
    if any(geo.trim):  # uneven 'same' padding: cuDNN writes one more row where it is, the epilogue drops it
        wide = (geo.n, geo.k, *geo.out_size)
        conv.out = cx.scratch(f"{anchor.name}__wide", wide)
        st = contiguous_strides(wide)
        lead = st[:2] if geo.batched else st[1:2]  # an input without its batch dim: N = 1, dropped
        value = leaf(f"{anchor.name}__wide", out_shape, (*lead, *st[len(st) - spatial:]),
                     sum(t * s for t, s in zip(geo.trim, st[2:], strict=True)))
        low = apply_epilogue(cx, g, anchor, value, epilogue, bias, env)
        low.kind, low.describe = "conv", text + " + epilogue " + epilogue_text(bias, epilogue)
    else:
        low, conv.out = library_call(cx, g, "conv", anchor, epilogue, bias, env, text)
    low.conv = conv
    return low


def pointwise(geo: ConvGeometry) -> bool:
    """A 1x1 convolution, stride 1, no padding, one group: per image, the product of the weight
    [K, C] and the input [C, HW]. Measured on an H100 in fp32: cuDNN ran such convolutions at
    22-34 TFLOP/s (a squeeze-excitation block's 256 -> 256 at 28 x 28, a separable block's 128 ->
    256 at 112 x 112), where a batched SGEMM of the same shape runs at about 50. The split variant
    leaves it unsplit: three copies of the whole activation for a reduction of a few hundred
    made all three bundled models with one slower."""
    return (not geo.transposed and geo.groups == 1 and set(geo.kernel) == {1} and set(geo.stride) == {1}
            and not any(geo.pad) and not any(geo.trim))  # any size: cuBLAS's batch strides are 64-bit


def patchify(geo: ConvGeometry) -> bool:
    """A convolution whose windows tile its input (kernel = stride, no padding or dilation, one
    group: a vision transformer's patch embedding, a 2 x 2 downsampling): its im2col is a pure
    permutation of the input, so it is a copy and a GEMM. Measured on an H100 in fp32: cuDNN ran
    a ViT-B/16 patch embedding (32 images, 768 channels) in 0.27 ms, a batched SGEMM of its
    product runs in about 0.15."""
    return (not geo.transposed and geo.groups == 1 and geo.kernel == geo.stride and set(geo.kernel) != {1}
            and set(geo.dilation) == {1} and not any(geo.pad) and not any(geo.trim) and geo.chunks == 1)


def depthwise(geo: ConvGeometry, w_shape: tuple[int, ...]) -> bool:
    """A depthwise convolution (a group a channel, one output channel each, at most 7 x 7 taps,
    symmetric padding). It is memory-bound: one pointwise kernel computes it and its epilogue,
    each output a sum of its window's zero-padded taps. Measured on an H100 in fp32: cuDNN's
    grouped direct kernel took 0.46 ms for a 3 x 3 one over 32 x 128 x 112 x 112 (eager's own
    kernel 0.50), and its batch norm and clamp epilogue 0.14 more."""
    return (not geo.transposed and geo.groups == geo.c == geo.k > 1 and numel(w_shape[2:]) <= 49
            and not any(geo.trim))


def _depthwise(cx: LowerContext, g: FusionGroup, anchor: Node, geo: ConvGeometry, x: Leaf, w: Leaf,
               bias: Expr | None, epilogue: list[Node], env: dict[str, Expr], text: str) -> Lowered:
    """A :func:`depthwise` convolution as a pointwise program: output [.., c, *out] is the sum
    over the taps r of x[.., c, out * stride + r * dilation - pad] (0.0 outside the input; the
    window test only on taps that can fall outside) times w[c, 0, r], then the bias and the
    epilogue in the same kernel."""
    out_shape = cx.shape(anchor.name)
    kernel = tuple(w.shape[2:])
    sp = len(kernel)
    stride, dilation, pad = geo.stride[-sp:], geo.dilation[-sp:], geo.pad[-sp:]
    size, out = x.shape[-sp:], out_shape[-sp:]
    lead, steps_x = x.strides[:-sp], x.strides[-sp:]
    taps = numel(kernel)
    total: Expr | None = None
    for t in range(taps):
        r = [t // numel(kernel[d + 1:]) % kernel[d] for d in range(sp)]
        shift = [r[d] * dilation[d] - pad[d] for d in range(sp)]
        window = tuple((d - sp, stride[d], shift[d], size[d]) for d in range(sp)
                       if shift[d] < 0 or (out[d] - 1) * stride[d] + shift[d] >= size[d])
        tap = Leaf(x.value, tuple(out_shape), (*lead, *(s * st for s, st in zip(steps_x, stride, strict=True))),
                   x.offset + sum(sh * s for sh, s in zip(shift, steps_x, strict=True)), window=window)
        weight = Leaf(w.value, (geo.c,) + (1,) * sp, (taps,) + (0,) * sp, w.offset + t)
        term = Expr("mul", (Expr("leaf", leaf=tap, shape=tuple(out_shape)),
                            Expr("leaf", leaf=weight, shape=weight.shape)), shape=tuple(out_shape))
        total = term if total is None else Expr("add", (total, term), shape=tuple(out_shape))
    assert total is not None
    if bias is not None:
        total = Expr("add", (total, bias), shape=tuple(out_shape))
    step = to_ident(anchor.name)
    env[anchor.name] = ref(step, out_shape)
    low = lower_pointwise(cx, g, epilogue, env, Program("pointwise", tuple(out_shape),
                                                        steps=[Step(step, "full", total)]))
    low.describe = (text + " as one pointwise kernel (each output its window's taps)"
                    + (" + epilogue " + epilogue_text(bias, epilogue) if bias is not None or epilogue else ""))
    return low


def _as_gemm(cx: LowerContext, g: FusionGroup, anchor: Node, geo: ConvGeometry, x: str, w: str,
             bias: Expr | None, epilogue: list[Node], env: dict[str, Expr], text: str) -> Lowered:
    """A pointwise convolution as a batched GEMM over the images (the weight shared), then the
    bias and the epilogue as one pointwise kernel; the CUTLASS variant runs it through CUTLASS as
    any GEMM, the split variant leaves it in fp32 (see :func:`pointwise`)."""
    hw = numel(geo.size)
    images = geo.n > 1
    gemm = Gemm(geo.n, geo.k, hw, geo.c, w, x, a_trans=False, b_trans=False, out="",
                stride_b=geo.c * hw if images else 0, stride_c=geo.k * hw if images else 0, no_split=True)
    text += f" as a GEMM: {geo.n} x [{geo.k} x {geo.c}] . [{geo.c} x {hw}]"
    low, gemm.out = library_call(cx, g, "gemm", anchor, epilogue, bias, env, text)
    low.gemm = place_product(cx, gemm)
    return low


def _patches_as_gemm(cx: LowerContext, g: FusionGroup, anchor: Node, geo: ConvGeometry, x: Leaf, w: str,
                     bias: Expr | None, epilogue: list[Node], env: dict[str, Expr], text: str) -> Lowered:
    """A :func:`patchify` convolution: one kernel copies the patches of all images into [C * taps,
    N * out positions] (a strided read of the input: x[n, c, p * k + r] at [c, r, n, p]), then ONE
    GEMM with the weight [K, C * taps] (measured on an H100: a ViT's patch embedding ran 2.5x
    slower as 32 per-image products of 196 columns) into [K, N * out positions], and one kernel
    writes it NCHW with the bias and the epilogue. Its depth being the whole window, the split
    variant may split it."""
    depth, cols = geo.c * numel(geo.kernel), geo.n * numel(geo.out_size)
    shape = (geo.c, *geo.kernel, geo.n, *geo.out_size)
    st = contiguous_strides((geo.n, geo.c, *geo.size))
    strides = (st[1], *st[2:], st[0], *(k * s for k, s in zip(geo.kernel, st[2:], strict=True)))
    patches, raw = f"{anchor.name}__patches", f"{anchor.name}__raw"
    copy = Program("pointwise", shape, steps=[Step(to_ident(patches), "full", leaf(x.value, shape, strides, x.offset))])
    copy.outputs[patches], copy.output_shapes[patches] = to_ident(patches), shape
    gemm = Gemm(1, geo.k, cols, depth, w, cx.scratch(patches, shape), a_trans=False, b_trans=False,
                out=cx.scratch(raw, (geo.k, cols)))
    out_shape = tuple(cx.shape(anchor.name))
    spatial = contiguous_strides(tuple(out_shape[-(len(out_shape) - (2 if geo.batched else 1)):]))
    value = leaf(raw, out_shape, ((numel(geo.out_size),) if geo.batched else ()) + (cols,) + spatial)
    write = apply_epilogue(cx, g, anchor, value, epilogue, bias, env)
    text += (f" as a GEMM over its patches: [{geo.k} x {depth}] . [{depth} x {cols}], written NCHW"
             + (" with " + epilogue_text(bias, epilogue) if bias is not None or epilogue else ""))
    return Lowered(g, "sequence", describe=text, parts=[
        Lowered(g, "pointwise", program=copy, describe=f"patches of {x.value} into {list(shape)}"),
        Lowered(g, "gemm", gemm=place_product(cx, gemm), describe="the patches' GEMM"), write])


def _cutlass_conv(cx: LowerContext, g: FusionGroup, anchor: Node, conv: Conv, bias: Expr | None,
                  epilogue: list[Node], env: dict[str, Expr], text: str) -> Lowered:
    """The convolution as CUTLASS's implicit GEMM (its kernel extension transposes to NHWC and
    back), the bias and a first activation applied as it writes NCHW; the rest of the epilogue
    stays one pointwise kernel."""
    value, activation = anchor, "identity"
    if epilogue and feeds_only(cx, anchor, epilogue[0]) and epilogue[0].args[:1] == ["%" + anchor.name]:
        act = activation_of(epilogue[0])
        if act is not None:
            activation, value, epilogue = act, epilogue[0], epilogue[1:]
    if bias is not None:
        lf: Leaf = bias.leaf  # type: ignore[assignment]
        conv.bias = cx.out.storage[lf.value] + (f" + {lf.offset}" if lf.offset else "")
    math = "tf32" if cx.options.tf32 else "3xtf32"
    tile, warp, stages = CUTLASS_CONV_TILES
    conv.cutlass = CutlassConv(math=math, align=4 if conv.c % 4 == 0 and conv.k % 4 == 0 else 1, tile=tile,
                               warp=warp, stages=stages, activation=activation,  # type: ignore[arg-type]
                               bias=bias is not None)
    conv.slot = cx.out.cutlass_slot(conv.cutlass)
    cx.out.cutlass_convs.append(conv)
    fused = [*(["bias"] if bias is not None else []), *([activation] if activation != "identity" else [])]
    text += (f" via CUTLASS {'3xTF32' if math == '3xtf32' else 'TF32'} implicit GEMM"
             + (f" (epilogue {' + '.join(fused)})" if fused else ""))
    low, conv.out = library_call(cx, g, "conv", value, epilogue, None, env, text)
    low.conv = conv
    return low


# CUTLASS's conv iterators index a tensor in 32-bit bytes; a larger one stays with cuDNN (a GPU run
# of a 16x128x1022x1022 output crashed the process)
CUTLASS_CONV_MAX_ELEMENTS = 1 << 29

# 64x64 warp tiles spill registers under 3xTF32; 64x32 ones do not (ptxas, sm_90)
CUTLASS_CONV_TILES = ((128, 128, 16), (64, 32, 16), 3)


_CONV_ARGS = ["input", "weight", "bias", "stride", "padding", "dilation", "groups"]  # convNd
_CONV_T_ARGS = ["input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"]
_CONVOLUTION_ARGS = ["input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding",
                     "groups"]  # aten.convolution, aten._convolution (whose further flags change no result)


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution node's arguments as cuDNN takes them: 2 or 3 spatial dims (a 1-d one as 2-d
    with H = 1), symmetric padding."""

    transposed: bool
    batched: bool  # False: the input has no batch dim (N = 1 for cuDNN)
    one_d: bool
    n: int
    c: int
    k: int
    groups: int
    size: tuple[int, ...]
    out_size: tuple[int, ...]  # what cuDNN writes
    kernel: tuple[int, ...]
    pad: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    trim: tuple[int, ...]  # leading rows of cuDNN's output the node's output drops (uneven 'same' padding)
    padding_text: str
    chunks: int  # calls over equal batch slices (what PyTorch does for tensors of 2^31 elements or more)


def conv_geometry(node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                  out_shape: tuple[int, ...]) -> ConvGeometry:
    """The convolution ``node`` (any of CONV_OPS) as cuDNN runs it; Unsupported where it cannot."""
    where = f"{node.name} ({node.op}.{node.overload})"
    op = node.op
    names = (_CONVOLUTION_ARGS if op in ("aten.convolution", "aten._convolution") else
             _CONV_T_ARGS if op.startswith("aten.conv_transpose") else _CONV_ARGS)
    a = dict(zip(names, node.args, strict=False))
    a.update({k: v for k, v in node.kwargs.items() if k in names})
    transposed = bool(a.get("transposed", op.startswith("aten.conv_transpose")))
    sp = len(w_shape) - 2
    if sp not in (1, 2, 3) or len(x_shape) not in (sp + 1, sp + 2) or len(out_shape) != len(x_shape):
        raise Unsupported(f"{where}: input {list(x_shape)}, weight {list(w_shape)}, output {list(out_shape)}")
    batched = len(x_shape) == sp + 2

    def ints(v: Any, default: int, what: str) -> tuple[int, ...]:
        v = default if v is None else v
        items = list(v) if isinstance(v, (list, tuple)) else [v]
        items = items * sp if len(items) == 1 else items
        if len(items) != sp or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            raise Unsupported(f"{where}: {what} {v!r} is not {sp} integers")
        return tuple(items)

    groups = a.get("groups")
    groups = 1 if groups is None else groups
    stride, dilation = ints(a.get("stride"), 1, "stride"), ints(a.get("dilation"), 1, "dilation")
    out_pad = ints(a.get("output_padding"), 0, "output_padding") if transposed else (0,) * sp
    kernel, size, out = tuple(w_shape[2:]), tuple(x_shape[-sp:]), tuple(out_shape[-sp:])
    padding = a.get("padding")
    if padding == "valid":
        left = right = (0,) * sp
    elif padding == "same" and not transposed:
        if set(stride) != {1}:
            raise Unsupported(f"{where}: padding='same' with stride {list(stride)}")
        left = tuple(d * (f - 1) // 2 for d, f in zip(dilation, kernel, strict=True))
        right = tuple(d * (f - 1) - lo for d, f, lo in zip(dilation, kernel, left, strict=True))
    elif isinstance(padding, str):
        raise Unsupported(f"{where}: padding={padding!r}")
    else:
        left = right = ints(padding, 0, "padding")
    c, k = x_shape[-sp - 1], out_shape[-sp - 1]
    if not isinstance(groups, int) or groups < 1 or c % groups or k % groups:
        raise Unsupported(f"{where}: groups={groups!r}")
    if tuple(w_shape[:2]) != ((c, k // groups) if transposed else (k, c // groups)):
        raise Unsupported(f"{where}: weight of shape {list(w_shape)}")
    if transposed:
        expect = tuple((n - 1) * st - 2 * p + d * (f - 1) + op_ + 1
                       for n, st, p, d, f, op_ in zip(size, stride, left, dilation, kernel, out_pad, strict=True))
        # cuDNN runs it as the backward-data of the convolution from our output back to our input
        back = tuple((o + 2 * p - d * (f - 1) - 1) // st + 1
                     for o, st, p, d, f in zip(expect, stride, left, dilation, kernel, strict=True))
        if back != size:
            raise Unsupported(f"{where}: output padding {list(out_pad)} not below stride {list(stride)}")
    else:
        expect = tuple((n + lo + hi - d * (f - 1) - 1) // st + 1
                       for n, lo, hi, d, f, st in zip(size, left, right, dilation, kernel, stride, strict=True))
    if out != expect or (batched and out_shape[0] != x_shape[0]):
        raise Unsupported(f"{where}: output {list(out_shape)}, expected spatial dims {list(expect)}")
    trim = tuple(hi - lo for lo, hi in zip(left, right, strict=True))
    cudnn_out = tuple(o + t for o, t in zip(out, trim, strict=True))
    n = x_shape[0] if batched else 1
    per_sample = max(numel((c, *size)), numel((k, *cudnn_out)))
    if max(per_sample, numel(w_shape)) > 2 ** 31 - 1:  # cuDNN's legacy descriptors count elements in int
        raise Unsupported(f"{where}: one sample's input or output, or the weight, has 2^31 elements or more")
    chunks = next(q for q in range(1, n + 1) if n % q == 0 and n // q * per_sample <= 2 ** 31 - 1)
    one_d = sp == 1

    def two(t: tuple[int, ...], first: int) -> tuple[int, ...]:
        return (first, *t) if one_d else t

    return ConvGeometry(transposed=transposed, batched=batched, one_d=one_d, n=n, c=c, k=k, groups=groups,
                        size=two(size, 1), out_size=two(cudnn_out, 1), kernel=two(kernel, 1), pad=two(right, 0),
                        stride=two(stride, 1), dilation=two(dilation, 1), trim=two(trim, 0),
                        padding_text=repr(padding) if isinstance(padding, str) else str(list(left)), chunks=chunks)
