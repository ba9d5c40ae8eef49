"""Module state a forward updates: BatchNorm's ``num_batches_tracked`` step, and the write-back of
every buffer the forward mutates (running statistics in training mode), as PyTorch does."""

from __future__ import annotations

from dataclasses import dataclass

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.cuda_files import render_kernel
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall, Strided
from stitchcuda.compiler.lowering.registry import lowering


@lowering("stitchcuda.int_add")
def int_add(ctx: FamilyContext, node: Node) -> KernelCall:
    """``x + step`` of an integer tensor (the capture renames BatchNorm's counter update to this)."""
    x = ctx.read(node.args[0])
    out = ctx.write(node.name, node.out[0].dtype)
    if x.numel != out.numel:
        raise Unsupported(f"{node.name} ({node.op}): a broadcasting integer add")
    name = ctx.kernel_name(node, "int_add")
    source = render_kernel("int_add.cu.j2", name=name, x=x, out=out, stride=x.strides[-1] if x.shape else 0,
                           step=int(node.args[1]))
    if x.shape and not x.contiguous:
        raise Unsupported(f"{node.name} ({node.op}): a strided integer operand")
    launch = (f"{name}<<<{-(-out.numel // 256)}, 256, 0, stream>>>({x.ptr}, {out.ptr});\n"
              "SC_CUDA_CHECK(cudaGetLastError());")
    return KernelCall({name: source}, launch, describe=f"{node.name} = x + {node.args[1]}")


# segments one launch of the state update carries in its parameter (64 x 32 bytes, within the 4 KB
# every architecture accepts)
STATE_SEGMENTS = 64


@dataclass(frozen=True)
class BufferUpdate:
    """One buffer the forward mutates: given its new ``value`` (copied in), or, for a counter the
    forward only steps (``num_batches_tracked += 1``), ``step`` added in place."""

    buffer: Strided
    name: str
    value: Strided | None = None
    step: int = 0


def write_backs(updates: list[BufferUpdate]) -> list[KernelCall]:
    """Every buffer update of the forward in one launch per element type (per 64 buffers): a
    ResNet-18 in training mode wrote its 20 BatchNorms' running statistics and counters back in
    80 launches of a few bytes each, half of its program's launches."""
    for u in updates:
        v = u.value
        if not u.buffer.contiguous or (v is not None and (v.numel != u.buffer.numel or v.ctype != u.buffer.ctype)):
            raise Unsupported(f"buffer write-back {u.name}: {v.ctype if v else '?'}{list(v.shape) if v else []} into "
                              f"{u.buffer.ctype}{list(u.buffer.shape)}")
    calls = []
    for ctype in sorted({u.buffer.ctype for u in updates}):
        same = [u for u in updates if u.buffer.ctype == ctype]
        for first in range(0, len(same), STATE_SEGMENTS):
            calls.append(_update_call(ctype, same[first:first + STATE_SEGMENTS]))
    return calls


def _update_call(ctype: str, updates: list[BufferUpdate]) -> KernelCall:
    short = ctype.replace("_t", "")
    kernel, table = f"k_state_update_{short}", f"ScStateUpdate_{short}"
    source = render_kernel("state_update.cu.j2", table=table, kernel=kernel, ctype=ctype, segments=STATE_SEGMENTS)
    lines = [f"{table} t{{}};"]
    for j, u in enumerate(updates):
        dst = f"const_cast<{ctype}*>({u.buffer.ptr})"
        lines.append(f"t.src[{j}] = {u.value.ptr if u.value is not None else u.buffer.ptr}; t.dst[{j}] = {dst}; "
                     f"t.n[{j}] = {u.buffer.numel}LL; t.step[{j}] = {u.step}LL;  // {u.name}")
    blocks = min(max(1, -(-max(u.buffer.numel for u in updates) // 256)), 1024)
    lines += [f"{kernel}<<<dim3({blocks}, {len(updates)}), 256, 0, stream>>>(t);", "SC_CUDA_CHECK(cudaGetLastError());"]
    steps = sum(1 for u in updates if u.value is None)
    describe = (f"write {len(updates) - steps} buffers back" + (f" and step {steps} counters" if steps else "")
                + f" ({ctype}) in one launch")
    return KernelCall({kernel: source}, "{\n" + "\n".join(lines) + "\n}", describe=describe)
