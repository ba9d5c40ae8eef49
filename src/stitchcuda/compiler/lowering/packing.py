"""Weights split once: a parameter's 3xTF32 halves kept between calls (prepacking, as oneDNN and
FBGEMM keep their reordered weights), remade when they go stale.

Splitting a weight on every call reads it and writes and reads its copies: for KernelBench's
1_MLP (batch 128, 1-GB weights) that traffic costs more than the tensor cores save. Kept, the
split costs one read of the copies per call. The program remakes every pack when any packed
parameter's storage (``data_ptr``) or version counter (``_version``, bumped by every in-place
write autograd sees: ``load_state_dict``, an optimizer step, ``copy_``, ``mul_``) differs from
the last pack's, before the forward's launches (and so outside its CUDA graph); inside a caller's
graph capture the pack is recorded into that graph and remade at the next direct call.

What it cannot see: a write through ``param.data`` (a detached alias with its own version
counter) or through a raw pointer. Code that updates weights that way must not use a packing
program; the verdict's trial with new weights goes through ``load_state_dict`` and the version.

A pack takes two (three for a shallow product) times its weight's memory; packs stay under
:data:`PACK_SHARE` of the GPU's memory together, and a weight beyond that splits on every call.
"""

from __future__ import annotations

from stitchcuda.compiler.lowering.lowered import Lowering
from stitchcuda.machine import physical_gpu

PACK_SHARE = 0.25
ASSUMED_GPU_BYTES = 80 << 30  # an H100's, where no GPU is visible


def gpu_bytes() -> int:
    gpu = physical_gpu("cuda")
    return gpu.memory_mib << 20 if gpu is not None and gpu.memory_mib else ASSUMED_GPU_BYTES


def parameter(low: Lowering, buffer: str) -> str | None:
    """The parameter placeholder whose entry buffer ``buffer`` (``ident`` or ``ident + offset``) is."""
    ident = buffer.split(" + ")[0]
    for p in low.graph.placeholders:
        if p.kind == "parameter" and low.storage.get(p.name) == ident:
            return p.name
    return None


def fits(low: Lowering, floats: int) -> bool:
    return low.pack_bytes + 4 * floats <= PACK_SHARE * gpu_bytes()


def pack_buffer(low: Lowering, param: str, floats: int) -> str:
    """A buffer of its own for one parameter's halves, counted against the budget."""
    ident = f"x_pack_{len(low.pack_params)}"
    low.intermediates.append((ident, [floats]))
    low.pack_bytes += 4 * floats
    low.pack_params.append(low.storage[param])
    return ident


def pack_note(low: Lowering) -> str:
    """The program's line on what its packs cost, or why weights still split every call."""
    budget = PACK_SHARE * gpu_bytes() / 2**30
    kept = (f"Weights split once: {len(low.pack_launches)} packed, {low.pack_bytes / 2**30:.2f} GiB kept between "
            f"calls (at most {budget:.0f} GiB, a quarter of the GPU's memory); remade when a weight's data_ptr or "
            "_version changes (load_state_dict, an optimizer step, copy_; not writes through .data).") \
        if low.pack_launches else ""
    refused = (f" {low.pack_refused / 2**30:.2f} GiB of weight halves did not fit the budget: those weights split on "
               "every call.") if low.pack_refused else ""
    hoisted = sum(lg.hoisted for lg in low.groups)
    once = (f" {hoisted} groups compute from the weights alone (hoist.py): they run with the packs, when a "
            "weight they read changes, not on every call.") if hoisted else ""
    return (kept + refused + once).strip()
