"""The host code of a matrix product's library calls: cuBLAS (strided-batched, or by pointer
arrays over two batch dimensions), cuBLASLt (descriptors once per Program, a call per run), the
3xTF32 split's kernels and GEMMs, and a CUTLASS kernel extension's launcher."""

from __future__ import annotations

from dataclasses import replace

from stitchcuda.compiler.ir.expr import c_float
from stitchcuda.compiler.lowering.cuda_files import cuda_file
from stitchcuda.compiler.lowering.lowered import Gemm

SPLIT_K_KERNEL = cuda_file("gemm_split_k.cuh")
# the summing pass's activation codes (SPLIT_K_KERNEL's switch)
SPLIT_K_ACTIVATIONS = {"identity": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4, "sigmoid": 5}


# Scratch for the pointer arrays of a product over two batch dimensions: A's, B's and C's, eight
# bytes a matrix each (six floats), shared by every such product (their launches run in order).
BATCH_PTRS = "x_batch_ptrs"
BATCH_PTRS_KERNEL = cuda_file("gemm_batch_ptrs.cuh")


# Products this small per matrix run on one block each (cuBLAS's smallest tiles ran a recommender's
# 32768 pairwise-interaction products, 17 x 17 x 64, at a few TFLOP/s on an H100: each call moves
# little and the tiles stay mostly empty). Both operands fit in shared memory with padded rows.
TINY_SIDE, TINY_K, TINY_MIN_MATRICES = 32, 128, 256
TINY_GEMM_KERNEL = cuda_file("gemm_tiny.cuh")


def tiny(g: Gemm) -> bool:
    """``g`` runs as :data:`TINY_GEMM_KERNEL` (many products of at most 32 x 32 x 128)."""
    return (max(g.m, g.n) <= TINY_SIDE and g.k <= TINY_K and g.batch * g.outer >= TINY_MIN_MATRICES
            and g.lt is None and g.cutlass is None and g.split is None and g.split_k == 1)


def tiny_launch(g: Gemm) -> str:
    """One block a product, as many threads as the product has 1 x 4 output strips (whole warps,
    at most 128)."""
    lda = g.ld_a or (g.m if g.a_trans else g.k)
    ldb = g.ld_b or (g.k if g.b_trans else g.n)
    strips = g.m * -(-g.n // 4)
    threads = min(128, -(-strips // 32) * 32)
    a_rows, b_rows = str(not g.a_trans).lower(), str(not g.b_trans).lower()
    return (f"sc_tiny_gemm<{g.m}, {g.n}, {g.k}, {a_rows}, {b_rows}, {threads}><<<{g.batch * g.outer}, {threads}, 0, "
            f"stream>>>(a.{g.a}, a.{g.b}, a.{g.out}, {lda}LL, {ldb}LL, {g.ld_c or g.n}LL, {g.batch}, "
            f"{g.stride_a}LL, {g.outer_a}LL, {g.stride_b}LL, {g.outer_b}LL, {g.stride_c}LL, {g.outer_c}LL, "
            f"{c_float(g.alpha)});\n"
            "SC_CUDA_CHECK(cudaGetLastError());")


def _lt_operands(g: Gemm) -> list[tuple[str, int, int, int, int]]:
    """(buffer, rows, cols, leading dimension, byte alignment) of cuBLASLt's A, B and D: the
    column-major view of the row-major product, C^T = B^T A^T, as in ``gemm_launch``."""
    def align(buf: str) -> int:
        off = int(buf.split(" + ")[1]) if " + " in buf else 0
        a = 256
        while off and (off * 4) % a:
            a //= 2
        return a

    lt_a = (g.b, g.k, g.n, g.ld_b or g.k) if g.b_trans else (g.b, g.n, g.k, g.ld_b or g.n)
    lt_b = (g.a, g.m, g.k, g.ld_a or g.m) if g.a_trans else (g.a, g.k, g.m, g.ld_a or g.k)
    lt_d = (g.out, g.n, g.m, g.ld_c or g.n)
    return [(*x, align(x[0])) for x in (lt_a, lt_b, lt_d)]


def lt_launch(g: Gemm, accumulate: bool = False) -> str:
    """One cuBLASLt call; ``accumulate``: D = A.B + D (C is the output itself, beta 1)."""
    i = g.lt
    lines = ["{"]
    if g.bias:
        lines += [f"  const float* bias = a.{g.bias};",
                  f"  SC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(P.lt_desc{i}, CUBLASLT_MATMUL_DESC_BIAS_POINTER, "
                  "&bias, sizeof(bias)));"]
    alpha = "&kOne"
    if g.alpha != 1.0:
        lines.append(f"  const float kAlpha = {c_float(g.alpha)};")
        alpha = "&kAlpha"
    beta = "&kOne" if accumulate else "&kZero"
    lines += [f"  SC_CUBLAS_CHECK(cublasLtMatmul(P.lt, P.lt_desc{i}, {alpha}, a.{g.b}, P.lt_a{i}, a.{g.a}, P.lt_b{i}, "
              f"{beta}, a.{g.out}, P.lt_d{i}, a.{g.out}, P.lt_d{i}, &P.lt_algo{i}, P.lt_workspace_ptr, "
              "kLtWorkspaceBytes, stream));", "}"]
    return "\n".join(lines)


def split_launch(g: Gemm) -> str:
    """3xTF32 by split operands: both operands' TF32 halves, the cross products, then the big one
    on top of them (C = the output) with the epilogue. bf16 copies: both copies, then one GEMM."""
    plan = g.split
    splits = [op.launch() for op in (plan.a, plan.b) if not op.packed]  # a packed weight's halves are kept
    gemms = [lt_launch(plan.main)] if plan.cross is None else [lt_launch(plan.cross), lt_launch(plan.main, True)]
    return "\n".join(["{", *splits, *gemms, "}"])


def cutlass_launch(g: Gemm) -> str:
    """One call of the kernel extension's launcher through the program's slot table (a host loop
    over an outer batch dimension that does not fold into the strided one)."""
    lda = g.ld_a or (g.m if g.a_trans else g.k)
    ldb = g.ld_b or (g.k if g.b_trans else g.n)

    def ptr(buf: str, step: int) -> str:
        return f"a.{buf}" + (f" + o * {step}LL" if g.outer > 1 and step else "")

    c = f"a.{g.c}" if g.c else "nullptr"
    call = (f"ScGemmArgs ga{{{g.m}, {g.n}, {g.k}, {g.batch}, {ptr(g.a, g.outer_a)}, {ptr(g.b, g.outer_b)}, {c}, "
            f"{ptr(g.out, g.outer_c)}, {lda}, {ldb}, {g.ld_c_src}, {g.ld_c or g.n}, {g.stride_a}, {g.stride_b}, "
            f"{g.stride_c_src}, {g.stride_c}, {c_float(g.alpha)}, {c_float(g.beta)}}};\n"
            f"sc_cutlass_check(sc_cutlass_gemm({g.slot})(&ga, stream), \"{g.cutlass.describe}\");")
    if g.outer > 1:
        return f"for (int o = 0; o < {g.outer}; ++o) {{\n{call}\n}}"
    if g.split_k > 1:
        mn = g.m * g.n
        c = f"a.{g.split_k_c}" if g.split_k_c else "nullptr"
        call += (f"\nsc_sum_slices<<<{min((mn + 255) // 256, 1 << 20)}, 256, 0, stream>>>(a.{g.out}, "
                 f"a.{g.split_k_out}, {mn}LL, {g.split_k}, {c}, {g.split_k_ld_c}LL, {g.n}LL, "
                 f"{c_float(g.split_k_beta)}, {SPLIT_K_ACTIVATIONS[g.split_k_act]});")
    return f"{{\n{call}\n}}"


def gemm_launch(g: Gemm) -> str:
    if g.split is not None:
        return split_launch(g)
    if g.cutlass is not None:
        return cutlass_launch(g)
    if g.lt is not None:
        return lt_launch(g)
    if tiny(g):
        return tiny_launch(g)
    if g.staged is not None:  # on copies padded to multiples of 4 (padded_gemm.py)
        return "\n".join(["{", *g.staged.before(), gemm_launch(replace(g.staged.apply(g), staged=None)),
                          *g.staged.after(), "}"])
    # Row-major C[M,N] = A[M,K] B[K,N] is column-major C^T = B^T A^T: cuBLAS's first operand
    # is B (as B^T, [N x K]), its second A (as A^T, [K x M]), ldc = N.
    # Strided views pass their row stride as the leading dimension. Two batch dimensions that fold
    # into no single stride (attention's heads inside its batch) run as ONE pointer-array call:
    # a host loop of strided calls, one per outer index, ran attention's small products 3x slower
    # than eager's single batched call on an H100.
    op_b, ld_b = ("CUBLAS_OP_T", g.ld_b or g.k) if g.b_trans else ("CUBLAS_OP_N", g.ld_b or g.n)
    op_a, ld_a = ("CUBLAS_OP_T", g.ld_a or g.m) if g.a_trans else ("CUBLAS_OP_N", g.ld_a or g.k)
    ld_c = g.ld_c or g.n
    pa, pb, pc = f"a.{g.a}", f"a.{g.b}", f"a.{g.out}"
    one = "&kOne" if g.alpha == 1.0 else "&kAlpha"
    if g.outer > 1:
        total = g.outer * g.batch
        call = "\n".join([
            f"const float** sc_pa = reinterpret_cast<const float**>(a.{BATCH_PTRS});",
            f"const float** sc_pb = sc_pa + {total};",
            f"float** sc_pc = reinterpret_cast<float**>(a.{BATCH_PTRS}) + {2 * total};",
            f"sc_batch_ptrs<<<{-(-total // 256)}, 256, 0, stream>>>({pa}, {pb}, {pc}, {g.batch}, {total}, "
            f"{g.stride_a}LL, {g.outer_a}LL, {g.stride_b}LL, {g.outer_b}LL, {g.stride_c}LL, {g.outer_c}LL, "
            "sc_pa, sc_pb, sc_pc);",
            "SC_CUDA_CHECK(cudaGetLastError());",
            f"SC_CUBLAS_CHECK(cublasSgemmBatched(blas, {op_b}, {op_a}, {g.n}, {g.m}, {g.k}, {one}, sc_pb, {ld_b}, "
            f"sc_pa, {ld_a}, &kZero, sc_pc, {ld_c}, {total}));"])
    elif g.batch == 1:
        call = (f"SC_CUBLAS_CHECK(cublasSgemm(blas, {op_b}, {op_a}, {g.n}, {g.m}, {g.k}, {one}, {pb}, {ld_b}, "
                f"{pa}, {ld_a}, &kZero, {pc}, {ld_c}));")
    else:
        call = (f"SC_CUBLAS_CHECK(cublasSgemmStridedBatched(blas, {op_b}, {op_a}, {g.n}, {g.m}, {g.k}, {one}, "
                f"{pb}, {ld_b}, {g.stride_b}LL, {pa}, {ld_a}, {g.stride_a}LL, &kZero, {pc}, {ld_c}, "
                f"{g.stride_c}LL, {g.batch}));")
    if g.alpha != 1.0 or g.outer > 1:
        call = "{\n" + (f"const float kAlpha = {c_float(g.alpha)};\n" if g.alpha != 1.0 else "") + call + "\n}"
    return call


def uses_batch_ptrs(g: Gemm) -> bool:
    """``g`` runs as a cuBLAS pointer-array call (and needs :data:`BATCH_PTRS` and its kernel)."""
    return g.outer > 1 and g.lt is None and g.cutlass is None and g.split is None and not tiny(g)
