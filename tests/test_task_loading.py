"""Task loading from every source, and the errors a malformed task gets."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stitchcuda.task import (
    TaskError,
    bundled_task_names,
    check_candidate_source,
    load_candidate,
    load_folder,
    load_kernelbench,
    load_parquet,
    load_task_file,
    resolve_tasks,
)
from stitchcuda.task.probe import check_reference
from tests.conftest import CPU, FIXTURES

TASKS = FIXTURES / "tasks"


def test_single_file():
    task = load_task_file(CPU / "tiny_mlp.py")
    assert task.name == "tiny_mlp" and task.origin == "file" and len(task.sha256) == 64
    check = check_reference(task)
    assert check.ok and check.forward == "meta"  # imported, inputs checked, one forward on the meta device


def test_a_constructor_that_reads_tensor_data_still_runs_its_forward_on_the_meta_device(tmp_path):
    """torchvision's RegNet computes its widths with tensors in ``__init__``, so it cannot be built on
    the meta device; built on the CPU, its forward still runs on the meta device (a CPU forward of the
    large ones took minutes and failed the check)."""
    path = tmp_path / "widths_from_tensors.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        width = int(torch.tensor([4096.0]).round().item())  # needs data: fails on meta\n"
        "        self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(2)])\n\n"
        "    def forward(self, x):\n"
        "        for _ in range(2000):  # minutes on a CPU; nothing on the meta device\n"
        "            x = torch.tanh(self.layers(x))\n"
        "        return x\n\n"
        "def get_inputs():\n    return [torch.randn(4096, 4096)]\n\n"
        "def get_init_inputs():\n    return []\n")
    check = check_reference(load_task_file(path), timeout_s=60)
    assert check.ok and check.forward == "meta", check


def test_missing_names_are_named():
    with pytest.raises(TaskError, match="lacks get_inputs"):
        load_task_file(TASKS / "no_get_inputs.py")


def test_missing_file():
    with pytest.raises(TaskError, match="does not exist"):
        load_task_file(TASKS / "nope.py")


def test_syntax_error_gives_line():
    with pytest.raises(TaskError, match="does not parse: line 4"):
        check_candidate_source((CPU / "syntax_error.py").read_text())


def test_import_failure_is_clear():
    task = load_task_file(TASKS / "fails_import.py")  # static checks pass
    problem = check_reference(task).problem
    assert "importing it failed ModuleNotFoundError" in problem and task.path in problem


def test_non_tensor_inputs():
    task = load_task_file(TASKS / "returns_nontensor.py")
    assert "non-tensors" in check_reference(task).problem


def test_candidate_without_modelnew():
    with pytest.raises(TaskError, match="defines no ModelNew"):
        check_candidate_source(load_candidate(CPU / "no_modelnew.py").source)


def test_folder(tmp_path):
    shutil.copy(CPU / "tiny_mlp.py", tmp_path / "a.py")
    shutil.copy(CPU / "tiny_mlp.py", tmp_path / "b.py")
    assert [t.name for t in load_folder(tmp_path)] == ["a", "b"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TaskError, match="holds no .py"):
        load_folder(empty)


def _fake_checkout(root):
    level = root / "KernelBench" / "level3"
    level.mkdir(parents=True)
    for name in ("1_MLP.py", "2_ShallowWideMLP.py", "10_ResNet101.py"):
        shutil.copy(CPU / "tiny_mlp.py", level / name)
    (level / "README.md").write_text("not a task")
    return root


def test_kernelbench_checkout(tmp_path):
    root = _fake_checkout(tmp_path)
    tasks = load_kernelbench(root, 3)
    assert [t.problem_id for t in tasks] == [1, 2, 10]  # numeric order, not lexicographic
    assert tasks[0].name == "L3/1_MLP" and tasks[0].origin == "kernelbench" and tasks[0].level == 3
    assert [t.problem_id for t in resolve_tasks(str(root), level=3, problem=10)] == [10]
    with pytest.raises(TaskError, match="name a level"):
        resolve_tasks(str(root))
    with pytest.raises(TaskError, match="not a KernelBench checkout with level 2"):
        load_kernelbench(root, 2)
    with pytest.raises(TaskError, match="no problem 7"):
        load_kernelbench(root, 3, 7)


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    code = (CPU / "tiny_mlp.py").read_text()
    table = pa.table({
        "code": [code, code, "class Model: pass"],
        "level": [1, 3, 3],
        "name": ["5_Matmul.py", "1_MLP.py", "9_Broken.py"],
        "problem_id": [5, 1, 9],
    })
    path = tmp_path / "kb.parquet"
    pq.write_table(table, path)
    tasks = load_parquet(path, level=3, problem=1)
    assert [t.name for t in tasks] == ["L3/1_MLP"] and tasks[0].origin == "parquet"
    with pytest.raises(TaskError, match="lacks get_inputs"):
        load_parquet(path, level=3)  # the broken row is reported, with where it is
    bad = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1]}), bad)
    with pytest.raises(TaskError, match="lacks column"):
        load_parquet(bad)


def test_bundled_suite_is_resolvable():
    names = bundled_task_names()
    assert len(names) >= 12
    assert [t.name for t in resolve_tasks("mlp")] == ["mlp"]
    assert len(resolve_tasks("suite")) == len(names)
    with pytest.raises(TaskError, match="neither a file"):
        resolve_tasks("no_such_task")


def test_comma_separated_tasks():
    tasks = resolve_tasks(f"mlp, small_cnn,{CPU / 'tiny_mlp.py'}")
    assert [t.name for t in tasks] == ["mlp", "small_cnn", "tiny_mlp"]
    with pytest.raises(TaskError, match="names a task twice"):
        resolve_tasks("mlp,mlp")
    with pytest.raises(TaskError, match="neither a file"):
        resolve_tasks("mlp,no_such_task")


def test_a_comma_list_longer_than_a_file_name_resolves(tmp_path):
    """A bench over many task files names them in one comma-separated spec; a spec past the file
    system's name limit (255 bytes) is a list, not an error."""
    source = (Path(__file__).parent.parent / "src/stitchcuda/task/suite/mlp.py").read_text()
    paths = []
    for i in range(12):
        path = tmp_path / f"task_with_a_rather_long_descriptive_name_number_{i:02d}.py"
        path.write_text(source)
        paths.append(str(path))
    spec = ",".join(paths)
    assert len(spec) > 1000
    assert [t.name for t in resolve_tasks(spec)] == [Path(p).stem for p in paths]
