"""What lowering produces: the records of a lowered program (cuBLAS and cuDNN calls, IR programs
for the fused kernels, family kernels, buffers), the options that vary how it is emitted, and the
operator sets the fused lowerings share. Nothing here lowers or emits."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from stitchcuda.compiler.capture.graph import OpGraph
from stitchcuda.compiler.ir.expr import Program
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.op_table import tagged
from stitchcuda.compiler.lowering.cutlass_conv import CutlassConv
from stitchcuda.compiler.lowering.kernel_call import KernelCall

PLAIN_GEMM_OPS = tagged("plain_gemm")  # the GEMMs lower_gemm takes (the accumulating batched forms decompose)


class CodegenOptions(BaseModel):
    """Variants the tuner can try."""

    graph: bool = Field(True, description="replay the forward from a CUDA graph (captured per argument pointers)")
    tf32: bool = Field(False, description="TF32 tensor cores in cuBLAS and cuDNN (only where the tolerance allows: "
                                          "--tolerance paper)")
    cublaslt: bool = Field(True, description="single GEMMs with a bias (and ReLU / tanh-GELU) through cuBLASLt, the "
                                             "bias and activation applied in its epilogue")
    cutlass: bool = Field(False, description="GEMMs and 2-d convolutions on tensor cores through CUTLASS: 3xTF32 "
                                             "(fp32-accurate) under strict, TF32 where tf32 is on; bias, scaling, a "
                                             "residual and an activation in its epilogue")
    pack_weights: bool = Field(True, description="a weight's 3xTF32 halves are made once and kept between calls, "
                                                 "remade when its data_ptr or version changes (packing.py)")
    split_tf32: bool = Field(False, description="GEMMs as 3xTF32 by split operands on cuBLASLt's TF32 tensor cores "
                                                "(wgmma on Hopper): about 2.5x fp32 SGEMM's speed, error about 1e-5 "
                                                "of the largest output (Hopper's accumulation), so the tolerance "
                                                "decides; bias and ReLU / tanh-GELU in cuBLASLt's epilogue; "
                                                "convolutions by split channels, channels-last, on cuDNN's TF32 "
                                                "kernels where a cost model says it pays")
    cost_model: bool = Field(False, description="each GEMM and convolution takes the path (fp32, 3xTF32 split, "
                                                "CUTLASS 3xTF32, among those switched on) the cost model estimates "
                                                "fastest; off: split where it pays, else CUTLASS, else cuBLAS")
    bf16: bool = Field(False, description="GEMMs and convolutions may run on bf16 copies of their operands with "
                                          "fp32 accumulation and fp32 output (bf16.py) where the cost model "
                                          "estimates it faster (only where the tolerance allows: --tolerance paper)")
    gpu: str = Field("", description="the cost model's GPU table (H100, H200, A100, ...); '' reads the GPU here, "
                                     "or the STITCHCUDA_GPU variable")
    vector_width: int = Field(4, description="elements per thread in pointwise kernels: 1 or 4 (float4)")
    block: int = Field(256, description="threads per block (a multiple of 32, at most 1024)")
    dnn_graph: bool = Field(False, description="forward fp32 convolutions also planned through cuDNN's graph API "
                                               "at setup (engines the legacy algorithms do not reach), each "
                                               "kept only where it beats the legacy algorithm on the same buffers")
    lt_timed: bool = Field(True, description="each cuBLASLt product takes the fastest of the heuristic's "
                                             "candidates, timed at setup on scratch operands of its layouts, "
                                             "where it is at least twice as fast as the first "
                                             "(templates/kernels/lt_pick.cuh); off: the heuristic's first choice")
    fused_attention: bool = Field(False, description="an attention group (Q.K^T, scale and mask, softmax, P.V) as one "
                                                     "fp32 kernel with an online softmax where its head is at most "
                                                     "128 wide, instead of two batched SGEMMs around a row kernel "
                                                     "(attention_kernel.py)")


@dataclass
class Gemm:
    batch: int
    m: int
    n: int
    k: int
    a: str  # buffer identifiers: row-major A [M, K] (or its transpose), B [K, N] (or its transpose)
    b: str
    a_trans: bool  # A is stored as A^T contiguous
    b_trans: bool  # B is stored as B^T contiguous (linear's weight)
    out: str  # identifier of the buffer the GEMM writes
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    ld_a: int = 0  # leading dimensions (row strides) of strided views; 0: the dense default
    ld_b: int = 0
    ld_c: int = 0
    outer: int = 1  # a second batch dimension that does not merge with the first: a host loop of calls
    outer_a: int = 0
    outer_b: int = 0
    outer_c: int = 0
    alpha: float = 1.0  # C = alpha * A.B: a constant scale of an operand folded into the call
    lt: int | None = None  # index of its cuBLASLt descriptors, when it runs through cuBLASLt
    epilogue: Literal["", "BIAS", "RELU_BIAS", "GELU_BIAS"] = ""  # cuBLASLt epilogue (bias over n)
    bias: str = ""  # the bias buffer (+ offset), for an epilogue with a bias
    cutlass: Any = None  # its CutlassGemm configuration, when it runs through CUTLASS
    estimate: Any = None  # the cost model's cost.Estimate of its paths
    slot: int = -1  # where the program keeps that kernel extension's launcher
    c: str = ""  # CUTLASS's source operand C: a bias broadcast over rows (ldc 0) or a residual
    ld_c_src: int = 0
    stride_c_src: int = 0
    beta: float = 0.0
    split: Any = None  # its SplitPlan: 3xTF32 by split operands (split_tf32.py), or bf16 copies (bf16.py)
    fast_tf32: bool = False  # a cuBLASLt GEMM on TF32 tensor cores: one of a split plan's two parts
    bf16: bool = False  # a cuBLASLt GEMM on bf16 copies of its operands, fp32 accumulate and output (bf16.py)
    no_split: bool = False  # a 1x1 convolution's product: see lower_conv.pointwise
    split_k: int = 1  # CUTLASS over this many slices of K into scratch (``out``), summed into ``split_k_out``
    split_k_out: str = ""
    # the epilogue the summing pass applies when split (the slices' own epilogue is the bare product):
    # act(sum + beta * C), C a bias over the columns (ld 0) or a residual of the output's layout (ld n)
    split_k_c: str = ""
    split_k_ld_c: int = 0
    split_k_beta: float = 0.0
    split_k_act: str = "identity"
    staged: Any = None  # padded_gemm.Staged: a TF32 cuBLAS call on copies padded to multiples of 4
    placed: bool = False  # a product with a plain epilogue, its path given by lower_gemm.place_product


@dataclass
class Conv:
    """One convolution through cuDNN, float32 NC(D)HW: 2-d (and 1-d, as 2-d with H = 1) with 4-d
    descriptors, 3-d with Nd ones. ``transposed``: a transposed convolution, run as cuDNN's
    backward-data of the convolution whose weight it holds ([c_in, c_out/groups, *kernel])."""

    index: int  # names the descriptors in the generated Program
    n: int
    c: int  # input channels
    k: int  # output channels
    size: tuple[int, ...]  # the input's spatial dims: (H, W) or (D, H, W)
    out_size: tuple[int, ...]  # what cuDNN writes (one more than the output where 'same' padding is uneven)
    kernel: tuple[int, ...]
    pad: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    transposed: bool
    x: str  # buffer identifiers
    weight: str
    out: str = ""
    chunks: int = 1  # calls over equal batch slices: cuDNN's descriptors count elements in int
    cutlass: Any = None  # its CutlassConv configuration, when it runs through CUTLASS (not cuDNN)
    slot: int = -1  # the launcher's slot; the workspace function's is the next one
    bias: str = ""  # the bias CUTLASS's path adds (+ offset)
    split: Any = None  # its channels-last copies: ConvSplit (3xTF32 by split channels, split_tf32.py) or ConvBf16
    estimate: Any = None  # the cost model's cost.Estimate of its paths
    graph_api: bool = False  # also planned through cuDNN's graph API at setup, the faster kept (dnn_graph.cuh)

    # the 2-d names of the last two spatial dims: input H x W, output P x Q, filter R x S
    @property
    def h(self) -> int:
        return self.size[-2]

    @property
    def w(self) -> int:
        return self.size[-1]

    @property
    def p(self) -> int:
        return self.out_size[-2]

    @property
    def q(self) -> int:
        return self.out_size[-1]

    @property
    def r(self) -> int:
        return self.kernel[-2]

    @property
    def s(self) -> int:
        return self.kernel[-1]


@dataclass
class Lowered:
    group: FusionGroup
    kind: Literal["gemm", "conv", "pointwise", "row", "alias", "sequence", "kernel", "attention"]
    program: Program | None = None
    call: KernelCall | None = None  # a family lowering's kernels and launch
    gemm: Gemm | None = None
    conv: Conv | None = None
    describe: str = ""
    parts: list[Lowered] = field(default_factory=list)  # a "sequence": GEMMs and kernels launched in order
    hoisted: bool = False  # computes from the weights alone: launched with the packs (hoist.py)
    recurrence: Any = None  # sequence_kernel.RecurrenceLaunch: what a one-launch recurrence reads and writes
    attention: Any = None  # attention_kernel.FusedAttention: an attention group as one kernel

    def launches(self) -> list[Lowered]:
        """The launchable pieces in order (the group itself unless it is a sequence)."""
        return [x for p in self.parts for x in p.launches()] if self.kind == "sequence" else [self]


@dataclass
class Lowering:
    """Everything ``generate`` renders: buffers, lowered groups in launch order."""

    graph: OpGraph
    args: list[tuple[str, str, list[int]]] = field(default_factory=list)  # (value, identifier, shape): entry args
    ctypes: dict[str, str] = field(default_factory=dict)  # identifier -> C element type, where not float
    intermediates: list[tuple[str, list[int]]] = field(default_factory=list)  # (identifier, shape)
    outputs: list[tuple[str, str, list[int]]] = field(default_factory=list)  # (value, identifier, shape)
    storage: dict[str, str] = field(default_factory=dict)  # graph value -> buffer identifier
    # values stored as a strided part of another value's buffer (concat_plan.py): value -> (strides, offset)
    layouts: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)
    groups: list[Lowered] = field(default_factory=list)
    uses_blas: bool = False
    uses_dnn: bool = False  # a family lowering calls cuDNN
    convs: list[Conv] = field(default_factory=list)
    lt_gemms: list[Gemm] = field(default_factory=list)
    cutlass: list[Any] = field(default_factory=list)  # distinct CUTLASS configurations, in slot order
    cutlass_slots: list[int] = field(default_factory=list)  # the first slot of each
    cutlass_convs: list[Conv] = field(default_factory=list)
    machine: Any = None  # the cost model's cost.Machine: the GPU table its estimates assume
    estimates: list[Any] = field(default_factory=list)  # cost.Estimate of every product and convolution
    # weights split once (packing.py): the packed parameters' entry buffers, the split launches that
    # remake the packs, their bytes, and the bytes of halves that did not fit the budget
    pack_params: list[str] = field(default_factory=list)
    pack_launches: list[str] = field(default_factory=list)
    pack_bytes: int = 0
    pack_refused: int = 0

    def _grown(self) -> tuple[list, ...]:
        """The lists a lowering only appends to."""
        return (self.args, self.intermediates, self.outputs, self.groups, self.convs, self.lt_gemms, self.cutlass,
                self.cutlass_slots, self.cutlass_convs, self.pack_params, self.pack_launches)

    def mark(self) -> tuple:
        """The record as it stands, for :meth:`undo`: a fused attempt that fails leaves nothing."""
        return (tuple(len(x) for x in self._grown()), dict(self.ctypes), dict(self.storage), self.uses_blas, self.uses_dnn,
                self.pack_bytes, self.pack_refused)

    def undo(self, mark: tuple) -> None:
        """Drop what was added since ``mark``: the buffers, launches and library configurations of a
        fused lowering that refused its group after it had started (its fallback starts clean)."""
        sizes, ctypes, storage, self.uses_blas, self.uses_dnn, self.pack_bytes, self.pack_refused = mark
        for x, n in zip(self._grown(), sizes, strict=True):
            del x[n:]
        self.ctypes, self.storage = ctypes, storage

    def cutlass_slot(self, config: Any) -> int:
        """The launcher slot of ``config``'s kernel extension, added on first use (a convolution's
        extension takes two: its launcher and its workspace function)."""
        if config not in self.cutlass:
            self.cutlass.append(config)
            self.cutlass_slots.append(sum(_slots(c) for c in self.cutlass[:-1]))
        return self.cutlass_slots[self.cutlass.index(config)]

    @property
    def cutlass_slot_count(self) -> int:
        return sum(_slots(c) for c in self.cutlass)


def _slots(config: Any) -> int:
    return 2 if isinstance(config, CutlassConv) else 1


def to_ident(name: str) -> str:
    text = re.sub(r"\W", "_", name)
    return text if text and not text[0].isdigit() else "v_" + text
