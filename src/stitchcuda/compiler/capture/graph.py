"""The reference's operator graph: one torch.export capture on the meta device (no compute, no
GPU), lowered to core ATen with torch's own decomposition table.

The model is captured in the mode its constructor leaves it in (KernelBench never calls
``.eval()``: BatchNorm then uses batch statistics and updates its running statistics, which the
graph returns as buffer mutations). Functionalisation removes in-place ops. The operators of
``KEEP`` stay whole because the compiler lowers them better than their decomposition. Every
value carries its shape and dtype, parameters and buffers keep their ``state_dict`` names, and
each node remembers the module it ran in. Capture failures raise :class:`CaptureError`.
"""

from __future__ import annotations

import logging
import math
import threading
import types
import warnings
from typing import Any, Literal

from pydantic import BaseModel, Field

from stitchcuda.compiler.capture.bounded import UnboundedSize, bound_data_dependent_sizes
from stitchcuda.compiler.capture.fast_paths import as_cuda_inference
from stitchcuda.compiler.capture.state import state_as_buffers
from stitchcuda.task.record import Task

# torch's tracing machinery (torch.export, fx's patcher, the proxy and fake dispatch modes) keeps
# process-wide state, and so does ``with torch.device(...)`` (the default device is a module
# global): a model built on the meta device in one thread while another thread traces (a bench's
# tasks) corrupts that trace (HF GPT-2's mask: "Cannot view a tensor ..." under torch 2.11). So a
# capture holds this lock from building the model to its last forward.
TRACE_LOCK = threading.RLock()


class CaptureError(RuntimeError):
    """The reference's graph could not be captured; the message says why."""


class TensorMeta(BaseModel):
    shape: list[int]
    dtype: str  # "float32", "int64", ...

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


Arg = str | int | float | bool | None | list  # a value name ("%name"), a constant, or a list of them


class Node(BaseModel):
    name: str
    op: str = Field(description="ATen overload packet, e.g. aten.addmm, aten.gelu")
    overload: str = Field("default", description="e.g. default, Tensor, Scalar, dim_IntList")
    args: list[Any] = Field([], description="'%name' for graph values, constants otherwise")
    kwargs: dict[str, Any] = {}
    out: list[TensorMeta] = Field(description="one entry per tensor output (several for e.g. layer_norm)")
    module: str = Field("", description="the nn.Module path the op ran in ('' at top level)")

    def inputs(self) -> list[str]:
        """Names of the graph values this node reads."""
        found: list[str] = []

        def walk(value: Any) -> None:
            if isinstance(value, str) and value.startswith("%"):
                found.append(value[1:])
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v)

        walk(self.args)
        walk(list(self.kwargs.values()))
        return found

    def reading(self, alias: dict[str, str]) -> Node:
        """This node reading value ``alias[v]`` wherever it read ``v``."""

        def rename(value: Any) -> Any:
            if isinstance(value, str) and value.startswith("%") and value[1:] in alias:
                return "%" + alias[value[1:]]
            if isinstance(value, (list, tuple)):
                return [rename(v) for v in value]
            return value

        return self.model_copy(update={"args": rename(self.args),
                                       "kwargs": {k: rename(v) for k, v in self.kwargs.items()}})


class Draw(BaseModel):
    """A tensor the forward draws from torch's generator (an initial state, a dropout mask's
    uniforms): the program draws the same distribution, shape and dtype on the device, each call."""

    fn: Literal["rand", "randn", "randint", "randperm", "normal"]
    shape: list[int]
    dtype: str
    low: int = 0  # randint's range [low, high)
    high: int = 0
    mean: float = 0.0  # normal's
    std: float = 1.0

    def python(self, device: str) -> str:
        """The call that draws it in the generated ``forward`` (``device``: an expression)."""
        where = f"dtype=torch.{self.dtype}, device={device}"
        size = repr(tuple(self.shape))
        if self.fn == "randint":
            return f"torch.randint({self.low}, {self.high}, {size}, {where})"
        if self.fn == "randperm":
            return f"torch.randperm({self.shape[0]}, {where})"
        if self.fn == "normal":
            return f"torch.normal({self.mean!r}, {self.std!r}, size={size}, {where})"
        return f"torch.{self.fn}({size}, {where})"


class Placeholder(BaseModel):
    name: str
    kind: Literal["input", "parameter", "buffer", "constant", "random"]
    target: str = Field("", description="state_dict key for parameters and buffers; input index as text")
    meta: TensorMeta | None = None


class OutputForm(BaseModel):
    """How the forward's tensors nest in what it returns (torch's pytree of them): a leaf (the graph's
    output ``index``), or a tuple, list or dict of forms."""

    kind: Literal["leaf", "tuple", "list", "dict"] = "leaf"
    index: int = 0
    items: list[OutputForm] = []
    keys: list[str | int] = Field([], description="a dict's keys, in its order")

    def python(self, flat: str, leaves: int) -> str:
        """The expression that rebuilds this form from ``flat``, the program's outputs: a tuple of
        ``leaves`` tensors, or the tensor itself when there is one."""
        if self.kind == "leaf":
            return flat if leaves == 1 else f"{flat}[{self.index}]"
        parts = [item.python(flat, leaves) for item in self.items]
        if self.kind == "tuple":
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        if self.kind == "list":
            return "[" + ", ".join(parts) + "]"
        return "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(self.keys, parts, strict=True)) + "}"


def output_form(spec: Any) -> OutputForm | None:
    """The form of torch.export's output TreeSpec, leaves numbered in order; None for a container
    this record does not rebuild (a named tuple, a model-output class): the program returns its
    tensors as a flat tuple there."""
    counter = iter(range(1 << 30))

    def form(s: Any) -> OutputForm | None:
        kinds = {tuple: "tuple", list: "list", dict: "dict"}
        if s.type is None:
            return OutputForm(index=next(counter))
        if s.type not in kinds:
            return None
        children = list(s.children()) if hasattr(s, "children") else list(s.children_specs)
        items = [form(c) for c in children]
        if any(i is None for i in items):
            return None
        keys = list(s.context) if s.type is dict else []
        if any(not isinstance(k, (str, int)) for k in keys):
            return None
        return OutputForm(kind=kinds[s.type], items=items, keys=keys)  # type: ignore[arg-type]

    return form(spec)


class OpGraph(BaseModel):
    task: str
    placeholders: list[Placeholder]
    nodes: list[Node]
    outputs: list[str] = Field(description="names of the values the forward returns, in order")
    mutations: dict[str, str] = Field({}, description="value -> the buffer placeholder it is written back to "
                                                      "(BatchNorm's running statistics in training mode)")
    getitems: dict[str, tuple[str, int]] = Field({}, description="name -> (multi-output node, index)")
    constants: dict[str, Any] = Field({}, description="lifted tensor constant (its target) -> its values as a "
                                                      "nested list: a tensor the forward makes (torch.tensor, "
                                                      "arange, a mask), recreated by the program")
    draws: dict[str, Draw] = Field({}, description="random placeholder -> how the program draws it")
    output_form: OutputForm | None = Field(None, description="how the returned tensors nest; None: a tensor, or "
                                                            "a flat tuple of them")
    state: list[str] = Field([], description="plain tensor attributes of the reference's modules (dotted "
                                             "names), captured as non-persistent buffers: state its forward "
                                             "may reassign (self.hidden = ...), which the program updates")

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def meta(self, name: str) -> TensorMeta | None:
        for p in self.placeholders:
            if p.name == name:
                return p.meta
        if name in self.getitems:
            src, index = self.getitems[name]
            return self.node(src).out[index]
        node = self.node(name)
        return node.out[0] if node.out else None

    def users(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for n in self.nodes:
            for i in n.inputs():
                found.setdefault(self.getitems.get(i, (i, 0))[0], []).append(n.name)
        return found


def _meta(value: Any) -> TensorMeta | None:
    import torch

    if isinstance(value, torch.Tensor):
        return TensorMeta(shape=[int(d) for d in value.shape], dtype=str(value.dtype).replace("torch.", ""))
    return None


def _arg(value: Any) -> Any:
    import torch.fx

    if isinstance(value, torch.fx.Node):
        return "%" + value.name
    if isinstance(value, (list, tuple)):
        return [_arg(v) for v in value]
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return repr(value)  # dtypes, devices, memory formats: kept as text


# Operators kept whole through the core-ATen decomposition: the compiler lowers them better than
# their decomposition (a library call, one fused row kernel, a recurrent layer instead of thousands
# of nodes). ``capture(decompose=...)`` decomposes any of them after all, when a lowering cannot take
# a particular instance (a softmax over a non-trailing dim, a group norm too large for one row).
KEEP = ("linear.default", "matmul.default", "conv1d.default", "conv2d.default", "conv3d.default",
        "conv1d.padding", "conv2d.padding", "conv3d.padding",
        "conv_transpose1d.default", "conv_transpose2d.input", "conv_transpose3d.input",
        "layer_norm.default", "group_norm.default", "instance_norm.default", "rms_norm.default",
        "softmax.int", "log_softmax.int", "_safe_softmax.default",
        "max_pool1d.default", "max_pool2d.default", "max_pool3d.default",
        "avg_pool1d.default", "adaptive_avg_pool1d.default", "adaptive_avg_pool2d.default",
        "adaptive_avg_pool3d.default", "adaptive_max_pool1d.default",
        "embedding.default", "lstm.input", "gru.input", "rnn_tanh.input", "rnn_relu.input",
        "lstm_cell.default", "gru_cell.default", "rnn_tanh_cell.default", "rnn_relu_cell.default",
        # one pointwise formula each in the fused kernels, not a chain of exp/log1p/where nodes
        "mish.default", "softplus.default", "selu.default", "celu.default", "hardswish.default",
        "hardsigmoid.default", "silu.default", "gelu.default", "hardtanh.default", "leaky_relu.default",
        "log_sigmoid.default", "logsigmoid.default",
        # layout operators with a general lowering of their own (families/layout.py)
        "tril.default", "triu.default", "roll.default", "flip.default", "pad.default")

# Core-ATen operators decomposed all the same: their decompositions (index reads and arithmetic)
# lower through the general lowerings.
_ALSO_DECOMPOSED = (("upsample_nearest2d", "vec"), ("upsample_bilinear2d", "vec"), ("upsample_bilinear2d", "default"),
                    ("upsample_nearest1d", "vec"), ("upsample_nearest3d", "vec"), ("upsample_trilinear3d", "vec"),
                    ("upsample_bicubic2d", "vec"), ("native_dropout", "default"))



def _clamp_by_tensors(x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002 - aten's own names
    """``clamp`` with tensor bounds (scalar or broadcast) as ``maximum`` then ``minimum``: the same
    values (NaN kept, ``max`` wins where the bounds cross) and the same type promotion."""
    import torch

    out = x if min is None else torch.ops.aten.maximum.default(x, min)
    return out if max is None else torch.ops.aten.minimum.default(out, max)


def _own_decompositions() -> dict[Any, Any]:
    """Decompositions of ours, for core-ATen overloads whose general form the lowerings take."""
    import torch

    aten = torch.ops.aten
    return {aten.clamp.Tensor: _clamp_by_tensors,
            aten.clamp_min.Tensor: lambda x, min: _clamp_by_tensors(x, min=min),
            aten.clamp_max.Tensor: lambda x, max: _clamp_by_tensors(x, max=max)}


# the most elements of a tensor the forward makes that a program recreates from a literal
MAX_CONSTANT = 1 << 14

# Operators that draw random numbers. The draws of _DRAWS become entry arguments the program draws
# from torch's generator (graph.draws); any other is a capture error naming it.
# the draws a program makes itself (graph.Draw), as _draw reads them
DRAWN_OPS = frozenset({"aten.rand", "aten.rand_like", "aten.randn", "aten.randn_like", "aten.randint", "aten.randperm",
                       "aten.normal"})
RANDOM_OPS = {"aten.native_dropout", "aten.bernoulli", "aten.rand", "aten.randn", "aten.rand_like",
              "aten.randn_like", "aten.randint", "aten.randint_like", "aten.randperm", "aten.normal",
              "aten.uniform", "aten.exponential", "aten.multinomial", "aten.poisson", "aten.geometric",
              "aten.cauchy", "aten.log_normal", "aten.rrelu_with_noise"}


def _instantiate(task: Task, devices: tuple[str, ...] = ("meta", "cpu")) -> tuple[Any, list[Any], list[str]]:
    """The reference model and its inputs, on the meta device when its code allows (no memory, no
    compute: a 4096 x 393216 input costs nothing), else on the CPU. The model stays in the mode its
    constructor leaves it in: KernelBench never calls ``.eval()``. Its plain tensor attributes are
    buffers by then (:func:`state_as_buffers`, whose names come third)."""
    import torch

    module = types.ModuleType(f"stitchcuda_capture_{task.sha256[:8]}")
    try:
        exec(compile(task.source, task.path or task.name, "exec"), module.__dict__)  # the user's own reference
    except Exception as exc:
        raise CaptureError(f"the reference does not run: {type(exc).__name__}: {exc}") from exc
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not callable(getattr(module, name, None)):
            raise CaptureError(f"the reference defines no {name}")
    failure: Exception | None = None
    for device in devices:
        try:
            with torch.device(device):
                torch.manual_seed(0)
                model = module.Model(*module.get_init_inputs())
                inputs = list(module.get_inputs())
            return model, inputs, state_as_buffers(model)
        except Exception as exc:
            failure = exc
    raise CaptureError(f"the reference did not build: {type(failure).__name__}: {failure}") from failure


def keep_table(decompose: frozenset[str] = frozenset()) -> dict[Any, Any]:
    """torch.export's core-ATen decomposition table less the operators the compiler keeps whole
    (less those named in ``decompose``, overload packets such as ``"aten.softmax"``)."""
    import torch
    from torch._decomp import decomposition_table

    table = torch.export.default_decompositions()
    for packet, overload in _ALSO_DECOMPOSED:  # core ATen keeps them; their decompositions are index reads
        op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
        if op is not None and op in decomposition_table:
            table[op] = decomposition_table[op]
    table.update(_own_decompositions())
    for name in KEEP:
        packet, overload = name.split(".")
        if f"aten.{packet}" in decompose:
            continue
        op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
        if op is not None and op in table:
            del table[op]
    return table


def capture(task: Task, decompose: frozenset[str] = frozenset()) -> OpGraph:
    """Export the reference's forward, in the mode the task leaves it, lower it to core ATen (in-place
    ops functionalised, the operators of ``KEEP`` whole) and describe it as an :class:`OpGraph`."""
    with TRACE_LOCK:
        return _capture(task, decompose)


def _capture(task: Task, decompose: frozenset[str]) -> OpGraph:
    model, inputs, state = _instantiate(task)
    try:
        try:
            exported = _export(model, inputs, decompose)
        except CaptureError:
            raise
        except Exception:
            if not any(getattr(t, "is_meta", False) for t in [*inputs, *model.parameters()]):
                raise
            # a trace on the meta device can fail where real tensors do not (a view whose strides
            # only a real kernel gives): the same capture once more, on the CPU
            model, inputs, state = _instantiate(task, ("cpu",))
            exported = _export(model, inputs, decompose)
    except CaptureError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CaptureError(f"torch.export could not capture the forward ({type(exc).__name__}: {first[:300]}); "
                           "the offline Coder needs a graph without data-dependent control flow") from exc
    _static_shapes(exported)
    graph = _describe(task.name, exported)
    if any(p.kind == "constant" for p in graph.placeholders) and any(
            getattr(v, "is_meta", False) for v in exported.constants.values()):
        # a constant made on the input's device has no values on the meta device: capture on the CPU
        model, inputs, state = _instantiate(task, ("cpu",))
        exported = _export(model, inputs, decompose)
        graph = _describe(task.name, exported)
    for p in graph.placeholders:
        value = exported.constants.get(p.target) if p.kind == "constant" else None
        if value is not None and not getattr(value, "is_meta", False) and value.numel() <= MAX_CONSTANT:
            graph.constants[p.target] = value.detach().cpu().tolist()
    _draws_as_arguments(graph)
    graph.state = state
    graph.output_form = output_form(exported.call_spec.out_spec)
    missed = _unrecorded_state(model, inputs, graph)
    if missed:
        raise CaptureError(f"the forward reassigns {', '.join(missed)} (state kept across calls), and torch.export did "
                           "not record it as a mutation (it misses reassignments inside submodules): the program "
                           "would not carry that state")
    return graph


def _unrecorded_state(model: Any, inputs: list[Any], graph: OpGraph) -> list[str]:
    """The state attributes one more forward of the captured model reassigns that the graph does
    not write back (checked only where the model has such attributes; a forward that cannot run
    again here is not judged)."""
    import torch

    if not graph.state:
        return []
    written = {p.target for p in graph.placeholders if p.name in set(graph.mutations.values())}

    def current(name: str) -> Any:
        path, _, key = name.rpartition(".")
        return getattr(model.get_submodule(path) if path else model, key, None)

    before = {name: current(name) for name in graph.state}
    try:
        with TRACE_LOCK, torch.no_grad():
            model(*inputs)
    except Exception:
        return []
    return [name for name in graph.state if current(name) is not before[name] and name not in written]


def _static_shapes(exported: Any) -> None:
    """Refuse, naming the operator, a capture with a size still symbolic after the data-dependent
    sizes were bounded (``capture/bounded.py``): the compiler's programs have static shapes, and the
    rewrite leaves none unless a form it does not know slipped through."""
    import torch

    for node in exported.graph.nodes:
        val = node.meta.get("val")
        values = val if isinstance(val, (list, tuple)) else [val]
        for v in values:
            if isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in v.shape):
                target = getattr(node.target, "__name__", str(node.target))
                raise CaptureError(
                    f"the forward's shapes depend on its data: {node.name} ({target}) has size "
                    f"{tuple(str(d) for d in v.shape)} after the data-dependent sizes were bounded; the compiler "
                    "writes programs of static shapes")


def _draws_as_arguments(graph: OpGraph) -> None:
    """Each random draw becomes an entry argument of kind ``random``: a tensor of the draw's
    distribution, shape and dtype that the program's forward draws from torch's generator on the
    device (a program cannot reproduce the reference's numbers, only their distribution; the
    Verifier checks the task's output does not depend on them)."""
    other = sorted({n.op for n in graph.nodes if n.op in RANDOM_OPS and _draw(n) is None})
    if other:
        raise CaptureError(f"the forward draws random numbers through {', '.join(other)}, which the program cannot "
                           "draw (it draws rand, randn, randint, randperm and normal)")
    kept = []
    for n in graph.nodes:
        draw = _draw(n) if n.op in RANDOM_OPS else None
        if draw is None:
            kept.append(n)
            continue
        graph.placeholders.append(Placeholder(name=n.name, kind="random", meta=n.out[0]))
        graph.draws[n.name] = draw
    graph.nodes = kept


def _draw(n: Node) -> Draw | None:
    if len(n.out) != 1:
        return None
    shape, dtype = list(n.out[0].shape), n.out[0].dtype
    a = n.args
    if n.op in ("aten.rand", "aten.rand_like", "aten.randn", "aten.randn_like") and n.overload == "default":
        return Draw(fn=n.op.removeprefix("aten.").removesuffix("_like"), shape=shape, dtype=dtype)  # type: ignore[arg-type]
    if n.op == "aten.randint" and n.overload in ("default", "low"):
        low, high = (0, a[0]) if n.overload == "default" else (a[0], a[1])
        return Draw(fn="randint", shape=shape, dtype=dtype, low=int(low), high=int(high))
    if n.op == "aten.randperm" and n.overload == "default":
        return Draw(fn="randperm", shape=shape, dtype=dtype)
    if n.op == "aten.normal" and n.overload == "float_float":
        return Draw(fn="normal", shape=shape, dtype=dtype, mean=float(a[0]), std=float(a[1]))
    return None


def _export(model: Any, inputs: list[Any], decompose: frozenset[str]) -> Any:
    import torch

    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    level = quiet.level
    with TRACE_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notes are not the user's business
        quiet.setLevel(logging.CRITICAL)  # a failed trace's traceback: the CaptureError says what failed
        try:
            with as_cuda_inference(model):  # the function the reference computes on the GPU
                exported = torch.export.export(model, tuple(inputs))
            exported = exported.run_decompositions(keep_table(decompose))
        finally:
            quiet.setLevel(level)
        try:
            bound_data_dependent_sizes(exported)
        except UnboundedSize as exc:
            raise CaptureError(str(exc)) from None
        except Exception as exc:  # a graph of a form the rewrite does not know
            raise CaptureError(f"the forward's data-dependent sizes could not be bounded ({type(exc).__name__}: "
                               f"{str(exc).strip()[:300]})") from exc
        return exported


def _describe(name: str, exported: Any) -> OpGraph:
    try:
        return _graph_of(name, exported)
    except CaptureError:
        raise
    except Exception as exc:  # an exported graph of a form this reading does not know
        raise CaptureError(f"the captured graph could not be read: {type(exc).__name__}: "
                           f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}") from exc


def _graph_of(name: str, exported: Any) -> OpGraph:
    import operator

    sig = exported.graph_signature
    kinds: dict[str, tuple[str, str]] = {}
    for spec in sig.input_specs:
        kind = spec.kind.name.lower()  # user_input, parameter, buffer, constant_tensor, ...
        label = {"user_input": "input", "parameter": "parameter", "buffer": "buffer"}.get(kind, "constant")
        kinds[spec.arg.name] = (label, spec.target or "")
    placeholders, nodes, outputs, getitems = [], [], [], {}
    user_outputs = [spec.arg.name for spec in sig.output_specs if spec.kind.name == "USER_OUTPUT"]
    buffer_of = {spec.target: spec.arg.name for spec in sig.input_specs if spec.kind.name == "BUFFER"}
    mutations = {spec.arg.name: buffer_of[spec.target] for spec in sig.output_specs
                 if spec.kind.name == "BUFFER_MUTATION" and spec.target in buffer_of}
    written = [spec.target for spec in sig.output_specs if spec.kind.name == "USER_INPUT_MUTATION"]
    if written:  # a program writes no tensor of its caller's: it would compute the outputs and leave these as they were
        said = ", ".join(written)
        raise CaptureError(f"the forward writes its input {said} in place (an in-place op on an argument, "
                           "such as x.mul_(2)): a program leaves its caller's tensors as they are, so it would "
                           "differ there; write the forward out of place")
    inputs_seen = 0
    for node in exported.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            kind, target = kinds.get(node.name, ("input", ""))
            if kind == "input":
                target, inputs_seen = str(inputs_seen), inputs_seen + 1
            placeholders.append(Placeholder(name=node.name, kind=kind, target=target, meta=_meta(val)))  # type: ignore[arg-type]
        elif node.op == "call_function" and node.target is operator.getitem:
            getitems[node.name] = (node.args[0].name, int(node.args[1]))
        elif node.op == "call_function":
            target = node.target
            packet = getattr(target, "_overloadpacket", None)
            op = f"aten.{packet.__name__}" if packet is not None else str(target)
            overload = getattr(target, "_overloadname", "default")
            outs = [m for m in ((_meta(v) for v in val) if isinstance(val, (list, tuple)) else [_meta(val)]) if m]
            if not outs and op.startswith("aten._assert"):
                continue  # a dtype/shape assertion of the trace (``.to(dtype)``): checks nothing at run time here
            stack = node.meta.get("nn_module_stack") or {}
            path = list(stack.values())[-1][0] if stack else ""
            nodes.append(Node(name=node.name, op=op, overload=overload, args=[_arg(a) for a in node.args],
                              kwargs={k: _arg(v) for k, v in node.kwargs.items()}, out=outs,
                              module=path.replace("L['self'].", "").replace("L__self___", "")))
        elif node.op == "output":
            flat = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
            outputs = [a.name for a in flat if hasattr(a, "name") and a.name in user_outputs]
    for n in nodes:  # BatchNorm's num_batches_tracked += 1: integer arithmetic the float kernels do not do
        if n.op in ("aten.add", "aten.sub") and n.out and n.out[0].dtype in ("int64", "int32") and len(n.args) == 2 \
                and isinstance(n.args[1], int) and not isinstance(n.args[1], bool):
            step = n.args[1] if n.op == "aten.add" else -n.args[1]
            n.op, n.overload, n.args = "stitchcuda.int_add", "default", [n.args[0], step]
    graph = OpGraph(task=name, placeholders=placeholders, nodes=nodes, outputs=outputs, getitems=getitems,
                    mutations=mutations)
    _recurrent_state_shapes(graph)
    for n in nodes:  # eval-mode BatchNorm as the one operator the conv/GEMM epilogues fold
        if n.op == "aten._native_batch_norm_legit_no_training":
            x, w, b, mean, var, momentum, eps = n.args
            n.op, n.args, n.out = "aten.batch_norm", [x, w, b, mean, var, False, momentum, eps, True], n.out[:1]
            _single_output(graph, n.name)
    return graph


_RECURRENT_LAYERS = ("aten.lstm", "aten.gru", "aten.rnn_tanh", "aten.rnn_relu")


def _recurrent_state_shapes(graph: OpGraph) -> None:
    """A whole recurrent layer's final states have the shapes of its initial states. torch 2.11's
    meta kernel gives a bidirectional LSTM's ``c_n`` an extra dim ([4, 1, 4, 256] for [4, 4, 256]),
    which the program would then return: the shapes are taken from the initial states instead."""
    for n in graph.nodes:
        if n.op not in _RECURRENT_LAYERS or n.overload != "input" or len(n.args) < 2:
            continue
        states = n.args[1] if isinstance(n.args[1], list) else [n.args[1]]
        for k, state in enumerate(states[:len(n.out) - 1]):
            meta = graph.meta(state[1:]) if isinstance(state, str) and state.startswith("%") else None
            if meta is not None and meta.numel == n.out[k + 1].numel:
                n.out[k + 1] = meta.model_copy()


def _single_output(graph: OpGraph, name: str) -> None:
    """Make ``name`` a one-output node: readers of its first output read the node itself."""
    alias = {"%" + g: "%" + name for g, (src, i) in graph.getitems.items() if src == name and i == 0}
    if any(src == name and i != 0 for src, i in graph.getitems.values()):
        raise CaptureError(f"{name}: a second output of it is read")

    def sub(value: Any) -> Any:
        if isinstance(value, str):
            return alias.get(value, value)
        if isinstance(value, list):
            return [sub(v) for v in value]
        return value

    for n in graph.nodes:
        n.args = sub(n.args)
        n.kwargs = {k: sub(v) for k, v in n.kwargs.items()}
    graph.outputs = [alias.get("%" + o, "%" + o)[1:] for o in graph.outputs]
    graph.getitems = {g: v for g, v in graph.getitems.items() if "%" + g not in alias}
