"""What a candidate computes in, as far as its source, its flags and its error show."""

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
    (r"\b__half2?\b|\bhalf\b|at::Half|torch\.(?:float16|half)\b|\.half\(\)", "fp16"),
    (r"__nv_bfloat16|at::BFloat16|torch\.bfloat16|\.bfloat16\(\)", "bf16"),
    (r"__nv_fp8|float8_e4m3|float8_e5m2", "fp8"),
    (r"\bwmma::|mma\.sync|\bwgmma\b|\bmma_sync\b", "tensor-core mma"),
    # what turns TF32 on, not the word: a strict program's comment saying "no TF32" is no disclosure
    (r"CUBLAS_COMPUTE_32F_FAST_TF32|CUBLAS_TF32_TENSOR_OP_MATH|CUDNN_TENSOR_OP_MATH|allow_tf32\s*=\s*True|"
     r"float32_matmul_precision\(\s*['\"](?:high|medium)|__float_to_tf32|precision::tf32|\.tf32\b", "tf32"),
    (r"\bautocast\b", "autocast"),
]


_C_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def source_hints(source: str) -> list[str]:
    code = _C_COMMENTS.sub("", source)
    return [hint for pattern, hint in _SOURCE_HINTS if re.search(pattern, code)]


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
    suggests = error_suggests(rel_l2)
    parts = []
    if output_dtypes:
        parts.append("outputs " + ", ".join(sorted(set(output_dtypes))))
    if hints:
        parts.append("source uses " + ", ".join(hints))
    if flags_changed:
        parts.append("changed " + ", ".join(flags_changed))
    if suggests:
        parts.append(f"error consistent with {suggests}")
    return Precision(output_dtypes=output_dtypes, source_hints=hints, flags_changed=flags_changed,
                     error_suggests=suggests, summary="; ".join(parts) or "unknown")
