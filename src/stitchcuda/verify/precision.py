"""What a candidate computes in, as far as its source, its flags and its error show.

Two readings of the same evidence:

- ``hints``: reduced-precision constructs named in the source (fp16, bf16, fp8, tensor-core mma,
  tf32, autocast), as before (comments, Python's too, and the English word "half" are no evidence;
  a CUTLASS tensor-op GEMM on float operands with the plain operator counts as "tf32");
- ``arithmetic``: the arithmetic the candidate's heavy math runs in, named exactly (``ARITHMETICS``).

The source is the candidate's whole ``.py`` text (``judge`` passes ``candidate.source``): the CUDA
and C++ of every kernel extension it builds are string constants in it, handed to ``load_inline``,
so regexes over it see them. What it does not see: sources read from files at run time, or text
assembled from fragments that split a keyword.

Arithmetic rules (comments stripped first; see :func:`arithmetic_of`):

- 3xTF32 (fp32 accumulate): CUTLASS ``OpMultiplyAddFastF32`` (also the complex variant), or a
  hand-written hi/lo split: ``big = <tf32 conversion>(x)`` and a second tf32 conversion of an
  expression subtracting ``big`` (``small = __float_to_tf32(x - big)``). A conversion without such a
  split is TF32.
- TF32 (fp32 accumulate): a CUTLASS tensor-op (``OpClassTensorOp``) GEMM/convolution on ``float``
  (or ``tfloat32_t``) operands with plain ``OpMultiplyAdd`` or no math operator named (CUTLASS's
  default for float tensor ops). The operand type is the first element type among the declaration's
  template arguments, through ``using``/``typedef`` aliases; none visible counts as float (this
  project's programs hold fp32 data). No operator named in the declaration while a Fast one is
  named elsewhere (``using MathOp = ...FastF32``) counts as that Fast one. PTX ``mma.sync`` / ``wgmma`` on ``.tf32``, ``cvt.*.tf32``,
  ``wmma::precision::tf32``, ``__float_to_tf32``; cuBLAS ``CUBLAS_COMPUTE_32F_FAST_TF32`` or
  ``CUBLAS_TF32_TENSOR_OP_MATH``; cuDNN ``CUDNN_TENSOR_OP_MATH``; torch ``allow_tf32 = True``,
  ``set_float32_matmul_precision("high")``, or a changed TF32 flag at run time.
- bf16 (fp32 accumulate): CUTLASS ``OpMultiplyAddFastBF16`` or tensor ops on ``bfloat16_t``; PTX/wmma
  on bf16; ``CUBLAS_COMPUTE_32F_FAST_16BF``; cuBLASLt layouts of ``CUDA_R_16BF`` operands; cuDNN
  ``CUDNN_DATA_BFLOAT16`` tensors; ``set_float32_matmul_precision("medium")``.
- fp16 (fp32 accumulate): CUTLASS ``OpMultiplyAddFastF16``, or tensor ops on ``half_t`` with a float
  in the same declaration (the accumulator); PTX/wmma on f16 with an f32 accumulator;
  ``CUBLAS_COMPUTE_32F_FAST_16F``; ``CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION`` (lets cuDNN convert fp32
  data down); autocast (fp16 unless bf16 is named).
- fp16: the same tensor-core constructs with an f16 accumulator, ``CUBLAS_COMPUTE_16F``; or half types
  used by the candidate's own code or outputs (``__half``, ``half2``, ``at::Half``, ``torch.float16``,
  ``.half()``) where no fp16 tensor-core arithmetic explains them.
- bf16: bf16 types in the candidate's own code or outputs where no bf16 tensor-core arithmetic
  explains them (the accumulation is not visible).
- fp8: ``__nv_fp8*``, ``float8_e4m3/e5m2``, CUTLASS ``float_e4m3_t/float_e5m2_t``, PTX e4m3/e5m2.

The verdict's ``arithmetic`` lists every one found, most accurate first, joined with " + "; fp32
plain kernels beside them are not listed (every program has some). "fp32" when none is found.
"""

from __future__ import annotations

import re

from stitchcuda.verify.verdict import Precision

# Flags of verify.torch_state that change numerics; a change is a precision disclosure.
PRECISION_FLAGS = {
    "cuda.matmul.allow_tf32", "cudnn.allow_tf32", "float32_matmul_precision",
    "cuda.matmul.allow_fp16_reduced_precision_reduction", "cuda.matmul.allow_bf16_reduced_precision_reduction",
    "default_dtype", "autocast.cuda",
}

# (pattern in the candidate's source, what it suggests)
_SOURCE_HINTS: list[tuple[str, str]] = [
    # half as a type, not the English word ("split in half", "a half-speed clock"): _FP16_TYPES below
    (r"\b__half2?\b|\bhalf2\b|__float2half|__half2float|\bat::Half\b|\bc10::Half\b|torch\.(?:float16|half)\b|"
     r"\.half\(\)|\bhalf\s*[*&>]|<\s*half\b|\(\s*half\s*\)|\bhalf\s+[A-Za-z_]\w*\s*[=;\[]|"
     r"[(,]\s*(?:const\s+)?half\s+[A-Za-z_]\w*\s*[,)]", "fp16"),
    (r"__nv_bfloat16|at::BFloat16|torch\.bfloat16|\.bfloat16\(\)", "bf16"),
    (r"__nv_fp8|float8_e4m3|float8_e5m2", "fp8"),
    (r"\bwmma::|mma\.sync|\bwgmma\b|\bmma_sync\b", "tensor-core mma"),
    # what turns TF32 on, not the word: a strict program's comment saying "no TF32" is no disclosure
    (r"CUBLAS_COMPUTE_32F_FAST_TF32|CUBLAS_TF32_TENSOR_OP_MATH|CUDNN_TENSOR_OP_MATH|allow_tf32\s*=\s*True|"
     r"float32_matmul_precision\(\s*['\"](?:high|medium)|__float_to_tf32|precision::tf32|\.tf32\b", "tf32"),
    (r"\bautocast\b", "autocast"),
]

# --- arithmetic names, most accurate first ---------------------------------------------------------
FP32 = "fp32"
X3TF32 = "3xTF32 (fp32 accumulate)"
TF32 = "TF32 (fp32 accumulate)"
BF16_ACC32 = "bf16 (fp32 accumulate)"
FP16_ACC32 = "fp16 (fp32 accumulate)"
BF16 = "bf16"
FP16 = "fp16"
FP8 = "fp8"
ARITHMETICS = (X3TF32, TF32, BF16_ACC32, FP16_ACC32, BF16, FP16, FP8)

# C/C++ comments, and Python comments ("# " after the start of a line or a space: never #include,
# #define or #pragma, whose '#' is followed by a letter).
_C_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_PY_COMMENTS = re.compile(r"(?m)(?:^|(?<=\s))#(?=\s)[^\n]*")

# Library and framework switches, anywhere in the code.
_SWITCHES: list[tuple[str, str]] = [
    (r"\bCUBLAS_COMPUTE_32F_FAST_TF32\b|\bCUBLAS_TF32_TENSOR_OP_MATH\b|\bCUDNN_TENSOR_OP_MATH\b|"
     r"allow_tf32\s*=\s*True|float32_matmul_precision\(\s*['\"]high['\"]", TF32),
    (r"\bCUBLAS_COMPUTE_32F_FAST_16BF\b|float32_matmul_precision\(\s*['\"]medium['\"]", BF16_ACC32),
    # cuBLASLt on bf16 operands (fp32 compute: no 16-bit compute type takes bf16) and cuDNN's
    # bf16 tensors under an fp32 compute type (its PSEUDO_BFLOAT16 configuration)
    (r"\bcublasLtMatrixLayoutCreate\s*\([^;]*\bCUDA_R_16BF\b|\bCUDNN_DATA_BFLOAT16\b", BF16_ACC32),
    (r"\bCUBLAS_COMPUTE_32F_FAST_16F\b|\bCUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION\b", FP16_ACC32),
    (r"\bCUBLAS_COMPUTE_16F\b", FP16),
    (r"\bOpMultiplyAdd(?:Complex)?FastF32\b", X3TF32),
    (r"\bOpMultiplyAddFastBF16\b", BF16_ACC32),
    (r"\bOpMultiplyAddFastF16\b", FP16_ACC32),
    (r"\bwmma::precision::tf32\b|\bprecision::tf32\b|\b__float_to_tf32\b|\bcvt\.\w+\.tf32\.f32\b", TF32),
    (r"__nv_fp8|float8_e4m3|float8_e5m2|\bfloat_e4m3_t\b|\bfloat_e5m2_t\b|\.e4m3\b|\.e5m2\b", FP8),
]
_FAST_OPS = re.compile(r"\bOpMultiplyAdd(?:Complex)?Fast(?:F32|BF16|F16)\b")

# CUTLASS: a declaration naming OpClassTensorOp, its operand element types and its math operator.
_TENSOR_OP = re.compile(r"\bOpClassTensorOp\b")
_ELEMENTS = {"float": "float", "tfloat32_t": "tfloat32_t", "half_t": "half_t", "half": "half_t", "__half": "half_t",
             "bfloat16_t": "bfloat16_t", "float_e4m3_t": "fp8", "float_e5m2_t": "fp8", "double": "double",
             "int8_t": "int", "uint8_t": "int", "int4b_t": "int", "uint4b_t": "int", "int32_t": "int"}
_ALIASES = re.compile(r"\busing\s+(\w+)\s*=\s*(?:typename\s+)?([\w:]+)\s*;|\btypedef\s+([\w:]+)\s+(\w+)\s*;")
_MATH_OP = re.compile(r"\bOpMultiplyAdd\w*")

# PTX matrix instructions: their type suffixes name the arithmetic.
_PTX_MMA = re.compile(r"\b(?:wgmma\.mma_async|mma\.sync)((?:\.\w+)+)")
# wmma fragments: operand and accumulator types.
_WMMA_AB = re.compile(r"\bmatrix_[ab]\s*,\s*\w+\s*,\s*\w+\s*,\s*\w+\s*,\s*((?:\w+::)*\w+)")
_WMMA_ACC = re.compile(r"\baccumulator\s*,\s*\w+\s*,\s*\w+\s*,\s*\w+\s*,\s*((?:\w+::)*\w+)")

# A conversion to tf32 (an intrinsic or the candidate's own helper naming tf32), assigned to an lvalue.
_TF32_FN = r"(?:\w+::)*\w*tf32\w*\s*\("
_TF32_ASSIGN = re.compile(r"([A-Za-z_][\w.\[\]]*)\s*=\s*" + _TF32_FN)

# Half and bfloat16 used as types by the candidate's own code (not the English word "half").
_FP16_TYPES = re.compile(_SOURCE_HINTS[0][0])
_BF16_TYPES = re.compile(r"__nv_bfloat162?|\bat::BFloat16\b|\bc10::BFloat16\b|torch\.bfloat16\b|\.bfloat16\(\)|"
                         r"__float2bfloat16|__bfloat162float")


def strip_comments(source: str) -> str:
    return _PY_COMMENTS.sub("", _C_COMMENTS.sub("", source))


def source_hints(source: str) -> list[str]:
    code = strip_comments(source)
    # a CUTLASS tensor-op GEMM on float operands with the plain operator is TF32 without naming it
    return [hint for pattern, hint in _SOURCE_HINTS
            if re.search(pattern, code) or (hint == "tf32" and TF32 in _cutlass_tensor_ops(code))]


def _statement(code: str, at: int) -> str:
    """The declaration around position ``at``: from the previous ';', '{' or '}' to the next ';'."""
    start = max(code.rfind(c, 0, at) for c in ";{}") + 1
    end = code.find(";", at)
    return code[start:end if end >= 0 else len(code)]


def _element_types(decl: str, aliases: dict[str, str]) -> list[str]:
    """The element types among a declaration's template arguments, in order, through aliases."""
    found = []
    for token in re.split(r"[<>,()]", decl):
        name = token.replace("typename", "").strip().split("::")[-1]
        for _ in range(3):  # using ElementA = ElementInput; using ElementInput = float;
            if name in _ELEMENTS or name not in aliases:
                break
            name = aliases[name]
        if name in _ELEMENTS:
            found.append(_ELEMENTS[name])
    return found


def _cutlass_tensor_ops(code: str) -> set[str]:
    """Arithmetic of each CUTLASS tensor-op declaration, from its first operand type and math op."""
    found: set[str] = set()
    fast_anywhere = bool(_FAST_OPS.search(code))
    aliases = {(m.group(1) or m.group(4)): (m.group(2) or m.group(3)).split("::")[-1] for m in _ALIASES.finditer(code)}
    for match in _TENSOR_OP.finditer(code):
        decl = _statement(code, match.start())
        ops = _MATH_OP.findall(decl)
        if any("Fast" in op for op in ops):
            continue  # named by _SWITCHES
        if not ops and fast_anywhere:
            continue  # the math operator comes through an alias, most likely the Fast one named elsewhere
        elements = _element_types(decl, aliases)
        # no element type visible: this project's programs hold fp32 data, and CUTLASS's default
        # operator for float tensor ops is TF32
        element = elements[0] if elements else "float"
        if element in ("float", "tfloat32_t"):
            found.add(TF32)
        elif element == "half_t":
            found.add(FP16_ACC32 if "float" in elements else FP16)
        elif element == "bfloat16_t":
            found.add(BF16_ACC32)
        elif element == "fp8":
            found.add(FP8)
    return found


def _ptx_and_wmma(code: str) -> set[str]:
    found: set[str] = set()
    for match in _PTX_MMA.finditer(code):
        types = set(match.group(1).split("."))
        if "tf32" in types:
            found.add(TF32)
        elif "bf16" in types:
            found.add(BF16_ACC32)
        elif types & {"e4m3", "e5m2"}:
            found.add(FP8)
        elif "f16" in types:
            found.add(FP16_ACC32 if "f32" in types else FP16)
    operands = {t.split("::")[-1] for t in _WMMA_AB.findall(code)}
    accumulators = {t.split("::")[-1] for t in _WMMA_ACC.findall(code)}
    if operands & {"half", "__half"}:
        found.add(FP16_ACC32 if "float" in accumulators else FP16)
    if operands & {"__nv_bfloat16", "nv_bfloat16"}:
        found.add(BF16_ACC32)
    if "tf32" in operands:
        found.add(TF32)
    return found


def tf32_split(code: str) -> bool:
    """A visible hi/lo split: ``big = tf32(x)`` and a tf32 conversion of something minus ``big``."""
    for match in _TF32_ASSIGN.finditer(code):
        big = re.escape(match.group(1))
        if re.search(_TF32_FN + r"[^;]*-\s*(?:[\w:]+\s*\(\s*)?" + big + r"(?![\w\[.])", code):
            return True
    return False


def arithmetic_of(source: str, output_dtypes: list[str] | tuple[str, ...] = (),
                  flags_changed: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The arithmetics the candidate computes in, most accurate first; [] means plain fp32."""
    code = strip_comments(source)
    found: set[str] = set()
    for pattern, name in _SWITCHES:
        if re.search(pattern, code):
            found.add(name)
    found |= _cutlass_tensor_ops(code)
    found |= _ptx_and_wmma(code)
    if TF32 in found and tf32_split(code):  # the hand-written 3xTF32: its conversions are not plain TF32
        found.discard(TF32)
        found.add(X3TF32)
    if re.search(r"\bautocast\b", code) or "autocast.cuda" in flags_changed:
        found.add(BF16_ACC32 if _BF16_TYPES.search(code) else FP16_ACC32)
    if {"cuda.matmul.allow_tf32", "cudnn.allow_tf32", "float32_matmul_precision"} & set(flags_changed):
        found.add(TF32)  # the worker turns TF32 off before the candidate: a change turned it on
    dtypes = set(output_dtypes)
    if (_FP16_TYPES.search(code) or "float16" in dtypes) and not found & {FP16_ACC32, FP16}:
        found.add(FP16)
    if (_BF16_TYPES.search(code) or "bfloat16" in dtypes) and BF16_ACC32 not in found:
        found.add(BF16)
    if any(d.startswith("float8") for d in dtypes):
        found.add(FP8)
    return [name for name in ARITHMETICS if name in found]


def describe(arithmetics: list[str]) -> str:
    return " + ".join(arithmetics) or FP32


def error_suggests(rel_l2: float | None) -> str | None:
    """What a relative L2 error against the fp32 reference is consistent with."""
    if rel_l2 is None:
        return None
    if rel_l2 <= 2e-5:
        return "fp32"
    if rel_l2 <= 2e-3:
        return "tf32 or fp32 with reordered reductions"
    return "fp16/bf16 or lower"


def assess(source: str, output_dtypes: list[str], flags_changed: list[str], rel_l2: float | None) -> Precision:
    hints = source_hints(source)
    flags_changed = [f for f in flags_changed if f in PRECISION_FLAGS]
    arithmetic = describe(arithmetic_of(source, output_dtypes, flags_changed))
    suggests = error_suggests(rel_l2)
    parts = [f"computes in {arithmetic}"]
    if output_dtypes:
        parts.append("outputs " + ", ".join(sorted(set(output_dtypes))))
    if hints:
        parts.append("source uses " + ", ".join(hints))
    if flags_changed:
        parts.append("changed " + ", ".join(flags_changed))
    if suggests:
        parts.append(f"error consistent with {suggests}")
    return Precision(output_dtypes=output_dtypes, source_hints=hints, flags_changed=flags_changed,
                     error_suggests=suggests, arithmetic=arithmetic, summary="; ".join(parts))
