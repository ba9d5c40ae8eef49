"""The cost model that gives each matrix product and convolution its arithmetic path.

Each path's time is estimated from the operator's FLOPs and bytes on a table of the GPU's peaks
(:data:`TABLES`, from ``gpu_specs``): its compute at the path's peak times what the path reaches of it, or its traffic
at HBM bandwidth, whichever is longer, plus what the path moves outside the product (the split's
copies of its operands, read and written) and a few microseconds a launch. The paths:

- ``cublas``: cuBLAS's fp32 SGEMM (cuDNN's fp32 kernels for a convolution);
- ``split``: 3xTF32 by split operands on TF32 tensor cores (:mod:`split_tf32`); a weight's split is
  paid on every call unless it is packed once (``packed``: the program keeps it between calls);
- ``cutlass``: CUTLASS's 3xTF32, the split inside the kernel, so no extra traffic; its own tiles,
  so a grid of fewer tiles than the GPU has SMs runs at that share (split along K where deep);
- ``simt``: our own one-block-a-matrix fp32 kernel for many tiny products (``gemm_calls.tiny``);
- ``bf16``: bf16 copies of the operands on bf16 tensor cores, fp32 accumulate (:mod:`bf16`, ``paper``
  only): the copies' traffic (a weight's paid once where it is packed), half the bytes in the product.

Under a TF32 variant (``paper``), cuBLAS, cuDNN and CUTLASS run plain TF32: ``cublas`` and
``cutlass`` are estimated at TF32's rate, one pass; except cuDNN's transposed and 3-d
convolutions, which gain nothing from TF32 in NCHW and are rated as fp32, the split offered
beside them (:func:`nchw_tf32_slow`).

The efficiencies (share of the table's peak a path reaches) were measured on an H100 (2026-11):
SGEMM about 50 TFLOP/s, cuDNN's transposed fp32 convolutions about 12, TF32 products about 300,
CUTLASS's 3xTF32 about 1.4x SGEMM, copies at about 2.5 TB/s. Convolutions' own figures were
measured on an H200 (ResNet-18, 2026-11): cuDNN's direct fp32 ones about 27 TFLOP/s, its
tensor-core ones rising with the output channels (see :data:`CONV_TENSOR_EFF`).

Accuracy comes before speed: a product whose output is summed over its own columns straight away
(a sum or mean over the features, the statistics of a group or layer norm) adds up the errors of
all its outputs while the sum can be far smaller than they are, and Hopper's tensor cores
accumulate with several times fp32's error, so split and CUTLASS's 3xTF32 both failed 1e-4 on
KernelBench's L2/18 (Linear 8192 -> 8192, then a sum) and L2/62 (then a GroupNorm) where cuBLAS's
SGEMM passed. Such a product keeps to fp32 (:func:`amplifies_error`).
"""

from __future__ import annotations

import math
import os
from typing import Any

from pydantic import BaseModel, Field

from stitchcuda.compiler.capture.graph import Node, OpGraph
from stitchcuda.compiler.lowering.cutlass_gemm import grid_fill, split_k_slices
from stitchcuda.compiler.lowering.padded_gemm import padded
from stitchcuda.gpu_specs import DEFAULT, NOMINAL, NominalPeaks, nominal_peaks
from stitchcuda.machine import physical_gpu

# the data sheets' figures, by the name fragment gpu_specs matches (H100, H200, A100, ...)
TABLES: dict[str, NominalPeaks] = dict(NOMINAL)

# share of the table's peak each path reaches (measured on an H100, see the module's docstring)
SGEMM_EFF, CONV_TRANSPOSED_EFF = 0.75, 0.18
TF32_EFF, CUTLASS_3X_EFF, SIMT_EFF, HBM_EFF = 0.6, 0.42, 0.25, 0.75
# cuDNN's direct fp32 forward convolutions (FFT and Winograd excluded, as true fp32 needs): 19 to 28
# TFLOP/s on ResNet-18's 3x3 convolutions at batch 10 on an H200 (torch.profiler, 2026-11-27), eager's
# own algorithm choice included; 0.75 before, from larger convolutions, picked cuDNN where the split
# was 1.2x faster over the whole network.
CONV_EFF = 0.4
# bf16 tensor cores: cuBLASLt's bf16 GEMMs reach about TF32's share of their (twice as high) peak
BF16_EFF = 0.6
# cuDNN's tensor-core convolutions (TF32, bf16, and the split's 3 x channels): their share of the
# peak grows with the output channels (the GEMM's N, which sets the tile): on the same H200 run the
# split's TF32 convolutions ran at about 92, 133 and 247 TFLOP/s for 64, 128 and 256 output
# channels. :func:`conv_tensor_eff` fits that (bf16 assumed alike: not measured here).
CONV_TENSOR_EFF, CONV_FULL_CHANNELS = 0.5, 256
LAUNCH_MS = 0.003  # a kernel's start and drain inside a CUDA graph
# A tile's prologue and epilogue (its first loads, its output's write) are paid once per tile
# whatever K is: a product of depth K runs at K / (K + K_HALF) of the path's rate.
K_HALF = 64
# Smallest tile sides: a product narrower than the tile pays for the whole tile.
SIMT_TILE, TENSOR_TILE = 32, 64
# Tensor-core kernels on a product whose M, N or K is not a multiple of 4 (8 for bf16) reach about
# a third of their rate, whatever the rows' alignment (H200, 2026-11: L1/8, 8205 x 5921 x 2949, in
# TF32 at 118 TFLOP/s and split 3xTF32 at 106 of TF32 work, where 4096-wide products reached
# 343-386). A TF32 product on cuBLAS big enough runs on padded copies instead (padded_gemm.py).
UNALIGNED_EFF = 0.35


class Machine(BaseModel):
    """The table a program's estimates use, and whether it was read from the GPU or assumed."""

    table: NominalPeaks
    assumed: bool = Field(description="no GPU where the program was written: the default table")
    device: str = ""

    @property
    def label(self) -> str:
        if not self.assumed:
            return f"{self.table.label} table ({self.device})"
        why = f"no table for {self.device}" if self.device else "no GPU where it was written"
        return f"{self.table.label} table (assumed: {why})"


def this_machine(requested: str = "") -> Machine:
    """The table to estimate with: ``requested`` (a table's name) if given, else the one of the GPU
    this process sees (``STITCHCUDA_GPU`` names one where the compiler runs apart from the GPU), else
    the default, marked as assumed."""
    requested = requested or os.environ.get("STITCHCUDA_GPU", "")
    if requested:
        table = nominal_peaks(requested)
        if table is None:
            raise ValueError(f"no cost table for GPU {requested!r}; known: {', '.join(TABLES)}")
        return Machine(table=table, assumed=False, device=requested)
    gpu = physical_gpu("cuda")  # nvidia-smi: the Coder's process starts no CUDA context
    if gpu is not None:
        table = nominal_peaks(gpu.name)
        return Machine(table=table or TABLES[DEFAULT], assumed=table is None, device=gpu.name)
    return Machine(table=TABLES[DEFAULT], assumed=True)


class Estimate(BaseModel):
    """One operator's paths and the one chosen."""

    op: str
    path: str
    ms: float
    paths: dict[str, float] = Field(description="every allowed path's estimate, ms")
    why: str = ""
    tf32: bool = Field(False, description="estimated for a TF32 variant: cuBLAS, cuDNN and CUTLASS in plain TF32")

    def name(self, path: str) -> str:
        return (TF32_NAMES.get(path) if self.tf32 else None) or PATH_NAMES[path]

    def note(self, table: str) -> str:
        others = ", ".join(f"{self.name(p)} {ms:.3f}" for p, ms in self.paths.items() if p != self.path)
        return (f" [cost model, {table}: {self.name(self.path)} {self.ms:.3f} ms est."
                + (f"; {others}" if others else "") + (f"; {self.why}" if self.why else "") + "]")


PATH_NAMES = {"cublas": "fp32 (cuBLAS/cuDNN)", "split": "3xTF32 split", "cutlass": "CUTLASS 3xTF32",
              "simt": "fp32 SIMT (own kernel)", "bf16": "bf16 (fp32 accumulate)"}
TF32_NAMES = {"cublas": "TF32 (cuBLAS/cuDNN)", "cutlass": "CUTLASS TF32"}  # the same paths in a TF32 variant


def _ms(flops: float, tflops: float) -> float:
    return flops / (tflops * 1e9)


def _copy_ms(nbytes: float, table: NominalPeaks) -> float:
    return nbytes / (table.hbm_tbps * HBM_EFF * 1e9)


def _ramp(k: int) -> float:
    return k / (k + K_HALF)


def _waste(g: Any, tile: int) -> float:
    return (-(-g.m // tile) * tile * -(-g.n // tile) * tile) / (g.m * g.n)


def gemm_paths(g: Any, table: NominalPeaks, allowed: list[str], packed_a: bool = False,
               packed_b: bool = False, tf32: bool = False) -> dict[str, float]:
    """Each allowed path's time for the product ``g`` (a :class:`lowered.Gemm`), ms; ``packed_*``: that
    operand (a weight) is split (or converted) once and kept (packing.py), so that costs nothing a
    call; ``tf32``: a TF32 variant, where cuBLAS and CUTLASS run plain TF32."""
    matrices = g.batch * g.outer
    flops = 2.0 * matrices * g.m * g.n * g.k
    a = g.m * g.k * (matrices if g.stride_a or g.outer_a else 1)
    b = g.k * g.n * (matrices if g.stride_b or g.outer_b else 1)
    c = g.m * g.n * matrices
    io = _copy_ms(4.0 * (a + b + c), table)
    odd = UNALIGNED_EFF if g.m % 4 or g.n % 4 or g.k % 4 else 1.0
    out: dict[str, float] = {}
    for path in allowed:
        if path == "cublas" and tf32:
            rate = table.tf32 * TF32_EFF * _ramp(g.k) / _waste(g, TENSOR_TILE)
            if padded(g):  # on padded copies (where its lowering runs it on cuBLAS): each matrix moved once more
                out[path] = max(_ms(flops, rate), io) + _copy_ms(8.0 * (a + b + c), table) + 4 * LAUNCH_MS
            else:
                out[path] = max(_ms(flops, rate * odd), io) + LAUNCH_MS
        elif path == "cublas":
            rate = table.fp32 * SGEMM_EFF * _ramp(g.k) / _waste(g, SIMT_TILE)
            out[path] = max(_ms(flops, rate), io) + LAUNCH_MS
        elif path == "simt":
            out[path] = max(_ms(flops, table.fp32 * SIMT_EFF), io) + LAUNCH_MS
        elif path == "cutlass":  # our own tiles: a grid smaller than the GPU leaves SMs idle (cuBLAS's heuristics
            # split K themselves); a deep one runs as slices of K, summed in one more pass
            slices = split_k_slices(g)
            rate = (table.tf32 * CUTLASS_3X_EFF * odd * _ramp(g.k // slices) * grid_fill(g, table.sms)
                    / _waste(g, TENSOR_TILE))
            summing = _copy_ms(4.0 * c * (slices + 1), table) + LAUNCH_MS if slices > 1 else 0.0
            out[path] = max(_ms((1 if tf32 else 3) * flops, rate), io) + LAUNCH_MS + summing
        elif path == "bf16":  # each operand read and written as bf16 (not a packed weight), the GEMM reads the copies
            copy_a = 0.0 if packed_a else 6.0 * a
            copy_b = 0.0 if packed_b else 6.0 * b
            rate = table.bf16 * BF16_EFF * (UNALIGNED_EFF if g.m % 8 or g.n % 8 or g.k % 8 else 1.0) \
                * _ramp(g.k) / _waste(g, TENSOR_TILE)
            gemm = max(_ms(flops, rate), _copy_ms(2.0 * (a + b) + 4.0 * c, table))
            out[path] = gemm + _copy_ms(copy_a + copy_b, table) + (3 - packed_a - packed_b) * LAUNCH_MS
        elif path == "split":
            copies = 3 if g.k <= 256 else 2  # split_tf32.ONE_GEMM_MAX_K: one GEMM of depth 3K, else two
            # the split kernels read each operand and write its copies; the GEMMs read the copies
            split_a = 0.0 if packed_a else 4.0 * a * (1 + copies)
            split_b = 0.0 if packed_b else 4.0 * b * (1 + copies)
            reads = 4.0 * copies * (a + b)
            writes = 4.0 * c * (1 if copies == 3 else 3)  # two GEMMs: the second reads and rewrites C
            rate = table.tf32 * TF32_EFF * odd * _ramp(3 * g.k if copies == 3 else g.k) / _waste(g, TENSOR_TILE)
            gemm = max(_ms(3 * flops, rate), _copy_ms(reads + writes, table))
            launches = 2 - packed_a - packed_b + (1 if copies == 3 else 2)
            out[path] = gemm + _copy_ms(split_a + split_b, table) + launches * LAUNCH_MS
    return out


def conv_tensor_eff(c: Any) -> float:
    """Share of the tensor cores' peak cuDNN reaches on the convolution ``c``: :data:`CONV_TENSOR_EFF`
    from :data:`CONV_FULL_CHANNELS` output channels a group, less below (measured, see there)."""
    return CONV_TENSOR_EFF * min(1.0, (c.k // c.groups) / CONV_FULL_CHANNELS) ** 0.6


def nchw_tf32_slow(c: Any) -> bool:
    """Whether cuDNN's TF32 kernels in NCHW (its legacy API, as our programs call it) run the
    convolution ``c`` no faster than its fp32 ones: transposed and 3-d convolutions. On an H200
    (2026-11-27, KernelBench's sample under paper) L1/57 (transposed) ran 31.3 ms in TF32 against
    eager fp32's 27.8, L2/5 (transposed) 25.4 against 28.7, L2/47 (3-d) 6.2 against 5.7 and L1/54
    (3-d) 1.89 against 1.91, where the split's channels-last TF32 ran L1/57 in 12.8 ms, L2/5 in 7.1
    and L2/47 in 3.7. So TF32 is rated there as cuDNN's fp32, and the split is offered under TF32 too."""
    return c.transposed or len(c.size) == 3


def conv_paths(c: Any, table: NominalPeaks, allowed: list[str], packed_w: bool = False,
               tf32: bool = False) -> dict[str, float]:
    """Each allowed path's time for the convolution ``c`` (a :class:`lowered.Conv`), ms: cuDNN's fp32
    kernels (TF32 ones in a ``tf32`` variant), or the split of its channels channels-last on cuDNN's
    TF32 ones (its input moved 7 times: read, three copies written and read; its output 3: written
    channels-last, transposed), or bf16 copies on cuDNN's bf16 ones (input and output each read
    and written once more, at half the bytes where bf16; the filter's copy free where packed)."""
    per_group = c.c // c.groups
    depth = per_group * math.prod(c.kernel)
    spatial = math.prod(c.size if c.transposed else c.out_size)
    flops = 2.0 * c.n * spatial * depth * (c.k // c.groups if c.transposed else c.k)
    x, y = c.n * c.c * math.prod(c.size), c.n * c.k * math.prod(c.out_size)
    w = c.k * depth
    tensor_eff = conv_tensor_eff(c)
    out: dict[str, float] = {}
    for path in allowed:
        if path == "cublas" and tf32 and not nchw_tf32_slow(c):
            out[path] = max(_ms(flops, table.tf32 * tensor_eff), _copy_ms(4.0 * (x + y + w), table)) + LAUNCH_MS
        elif path == "cublas":
            eff = CONV_TRANSPOSED_EFF if c.transposed else CONV_EFF
            out[path] = max(_ms(flops, table.fp32 * eff), _copy_ms(4.0 * (x + y + w), table)) + LAUNCH_MS
        elif path == "bf16":
            conv = max(_ms(flops, table.bf16 * tensor_eff), _copy_ms(2.0 * (x + y + w), table))
            copies = _copy_ms(6.0 * x + 6.0 * y + (0.0 if packed_w else 6.0 * w), table)
            out[path] = conv + copies + (3 if packed_w else 4) * LAUNCH_MS
        elif path == "split":
            out[path] = (_ms(3 * flops, table.tf32 * tensor_eff) + _copy_ms(4.0 * (7 * x + 3 * y + 4 * w), table)
                         + 4 * LAUNCH_MS)
        elif path == "cutlass":  # NHWC copies of input and output around CUTLASS's implicit GEMM
            out[path] = (max(_ms(3 * flops, table.tf32 * CUTLASS_3X_EFF), _copy_ms(4.0 * (x + y + w), table))
                         + _copy_ms(4.0 * 2 * (x + y), table) + 3 * LAUNCH_MS)
    return out


# A path other than the first listed (the plainest) is taken only where it saves this share of the
# estimate: the model's error is larger than a few percent, and each CUTLASS configuration costs
# the build a minute.
MARGIN = 0.10


def fixed_path(paths: dict[str, float], split: bool, cutlass: bool) -> str:
    """The path a variant that fixes the GEMM path takes (no model choosing): the split where the
    model says it beats SGEMM, else CUTLASS where switched on, else SGEMM (the SIMT kernel for tiny
    products, whatever the variant)."""
    if "simt" in paths:
        return "simt"
    if split and "split" in paths and paths["split"] < paths["cublas"]:
        return "split"
    return "cutlass" if cutlass and "cutlass" in paths else "cublas"


def choose(op: str, paths: dict[str, float], why: str = "", tf32: bool = False) -> Estimate:
    """The path with the least estimate, the paths taken in their listed order (plainest first):
    a later one replaces the one held only where it saves :data:`MARGIN` of its estimate."""
    best = next(iter(paths))
    for path, ms in paths.items():
        if ms < paths[best] * (1 - MARGIN):
            best = path
    return Estimate(op=op, path=best, ms=paths[best], paths=paths, why=why, tf32=tf32)


# Reductions whose result sums a product's outputs over its columns (the last dim)
_SUMMING = {"aten.sum", "aten.mean", "aten.var", "aten.var_mean", "aten.std", "aten.std_mean",
            "aten.group_norm", "aten.native_group_norm", "aten.layer_norm", "aten.native_layer_norm"}
# ops of one tensor (and constants) that keep the error's pattern
_ONE_INPUT = {"aten.relu", "aten.gelu", "aten.silu", "aten.sigmoid", "aten.tanh", "aten.leaky_relu", "aten.mul",
              "aten.div", "aten.add", "aten.sub", "aten.clone", "aten.view", "aten.reshape", "aten.squeeze",
              "aten.unsqueeze", "aten.hardtanh", "aten.elu", "aten.neg", "aten.dropout"}


def amplifies_error(graph: OpGraph, name: str, nodes: dict[str, Node] | None = None,
                    users: dict[str, list[str]] | None = None, depth: int = 4) -> str:
    """Why the value ``name`` (a product's output) needs fp32 arithmetic: it reaches a reduction
    over its last dim through ops of that one tensor alone ('' when it does not). ``nodes`` and
    ``users`` are the graph's by name (a lowering's context has them; made here otherwise)."""
    nodes = nodes if nodes is not None else {n.name: n for n in graph.nodes}
    users = users if users is not None else graph.users()
    frontier, seen = [name], set()
    for _ in range(depth):
        nxt = []
        for value in frontier:
            for u in (nodes[n] for n in users.get(value, []) if n in nodes):  # not "<buffer write-back>"
                if u.name in seen:
                    continue
                seen.add(u.name)
                if u.op in _SUMMING and _over_last_dim(graph, u):
                    return (f"its output goes straight into {u.op.removeprefix('aten.')} over its columns, which adds "
                            "up every output's error: fp32 keeps that sum within tolerance where 3xTF32 on tensor "
                            "cores (several times fp32's error) may not")
                if u.op in _ONE_INPUT and len(set(u.inputs())) == 1:
                    nxt.append(u.name)
        frontier = nxt
    return ""


def _over_last_dim(graph: OpGraph, n: Node) -> bool:
    if n.op in ("aten.group_norm", "aten.native_group_norm", "aten.layer_norm", "aten.native_layer_norm"):
        return True
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    if dims is None:
        return True
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    src = n.inputs()[0] if n.inputs() else ""
    meta = graph.meta(src) if src else None
    rank = len(meta.shape) if meta is not None else None
    return any(d == -1 or (rank is not None and d == rank - 1) for d in dims if isinstance(d, int))
