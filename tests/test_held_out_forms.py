"""Forms seen on models nobody here wrote, each held on the CPU: patches cut with ``Tensor.unfold``
and convolutions written with ``F.unfold``, ``clamp`` with tensor bounds, outputs nested in tuples
(and dicts), a graph that follows its model's weights after ``load_state_dict``.

The captured and simplified graph runs here with torch's own operators (capture/evaluate.py):
each rewrite is held to the reference's function, before and after new weights are loaded.
"""

from __future__ import annotations

import textwrap
import types

import pytest
import torch

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.capture.evaluate import run_graph
from stitchcuda.compiler.capture.fast_paths import as_cuda_inference
from stitchcuda.compiler.capture.graph import CaptureError, capture
from stitchcuda.compiler.ir.expr import leaf, view_expr
from stitchcuda.compiler.schedule.simplify import simplify
from stitchcuda.task.probe import check_here
from stitchcuda.task.record import Task
from stitchcuda.verify.correctness import flatten_output
from stitchcuda.verify.kernelbench_harness import _not_one_tensor, adapt_for_harness, flattened_outputs
from stitchcuda.verify.weights_trial import perturbed

TASKS = {
    "unfold_patches": ("""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Linear(3 * 4 * 4, 32)
                self.norm = nn.LayerNorm(32)

            def forward(self, x):
                b, c = x.shape[0], x.shape[1]
                patches = x.unfold(2, 4, 4).unfold(3, 4, 4).permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * 16)
                return self.norm(self.embed(patches))
        """, "[torch.randn(2, 3, 16, 12)]"),
    "unfold_overlapping": ("""
        class Model(nn.Module):
            def forward(self, x):
                return x.unfold(-1, 5, 2).sum(-1) + x.transpose(1, 2).unfold(1, 3, 3).amax(-1).sum(1, keepdim=True)
        """, "[torch.randn(2, 6, 15)]"),
    "im2col": ("""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(8, 4 * 9))

            def forward(self, x):
                b, _, h, w = x.shape
                return (self.w @ nn.functional.unfold(x, 3, padding=1, stride=1)).view(b, -1, h, w)
        """, "[torch.randn(2, 4, 6, 5)]"),
    "clamp_tensor_bounds": ("""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = nn.Parameter(torch.log(10 * torch.ones(4, 1, 1)))
                self.register_buffer("floor", -0.5 - torch.rand(6))
                self.register_buffer("ceiling", 0.5 + torch.rand(6))

            def forward(self, x):
                scale = torch.clamp(self.scale, max=torch.log(torch.tensor(1.0 / 0.01))).exp()
                y = torch.clamp(x * scale, min=self.floor, max=self.ceiling)
                return y + x.clamp_min(self.floor) - x.clamp_max(self.ceiling)
        """, "[torch.randn(2, 4, 5, 6)]"),
    "lstm_states": ("""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.LSTM(8, 16, num_layers=2, batch_first=True)

            def forward(self, x):
                return self.net(x)
        """, "[torch.randn(2, 5, 8)]"),
    "dict_of_tensors": ("""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(8, 8)

            def forward(self, x):
                y = self.proj(x)
                return {"hidden": y, "pooled": [y.mean(1), (y.amax(1),)]}
        """, "[torch.randn(2, 5, 8)]"),
    "moe_where_index_add": ("""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.gate = nn.Linear(8, 4, bias=False)
                self.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
                                             for _ in range(4))

            def forward(self, x):
                tokens = x.reshape(-1, x.shape[-1])
                weights, chosen = torch.topk(self.gate(tokens).softmax(dim=-1), 2, dim=-1)
                out = torch.zeros_like(tokens)
                for e, expert in enumerate(self.experts):
                    rows, slot = torch.where(chosen == e)
                    out.index_add_(0, rows, expert(tokens[rows]) * weights[rows, slot, None])
                return out.reshape(x.shape)
        """, "[torch.randn(2, 6, 8)]"),
    "moe_mask_setitem": ("""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.router = nn.Linear(8, 3)
                self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

            def forward(self, x):
                choice = self.router(x).argmax(-1)
                out = x.clone()
                for e, expert in enumerate(self.experts):
                    picked = choice == e
                    out[picked] = expert(x[picked]).softmax(0) + x[picked].sum(0)
                return out + x[x > 0].sum() + x[x > 0.5].amax()
        """, "[torch.randn(3, 5, 8)]"),
    "masked_rows_softmax": ("""
        class Model(nn.Module):
            def forward(self, x):
                picked = x[:, 0] > 0
                rows = torch.where(picked)[0]
                chosen = nn.functional.layer_norm(x[picked], (4,))
                out = x.index_add(0, rows, chosen.softmax(0) * x[picked].cumsum(0)) + x[picked].amax(0)
                return out.index_put((rows,), torch.tensor(2.0), accumulate=True)
        """, "[torch.randn(7, 4)]"),
}

UNBOUNDED = {
    "a result of data-dependent size": ("return x[x > 0]", r"returns index, whose size depends on its data"),
    "a mean over the chosen rows": ("return x[x > 0].mean() + x", r"reduces over a data-dependent number .* mean"),
    "the count as a number": ("return x[x > 0].sum(0) / x[x > 0].shape[0] + x", r"uses the number of rows"),
    "a sort of the chosen rows": ("return torch.sort(x[x > 0])[0].sum() + x", r"runs sort over a dim whose size"),
    "a norm across the chosen rows": ("return nn.functional.layer_norm(x[x[:, 0] > 0].t(), "
                                      "(torch.where(x[:, 0] > 0)[0].shape[0],)).sum() + x", r"runs layer_norm over a dim"),
    "a size no mask gives": ("return torch.unique(x).sum() * x", r"cannot bound: _unique2"),
}


def _task(name: str) -> Task:
    body, inputs = TASKS[name]
    source = (f"import torch\nimport torch.nn as nn\n\n{textwrap.dedent(body)}\n\n"
              f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return []\n")
    return Task(name=name, source=source)


def _module(task: Task) -> types.ModuleType:
    module = types.ModuleType(task.name)
    exec(compile(task.source, task.name, "exec"), module.__dict__)
    return module


def _max_gap(reference, graph_outputs) -> float:
    leaves = flatten_output(reference)
    assert leaves is not None and len(leaves) == len(graph_outputs)
    return max((a - b).abs().max().item() for a, b in zip(leaves, graph_outputs, strict=True))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_captured_graph_computes_the_reference_and_follows_new_weights(name):
    """Capture and simplification keep the reference's function (the tensor clamp bounds become
    maximum/minimum, the unfolds strided views, data-dependent routing a graph of static shapes
    sized by the masks' bounds), and the graph reads the weights the model holds
    now: after a perturbed state_dict is loaded, it matches the reference again."""
    task = _task(name)
    graph = simplify(capture(task))
    module = _module(task)
    torch.manual_seed(0)
    model = module.Model()
    inputs = module.get_inputs()
    with torch.no_grad():
        assert _max_gap(model(*inputs), run_graph(graph, model.state_dict(keep_vars=True), inputs)) < 1e-5
        if model.state_dict():
            before = flatten_output(model(*inputs))
            model.load_state_dict(perturbed(model.state_dict(), 5))
            after = model(*inputs)
            assert _max_gap(after, before) > 1e-3  # the new weights moved the output
            assert _max_gap(after, run_graph(graph, model.state_dict(keep_vars=True), inputs)) < 1e-5
    if name == "clamp_tensor_bounds":
        assert not any(n.op in ("aten.clamp", "aten.clamp_min", "aten.clamp_max") and n.overload == "Tensor"
                       for n in graph.nodes)
    compile_task(task).program()  # and a program is written: no refusal


@pytest.mark.parametrize("what", sorted(UNBOUNDED))
def test_a_data_dependent_size_no_bound_makes_exact_is_refused_with_the_reason(what):
    body, reason = UNBOUNDED[what]
    source = (f"import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
              f"        {body}\n\n\ndef get_inputs():\n    return [torch.randn(6, 4)]\n\n\n"
              "def get_init_inputs():\n    return []\n")
    with pytest.raises(CaptureError, match=reason):
        capture(Task(name="unbounded", source=source))


@pytest.mark.parametrize("shape,dim,size,step", [((2, 3, 16, 12), 2, 4, 4), ((2, 6, 15), -1, 5, 2),
                                                 ((7,), 0, 3, 1), ((4, 9, 2), 1, 2, 3)])
def test_tensor_unfold_reads_through_torch_s_own_strides(shape, dim, size, step):
    x = torch.randn(shape)
    want = x.unfold(dim, size, step)
    node = types.SimpleNamespace(name="u", op="aten.unfold", overload="default", args=["%x", dim, size, step],
                                 out=[types.SimpleNamespace(shape=list(want.shape))])
    read = view_expr(node, leaf("x", shape)).leaf
    assert read.shape == tuple(want.shape) and read.strides == want.stride() and read.offset == 0
    # after a transpose the read composes with the view before it, as torch's strides do
    t = x.transpose(0, -1)
    node.args, node.out[0].shape = ["%x", 0, 1, 1], list(t.unfold(0, 1, 1).shape)
    read = view_expr(node, leaf("x", t.shape, t.stride())).leaf
    assert read.strides == t.unfold(0, 1, 1).stride()


def test_programs_return_the_forward_s_own_nesting():
    """LSTM's ``output, (h_n, c_n)`` comes back nested as the reference returns it; a flat tuple and a
    single tensor are the host's own return, unchanged."""
    program = compile_task(_task("lstm_states")).program()
    assert "return (outputs[0], (outputs[1], outputs[2]))" in program
    program = compile_task(_task("dict_of_tensors")).program()
    assert "return {'hidden': outputs[0], 'pooled': [outputs[1], (outputs[2],)]}" in program
    assert "outputs = " not in compile_task(_task("im2col")).program()


def test_the_reference_check_takes_any_nesting_of_tensors_and_names_what_is_not_one():
    for name in ("lstm_states", "dict_of_tensors"):
        task = _task(name)
        assert check_here(task.name, task.source, task.name).problem is None
    source = _task("im2col").source.replace("return (self.w", "return 3, (self.w")
    problem = check_here("bad", source, "bad.py").problem
    assert problem is not None and "int" in problem and "tensors" in problem


def test_kernelbench_s_harness_compares_a_tuple_of_tensors_flattened_into_one():
    """Its harness reads ``output.shape`` and calls one ``torch.allclose``: nn.LSTM's
    ``output, (h_n, c_n)`` goes to it as the three flattened and concatenated, in both models (the
    same elementwise test as leaf by leaf); outputs of mixed dtypes it is told it cannot compare."""
    source = _task("lstm_states").source
    assert flattened_outputs(source) == 3 and _not_one_tensor(source) is None
    assert flattened_outputs(_task("im2col").source) is None and _not_one_tensor(_task("im2col").source) is None
    reference, candidate, said = adapt_for_harness(source, source.replace("class Model(", "class ModelNew("))
    assert "3 tensors" in said and "flattened" in said
    scope: dict = {}
    exec(reference, scope)
    torch.manual_seed(0)
    model = scope["Model"](*scope["get_init_inputs"]())
    inputs = scope["get_inputs"]()
    flat = model(*inputs)
    leaves = torch.utils._pytree.tree_leaves(scope["_stitchcuda_Model_forward"](model, *inputs))
    assert len(leaves) == 3 and torch.equal(flat, torch.cat([t.reshape(-1) for t in leaves]))
    mixed = source.replace("return self.net(x)", "return self.net(x)[0], x.argmax()")
    assert mixed != source and flattened_outputs(mixed) is None
    why = _not_one_tensor(mixed)
    assert why is not None and "tuple of 2 values" in why


def _encoder_task(**kwargs) -> Task:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return Task(name="encoder", source=(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        f"        super().__init__()\n        self.layer = nn.TransformerEncoderLayer(32, {args})\n"
        "        self.layer.eval()\n\n    def forward(self, x):\n        return self.layer(x)\n\n\n"
        "def get_inputs():\n    return [torch.randn(2, 5, 32)]\n\n\ndef get_init_inputs():\n    return []\n"))


@pytest.mark.parametrize("kwargs,approximate", [
    ({"nhead": 4, "activation": "gelu", "batch_first": True, "norm_first": True}, "tanh"),
    ({"nhead": 4, "activation": "gelu", "batch_first": True}, "tanh"),
    ({"nhead": 4, "activation": "gelu", "batch_first": False}, "none"),  # no native path: the Python code
    ({"nhead": 1, "activation": "gelu", "batch_first": True}, "none"),  # an odd head count: likewise
])
def test_an_eval_encoder_layer_is_captured_as_cuda_runs_it_under_no_grad(kwargs, approximate):
    """nn.TransformerEncoderLayer's native inference path applies GELU in cuBLASLt's epilogue (the tanh
    form) on CUDA: a ViT front end's reference missed its own Python code by 2.8e-4 there, and a
    program of the erf GELU failed strict against it. The capture follows the path the layer takes."""
    graph = capture(_encoder_task(dim_feedforward=64, **kwargs))
    gelus = [n for n in graph.nodes if n.op == "aten.gelu"]
    assert len(gelus) == 1 and gelus[0].kwargs.get("approximate", "none") == approximate
    layer = torch.nn.TransformerEncoderLayer(32, dim_feedforward=64, **kwargs).eval()
    with as_cuda_inference(layer):
        assert ("forward" in vars(layer)) == (approximate == "tanh")
    assert "forward" not in vars(layer)  # the module's own forward again after the capture


class _Cancelling(torch.nn.Module):
    """w times a sum that cancels: fp32's running sum misses the exact one by several units."""

    def __init__(self, exact: bool):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.exact = exact

    def forward(self, x):
        total = x.double().sum(-1).float() if self.exact else x.sum(-1)
        return self.w * total


def test_the_weights_trial_judges_an_ill_conditioned_model_against_fp64():
    """A model whose trials needed the fp64 judgement stays ill-conditioned after the new weights: the
    trial judges it against fp64 again (an exact candidate passes), rather than by how far the
    weights moved the output alone."""
    from types import SimpleNamespace

    from stitchcuda.verify.config import TOLERANCES
    from stitchcuda.verify.weights_trial import follows_weights

    def get_inputs():  # each row: 1e8, ten ones, -1e8, repeated; exact sum 40, fp32's far from it
        row = torch.tensor(([1e8] + [1.0] * 10 + [-1e8]) * 4)
        return [row.repeat(3, 1)]

    reference = SimpleNamespace(get_inputs=get_inputs)
    request = SimpleNamespace(config=SimpleNamespace(seed=0, tol=TOLERANCES["strict"]))
    trial = follows_weights(request, reference, _Cancelling(False), _Cancelling(True), torch.device("cpu"),
                            draws=False, conditioned=True, fp64=True)
    assert trial.ran and trial.passed and trial.conditioning is not None and trial.conditioning.passed


STATEFUL = """
import torch
import torch.nn as nn


class Cell(nn.Module):
    def __init__(self):
        super().__init__()
        self.i2h = nn.Linear(4 + 6, 6)
        self.hidden = torch.randn(3, 6)

    def forward(self, x):
        self.hidden = torch.tanh(self.i2h(torch.cat((x, self.hidden), dim=1)))
        return self.hidden * 2


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = Cell()

    def forward(self, x):
        return self.cell(x) + 1


def get_inputs():
    return [torch.randn(3, 4)]


def get_init_inputs():
    return []
"""


def test_state_a_submodule_reassigns_is_carried_across_calls():
    """A stateful cell inside the task's Model reassigns ``self.hidden`` each call: torch.export
    misses a reassignment inside a submodule, so the capture turned it away. It now records the
    write-back, the program carries the state, and two calls of the graph follow two of the
    reference."""
    task = Task(name="stateful", source=STATEFUL)
    graph = simplify(capture(task))
    assert graph.state == ["cell.hidden"] and list(graph.mutations.values())
    module = _module(task)
    torch.manual_seed(0)
    reference = module.Model()
    torch.manual_seed(0)
    twin = module.Model()
    state = dict(twin.named_parameters()) | {"cell.hidden": twin.cell.hidden}  # a plain attribute there
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 4)
            (out,) = run_graph(graph, state, [x])
            assert torch.allclose(out, reference(x), atol=1e-6)
        assert torch.allclose(twin.cell.hidden, reference.cell.hidden, atol=1e-6)
    assert "_buffers['hidden']" in compile_task(task).program()


NESTED_ENCODER = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first={batch_first})
        self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(32))
        self.eval()

    def forward(self, x, pad):
        return self.encoder(x, src_key_padding_mask=pad)


def get_inputs():
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    pad[2, 3:] = True
    return [torch.randn({shape}), pad]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("batch_first", [True, False])
def test_an_eval_encoder_with_a_padding_mask_is_captured_as_its_nested_path(batch_first):
    """nn.TransformerEncoder in eval mode runs a padded batch as a nested tensor under no_grad and
    returns zeros (then its norm) at the padded positions; its Python code computes values there,
    2.6 apart. The capture follows the nested path where torch takes it (each row's tokens first)
    and the Python code where it does not (padding at the front, as torch decides per call; a
    sequence-first layer, which torch never nests)."""
    shape = "3, 7, 32" if batch_first else "7, 3, 32"
    task = Task(name="encoder", source=NESTED_ENCODER.format(batch_first=batch_first, shape=shape))
    graph = simplify(capture(task))
    module = _module(task)
    torch.manual_seed(0)
    model = module.Model()
    x, pad = module.get_inputs()
    state = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for mask in (pad, pad.flip(-1)):  # trailing padding nests; leading padding does not
            (out,) = run_graph(graph, state, [x, mask])
            assert (out - model(x, mask)).abs().max() < 1e-5
    compile_task(task).program()
