"""A candidate's Python as the static checks read it: an index of the module (constants,
functions, classes, the handles bound to its ``load_inline`` extensions, PyTorch under other
names), the functions reachable from ``ModelNew.forward``, and the PyTorch compute each calls.

Nothing here judges: the checks in static_checks.py decide what a finding means.
"""

from __future__ import annotations

import ast

# PyTorch operations that carry the heavy compute of a model: left in forward, they make a
# candidate at best a partial hack.
HEAVY_OPS = {
    "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "bilinear", "einsum", "tensordot",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "scaled_dot_product_attention", "multi_head_attention_forward", "lstm", "gru", "rnn_tanh", "rnn_relu",
    "embedding_bag", "chain_matmul", "kron", "inner", "outer", "dot", "mv",
}
HEAVY_MODULES = {
    "Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "MultiheadAttention", "LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell",
    "Transformer", "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer",
    "TransformerDecoderLayer", "EmbeddingBag",
}
# Python-side operations that move or allocate data without computing the model's function.
SHAPE_OPS = {
    "view", "reshape", "permute", "transpose", "t", "contiguous", "flatten", "unflatten", "unsqueeze",
    "squeeze", "expand", "expand_as", "size", "dim", "numel", "stride", "data_ptr", "is_contiguous",
    "empty", "empty_like", "new_empty", "empty_strided", "to", "cuda", "cpu", "float", "view_as",
    "narrow", "split", "chunk", "unbind", "select", "as_strided", "movedim", "swapaxes", "get_device",
    "device", "is_cuda", "element_size", "storage_offset", "zeros", "zeros_like", "new_zeros",
    "zero_", "fill_", "ones", "ones_like", "new_ones", "full", "full_like", "tensor", "as_tensor",
    "arange", "Size", "is_floating_point", "type", "item", "tolist", "numpy", "clone", "detach",
    "requires_grad_", "parameters", "named_parameters", "buffers", "state_dict", "cat", "stack",
    "no_grad", "inference_mode", "manual_seed", "get_default_dtype", "current_device",
    "current_stream", "default_stream", "synchronize", "is_available", "set_device", "copy_",
}

# Random draws from torch's generator: a forward that draws (an initial state, a dropout mask) makes
# its program draw the same distribution; a draw is no part of the model's compute.
RANDOM_DRAWS = {"rand", "randn", "randint", "randperm", "normal", "rand_like", "randn_like", "randint_like",
                "bernoulli", "multinomial", "uniform_", "normal_", "bernoulli_", "random_", "exponential_"}


def dotted_name(node: ast.AST) -> str:
    """``torch.nn.functional.linear`` for an attribute chain, '' when it is not one."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):
        inner = dotted_name(node.func)
        return (inner + "()." + ".".join(reversed(parts))) if inner and parts else ""
    return ""


def string_value(node: ast.AST, constants: dict[str, str]) -> str | None:
    """The text of a string expression: literals, names of module constants, + and f-strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = string_value(node.left, constants), string_value(node.right, constants)
        return left + right if left is not None and right is not None else (left or right)
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    if isinstance(node, (ast.List, ast.Tuple)):
        parts = [string_value(e, constants) for e in node.elts]
        return "\n".join(p for p in parts if p)
    return None


# The names the checks already read as PyTorch: aliases of these need no resolving.
CONVENTIONAL = {"torch": "torch", "nn": "torch.nn", "F": "torch.nn.functional",
                 "functional": "torch.nn.functional"}


def torch_aliases(tree: ast.Module) -> dict[str, str]:
    """Module-level names bound to PyTorch modules or functions under another name:
    ``import torch.nn.functional as nnf``, ``from torch import cuda as _cuda``,
    ``from torch.nn.functional import linear as dense``, ``_mm = torch.matmul``."""
    aliases: dict[str, str] = {}

    def bind(name: str, target: str) -> None:
        if CONVENTIONAL.get(name) != target:
            aliases[name] = target

    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name.split(".")[0] == "torch":
                    bind(a.asname, a.name)
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                if a.name != "*":
                    bind(a.asname or a.name, f"{node.module}.{a.name}")
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = dotted_name(node.value)
            head, _, rest = value.partition(".")
            value = aliases.get(head, CONVENTIONAL.get(head, head)) + ("." + rest if rest else "")
            if value.startswith("torch.") and "()" not in value:
                bind(node.targets[0].id, value)
    return aliases


class CandidateModule:
    """Indexes a candidate module: constants, functions, classes, extension handles."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.constants: dict[str, str] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = string_value(node.value, self.constants)
                if value is not None:
                    self.constants[node.targets[0].id] = value
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node  # type: ignore[assignment]
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
        self.ext_names: set[str] = set()  # plain names and "self.attr" bound to extensions
        self.ext_calls: list[ast.Call] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and dotted_name(node.func).split(".")[-1] in ("load_inline", "load"):
                self.ext_calls.append(node)
        # module functions that build an extension and return it: `_ext = _compile()` is a handle too
        self.ext_factories = {name for name, fn in self.functions.items()
                              if any(c in self.ext_calls for c in ast.walk(fn))
                              and any(isinstance(r, ast.Return) and r.value is not None for r in ast.walk(fn))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and (
                    node.value in self.ext_calls or dotted_name(node.value.func) in self.ext_factories):
                for target in node.targets:
                    name = dotted_name(target)
                    if name:
                        self.ext_names.add(name)
        # aliases: self.ext = ext, _ops = ext
        changed = True
        while changed:
            changed = False
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and dotted_name(node.value) in self.ext_names:
                    for target in node.targets:
                        name = dotted_name(target)
                        if name and name not in self.ext_names:
                            self.ext_names.add(name)
                            changed = True
        self.aliases = torch_aliases(tree)

    def resolve(self, dotted: str) -> str:
        """``dense(...)`` -> ``torch.nn.functional.linear`` when the file imported it so."""
        head, _, rest = dotted.partition(".")
        target = self.aliases.get(head)
        return (target + ("." + rest if rest else "")) if target else dotted

    def methods(self, cls: str) -> dict[str, ast.FunctionDef]:
        node = self.classes.get(cls)
        if node is None:
            return {}
        return {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}  # type: ignore[misc]

    def submodules(self, cls: str) -> dict[str, str]:
        """self.<attr> -> the class it is built from in __init__ ('nn.Linear', 'MyBlock', ...)."""
        init = self.methods(cls).get("__init__")
        found: dict[str, str] = {}
        if init is None:
            return found
        for node in ast.walk(init):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                built = self.resolve(dotted_name(node.value.func))
                for target in node.targets:
                    name = dotted_name(target)
                    if name.startswith("self.") and built:
                        found[name] = built
        return found


def reachable_functions(mod: CandidateModule, root_class: str = "ModelNew") -> list[tuple[str, ast.FunctionDef]]:
    """(owner, function) pairs reachable from root_class.forward through self-methods, module
    functions and candidate-defined submodules."""
    seen: set[tuple[str, str]] = set()
    order: list[tuple[str, ast.FunctionDef]] = []
    todo = [(root_class, "forward")]
    while todo:
        owner, name = todo.pop()
        if (owner, name) in seen:
            continue
        seen.add((owner, name))
        fn = mod.methods(owner).get(name) if owner else mod.functions.get(name)
        if fn is None:
            continue
        order.append((owner, fn))
        subs = mod.submodules(owner) if owner else {}
        init = mod.methods(owner).get("__init__") if owner and name == "forward" else None
        for node in ast.walk(init) if init else ():  # own blocks in nn.ModuleList / nn.Sequential / lists,
            if isinstance(node, ast.Call) and dotted_name(node.func) in mod.classes:  # called in loops
                todo.append((dotted_name(node.func), "forward"))
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            callee = dotted_name(node.func)
            if callee.startswith("self.") and callee.count(".") == 1 and owner:
                attr = callee
                if callee.split(".")[1] in mod.methods(owner):
                    todo.append((owner, callee.split(".")[1]))
                elif subs.get(attr, "").split(".")[-1] in mod.classes:
                    todo.append((subs[attr].split(".")[-1], "forward"))
            elif callee in mod.functions:
                todo.append(("", callee))
            elif callee in mod.classes:
                todo.append((callee, "__init__"))
            for arg in node.args + [k.value for k in node.keywords]:  # callbacks: f, self.method
                if isinstance(arg, ast.Name) and arg.id in mod.functions:
                    todo.append(("", arg.id))
                elif owner and dotted_name(arg).startswith("self.") and dotted_name(arg).count(".") == 1 \
                        and dotted_name(arg)[5:] in mod.methods(owner):
                    todo.append((owner, dotted_name(arg)[5:]))
    return order


def calls_extension(node: ast.AST, mod: CandidateModule) -> bool:
    """Whether ``node`` calls into the candidate's extensions, or hands one of their functions
    to something that will (``pool.submit(ext.fn, ...)``, ``functools.partial(ext.fn)``)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and dotted_name(sub.func) in mod.ext_names:
            return True
        if isinstance(sub, ast.Call) and dotted_name(sub.func).split("().")[0] in mod.ext_factories \
                and "()." in dotted_name(sub.func):  # _kernels().fused(x): through the factory's handle
            return True
        if isinstance(sub, ast.Attribute) and dotted_name(sub.value) in mod.ext_names:
            return True
    return False


def torch_compute(node: ast.AST, mod: CandidateModule, owner: str) -> list[str]:
    """PyTorch compute operations called in ``node`` (names, in order, once each)."""
    subs = mod.submodules(owner) if owner else {}
    ops: list[str] = []
    for sub in ast.walk(node):
        op = None
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.MatMult):
            op = "@ (matmul)"
        elif isinstance(sub, ast.Call):
            written = dotted_name(sub.func)
            head = written.rsplit(".", 1)[0] if "." in written else ""
            if not written or head in mod.ext_names or head.removesuffix("()") in mod.ext_factories:
                continue
            callee = mod.resolve(written)
            last = callee.split(".")[-1]
            if callee.startswith("self.") and callee.count(".") == 1:
                built = subs.get(callee, "")
                kind = built.split(".")[-1]
                if built and kind not in mod.classes and (built.startswith(("nn.", "torch.nn.")) or kind in HEAVY_MODULES):
                    op = f"{kind} module"
                continue_ = op is None
                if continue_:
                    continue
            elif callee.startswith(("torch.", "F.", "nn.functional.", "functional.")) and last not in SHAPE_OPS \
                    and last not in RANDOM_DRAWS:
                if not callee.startswith(("torch.cuda.", "torch.utils.", "torch.backends.", "torch.nn.Parameter")):
                    op = callee if callee == written else f"{callee} (as {written})"
            elif isinstance(sub.func, ast.Attribute) and (last in HEAVY_OPS or last in TENSOR_COMPUTE_METHODS):
                root = dotted_name(sub.func.value)
                if root.split(".")[0] not in ("math", "np", "numpy", "os", "sys", "re", "json", "self") or (
                        root.startswith("self.") and root in subs):
                    op = f".{last}()"
        if op and op not in ops:
            ops.append(op)
    return ops


TENSOR_COMPUTE_METHODS = {
    "relu", "gelu", "silu", "sigmoid", "tanh", "softmax", "log_softmax", "exp", "log", "sum", "mean",
    "pow", "sqrt", "rsqrt", "mul", "add", "sub", "div", "clamp", "clamp_min", "var", "std", "norm",
    "layer_norm", "max", "amax", "min", "cumsum", "gather", "masked_fill", "abs", "erf", "lerp", "addcmul",
    "mul_", "add_", "div_", "sub_", "clamp_", "relu_", "exp_", "matmul", "mm", "bmm", "addmm",
}


def is_heavy(op: str) -> bool:
    name = op.split(" (as ")[0].split(".")[-1].replace("()", "").replace(" module", "").strip()
    return name in HEAVY_OPS or name in HEAVY_MODULES or op.startswith("@")
