"""Shape checks for the bundled benchmark suite (src/stitchcuda/task/suite).

Every task file is imported by path and its Model is built and run on the meta
device, so that sizes and shapes are checked without allocating or computing the
full-size tensors. The task list is found by globbing the folder, not hard-coded.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

SUITE_DIR = Path(__file__).resolve().parents[1] / "src" / "stitchcuda" / "task" / "suite"
SUITE_FILES = sorted(p for p in SUITE_DIR.glob("*.py") if p.name != "__init__.py")


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"_suite_task_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    assert isinstance(out, (tuple, list)) and out, f"output is {type(out).__name__}, not a tensor or tuple"
    assert all(isinstance(t, torch.Tensor) for t in out), "output tuple holds a non-tensor"
    return list(out)


def test_suite_has_enough_tasks():
    assert len(SUITE_FILES) >= 12, [p.name for p in SUITE_FILES]


@pytest.mark.parametrize("path", SUITE_FILES, ids=[p.stem for p in SUITE_FILES])
def test_suite_task_shapes_on_meta(path: Path):
    module = _load(path)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        assert hasattr(module, name), f"{path.name} does not define {name}"
    assert (module.__doc__ or "").strip(), f"{path.name} has no module docstring"

    init = module.get_init_inputs()
    assert isinstance(init, list)
    assert not any(isinstance(v, torch.Tensor) for v in init), "init inputs should be plain Python values"

    # get_inputs builds real CPU tensors; the largest suite input is a few hundred MB at most.
    inputs = module.get_inputs()
    assert isinstance(inputs, list) and inputs
    for t in inputs:
        assert isinstance(t, torch.Tensor), type(t)
        assert t.device.type == "cpu"
        assert t.dtype in (torch.float32, torch.int64), t.dtype

    torch.manual_seed(0)
    with torch.device("meta"):
        model = module.Model(*init)
    assert not any(
        m.training for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
    ), "batch norm must be in eval mode"
    meta_inputs = [t.to("meta") for t in inputs]
    with torch.no_grad():
        out = model(*meta_inputs)
    for t in _tensors(out):
        assert t.device.type == "meta"
        assert t.dtype == torch.float32
        assert t.numel() > 0
