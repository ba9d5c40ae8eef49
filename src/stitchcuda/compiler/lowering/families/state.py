"""Module state a forward updates: BatchNorm's ``num_batches_tracked`` step, and the write-back of
every buffer the forward mutates (running statistics in training mode), as PyTorch does."""

from __future__ import annotations

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.families import FamilyContext, KernelCall, Strided
from stitchcuda.compiler.lowering.registry import lowering


@lowering("stitchcuda.int_add")
def int_add(ctx: FamilyContext, node: Node) -> KernelCall:
    """``x + step`` of an integer tensor (the capture renames BatchNorm's counter update to this)."""
    x = ctx.read(node.args[0])
    out = ctx.write(node.name, node.out[0].dtype)
    if x.numel != out.numel:
        raise Unsupported(f"{node.name} ({node.op}): a broadcasting integer add")
    name = ctx.kernel_name(node, "int_add")
    source = (f"__global__ void {name}(const {x.ctype}* __restrict__ x, {out.ctype}* __restrict__ y) {{\n"
              f"  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
              f"  if (i < {out.numel}LL) y[i] = x[{x.offset}LL + i * {x.strides[-1] if x.shape else 0}LL] + "
              f"({out.ctype})({int(node.args[1])});\n}}\n")
    if x.shape and not x.contiguous:
        raise Unsupported(f"{node.name} ({node.op}): a strided integer operand")
    launch = (f"{name}<<<{-(-out.numel // 256)}, 256, 0, stream>>>({x.ptr}, {out.ptr});\n"
              "SC_CUDA_CHECK(cudaGetLastError());")
    return KernelCall({name: source}, launch, describe=f"{node.name} = x + {node.args[1]}")


def write_back(value: Strided, buffer: Strided, name: str) -> KernelCall:
    """Copy a computed value into the module buffer it replaces (the argument's memory)."""
    if value.numel != buffer.numel or value.ctype != buffer.ctype or not buffer.contiguous:
        raise Unsupported(f"buffer write-back {name}: {value.ctype}{list(value.shape)} into "
                          f"{buffer.ctype}{list(buffer.shape)}")
    kernel = f"k_write_back_{value.ctype.replace('_t', '')}"
    source = (f"__global__ void {kernel}(const {value.ctype}* __restrict__ src, {value.ctype}* __restrict__ dst, "
              "long long n) {\n  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
              "  if (i < n) dst[i] = src[i];\n}\n")
    launch = (f"{kernel}<<<{max(1, -(-value.numel // 256))}, 256, 0, stream>>>({value.ptr}, "
              f"const_cast<{buffer.ctype}*>({buffer.ptr}), {value.numel}LL);\nSC_CUDA_CHECK(cudaGetLastError());")
    return KernelCall({kernel: source}, launch, describe=f"write {name} back into its buffer")
