"""A recurrent layer's every time step in one launch (``templates/kernels/recurrence.cu.j2``).

Stepped one launch at a time, a layer pays two launches a step (h.W_hhᵀ, then the gates) on a
matrix of a few rows: its time is the launches', and eager replayed from a CUDA graph, running
cuDNN's persistent kernels, is faster. Here one cooperative launch runs the whole sequence: each
block keeps its hidden units' rows of W_hh on chip (registers, else shared memory, else read
through L2 each step), computes their h.W_hhᵀ and gates in fp32 on CUDA cores, and meets the direction's
other blocks at a barrier (``grid_barrier.cuh``) before the next step reads the new h. Both
directions of a layer run side by side in the same launch.

The plan sizes the blocks so that each does enough multiply-adds a step to be worth its share of
the barrier, and never more blocks than the GPU has SMs (a block needs at most 48 KB of shared
memory and 256 threads, so two fit on an SM on any GPU we know). Where the state of a step does
not fit a block's shared memory (batch x hidden near 12k floats) or the batch is over 64 (a
thread keeps a sum per row of the batch in registers), the layer stays stepped."""

from __future__ import annotations

from dataclasses import dataclass

from stitchcuda.compiler.lowering.cost import LAUNCH_MS, SIMT_EFF
from stitchcuda.compiler.lowering.cuda_files import cuda_file, render_kernel
from stitchcuda.gpu_specs import NominalPeaks

BARRIER = cuda_file("grid_barrier.cuh")
BARRIER_NAME = "sc_grid_barrier"
BLOCK = 256
SHARED_BYTES = 48 * 1024  # the static limit: no opt-in attribute needed at launch
WORK_PER_BLOCK = 32768  # multiply-adds of h.W_hhᵀ a block does a step, at least (where the SMs allow)
MAX_BATCH = 64
MAX_W_REGISTERS = 64  # a thread's share of its row of W_hh, kept in registers up to this many floats
# a step's barrier over a direction's blocks: an arrival and a poll through L2, and the next step's
# first read of h (a guess from the usual figures for a grid-wide sync; not yet measured here)
BARRIER_MS = 0.0015
L2_SM_TBPS = 0.1  # what one SM reads from L2 a second, about: W_hh's rows where they are not kept


PLACES = {"registers": "in registers", "shared": "in shared memory", "global": "read through L2 each step"}


Pointer = tuple[str, int]  # a buffer's identifier and an element offset into it


@dataclass
class RecurrenceGroup:
    """One layer's direction in a launch: the buffers it reads and writes."""

    w: Pointer  # W_hh, [gates x hidden, hidden]
    hs: str  # the states' rows, [steps + 2, batch, hidden]
    gi: Pointer | None = None  # x.W_ihᵀ of every step (the launch's first layer)
    wi: Pointer | None = None  # W_ih (a wavefront's later layers: x is the layer below's h)
    bi: Pointer | None = None
    bh: Pointer | None = None
    h0: Pointer | None = None  # None: the constant initial state
    c0: Pointer | None = None
    cs: str | None = None


@dataclass
class RecurrenceLaunch:
    """What one launch computes, for whoever runs it another way (the tests' CPU simulation)."""

    cell: str
    steps: int
    batch: int
    hidden: int
    gates: int
    dirs: int
    gi_step: int
    gi_row: int
    h0: tuple[float | None, int, int]  # (a constant, or None and the batch and hidden strides)
    c0: tuple[float | None, int, int]
    groups: list[RecurrenceGroup]


@dataclass(frozen=True)
class RecurrencePlan:
    units: int  # hidden units a block owns
    blocks: int  # blocks a direction
    tp: int  # threads a gate row: each sums every tp-th column of the row, then they add up by shuffles
    w_place: str  # where a block keeps its W_hh rows: "registers", "shared" or "global" (L2 each step)
    shared_bytes: int
    block: int = BLOCK
    layers: int = 1  # layers in the launch: more than one runs as a wavefront (one direction only)


def plan_recurrence(batch: int, hidden: int, gates: int, dirs: int, sms: int, units: int | None = None,
                    block: int = BLOCK, w_place: str | None = None, layers: int = 1) -> RecurrencePlan | None:
    """How a layer's steps (or, ``layers`` > 1, a unidirectional stack's) spread over blocks, or
    None where one launch cannot hold them."""
    if batch > MAX_BATCH or hidden < 1 or gates > block or (layers > 1 and dirs > 1):
        return None
    if units is None:
        units = max(1, -(-WORK_PER_BLOCK // (gates * hidden * batch)), -(-hidden * dirs * layers // sms))
    units = min(units, hidden, block // gates)
    blocks = -(-hidden // units)
    units = -(-hidden // blocks)
    rows = gates * units
    tp = 1
    while tp < 32 and rows * tp * 2 <= block:
        tp *= 2
    if shared_bytes(batch, hidden, rows, tp, "global", layers) > SHARED_BYTES:
        return None
    if w_place is None:  # a wavefront keeps W_ih's rows too: registers only
        w_place = "registers" if -(-hidden // tp) * (2 if layers > 1 else 1) <= MAX_W_REGISTERS else \
            "shared" if shared_bytes(batch, hidden, rows, tp, "shared", layers) <= SHARED_BYTES and layers == 1 \
            else "global" if layers == 1 else ""
    if not w_place:
        return None
    return RecurrencePlan(units, blocks, tp, w_place, shared_bytes(batch, hidden, rows, tp, w_place, layers), block,
                          layers)


def shared_bytes(batch: int, hidden: int, rows: int, tp: int, w_place: str, layers: int = 1) -> int:
    """A block's shared memory: the step's h, its rows' products, their W_hh rows where kept there
    (each row padded by ``tp`` against bank conflicts), and a wavefront's input and its products."""
    state = batch * hidden + rows * batch
    return 4 * (state * (2 if layers > 1 else 1) + (rows * (hidden + tp) if w_place == "shared" else 0))


def recurrence_ms(p: RecurrencePlan, steps: int, batch: int, hidden: int, gates: int, table: NominalPeaks) -> float:
    """The one launch: a barrier and a block's share of the products each step (two products in a
    wavefront's later layers, which finish ``layers - 1`` steps after the first)."""
    per_sm = table.fp32 * 1e12 / table.sms * SIMT_EFF
    work = 2.0 * gates * p.units * hidden * batch / per_sm * 1e3 * (2 if p.layers > 1 else 1)
    reads = 4.0 * gates * p.units * hidden / (L2_SM_TBPS * 1e12) * 1e3 if p.w_place == "global" else 0.0
    return (steps + p.layers - 1) * (BARRIER_MS + work + reads) + 2 * LAUNCH_MS


def stepped_ms(steps: int, batch: int, hidden: int, gates: int, dirs: int, table: NominalPeaks) -> float:
    """A launch for h.W_hhᵀ (an SGEMM of ``batch`` rows) and one for the gates, every step of every
    direction in turn."""
    gemm = max(2.0 * batch * hidden * gates * hidden / (table.fp32 * 1e12 * SIMT_EFF),
               4.0 * gates * hidden * hidden / (table.hbm_tbps * 1e12)) * 1e3
    return dirs * steps * (gemm + 2 * LAUNCH_MS)


def recurrence_kernel(name: str, p: RecurrencePlan, cell: str, steps: int, batch: int, hidden: int, gates: int,
                      dirs: int, gi_step: int, gi_row: int, bias: bool, h0: tuple[float | None, int, int],
                      c0: tuple[float | None, int, int], layers: int = 1) -> str:
    """The kernel's source. ``gi_step``/``gi_row``: how far apart x.W_ihᵀ's steps and batch rows
    lie; ``h0``/``c0``: (a constant initial state, or None for one read from memory with these
    batch and hidden strides)."""
    return render_kernel("recurrence.cu.j2", name=name, block=p.block, steps=steps, batch=batch, hidden=hidden,
                         gates=gates, units=p.units, blocks=p.blocks, dirs=dirs, cell=cell, w_place=p.w_place, place=PLACES[p.w_place], tp=p.tp,
                         layers=layers, groups=layers * dirs, gi_step=gi_step, gi_row=gi_row, bias=bias, h0_const=_literal(h0[0]), h0_sb=h0[1],
                         h0_sh=h0[2], c0_const=_literal(c0[0]), c0_sb=c0[1], c0_sh=c0[2])


def _literal(value: float | None) -> str | None:
    return None if value is None else f"{float(value)!r}f".replace("inf", "INFINITY")


def recurrence_launch(name: str, p: RecurrencePlan, what: RecurrenceLaunch, sync: str) -> str:
    """Zero the barrier counters, then the cooperative launch with each group's buffers."""
    def at(ptr: Pointer | str | None) -> str | None:
        if ptr is None:
            return None
        ident, offset = (ptr, 0) if isinstance(ptr, str) else ptr
        return f"a.{ident} + {offset}" if offset else f"a.{ident}"

    fields = [f"p.{k}[{g}] = {v};" for k in ("gi", "w", "wi", "bi", "bh", "h0", "c0", "hs", "cs")
              for g, group in enumerate(what.groups) if (v := at(getattr(group, k)))]
    groups = len(what.groups)
    return (f"{{\n  SC_CUDA_CHECK(cudaMemsetAsync({sync}, 0, {groups} * sizeof(unsigned), stream));\n"
            f"  {name}_args p = {{}};\n  {' '.join(fields)}\n  p.sync = reinterpret_cast<unsigned*>({sync});\n"
            f"  cudaLaunchAttribute attr[1];\n  attr[0].id = cudaLaunchAttributeCooperative;\n"
            f"  attr[0].val.cooperative = 1;\n  cudaLaunchConfig_t cfg = {{}};\n"
            f"  cfg.gridDim = dim3({groups * p.blocks});\n  cfg.blockDim = dim3({p.block});\n"
            f"  cfg.dynamicSmemBytes = {p.shared_bytes};\n  cfg.stream = stream;\n  cfg.attrs = attr;\n"
            f"  cfg.numAttrs = 1;\n  SC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, {name}, p));\n}}")
