"""Static anti-hacking checks: read a candidate's Python (AST) and its CUDA/C++ sources, run nothing.

Each check returns :class:`Finding` records with the hacking level the finding implies on its
own (docs/design.md, "What counts as hacking"). They are cheap enough for CI and for every sample
of an RL batch; the worker's dynamic checks confirm what can only be seen at run time.

The Python analysis follows the code reachable from ``ModelNew.forward``: its own methods,
module-level helpers and candidate-defined submodules it calls (read by candidate_ast.py).
Names bound to the value of ``load_inline(...)`` are "extensions"; a call through one of them
is a call into the candidate's own compiled code. The C++ checks are static_cpp.py's.
"""

from __future__ import annotations

import ast

from stitchcuda.verify.candidate_ast import (
    SHAPE_OPS,
    CandidateModule,
    calls_extension,
    dotted_name,
    is_heavy,
    reachable_functions,
    string_value,
    torch_compute,
)
from stitchcuda.verify.static_cpp import check_cpp, cpp_sources_of
from stitchcuda.verify.static_report import StaticReport

# Global state a candidate may not change (precision is disclosed, the change is flagged).
GLOBAL_STATE_CALLS = {
    "set_float32_matmul_precision", "set_default_dtype", "set_default_tensor_type",
    "use_deterministic_algorithms", "set_num_threads", "set_flush_denormal", "set_default_device",
    "set_autocast_enabled", "enable_flash_sdp", "enable_math_sdp", "enable_mem_efficient_sdp",
    "set_grad_enabled",
}
REFERENCE_REACH = {"sys.modules", "__main__", "importlib", "gc.get_objects", "inspect.stack",
                   "inspect.currentframe", "sys._getframe", "get_inputs", "get_init_inputs", "builtins"}
THREAD_MODULES = {"threading", "concurrent", "multiprocessing", "_thread", "asyncio"}
SUBCLASS_HOOKS = {"__torch_function__", "__torch_dispatch__", "_make_subclass", "_make_wrapper_subclass",
                  "TorchDispatchMode", "TorchFunctionMode", "_python_dispatch"}
STREAM_SYNC = {"wait_stream", "synchronize", "wait_event", "record_event"}
# Methods that put their arguments into the container they are called on (not ``add``: on a
# tensor it computes a new one and leaves the receiver as it was).
CONTAINER_FILLS = {"append", "extend", "insert", "setdefault", "update", "appendleft", "extendleft"}
# One tensor out of a list of them: it holds whatever went into the list.
TENSOR_JOINS = {"stack", "cat", "concat", "concatenate", "hstack", "vstack", "dstack", "column_stack"}


def check_python(source: str, report: StaticReport) -> None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return  # the verdict already says it does not parse
    mod = CandidateModule(tree)
    _check_whole_module(tree, mod, report)
    if "ModelNew" not in mod.classes:
        return
    forward_fns = [(o, f) for o, f in reachable_functions(mod) if f.name != "__init__"]
    uses_ext = any(calls_extension(f, mod) for _, f in forward_fns)

    for ext in mod.ext_calls:
        for kw in ext.keywords:
            if kw.arg == "name":
                value = string_value(kw.value, mod.constants)
                if value:
                    report.extensions.append(value)
            if kw.arg == "functions":
                if isinstance(kw.value, (ast.List, ast.Tuple)):
                    report.exported += [e.value for e in kw.value.elts
                                        if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                elif isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    report.exported.append(kw.value.value)

    ops: list[str] = []
    for owner, fn in forward_fns:
        for op in torch_compute(fn, mod, owner):
            if op not in ops:
                ops.append(op)
    report.torch_ops_in_forward = ops
    heavy = [op for op in ops if is_heavy(op)]
    light = [op for op in ops if not is_heavy(op)]

    if not mod.ext_calls:
        report.add("no_custom_kernels", "total", "the candidate builds no extension (no load_inline): "
                   + (f"forward computes with PyTorch ({', '.join(ops[:8])})" if ops else "no kernel of its own"))
    elif not uses_ext:
        report.add("kernels_never_called", "total",
                   f"the extension(s) {report.extensions or '?'} are built but forward never calls them"
                   + (f"; it computes with PyTorch ({', '.join(ops[:8])})" if ops else ""))
    else:
        if heavy:
            report.add("pytorch_compute", "partial",
                       f"heavy compute left in PyTorch in forward: {', '.join(heavy)}")
        if light:
            report.add("pytorch_compute_light", "none",
                       f"PyTorch compute left in forward (own kernels could fuse it): {', '.join(light)}")

    for owner, fn in forward_fns:
        _check_fallbacks(fn, mod, owner, report)
        _check_outputs(fn, mod, owner, report)
    forward = mod.methods("ModelNew").get("forward")
    if forward is not None:
        _check_input_mutation(forward, mod, report)


def _check_whole_module(tree: ast.Module, mod: CandidateModule, report: StaticReport) -> None:
    """Checks that hold wherever in the file the construct appears."""
    stream_made = stream_synced = False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                root = name.split(".")[0]
                if root in THREAD_MODULES:
                    report.add("threads", "total", f"imports {name}: work on another thread escapes the timer")
                if root == "importlib" or name in ("gc", "inspect", "builtins"):
                    report.add("reference_access", "total", f"imports {name}, a way to reach the reference program")
            if isinstance(node, ast.ImportFrom):
                if any(a.name in ("Model", "get_inputs", "get_init_inputs") for a in node.names):
                    report.add("reference_access", "total", f"imports the reference's names from {node.module}")
                if node.module and node.module.startswith(("torch._dynamo", "torch._inductor")):
                    report.add("torch_compile", "total", f"imports {node.module}")
        elif isinstance(node, ast.Name) and node.id in ("Model", "get_inputs", "get_init_inputs") and isinstance(
                node.ctx, ast.Load):
            report.add("reference_access", "total", f"uses the reference's name {node.id!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in (
                "__main__", "stitchcuda_reference", "reference", "Model"):
            report.add("reference_access", "total", f"looks up {node.value!r}, a way to reach the reference program")
        elif isinstance(node, ast.Attribute) or (isinstance(node, ast.Name) and node.id in mod.aliases):
            dotted = mod.resolve(dotted_name(node))  # through aliases: `from torch import cuda as _c` ...
            attr = dotted.rsplit(".", 1)[-1]
            if any(dotted == r or dotted.startswith(r + ".") for r in REFERENCE_REACH if "." in r):
                report.add("reference_access", "total", f"uses {dotted}, a way to reach the reference program")
            if attr in ("compile", "script", "trace") and dotted.startswith(("torch.", "jit.")) and (
                    dotted in ("torch.compile", "torch.jit.script", "torch.jit.trace", "jit.script", "jit.trace")):
                report.add("torch_compile", "total", f"uses {dotted}: PyTorch's compiler writes the kernels")
            if dotted.startswith(("torch._dynamo", "torch._inductor")):
                report.add("torch_compile", "total", f"uses {dotted}")
            if attr in SUBCLASS_HOOKS:
                report.add("tensor_subclass", "total", f"uses {dotted}: a tensor subclass or dispatch mode can fake or defer results")
            if dotted in ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream", "torch.cuda.ExternalStream"):
                stream_made = True
            if attr in STREAM_SYNC and dotted not in ("torch.cuda.synchronize",):
                stream_synced = True
            if dotted == "torch.cuda.synchronize":
                stream_synced = True
            if attr in GLOBAL_STATE_CALLS and dotted.startswith("torch"):
                report.add("global_state", "partial", f"calls {dotted}: changes torch's global state")
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                if dotted_name(base) in ("torch.Tensor", "Tensor", "torch._C._TensorBase", "TorchDispatchMode",
                                     "TorchFunctionMode"):
                    report.add("tensor_subclass", "total", f"class {node.name} subclasses {dotted_name(base)}")
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in SUBCLASS_HOOKS:
                    report.add("tensor_subclass", "total", f"class {node.name} defines {item.name}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute):  # rebinding a plain name patches nothing
                    _check_patching(mod.resolve(dotted_name(target)), report)
        elif isinstance(node, ast.Call):
            callee = dotted_name(node.func)
            if callee == "setattr" and node.args:
                _check_patching(mod.resolve(dotted_name(node.args[0])) + ".<attr>", report)
            if callee in ("globals", "vars", "locals", "eval", "exec", "__import__", "open"):
                report.add("reference_access", "total" if callee != "open" else "partial",
                           f"calls {callee}(): dynamic code or file access can reach the reference or the harness")
    if stream_made and not stream_synced:
        report.add("side_stream", "total", "runs work on a side CUDA stream that is never synchronised with the "
                                           "caller's stream: the timer does not see it")
    elif stream_made:
        report.add("side_stream_synced", "none", "uses a side CUDA stream, synchronised back (wait_stream/events)")


def _check_patching(dotted: str, report: StaticReport) -> None:
    if not dotted:
        return
    root = dotted.split(".")[0]
    if dotted.startswith("torch.backends."):
        report.add("global_state", "partial", f"sets {dotted}: changes torch's global state (restored by the verifier)")
    elif root in ("torch", "time", "builtins", "gc", "sys", "os", "stitchcuda", "timeit", "triton"):
        report.add("harness_patching", "total", f"assigns {dotted}: patches a module the harness relies on "
                                                "(timers, synchronisation or torch itself)")


def _guard_refs_state(test: ast.AST) -> bool:
    for sub in ast.walk(test):
        dotted = dotted_name(sub) if isinstance(sub, ast.Attribute) else ""
        if dotted.startswith("self.") or (isinstance(sub, ast.Call) and dotted_name(sub.func) == "hasattr"):
            return True
        if isinstance(sub, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in sub.ops):
            return True
        if isinstance(sub, ast.Name) and sub.id.isupper():  # module-level caches are usually CONSTANT_CASE
            return True
    return False


def _check_fallbacks(fn: ast.FunctionDef, mod: CandidateModule, owner: str, report: StaticReport) -> None:
    for node in ast.walk(fn):
        if isinstance(node, ast.Try):
            body_ext = any(calls_extension(s, mod) for s in node.body)
            for handler in node.handlers:
                reraises = all(isinstance(s, ast.Raise) for s in handler.body)
                handler_ops = [op for s in handler.body for op in torch_compute(s, mod, owner)]
                if body_ext and not reraises:
                    what = f" with PyTorch ({', '.join(handler_ops[:5])})" if handler_ops else ""
                    report.add("try_except_fallback", "total",
                               f"{fn.name} catches failures of its own kernels and carries on{what}")
    for node, orelse in _if_branches(fn):
        body_ext = any(calls_extension(s, mod) for s in node.body)
        else_ext = any(calls_extension(s, mod) for s in orelse)
        body_ops = [op for s in node.body for op in torch_compute(s, mod, owner)]
        else_ops = [op for s in orelse for op in torch_compute(s, mod, owner)]
        returns_torch = any(isinstance(s, ast.Return) for s in node.body) and body_ops and not body_ext
        if (body_ext and else_ops and not else_ext) or (else_ext and body_ops and not body_ext) or (
                returns_torch and calls_extension(fn, mod)):
            ops = ", ".join((body_ops or else_ops)[:5])
            report.add("fallback_branch", "total",
                       f"{fn.name} has a branch that computes with PyTorch ({ops}) instead of its own kernels")


def _if_branches(fn: ast.FunctionDef) -> list[tuple[ast.If, list[ast.stmt]]]:
    """Each ``if`` in ``fn`` with its else branch. An ``if`` without ``else`` whose body ends in
    ``return`` or ``raise`` has the statements after it in the same block as its else."""
    pairs = []
    for node in ast.walk(fn):
        for block in (getattr(node, name, None) for name in ("body", "orelse", "finalbody")):
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                if isinstance(stmt, ast.If):
                    early_exit = not stmt.orelse and isinstance(stmt.body[-1], (ast.Return, ast.Raise))
                    pairs.append((stmt, block[i + 1:] if early_exit else stmt.orelse))
    return pairs


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        dotted_name(n) for n in ast.walk(node) if isinstance(n, ast.Attribute) and dotted_name(n).startswith("self.")}


def _check_outputs(fn: ast.FunctionDef, mod: CandidateModule, owner: str, report: StaticReport) -> None:
    """Constant, cached and uninitialised outputs."""
    params = {a.arg for a in fn.args.args[1:] + fn.args.kwonlyargs} | (
        {fn.args.vararg.arg} if fn.args.vararg else set())
    if fn.args.args and fn.args.args[0].arg != "self":
        params.add(fn.args.args[0].arg)
    if fn.name != "forward" or owner != "ModelNew":
        return
    empties: dict[str, ast.AST] = {}
    written: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            for arg in list(node.args) + [k.value for k in node.keywords]:
                written |= {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)}
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            callee = dotted_name(node.value.func).split(".")[-1]
            if callee in ("empty", "empty_like", "new_empty", "empty_strided"):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        empties[t.id] = node
    tainted = _input_dependent(fn, mod, params)
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and node.value is not None:
            used = _names(node.value)
            if not _reads(node.value, tainted) and not calls_extension(node.value, mod):
                if any(isinstance(n, ast.Attribute) and dotted_name(n).startswith("self.") for n in ast.walk(node.value)) \
                        or any(n.id.isupper() for n in ast.walk(node.value) if isinstance(n, ast.Name)):
                    report.add("cached_output", "total",
                               f"forward returns stored state ({ast.unparse(node.value)[:80]}) that does not "
                               "depend on this call's inputs")
                else:
                    report.add("constant_output", "total",
                               f"forward returns {ast.unparse(node.value)[:80]}, which does not depend on its inputs")
            for name in used & set(empties):
                if name not in written:
                    report.add("uninitialised_output", "total",
                               f"forward returns {name}, allocated with torch.empty and never written by a kernel")
    stored = {name for name, conditional in _state_writes(fn.body, mod).items() if conditional}
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and node.value is not None and not calls_extension(node.value, mod):
            for name in sorted(_returned_state(node.value) & stored):
                report.add("cached_output", "total",
                           f"forward returns {name}, which it writes only when a check of its own state passes: "
                           "later calls get a stored result")
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and _guard_refs_state(node.test):
            for branch in (node.body, node.orelse):
                for stmt in branch:
                    if isinstance(stmt, ast.Return) and stmt.value is not None and not calls_extension(stmt.value, mod):
                        state = [dotted_name(n) for n in ast.walk(stmt.value)
                                 if isinstance(n, ast.Attribute) and dotted_name(n).startswith("self.")]
                        caches = [n for n in ast.walk(stmt.value) if isinstance(n, ast.Subscript)]
                        if state and (caches or not (_names(stmt.value) & set(params))):
                            report.add("cached_output", "total",
                                       f"forward returns a stored result ({ast.unparse(stmt.value)[:80]}) "
                                       "when a cache check passes")


def _state_root(node: ast.AST | str) -> str:
    """``self.cache`` for ``self.cache``, ``self.cache[key]`` or ``self.cache.data``; '' otherwise."""
    while isinstance(node, ast.Subscript):
        node = node.value
    dotted = node if isinstance(node, str) else dotted_name(node)
    return ".".join(dotted.split(".")[:2]) if dotted.startswith("self.") else ""


def _input_dependent(fn: ast.FunctionDef, mod: CandidateModule, params: set[str]) -> set[str]:
    """Names and ``self.`` attributes of ``fn`` whose value may carry data of ``params``.

    Flow-insensitive and iterated to a fixed point, so a loop that fills a list in one iteration
    and reads it in the next needs no statement order. A container filled through ``append`` and
    the like counts only when this call makes it afresh (a local, or module state rebound on every
    call): state or a global that is only ever appended to hands back earlier calls' results."""
    tainted = set(params)
    local = set(params) | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    local -= {name for n in ast.walk(fn) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    fresh_state = {name for name, conditional in _state_writes(fn.body, mod, rebinds_only=True).items()
                   if not conditional}
    while True:
        before = len(tainted)
        for node in ast.walk(fn):
            for target, value in _flows(node):
                if _reads(value, tainted):
                    tainted |= _bound(target)
            if isinstance(node, ast.Call) and any(_reads(a, tainted) for a in _call_args(node)):
                tainted |= _call_writes(node, mod)  # kernel(x, out=self.buf): the buffer now holds x's result
                filled = _filled(node)
                if filled and (_state_root(filled) in fresh_state if filled.startswith("self.")
                               else filled.split(".")[0] in local):
                    tainted |= {filled, filled.split(".")[0]} - {"self"}
        if len(tainted) == before:
            return tainted


def _reads(node: ast.AST, tainted: set[str]) -> bool:
    """Whether evaluating ``node`` reads a tainted value. A comprehension's element reads its loop
    variable's iterable, so ``[k(c) for c in x.chunk(4)]`` reads x and ``[zeros(n) for c in x]`` does not.
    A work list, not recursion: a long expression must not overflow the stack."""
    todo = [(node, tainted)]
    while todo:
        node, names = todo.pop()
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = set(names)
            for gen in node.generators:
                reads_iter = not _is_range(gen.iter) and _reads(gen.iter, inner)
                inner = (inner | _bound(gen.target)) if reads_iter else (inner - _bound(gen.target))
            todo += [(e, inner) for e in ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt])]
        elif isinstance(node, ast.Name):
            if node.id in names:
                return True
        elif isinstance(node, ast.Attribute) and dotted_name(node) in names:
            return True
        else:
            todo += [(child, names) for child in ast.iter_child_nodes(node)]
    return False


def _flows(node: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """(target, value) for each binding ``node`` makes, a tuple unpacked from a tuple element by element."""
    if isinstance(node, ast.Assign):
        return [pair for target in node.targets for pair in _pairs(target, node.value)]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
        return [(node.target, node.value)]
    if isinstance(node, (ast.For, ast.AsyncFor)) and not _is_range(node.iter):  # an index carries no data
        return [(node.target, node.iter)]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [(item.optional_vars, item.context_expr) for item in node.items if item.optional_vars is not None]
    return []


def _pairs(target: ast.AST, value: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts) \
            and not any(isinstance(e, ast.Starred) for e in target.elts + value.elts):
        return [pair for t, v in zip(target.elts, value.elts, strict=True) for pair in _pairs(t, v)]
    return [(target, value)]


def _bound(target: ast.AST) -> set[str]:
    """What an assignment target binds: names, attributes (``self.a.b`` also rebinds what
    ``self.a`` holds, ``obj.a`` what ``obj`` holds) and the container an item is stored into."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_bound(e) for e in target.elts))
    if isinstance(target, (ast.Subscript, ast.Starred)):
        return _bound(target.value)
    if isinstance(target, ast.Name):
        return {target.id}
    parts = dotted_name(target).split(".") if dotted_name(target) else []
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} - {"self"}


def _is_range(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and dotted_name(node.func) == "range"


def _call_args(call: ast.Call) -> list[ast.AST]:
    return list(call.args) + [k.value for k in call.keywords]


def _filled(call: ast.Call) -> str:
    """The container ``outs.append(h)``, ``self.outs.extend(hs)`` or ``outs[i].append(h)`` puts
    its arguments into; '' for any other call."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr in CONTAINER_FILLS):
        return ""
    receiver = call.func.value
    while isinstance(receiver, ast.Subscript):
        receiver = receiver.value
    return dotted_name(receiver)


def _call_writes(call: ast.Call, mod: CandidateModule) -> set[str]:
    """Names and ``self.`` attributes a call may write: every argument of a call into the
    candidate's extension (its kernels write their outputs), the receiver of an in-place
    method (``buf.copy_(y)``) and an ``out=`` argument."""
    written = set()
    if calls_extension(call.func, mod):
        written |= {dotted_name(a) for a in call.args if dotted_name(a)}
    if isinstance(call.func, ast.Attribute) and call.func.attr.endswith("_") and not call.func.attr.endswith("__"):
        receiver = call.func.value
        while isinstance(receiver, ast.Subscript):  # buf[:n].copy_(y) writes buf
            receiver = receiver.value
        written.add(dotted_name(receiver))
    written |= {dotted_name(k.value) for k in call.keywords if k.arg == "out" and dotted_name(k.value)}
    return written - {""}


def _state_writes(stmts: list[ast.stmt], mod: CandidateModule, rebinds_only: bool = False) -> dict[str, bool]:
    """``self.<attr>`` written in ``stmts`` -> True when every write is conditional on the
    module's own state (under ``if self._out is None:`` and the like, with no matching write in
    the other branch), False when some write happens on every call. ``rebinds_only``: only the
    writes that replace what the attribute held (``self.outs = []``, ``self.outs.clear()``)."""
    found: dict[str, bool] = {}

    def note(name: str, conditional: bool) -> None:
        found[name] = found.get(name, True) and conditional

    for stmt in stmts:
        if isinstance(stmt, ast.If):
            body, other = _state_writes(stmt.body, mod, rebinds_only), _state_writes(stmt.orelse, mod, rebinds_only)
            state_guard = _guard_refs_state(stmt.test)
            for name in body.keys() | other.keys():
                if state_guard and not (name in body and name in other):
                    note(name, True)
                else:
                    note(name, body.get(name, True) and other.get(name, True))
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)):
            blocks = [stmt.body, getattr(stmt, "orelse", []), getattr(stmt, "finalbody", [])]
            blocks += [h.body for h in getattr(stmt, "handlers", [])]
            for block in blocks:
                for name, conditional in _state_writes(block, mod, rebinds_only).items():
                    note(name, conditional)
        else:
            for node in ast.walk(stmt):
                targets: list[ast.AST | str] = []
                if rebinds_only:
                    targets = _rebinds(node)
                elif isinstance(node, ast.Assign):
                    targets = list(node.targets)
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                    targets = [node.target]
                elif isinstance(node, ast.Call):
                    targets = list(_call_writes(node, mod)) + [_filled(node)]
                for target in targets:
                    if root := _state_root(target):
                        note(root, False)
    return found


def _rebinds(node: ast.AST) -> list[ast.AST | str]:
    """The attributes ``node`` gives a new value as a whole: ``self.a = ...`` (also unpacked),
    ``self.a.clear()``; not ``self.a[i] = ...`` nor ``self.a.b = ...``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "clear":
        return [node.func.value]
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return []
    found: list[ast.AST | str] = []
    todo = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
    while todo:
        target = todo.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            todo += target.elts
        elif isinstance(target, ast.Attribute) and _state_root(target) == dotted_name(target):
            found.append(target)
    return found


def _returned_state(value: ast.AST) -> set[str]:
    """The module state a return value hands back as it is: ``self.out``, ``self.cache[k]``,
    ``self.out.view(...)``, also inside a tuple or joined (``torch.stack(self.outs)``)."""
    if isinstance(value, (ast.Tuple, ast.List)):
        return set().union(*(_returned_state(e) for e in value.elts)) if value.elts else set()
    while True:
        if isinstance(value, ast.Subscript):
            value = value.value
        elif isinstance(value, ast.Call) and dotted_name(value.func).split(".")[-1] in TENSOR_JOINS and value.args:
            return _returned_state(value.args[0])  # torch.stack(self.outs): the stored tensors, joined
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in SHAPE_OPS:
            value = value.func.value
        else:
            break
    root = _state_root(value)
    return {root} if root else set()


def _check_input_mutation(fn: ast.FunctionDef, mod: CandidateModule, report: StaticReport) -> None:
    params = [a.arg for a in fn.args.args[1:]]
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            root = dotted_name(node.func.value)
            method = node.func.attr
            if root in params and method.endswith("_") and not method.endswith("__") and method not in (
                    "requires_grad_",):
                report.add("input_mutation", "total", f"forward modifies its input {root} in place ({method})")
            for kw in node.keywords:
                if kw.arg == "out" and dotted_name(kw.value) in params:
                    report.add("input_mutation", "total", f"forward writes into its input {dotted_name(kw.value)} (out=)")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and dotted_name(t.value) in params:
                    report.add("input_mutation", "total", f"forward assigns into its input {dotted_name(t.value)}")
                if isinstance(t, ast.Attribute) and t.attr == "data" and dotted_name(t.value) in params:
                    report.add("input_mutation", "total", f"forward replaces {dotted_name(t.value)}.data")
            if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id in params:
                report.add("input_mutation", "total", f"forward updates its input {node.target.id} in place (augmented assignment)")
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Name) and node.value.id in params:
            feeds_ext = any(isinstance(c, ast.Call) and calls_extension(c, mod)
                            and node.value.id in {n.id for a in c.args for n in ast.walk(a) if isinstance(n, ast.Name)}
                            for c in ast.walk(fn))
            if feeds_ext:
                report.add("input_mutation", "total",
                           f"forward returns its input buffer {node.value.id} after its kernels wrote into it")


def static_findings(source: str) -> StaticReport:
    report = StaticReport()
    check_python(source, report)
    check_cpp(cpp_sources_of(source), report)
    return report
