"""Split-K in CUTLASS with the product's epilogue in the summing pass: a deep, narrow Linear with
a bias and an activation (small_cnn's fc1, 256 x 512 x 16384, filled 32 of 132 SMs as one grid)
runs as slices of K, and the pass that sums them adds the bias and applies the activation."""

from __future__ import annotations

import importlib.util

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.check import cuda_source
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate, lower
from stitchcuda.task import resolve_tasks

DEEP_LINEAR_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16384, 256)
        self.act = nn.{act}()

    def forward(self, x):
        return self.act(self.fc(x))


def get_inputs():
    return [torch.randn(256, 16384)]


def get_init_inputs():
    return []
'''
CUTLASS = CodegenOptions(cutlass=True)


def _compiled(tmp_path, act: str = "ReLU"):
    path = tmp_path / f"deep_linear_{act.lower()}.py"
    path.write_text(DEEP_LINEAR_TASK.replace("{act}", act))
    (task,) = resolve_tasks(str(path))
    return task, compile_task(task)


def _gemm(compiled, options=CUTLASS):
    low = lower(compiled.graph, compiled.groups, options)
    (g,) = [x.gemm for grp in low.groups for x in grp.launches() if x.gemm is not None]
    return low, g


@pytest.mark.parametrize("act, code", [("ReLU", 1), ("GELU", 2), ("SiLU", 4), ("Sigmoid", 5)])
def test_the_bias_and_activation_move_to_the_summing_pass(tmp_path, act, code):
    task, compiled = _compiled(tmp_path, act)
    low, g = _gemm(compiled)
    assert g.split_k == 32 and (g.batch, g.k) == (32, 512)  # 16 tiles: 32 slices fill two waves
    # the slices compute the bare product into scratch; C and the activation are the pass's
    assert g.cutlass.activation == "identity" and not g.c and g.beta == 0.0
    assert g.split_k_c and g.split_k_ld_c == 0 and g.split_k_beta == 1.0
    assert g.split_k_act == {"ReLU": "relu", "GELU": "gelu", "SiLU": "silu", "Sigmoid": "sigmoid"}[act]
    program = generate(task, compiled.graph, compiled.groups, CUTLASS)
    source = cuda_source(program)
    assert f"a.{g.split_k_c}, 0LL, 256LL, 1.0f, {code});" in source
    assert f"(epilogue bias + {g.split_k_act}), split-K: K = 16384 as 32 slices" in program


def test_a_wide_product_keeps_its_epilogue_in_cutlass(tmp_path):
    path = tmp_path / "wide.py"
    path.write_text(DEEP_LINEAR_TASK.replace("{act}", "ReLU")
                    .replace("nn.Linear(16384, 256)", "nn.Linear(1024, 4096)").replace("256, 16384", "4096, 1024"))
    (task,) = resolve_tasks(str(path))
    _, g = _gemm(compile_task(task))
    assert g.split_k == 1 and g.cutlass.activation == "relu" and g.c and not g.split_k_c


@pytest.mark.nvcc
def test_the_split_k_program_compiles_for_sm90(tmp_path):
    from tests.test_offline_codegen import _compile_together

    task, compiled = _compiled(tmp_path, "GELU")
    _compile_together([cuda_source(generate(task, compiled.graph, compiled.groups, CUTLASS))], tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["ReLU", "GELU"])
def test_split_k_with_its_epilogue_on_the_gpu(tmp_path, act):
    import torch

    task, compiled = _compiled(tmp_path, act)
    (tmp_path / "program.py").write_text(generate(task, compiled.graph, compiled.groups, CUTLASS))
    spec = importlib.util.spec_from_file_location(f"deep_linear_{act}", tmp_path / "program.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reference = importlib.util.spec_from_file_location("deep_ref", tmp_path / f"deep_linear_{act.lower()}.py")
    ref_module = importlib.util.module_from_spec(reference)
    reference.loader.exec_module(ref_module)
    torch.manual_seed(0)
    ref = ref_module.Model().cuda()
    torch.manual_seed(0)
    model = module.ModelNew().cuda()
    x = torch.randn(256, 16384, device="cuda")
    with torch.no_grad():
        got, again = model(x).clone(), model(x)
        exact = ref.double()(x.double())
    for out in (got, again):
        assert (out.double() - exact).abs().max().item() < 1e-4
