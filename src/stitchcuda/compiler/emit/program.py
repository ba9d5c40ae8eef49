"""The candidate program: every lowered group's kernels and library calls in launch order, rendered
into the program's kernel library (``templates/program.cu.j2``: CUDA with no torch header, behind a
table of entry points), and the Python module around it (``module.py.j2``), which hands the table
and a :class:`ProgramSpec` to the program host (``templates/program_host.cpp``: argument checks,
allocation, the CUDA graph; one source for every program)."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from stitchcuda.compiler.capture.graph import OpGraph
from stitchcuda.compiler.emit.emit import Emitter
from stitchcuda.compiler.emit.library_calls import (
    conv_launch,
    conv_members,
    conv_setup,
    cutlass_conv_setup,
    lt_members,
    lt_setup,
)
from stitchcuda.compiler.emit.loops import fold_repeats, new_folder
from stitchcuda.compiler.emit.pymodule import REFERENCE_CLASS, reference_init_source
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.lowering.bf16 import KERNEL as BF16_KERNEL
from stitchcuda.compiler.lowering.bf16 import ConvBf16
from stitchcuda.compiler.lowering.cuda_files import TEMPLATES, cuda_file
from stitchcuda.compiler.lowering.cutlass_conv import CONV_ABI, CutlassConv
from stitchcuda.compiler.lowering.cutlass_conv import kernel_sources as conv_sources
from stitchcuda.compiler.lowering.cutlass_gemm import ABI as GEMM_ABI
from stitchcuda.compiler.lowering.cutlass_gemm import CUDA_CFLAGS
from stitchcuda.compiler.lowering.cutlass_gemm import kernel_sources as gemm_sources
from stitchcuda.compiler.lowering.gemm_calls import (
    BATCH_PTRS_KERNEL,
    SPLIT_K_KERNEL,
    TINY_GEMM_KERNEL,
    tiny,
    uses_batch_ptrs,
)
from stitchcuda.compiler.lowering.lower import lower
from stitchcuda.compiler.lowering.lowered import CodegenOptions, Lowering, to_ident
from stitchcuda.compiler.lowering.packing import pack_note
from stitchcuda.compiler.lowering.split_tf32 import KERNEL as SPLIT_KERNEL
from stitchcuda.compiler.lowering.split_tf32 import ConvSplit
from stitchcuda.records import CostEstimate
from stitchcuda.task.record import Task
from stitchcuda.templating import environment

ENTRY_MARK = "// ---- stitchcuda entry point ----"
# A staged graph copies the forward's inputs in and its outputs out to save the host a launch per
# kernel (a few microseconds each); a mebibyte copied costs well under one on these GPUs' memory,
# so a call stages at most this much per launch it saves, and a memory-bound program of a few
# large tensors launches directly
STAGE_BYTES_PER_LAUNCH = 1 << 20
HOST_SOURCE = "program_host.cpp"  # in the templates folder; read as is (C++ braces are not Jinja's)


@functools.cache
def host_source() -> str:
    """StitchCUDA's program host: the torch side of every program (one source, one build per machine)."""
    return (TEMPLATES / HOST_SOURCE).read_text()


@functools.cache
def host_name(source: str) -> str:
    """The host extension's name: by its content, so every program of one StitchCUDA shares its build."""
    return "stitchcuda_host_" + hashlib.sha256(source.encode()).hexdigest()[:16]


def host_module() -> str:
    """A module that builds the program host alone, with the very ``load_inline`` call every program
    makes (one cache entry for both)."""
    source = host_source()
    return environment(TEMPLATES).get_template("program_host_module.py.j2").render(
        host_src=source, host_name=host_name(source))


class ProgramSpec(BaseModel):
    """What the program host needs to know of a program's kernel library: its arguments (names for
    messages, shapes and element types to check), its intermediate buffers and outputs (to allocate),
    the arguments its packed weights come from, the forward's own inputs (read, never written: a
    staged graph may take copies of them, up to ``stage_bytes`` a call in and out), and whether it
    replays a CUDA graph, calls cuBLAS (the host hands it torch's handle) or launches CUTLASS (whose
    operands must be 16-byte aligned)."""

    names: list[str]
    arg_shapes: list[list[int]]
    arg_types: list[str]
    buffer_shapes: list[list[int]]
    buffer_types: list[str]
    output_shapes: list[list[int]]
    output_types: list[str]
    packed: list[int]
    staged: list[int]
    stage_bytes: int
    graph: bool
    blas: bool
    realign: bool

    def arguments(self) -> list[tuple[str, str]]:
        """(name, Python literal) of each field, in the order ``Program(table, ...)`` takes them."""
        return [(name, repr(getattr(self, name))) for name in type(self).model_fields]


def program_spec(program: str) -> ProgramSpec:
    """What a generated program tells its host (``_program = _host.Program(table, ...)``), read back
    from its source."""
    for node in ast.walk(ast.parse(program)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Program":
            values = [ast.literal_eval(a) for a in node.args[1:]]
            return ProgramSpec(**dict(zip(ProgramSpec.model_fields, values, strict=True)))
    raise ValueError("the program makes no Program")


def split_cuda(cuda_src: str) -> tuple[str, str]:
    """(everything before the entry point, the entry point): the tests compile several programs'
    bodies in one translation unit (their namespaces differ), without their table of entry points."""
    head, _, entry = cuda_src.partition(ENTRY_MARK)
    return head, entry


def _signature(task: Task, method: str) -> ast.arguments | None:
    try:
        tree = ast.parse(task.source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    args = item.args
                    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                        if a is not None:
                            a.annotation = None
                    args.defaults = [d if isinstance(d, ast.Constant) else ast.Constant(None) for d in args.defaults]
                    args.kw_defaults = [d if d is None or isinstance(d, ast.Constant) else ast.Constant(None)
                                        for d in args.kw_defaults]
                    return args
    return None


def program_estimate(low: Lowering) -> CostEstimate | None:
    """The cost model's figures for the whole program, as its docstring's ``Estimate`` line."""
    if not low.estimates:
        return None
    return CostEstimate(table=low.machine.table.label, assumed=low.machine.assumed, device=low.machine.device,
                           operators=len(low.estimates), ms=round(sum(e.ms for e in low.estimates), 4),
                           paths=dict(Counter(e.path for e in low.estimates)))


def _estimate_text(low: Lowering) -> str:
    if not low.estimates:
        return ""
    total = sum(e.ms for e in low.estimates)
    fp32 = sum(e.paths.get("cublas", e.paths.get("simt", e.ms)) for e in low.estimates)
    packs = pack_note(low)
    count = len(low.estimates)
    what = "its product or convolution" if count == 1 else f"its {count} products and convolutions"
    return (f"Cost model, {low.machine.label}: {what} "
            f"{total:.3f} ms estimated, {fp32:.3f} ms if all ran in fp32 on cuBLAS and cuDNN." + (f"\n{packs}" if packs else ""))


def _python_literal(value: Any) -> str:
    """A nested list of numbers as Python source (``repr`` writes inf and nan as bare names)."""
    if isinstance(value, list):
        return "[" + ", ".join(_python_literal(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return f"float('{value}')"
    return repr(value)


def _tensor_source(values: Any, shape: list[int], dtype: str) -> str:
    """Python source making a constant tensor: ``torch.full`` where every element is one value."""
    flat, todo = [], [values]
    while todo:
        v = todo.pop()
        if isinstance(v, list):
            todo.extend(v)
        else:
            flat.append(v)
    if len(flat) > 1 and all(repr(v) == repr(flat[0]) for v in flat):
        return f"torch.full({shape}, {_python_literal(flat[0])}, dtype=torch.{dtype})"
    return f"torch.tensor({_python_literal(values)}, dtype=torch.{dtype})"


def _constant_name(target: str) -> str:
    return "_stitchcuda_" + to_ident(target)


class StateReads:
    """How the program reaches the parameters and buffers it hands to its host: each owning
    submodule once through its parent's ``_modules`` dict, then the tensor from that module's
    ``_parameters`` or ``_buffers``. ``get_parameter`` walks (and type-checks) the whole path per
    tensor: for MobileNetV2's 314 tensors that was about 1.5 ms a call on an H100 host, more than
    its kernels take. The reads run again whenever any of those dicts changed
    (``ModelNew._stitchcuda_gather``), so they follow everything a user does to the weights:
    ``load_state_dict``, an optimizer step, ``.to()`` (which replaces buffers), a reassigned
    parameter or submodule."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._modules: dict[str, str] = {"": "self"}

    def _module(self, path: str) -> str:
        if path not in self._modules:
            parent, _, name = path.rpartition(".")
            owner = self._module(parent)
            var = f"_m{len(self._modules)}"
            self.lines.append(f"{var} = {owner}._modules[{name!r}]")
            self._modules[path] = var
        return self._modules[path]

    def read(self, key: str, kind: str) -> str:
        owner, _, name = key.rpartition(".")
        return f"{self._module(owner)}.{'_parameters' if kind == 'parameter' else '_buffers'}[{name!r}]"


def _device_of(graph: OpGraph, by_name: dict[str, str], weight: Callable[[str, str], int]) -> str:
    """Where the program draws its random tensors: the first input's device, else a weight's."""
    for p in graph.placeholders:
        if p.kind == "input" and p.meta is not None:
            return f"{by_name[p.name]}.device"
    for p in graph.placeholders:
        if p.kind in ("parameter", "buffer"):
            return f"w[{weight(p.target, p.kind)}].device"
    return "'cuda'"


def _call_args(args: list[str | int]) -> list[str]:
    """The entry point's arguments as Python, each weight (an ``int``: its index in the gathered
    tuple ``w``) as ``w[i]`` and each run of consecutive weights as one slice ``*w[i:j]``."""
    out: list[str] = []
    run: list[int] = []

    def close() -> None:
        if run:
            out.append(f"w[{run[0]}]" if len(run) == 1 else f"*w[{run[0]}:{run[-1] + 1}]")
            run.clear()

    for a in args:
        if isinstance(a, int) and run and a != run[-1] + 1:
            close()
        if isinstance(a, int):
            run.append(a)
        else:
            close()
            out.append(a)
    close()
    return out


def _state_owners(state: list[str]) -> list[tuple[str, str]]:
    """(module path, attribute) of each plain tensor attribute the program turns into a buffer."""
    return [(name.rpartition(".")[0], name.rpartition(".")[2]) for name in state]


def generate(task: Task, graph: OpGraph, groups: list[FusionGroup], options: CodegenOptions | None = None,
             low: Lowering | None = None) -> str:
    """The candidate program (Python source) for ``task``; raises :class:`Unsupported` saying why not.
    ``low``: the groups already lowered under ``options`` (:meth:`Compiled.lowering`)."""
    options = options or CodegenOptions()
    low = low or lower(graph, groups, options)
    # the kernels' namespace: what the kernels compute (how the outputs nest is the Python side's)
    digest = hashlib.sha256((graph.model_dump_json(exclude={"output_form"}) + options.model_dump_json()).encode()
                            ).hexdigest()[:12]
    prefix = f"sc{digest}"
    emitter = Emitter(low, options, prefix)
    for c in low.convs:  # fp32 forward convolutions, one call each: also through cuDNN's graph API
        c.graph_api = options.dnn_graph and not c.transposed and c.split is None and c.chunks == 1 \
            and c.cutlass is None
    split = any(g.fast_tf32 for g in low.lt_gemms) or any(isinstance(c.split, ConvSplit) for c in low.convs)
    bf16 = any(g.bf16 for g in low.lt_gemms) or any(isinstance(c.split, ConvBf16) for c in low.convs)
    # the split's and bf16's transposing conversions share one tile loop, written once
    kernels = ([cuda_file("tile_transpose.cuh")] if split or bf16 else []) + ([SPLIT_KERNEL] if split else []) + (
        [BF16_KERNEL] if bf16 else [])
    launches: list[str] = []
    gemms = [x.gemm for lg in low.groups for x in lg.launches() if x.gemm is not None]
    if any(g.split_k > 1 for g in gemms):
        kernels.append(SPLIT_K_KERNEL)
    if any(uses_batch_ptrs(g) for g in gemms):
        kernels.append(BATCH_PTRS_KERNEL)
    if any(tiny(g) for g in gemms):
        kernels.append(TINY_GEMM_KERNEL)
    emitted_family: set[str] = set()
    folder = new_folder()
    hoisted: list[str] = []  # groups that compute from the weights alone: launched with the packs
    for lg in low.groups:
        head = f"// group {lg.group.id} ({lg.group.kind}): {lg.describe}"
        if lg.kind == "alias":
            launches.append(head + " -- no launch")
            continue
        if lg.hoisted:
            launches.append(head + " -- from the weights alone: launched with the packs")
        text = [head]
        kinds: dict[str, int] = {}  # a group's second kernel of a kind is named g<id>_1, and so on
        for part in lg.launches():
            if part.call is not None:
                for kname, ksource in part.call.kernels.items():
                    if kname not in emitted_family:
                        emitted_family.add(kname)
                        kernels.append(ksource)
                text.append(part.call.launch)
                continue
            if part.attention is not None:
                k = emitter.attention(part.attention)
                if k.source:
                    kernels.append(k.source)
                text.append(k.launch)
            if part.gemm is not None:
                text.append(emitter.gemm(part.gemm))
            if part.conv is not None:
                text.append(conv_launch(part.conv))
            if part.program is not None and (part.kind not in ("gemm", "conv") or part.program.steps):
                kind = "row" if part.kind == "row" else "pointwise"
                kinds[kind] = kinds.get(kind, -1) + 1
                gid = f"{lg.group.id}_{kinds[kind]}" if kinds[kind] else str(lg.group.id)
                k = emitter.row(gid, part.program) if kind == "row" else emitter.pointwise(gid, part.program)
                if k.source:
                    kernels.append(k.source)
                text.append(k.launch)
        (hoisted if lg.hoisted else launches).append("\n".join([text[0], *fold_repeats(text[1:], folder)]))
    launches = fold_repeats(launches, folder)  # groups alike but for their offsets (cells stepped in Python)
    inputs = [(v, i, s, low.ctypes.get(i, "float")) for v, i, s in low.args]
    low.outputs.sort(key=lambda o: graph.outputs.index(o[0]))
    dnn_math = "CUDNN_TENSOR_OP_MATH" if options.tf32 else "CUDNN_FMA_MATH"
    cuda_src = emitter.env.get_template("program.cu.j2").render(
        ns=prefix, task=task.name, options=options.model_dump(), blas=low.uses_blas, bf16=bf16,
        blas_math="CUBLAS_TF32_TENSOR_OP_MATH" if options.tf32 else "CUBLAS_DEFAULT_MATH", kernels=kernels,
        dnn=bool(low.convs) or low.uses_dnn, dnn_math=dnn_math, dnn_plans=[c.index for c in low.convs if c.graph_api], ctypes=low.ctypes, dnn_members=[m for c in low.convs for m in conv_members(c)],
        lt=bool(low.lt_gemms), lt_members=[m for g in low.lt_gemms for m in lt_members(g)],
        lt_setup=[line for g in low.lt_gemms for line in lt_setup(
            g, "CUBLAS_COMPUTE_32F_FAST_TF32" if options.tf32 else "CUBLAS_COMPUTE_32F")],
        dnn_setup=[line for c in low.convs for line in conv_setup(
            c, "CUDNN_TENSOR_OP_MATH" if c.split is not None else dnn_math)],
        launches=launches, args=inputs, pack_params=low.pack_params, pack_launches=hoisted + low.pack_launches, intermediates=low.intermediates, outputs=low.outputs,
        entry_mark=ENTRY_MARK, prelude=emitter.env.get_template("prelude.cu.j2").render(),
        cutlass=bool(low.cutlass), cutlass_slots=low.cutlass_slot_count, cutlass_abi=GEMM_ABI + CONV_ABI,
        cutlass_setup=[cutlass_conv_setup(c) for c in low.cutlass_convs])
    cpp_src = emitter.env.get_template("program_binding.cpp.j2").render(cutlass=bool(low.cutlass))
    host_src = host_source()
    arg_index = {i: k for k, (_, i, _, _) in enumerate(inputs)}
    forward_inputs = {p.name for p in graph.placeholders if p.kind == "input"}
    spec = ProgramSpec(
        names=[v for v, _, _, _ in inputs], arg_shapes=[list(s) for _, _, s, _ in inputs],
        arg_types=[c for _, _, _, c in inputs],
        buffer_shapes=[list(s) for _, s in low.intermediates],
        buffer_types=[low.ctypes.get(i, "float") for i, _ in low.intermediates],
        output_shapes=[list(s) for _, _, s in low.outputs],
        output_types=[low.ctypes.get(i, "float") for _, i, _ in low.outputs],
        packed=[arg_index[i] for i in low.pack_params],
        staged=[k for k, (v, _, _, _) in enumerate(inputs) if v in forward_inputs],
        stage_bytes=len(launches) * STAGE_BYTES_PER_LAUNCH,
        graph=options.graph, blas=low.uses_blas,
        realign=bool(low.cutlass))
    name = "stitchcuda_offline_" + hashlib.sha256((cuda_src + cpp_src).encode()).hexdigest()[:16]
    fwd_args = _signature(task, "forward")
    entry_inputs = [p for p in graph.placeholders if p.kind == "input"]
    fwd_names = [a.arg for a in fwd_args.args[1:]] if fwd_args is not None and not fwd_args.vararg else []
    if len(fwd_names) != len(entry_inputs) or any(x in ("self", "_host", "_kernels", "_program", "torch", "nn") for x in fwd_names):
        fwd_names = [to_ident(p.name) for p in entry_inputs]
    by_name = dict(zip((p.name for p in entry_inputs), fwd_names, strict=True))
    call_args: list[str | int] = []
    entry = {v for v, _, _ in low.args}
    reads = StateReads()
    weights: dict[str, int] = {}  # gathered once while the model's modules do not change (ModelNew._stitchcuda_gather)

    def weight(target: str, kind: str) -> int:
        return weights.setdefault(reads.read(target, kind), len(weights))

    device = _device_of(graph, by_name, weight)
    for p in graph.placeholders:
        if p.name in entry:
            if p.kind == "constant":
                call_args.append(f"self.{_constant_name(p.target)}")
            elif p.kind == "random":
                call_args.append(graph.draws[p.name].python(device))
            else:
                call_args.append(f"{by_name[p.name]}.contiguous()" if p.kind == "input" else weight(p.target, p.kind))
    estimate = program_estimate(low)
    cutlass_sources = [(c.extension_name, *(conv_sources(c) if isinstance(c, CutlassConv) else gemm_sources(c)))
                       for c in low.cutlass]
    if "'''" in cuda_src or any("'''" in text for source in cutlass_sources for text in source):
        raise Unsupported("generated CUDA contains a triple quote")
    modules = {n.name: n.module for n in graph.nodes}
    return emitter.env.get_template("module.py.j2").render(
        task=task.name, options=options.model_dump(), name=name, cuda_src=cuda_src, cpp_src=cpp_src,
        host_src=host_src, host_name=host_name(host_src), spec=spec.arguments(),
        blas=low.uses_blas, lt=bool(low.lt_gemms), dnn=bool(low.convs) or low.uses_dnn,
        reference_init=reference_init_source(task), reference_class=REFERENCE_CLASS,
        fwd_args=", ".join(["self", *fwd_names]), call_args=_call_args(call_args), output_form=_output_form(graph), state_reads=reads.lines,
        weights=list(weights), state=_state_owners(graph.state),
        constants=[(_constant_name(p.target), _tensor_source(graph.constants[p.target], p.meta.shape, p.meta.dtype))
                   for p in graph.placeholders if p.kind == "constant" and p.name in entry and p.meta is not None],
        cutlass=bool(low.cutlass), cutlass_sources=cutlass_sources, cutlass_flags=repr(CUDA_CFLAGS),
        cutlass_describe=[c.describe for c in low.cutlass],
        estimate=json.dumps(estimate.model_dump(exclude_none=True)) if estimate else "", estimate_text=_estimate_text(low),
        groups=[f"group {lg.group.id} ({lg.group.kind}){_modules_of(modules, lg.group, lg.describe)}: {lg.describe}"
                                            + (" [from the weights alone: run when they change]" if lg.hoisted else "")
                                            for lg in low.groups])


def _output_form(graph: OpGraph) -> str:
    """The expression that nests the program's outputs as the forward returned them, or "" where the
    host's own return (a tensor, or a flat tuple of them) is that form."""
    form, leaves = graph.output_form, len(graph.outputs)
    if form is None or form.kind == "leaf" or (form.kind == "tuple" and leaves > 1 and all(
            item.kind == "leaf" and item.index == i for i, item in enumerate(form.items))):
        return ""
    return form.python("outputs", leaves)


def _modules_of(modules: dict[str, str], group: FusionGroup, describe: str) -> str:
    """" in MODULE, ..." : the model's own module paths the group's operators ran in (``modules``:
    each node's), so that a user reads the program in their model's names (``net.layers.0.norm1``),
    not only the graph's (``view_7``)."""
    found = [m for m in dict.fromkeys(modules.get(n, "") for n in group.nodes) if m]
    found = [m for m in found if m not in describe]
    if not found:
        return ""
    return " in " + ", ".join(found[:2]) + (f" and {len(found) - 2} more" if len(found) > 2 else "")

