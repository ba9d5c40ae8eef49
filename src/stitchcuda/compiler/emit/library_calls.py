"""The host code of the library calls a program makes once per Program and per run: cuDNN's
descriptors and algorithm choice, CUTLASS convolutions' workspace and launch, cuBLASLt's matrix
layouts and epilogues. Lowering decides which calls a program makes (``Conv``, ``Gemm``); this
module writes them as C++ for the program host's template."""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.ir.expr import contiguous_strides, numel
from stitchcuda.compiler.lowering.gemm_calls import _lt_operands
from stitchcuda.compiler.lowering.lowered import Conv, Gemm


def cutlass_conv_args(c: Conv, pointers: bool = True) -> str:
    """The launcher's argument record for ``c`` (only its sizes when ``pointers`` is False: what the
    workspace function reads at setup)."""
    x, w, b, y = (f"a.{c.x}", f"a.{c.weight}", f"a.{c.bias}" if c.bias else "nullptr", f"a.{c.out}") \
        if pointers else ("nullptr",) * 4
    ws = "P.cutlass_ws_ptr, P.cutlass_ws_bytes" if pointers else "nullptr, 0"
    return (f"ScConvArgs ca{{{c.n}, {c.h}, {c.w}, {c.c}, {c.k}, {c.r}, {c.s}, {c.p}, {c.q}, {c.pad[-2]}, {c.pad[-1]}, "
            f"{c.stride[-2]}, {c.stride[-1]}, {c.dilation[-2]}, {c.dilation[-1]}, {x}, {w}, {b}, {y}, {ws}}};")



def cutlass_conv_setup(c: Conv) -> str:
    return (f"{{\n  {cutlass_conv_args(c, pointers=False)}\n  made->cutlass_ws_bytes = std::max<int64_t>("
            f"made->cutlass_ws_bytes, sc_cutlass_conv_workspace({c.slot + 1})(&ca));\n}}")



def conv_members(c: Conv) -> list[str]:
    i = c.index
    return [f"cudnnTensorDescriptor_t dnn_x{i} = nullptr, dnn_y{i} = nullptr;",
            f"cudnnFilterDescriptor_t dnn_w{i} = nullptr;",
            f"cudnnConvolutionDescriptor_t dnn_c{i} = nullptr;",
            f"{'cudnnConvolutionBwdDataAlgo_t' if c.transposed else 'cudnnConvolutionFwdAlgo_t'} dnn_algo{i}{{}};",
            f"size_t dnn_bytes{i} = 0;",
            *([f"std::shared_ptr<ScDnnPlan> dnn_plan{i};  // cuDNN's graph API, where it beat the algorithm"]
              if c.graph_api else [])]



def conv_setup(c: Conv, math: str) -> list[str]:
    """Descriptors and the algorithm (timed by cuDNN at setup, else its heuristics; the first that works under the
    math mode within the workspace limit), once per Program: nothing here runs inside a capture."""
    i, m = c.index, "made->"
    cin = c.split.copies * c.c if c.split is not None else c.c  # split channels: [big | small | big] (split_tf32.py)
    dtype = c.split.data_type if c.split is not None else "CUDNN_DATA_FLOAT"  # bf16 copies: bf16.py
    x_dims, y_dims = (c.n // c.chunks, cin, *c.size), (c.n // c.chunks, c.k, *c.out_size)
    # a transposed convolution is the backward-data of the convolution from its output to its input
    w_dims = (cin, c.k // c.groups, *c.kernel) if c.transposed else (c.k, cin // c.groups, *c.kernel)
    pick = "sc_pick_bwd_data" if c.transposed else "sc_pick_fwd"
    layout = "CUDNN_TENSOR_NHWC" if c.split is not None else "CUDNN_TENSOR_NCHW"
    if len(c.size) == 2:
        descriptors = [
            f"SC_CUDNN_CHECK(cudnnCreateTensorDescriptor(&{m}dnn_x{i}));",
            f"SC_CUDNN_CHECK(cudnnSetTensor4dDescriptor({m}dnn_x{i}, {layout}, {dtype}, "
            f"{', '.join(map(str, x_dims))}));",
            f"SC_CUDNN_CHECK(cudnnCreateTensorDescriptor(&{m}dnn_y{i}));",
            f"SC_CUDNN_CHECK(cudnnSetTensor4dDescriptor({m}dnn_y{i}, {layout}, {dtype}, "
            f"{', '.join(map(str, y_dims))}));",
            f"SC_CUDNN_CHECK(cudnnCreateFilterDescriptor(&{m}dnn_w{i}));",
            f"SC_CUDNN_CHECK(cudnnSetFilter4dDescriptor({m}dnn_w{i}, {dtype}, {layout}, "
            f"{', '.join(map(str, w_dims))}));",
            f"SC_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&{m}dnn_c{i}));",
            f"SC_CUDNN_CHECK(cudnnSetConvolution2dDescriptor({m}dnn_c{i}, {c.pad[0]}, {c.pad[1]}, {c.stride[0]}, "
            f"{c.stride[1]}, {c.dilation[0]}, {c.dilation[1]}, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));",
        ]
    else:  # 3-d: Nd descriptors, fully packed NCDHW (NDHWC when split)
        nd, sp = len(x_dims), len(c.size)

        def arr(v: Any) -> str:
            return "{" + ", ".join(map(str, v)) + "}"

        def strides(dims: tuple[int, ...]) -> tuple[int, ...]:  # NCDHW dims, NDHWC memory when split
            if c.split is None:
                return contiguous_strides(dims)
            last = contiguous_strides((dims[0], *dims[2:], dims[1]))
            return (last[0], 1, *last[1:-1])

        descriptors = [
            f"SC_CUDNN_CHECK(cudnnCreateTensorDescriptor(&{m}dnn_x{i}));",
            f"{{ const int dims[{nd}] = {arr(x_dims)}, strides[{nd}] = {arr(strides(x_dims))};",
            f"  SC_CUDNN_CHECK(cudnnSetTensorNdDescriptor({m}dnn_x{i}, {dtype}, {nd}, dims, strides)); }}",
            f"SC_CUDNN_CHECK(cudnnCreateTensorDescriptor(&{m}dnn_y{i}));",
            f"{{ const int dims[{nd}] = {arr(y_dims)}, strides[{nd}] = {arr(strides(y_dims))};",
            f"  SC_CUDNN_CHECK(cudnnSetTensorNdDescriptor({m}dnn_y{i}, {dtype}, {nd}, dims, strides)); }}",
            f"SC_CUDNN_CHECK(cudnnCreateFilterDescriptor(&{m}dnn_w{i}));",
            f"{{ const int dims[{nd}] = {arr(w_dims)};",
            f"  SC_CUDNN_CHECK(cudnnSetFilterNdDescriptor({m}dnn_w{i}, {dtype}, {layout}, {nd}, "
            "dims)); }",
            f"SC_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&{m}dnn_c{i}));",
            f"{{ const int pad[{sp}] = {arr(c.pad)}, stride[{sp}] = {arr(c.stride)}, dilation[{sp}] = "
            f"{arr(c.dilation)};",
            f"  SC_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor({m}dnn_c{i}, {sp}, pad, stride, dilation, "
            "CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)); }",
        ]
    # the pick's key (a program's convolutions of one shape search once) and its scratch operands'
    # sizes, at 4 bytes an element whatever the data type
    key = "|".join(str(v).replace(" ", "") for v in ("bwd" if c.transposed else "fwd", x_dims, w_dims, y_dims,
                                                     tuple(c.pad), tuple(c.stride), tuple(c.dilation), c.groups,
                                                     layout, dtype, math))
    x_bytes, w_bytes, y_bytes = (4 * numel(d) for d in (x_dims, w_dims, y_dims))
    return [
        *descriptors,
        f"SC_CUDNN_CHECK(cudnnSetConvolutionGroupCount({m}dnn_c{i}, {c.groups}));",
        (f"{m}dnn_algo{i} = {pick}({m}dnn, {m}dnn_w{i}, {m}dnn_x{i}, {m}dnn_c{i}, {m}dnn_y{i}, {math}, "
         f"&{m}dnn_bytes{i}, {m}dnn_picks, \"{key}\", {w_bytes}, {x_bytes}, {y_bytes});" if c.transposed else
         f"{m}dnn_algo{i} = {pick}({m}dnn, {m}dnn_x{i}, {m}dnn_w{i}, {m}dnn_c{i}, {m}dnn_y{i}, {math}, "
         f"&{m}dnn_bytes{i}, {m}dnn_picks, \"{key}\", {x_bytes}, {w_bytes}, {y_bytes});"),
        f"dnn_bytes = std::max(dnn_bytes, {m}dnn_bytes{i});",
        *_plan_setup(c, x_dims, w_dims, y_dims, math),
    ]


def _plan_setup(c: Conv, x_dims: tuple[int, ...], w_dims: tuple[int, ...], y_dims: tuple[int, ...],
                math: str) -> list[str]:
    """The graph API's plan for a forward convolution, timed against the algorithm just picked
    (dnn_graph.cuh); none where the algorithm is as fast."""
    if not c.graph_api:
        return []
    i, m, nd = c.index, "made->", len(x_dims)

    def arr(v: Any) -> str:
        return "{" + ", ".join(map(str, v)) + "}"

    return [
        f"{{ const int64_t xd[{nd}] = {arr(x_dims)}, wd[{nd}] = {arr(w_dims)}, yd[{nd}] = {arr(y_dims)};",
        f"  const int64_t pad[{nd - 2}] = {arr(c.pad)}, stride[{nd - 2}] = {arr(c.stride)}, "
        f"dilation[{nd - 2}] = {arr(c.dilation)};",
        f"  {m}dnn_plan{i} = sc_pick_plan({m}dnn, {m}dnn_plan_cache, {nd}, xd, wd, yd, pad, stride, dilation, {math}, "
        f"{m}dnn_x{i}, {m}dnn_w{i}, {m}dnn_c{i}, {m}dnn_y{i}, {m}dnn_algo{i}, {m}dnn_bytes{i}, kDnnWorkspaceLimit);",
        f"  if ({m}dnn_plan{i}) dnn_bytes = std::max(dnn_bytes, static_cast<size_t>({m}dnn_plan{i}->workspace)); }}",
    ]



def conv_launch(c: Conv) -> str:
    if c.cutlass is not None:
        return (f"{{\n{cutlass_conv_args(c)}\nsc_cutlass_check(sc_cutlass_conv({c.slot})(&ca, stream), "
                f"\"{c.cutlass.describe}\");\n}}")
    i = c.index
    x, weight, out = f"a.{c.x}", f"a.{c.weight}", f"a.{c.out}"
    if c.split is not None:  # the halves in scratch, one TF32 call over three times the channels, back to NCHW
        x, weight, out = f"a.{c.split.x3}", f"a.{c.split.w3}", f"a.{c.split.y}"
    if c.chunks > 1:  # one call per batch slice
        x += f" + b * {numel((c.n // c.chunks, c.c, *c.size))}LL"
        out += f" + b * {numel((c.n // c.chunks, c.k, *c.out_size))}LL"
    if c.transposed:  # dx = conv^T(dy): dy is our input, dx our output
        call = (f"SC_CUDNN_CHECK(cudnnConvolutionBackwardData(P.dnn, &kOne, P.dnn_w{i}, {weight}, P.dnn_x{i}, "
                f"{x}, P.dnn_c{i}, P.dnn_algo{i}, P.dnn_workspace_ptr, P.dnn_bytes{i}, &kZero, P.dnn_y{i}, "
                f"{out}));")
    else:
        call = (f"SC_CUDNN_CHECK(cudnnConvolutionForward(P.dnn, &kOne, P.dnn_x{i}, {x}, P.dnn_w{i}, {weight}, "
                f"P.dnn_c{i}, P.dnn_algo{i}, P.dnn_workspace_ptr, P.dnn_bytes{i}, &kZero, P.dnn_y{i}, {out}));")
        if c.graph_api:  # the plan where setup kept one and the pointers have the alignment it was made for
            call = (f"if (P.dnn_plan{i} && sc_dnn_aligned({x}, {weight}, {out}))\n"
                    f"  SC_CUDNN_CHECK(sc_dnn_execute(P.dnn, P.dnn_plan{i}->plan, {x}, {weight}, {out}, "
                    f"P.dnn_workspace_ptr));\nelse\n  {call}")
    if c.split is not None:
        return "\n".join([*c.split.split_launches(), call, c.split.to_nchw(c.out)])
    return call if c.chunks == 1 else f"for (long long b = 0; b < {c.chunks}; ++b) {{\n  {call}\n}}"



def lt_members(g: Gemm) -> list[str]:
    i = g.lt
    return [f"cublasLtMatmulDesc_t lt_desc{i} = nullptr;",
            f"cublasLtMatrixLayout_t lt_a{i} = nullptr, lt_b{i} = nullptr, lt_d{i} = nullptr;",
            f"cublasLtMatmulAlgo_t lt_algo{i}{{}};"]



def lt_setup(g: Gemm, compute: str) -> list[str]:
    """Descriptors, layouts and the heuristic's algorithm, once per Program (never in a capture)."""
    i, m = g.lt, "made->"
    (_, ar, ac, ald, aal), (_, br, bc, bld, bal), (_, dr, dc, dld, dal) = _lt_operands(g)
    op_a = "CUBLAS_OP_T" if g.b_trans else "CUBLAS_OP_N"
    op_b = "CUBLAS_OP_T" if g.a_trans else "CUBLAS_OP_N"
    # bf16 copies (bf16.py): bf16 A and B, fp32 C and D, fp32 accumulation (FAST_TF32 is no compute
    # type for bf16 operands, whatever the variant's TF32 switch)
    compute = "CUBLAS_COMPUTE_32F" if g.bf16 else "CUBLAS_COMPUTE_32F_FAST_TF32" if g.fast_tf32 else compute
    operand = "CUDA_R_16BF" if g.bf16 else "CUDA_R_32F"
    lines = [
        f"SC_CUBLAS_CHECK(cublasLtMatmulDescCreate(&{m}lt_desc{i}, {compute}, CUDA_R_32F));",
        f"sc_lt_set(made->lt_desc{i}, CUBLASLT_MATMUL_DESC_TRANSA, {op_a});",
        f"sc_lt_set(made->lt_desc{i}, CUBLASLT_MATMUL_DESC_TRANSB, {op_b});",
        f"sc_lt_set(made->lt_desc{i}, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_{g.epilogue or 'DEFAULT'});",
        f"SC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&{m}lt_a{i}, {operand}, {ar}, {ac}, {ald}));",
        f"SC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&{m}lt_b{i}, {operand}, {br}, {bc}, {bld}));",
        f"SC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&{m}lt_d{i}, CUDA_R_32F, {dr}, {dc}, {dld}));",
    ]
    if g.batch > 1:  # strided batches: cuBLASLt's A is our B, its B our A
        lines += [f"sc_lt_batch({m}lt_a{i}, {g.batch}, {g.stride_b});", f"sc_lt_batch({m}lt_b{i}, {g.batch}, {g.stride_a});",
                  f"sc_lt_batch({m}lt_d{i}, {g.batch}, {g.stride_c});"]
    return [*lines, f"{m}lt_algo{i} = sc_lt_algo({m}lt, {m}lt_desc{i}, {m}lt_a{i}, {m}lt_b{i}, {m}lt_d{i}, "
                    f"{aal}, {bal}, {dal});"]
