"""Typed elementwise work the fused float32 kernels do not do: integer and bool arithmetic (the
index math of decompositions: ``arange``, ``sub``, ``ge``, ``fmod``, ``clamp`` of int64 tensors),
comparisons producing masks, ``where`` / ``masked_fill`` of non-float values, casts
(``_to_copy``), constants (``full``, ``scalar_tensor``, ``*_like``, ``arange``) and copies of
integer tensors.

Each node is one kernel with a thread per output element, its operands read through their
strides and broadcast, computed in the type torch promotes them to. Which operators these are,
and which of their nodes scheduling sends here rather than to the fused kernels, is the IR's
(``ir/typed.py``).
"""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.ir.typed import BINARY, COMPARE, COPIES, FILLS, LOGICAL, TYPED
from stitchcuda.compiler.lowering.families.layout import (
    broadcast_at,
    convert,
    map_kernel,
    offset,
    scalar_text,
    single_output,
    where_of,
)
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall, Strided
from stitchcuda.compiler.lowering.registry import lowering

RANK = {"bool": 0, "int32_t": 1, "int64_t": 2, "float": 3}


def promote(ctypes: list[str], scalars: list[Any]) -> str:
    """torch's result type: the highest category among tensors (bool < integer < float), unless a
    Python scalar is of a higher category (then the default type of that category)."""
    best = max((RANK[c] for c in ctypes), default=0)
    kinds = [3 if isinstance(s, float) else 0 if isinstance(s, bool) else 2 for s in scalars]
    scalar = max(kinds, default=0)
    if scalar > best and not (scalar == 2 and best >= 1):
        return {3: "float", 2: "int64_t", 0: "bool"}[scalar]
    return {0: "bool", 1: "int32_t", 2: "int64_t", 3: "float"}[best]


def _float_max(a: str, b: str, fn: str) -> str:
    return f"(({a}) != ({a}) || ({b}) != ({b}) ? NAN : {fn}({a}, {b}))"


def _binary(op: str, ct: str, a: str, b: str, where: str) -> str:
    """C++ of a binary operator in compute type ``ct``."""
    f = ct == "float"
    if op in ("aten.add", "aten.sub", "aten.mul"):
        return f"({a} {'+' if op == 'aten.add' else '-' if op == 'aten.sub' else '*'} {b})"
    if op == "aten.maximum":
        return _float_max(a, b, "fmaxf") if f else f"(({a}) > ({b}) ? ({a}) : ({b}))"
    if op == "aten.minimum":
        return _float_max(a, b, "fminf") if f else f"(({a}) < ({b}) ? ({a}) : ({b}))"
    if op == "aten.fmod":
        return f"fmodf({a}, {b})" if f else f"(({a}) % ({b}))"
    if op == "aten.remainder":
        r = f"fmodf({a}, {b})" if f else f"(({a}) % ({b}))"
        return f"[&] {{ auto r = {r}; return (r != 0 && ((r < 0) != (({b}) < 0))) ? r + ({b}) : r; }}()"
    if op == "aten.floor_divide":
        if f:
            return f"floorf(({a}) / ({b}))"
        return (f"[&] {{ auto q = ({a}) / ({b}); return (({a}) % ({b}) != 0 && ((({a}) < 0) != (({b}) < 0))) "
                f"? q - 1 : q; }}()")
    if op in ("aten.bitwise_and", "aten.bitwise_or", "aten.bitwise_xor"):
        if f:
            raise Unsupported(f"{where}: a bitwise operator on floats")
        return f"({a} {dict(and_='&', or_='|', xor='^')[op[13:] + '_']} {b})"
    if op == "aten.pow":
        if not f:
            raise Unsupported(f"{where}: an integer power")
        return f"powf({a}, {b})"
    raise Unsupported(f"{where}: no typed form of {op}")




def _unary(node: Node, ct: str, a: str, out_ct: str, where: str) -> str:
    op, args, f = node.op, node.args, ct == "float"
    if op == "aten.neg":
        return f"(-{a})"
    if op == "aten.abs":
        return f"fabsf({a})" if f else f"(({a}) < 0 ? -({a}) : ({a}))"
    if op == "aten.sign":
        return f"(({a}) > 0 ? 1 : (({a}) < 0 ? -1 : 0))" if not f else \
            f"(({a}) != ({a}) ? NAN : (({a}) > 0.0f ? 1.0f : (({a}) < 0.0f ? -1.0f : 0.0f)))"
    if op == "aten.bitwise_not":
        return f"(!{a})" if ct == "bool" else f"(~{a})"
    if op == "aten.logical_not":
        return f"(({a}) == 0)"
    if op in ("aten.floor", "aten.ceil", "aten.round", "aten.trunc"):
        return f"{dict(floor='floorf', ceil='ceilf', round='rintf', trunc='truncf')[op[5:]]}({a})" if f else a
    if op in ("aten.isnan", "aten.isinf", "aten.isfinite"):
        if not f:
            return "true" if op == "aten.isfinite" else "false"
        return {"aten.isnan": f"isnan({a})", "aten.isinf": f"isinf({a})", "aten.isfinite": f"isfinite({a})"}[op]
    if op == "aten.relu":
        return f"(({a}) < 0 ? ({ct})0 : ({a}))"
    lo = hi = None
    if op == "aten.clamp":
        lo = node.kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = node.kwargs.get("max", args[2] if len(args) > 2 else None)
    elif op == "aten.clamp_min":
        lo = args[1]
    elif op == "aten.clamp_max":
        hi = args[1]
    text = a
    for bound, cmp in ((lo, "<"), (hi, ">")):
        if bound is None:
            continue
        if isinstance(bound, str):
            raise Unsupported(f"{where}: a tensor clamp bound")
        b = scalar_text(bound, ct, where)
        text = f"[&] {{ auto v = {text}; return v {cmp} {b} ? {b} : v; }}()" if not f else \
            f"[&] {{ float v = {text}; return (v != v) ? v : (v {cmp} {b} ? {b} : v); }}()"
    return text


@lowering(*sorted(TYPED))
def typed(ctx: FamilyContext, node: Node) -> KernelCall:
    """One typed elementwise operator, its operands broadcast to the output."""
    where = where_of(node)
    op, a = node.op, node.args
    out = single_output(ctx, node)
    if op == "aten.masked_fill":
        positions = [(a[1], None), (a[2], None), (a[0], None)]  # where(mask, value, self)
    elif op == "aten.copy":
        positions = [(a[1], None)]
    elif op in BINARY | set(COMPARE) | set(LOGICAL):
        positions = [(a[0], None), (a[1], None)]
    elif op == "aten.where":
        if len(a) != 3:
            raise Unsupported(f"{where}: where with {len(a)} arguments")
        positions = [(v, None) for v in a]
    else:
        positions = [(a[0], None)]
    inputs: dict[str, Strided] = {}
    operands: list[tuple[str, str, Any]] = []  # (param or "", ctype, scalar)
    for j, (v, _) in enumerate(positions):
        if isinstance(v, str) and v.startswith("%"):
            x = ctx.read(v)
            inputs[f"x{j}"] = x
            operands.append((f"x{j}", x.ctype, None))
        else:
            operands.append(("", "", v))
    tensors = [c for p, c, _ in operands if p]
    scalars = [s for p, _, s in operands if not p]
    if op in ("aten.where", "aten.masked_fill") or op in COPIES:
        ct = out.ctype  # the chosen value converted as torch converts it to the result type
    elif op in COMPARE:
        ct = promote(tensors, scalars)
    elif op in LOGICAL or op == "aten.logical_not":
        ct = "bool"
    elif op == "aten.div":
        mode = node.kwargs.get("rounding_mode", a[2] if len(a) > 2 else None)
        ct = out.ctype if mode is not None else "float"
    elif op in ("aten.isnan", "aten.isinf", "aten.isfinite", "aten.bitwise_not"):
        ct = tensors[0] if tensors else out.ctype
    else:
        ct = out.ctype if out.ctype != "bool" else "int32_t"  # bool arithmetic as torch: via integers

    def body(c: list[str], ity: str) -> str:
        vals = []
        for p, ctype, s in operands:
            if p:
                x = inputs[p]
                text = f"{p}[{offset(x, broadcast_at(x, c), ity)}]"
                vals.append((text, ctype))
            else:
                vals.append((scalar_text(s, ct, where), ct))
        conv = [convert(t, src, ct) for t, src in vals]
        if op in COPIES:
            expr = convert(vals[0][0], vals[0][1], out.ctype)
            return f"y[i] = {expr};"
        if op in ("aten.where", "aten.masked_fill"):
            cond = f"({vals[0][0]} != 0)" if vals[0][1] != "bool" else vals[0][0]
            expr = f"({cond} ? {conv[1]} : {conv[2]})"
        elif op in COMPARE:
            expr = f"({conv[0]} {COMPARE[op]} {conv[1]})"
        elif op in LOGICAL:
            expr = f"({conv[0]} {LOGICAL[op]} {conv[1]})"
        elif op == "aten.div":
            mode = node.kwargs.get("rounding_mode", a[2] if len(a) > 2 else None)
            if mode is None:
                expr = f"({conv[0]} / {conv[1]})"
            elif mode == "trunc":
                expr = f"truncf({conv[0]} / {conv[1]})" if ct == "float" else f"({conv[0]} / {conv[1]})"
            else:
                expr = _binary("aten.floor_divide", ct, conv[0], conv[1], where)
        elif op in ("aten.add", "aten.sub", "aten.rsub"):
            x, y = (conv[1], conv[0]) if op == "aten.rsub" else (conv[0], conv[1])
            alpha = node.kwargs.get("alpha", a[2] if len(a) > 2 else 1)
            if alpha != 1:
                y = f"({scalar_text(alpha, ct, where)} * {y})"
            expr = _binary("aten.sub" if op != "aten.add" else "aten.add", ct, x, y, where)
        elif op in BINARY:
            expr = _binary(op, ct, conv[0], conv[1], where)
        else:
            expr = _unary(node, ct, conv[0], out.ctype, where)
        return f"y[i] = {convert(expr, ct, out.ctype)};"

    return map_kernel(ctx, node, "typed", out, inputs, body,
                      f"{node.name}: {op[5:]} -> {node.out[0].dtype} (typed elementwise)")


# -- constants --------------------------------------------------------------------------------------



@lowering(*FILLS)
def fill(ctx: FamilyContext, node: Node) -> KernelCall:
    """A constant tensor (``empty`` is filled with 0: its contents are unspecified)."""
    where = where_of(node)
    out = single_output(ctx, node)
    at = FILLS[node.op]
    value = node.args[at] if at is not None and len(node.args) > at else \
        node.kwargs.get("fill_value", 1 if "ones" in node.op else 0)
    text = scalar_text(value, out.ctype, where)
    return map_kernel(ctx, node, "fill", out, {}, lambda c, ity: f"y[i] = {text};",
                      f"{node.name}: fill with {value}")


@lowering("aten.arange")
def arange(ctx: FamilyContext, node: Node) -> KernelCall:
    """``start + i * step`` in the output type (float math as torch's CUDA kernel does it)."""
    where = where_of(node)
    out = single_output(ctx, node)
    a = node.args
    start, step = (0, 1) if node.overload == "default" else (a[0], a[2] if len(a) > 2 else 1)
    for v in (start, step):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Unsupported(f"{where}: arange bound {v!r}")
    if out.ctype == "float":
        expr = f"{scalar_text(start, 'float', where)} + (float)i * {scalar_text(step, 'float', where)}"
    elif isinstance(start, float) or isinstance(step, float):
        expr = f"static_cast<{out.ctype}>({float(start)!r} + (double)i * {float(step)!r})"
    else:
        expr = f"static_cast<{out.ctype}>({int(start)}LL + (long long)i * {int(step)}LL)"
    return map_kernel(ctx, node, "arange", out, {}, lambda c, ity: f"y[i] = {expr};",
                      f"{node.name}: arange from {start} step {step}")
