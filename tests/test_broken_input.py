"""Bad input never shows a traceback: a corpus of broken references through every command that
takes one, and broken candidates through `verify`, on the CPU.

A broken reference is unusable input: exit 2, a message that names the user's file, no frame of
ours. A broken candidate is a verdict (exit 1, the README's contract): built, run and judged in
the worker, its file named, nothing of our stack shown.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from stitchcuda.cli import app
from tests.conftest import CPU, FIXTURES

BROKEN = FIXTURES / "broken"
REFERENCES = sorted((BROKEN / "references").glob("*.py"))
GOOD_CANDIDATE = CPU / "cpp_extension.py"  # never built: the reference is refused first
# where the message must point: the line the user has to fix
LINES = {"syntax_error": "line 8", "raising_init": "line 11", "raising_forward": "line 16",
         "wrong_output_shape": "line 15"}

runner = CliRunner()


HANG_LIMIT_S = "5"  # where the hanging forward is checked: it is stopped at this limit


@pytest.fixture(autouse=True)
def _limit(monkeypatch):
    # room for a loaded machine elsewhere: at 5 s, checks of tiny references ran past it beside a build
    monkeypatch.setenv("STITCHCUDA_REFERENCE_TIMEOUT", "60")


@pytest.fixture
def hang_limit(monkeypatch):
    monkeypatch.setenv("STITCHCUDA_REFERENCE_TIMEOUT", HANG_LIMIT_S)


def _assert_clean(result, path: Path, exit_code: int = 2) -> str:
    output = result.output
    assert result.exit_code == exit_code, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in output and "site-packages" not in output and "stitchcuda/" not in output.replace(
        str(FIXTURES), ""), output
    assert str(path) in output, output
    return output


def test_the_corpus_has_every_kind_of_broken_reference():
    assert {p.stem for p in REFERENCES} == {"syntax_error", "no_model", "non_tensor_inputs", "raising_init",
                                            "raising_forward", "wrong_output_shape", "hanging_forward"}


@pytest.mark.parametrize("reference", REFERENCES, ids=lambda p: p.stem)
def test_broken_reference_through_optimize_verify_and_reward(reference, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if reference.stem == "hanging_forward":
        monkeypatch.setenv("STITCHCUDA_REFERENCE_TIMEOUT", HANG_LIMIT_S)
    commands = {
        "optimize": ["optimize", str(reference), "--workspace", str(tmp_path / "ws")],
        "verify": ["verify", str(reference), str(GOOD_CANDIDATE), "--preset", "tiny-debug"],
        "reward": ["reward", str(reference), str(GOOD_CANDIDATE), "--device", "cpu", "--preset", "tiny-debug"],
    }
    for name, args in commands.items():
        output = _assert_clean(runner.invoke(app, args), reference)
        if reference.stem in LINES:
            assert LINES[reference.stem] in output, (name, output)
    assert not list(tmp_path.glob("*_stitchcuda.py")), "no program is written for an unusable reference"


def test_broken_reference_as_json_is_a_json_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    reference = BROKEN / "references" / "raising_forward.py"
    for args in (["optimize", str(reference), "--json"],
                 ["verify", str(reference), str(GOOD_CANDIDATE), "--preset", "tiny-debug", "--json"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2
        error = json.loads(result.stdout)
        assert error["exit_code"] == 2 and str(reference) in error["error"] and "line 16" in error["error"]


def test_a_bench_over_a_folder_names_every_unusable_task(tmp_path, hang_limit):
    ws = tmp_path / "ws"
    result = runner.invoke(app, ["bench", str(BROKEN / "references"), "--gpus", "cpu", "--workspace", str(ws)])
    output = _assert_clean(result, REFERENCES[0])
    for reference in REFERENCES:
        assert str(reference) in output
    assert "7 of 7 tasks are unusable" in output and "--skip-unusable" in output
    assert not (ws / "runs.sqlite").exists()  # refused before a store is made


def test_a_bench_can_leave_unusable_tasks_out(tmp_path):
    folder = tmp_path / "tasks"
    folder.mkdir()
    for name in ("raising_init", "non_tensor_inputs"):
        (folder / f"{name}.py").write_text((BROKEN / "references" / f"{name}.py").read_text())
    result = runner.invoke(app, ["bench", str(folder), "--gpus", "cpu", "--workspace", str(tmp_path / "ws"),
                                 "--skip-unusable"])
    assert result.exit_code == 2 and "skipped:" in result.output and "no usable task is left" in result.output


def test_tasks_check_lists_every_broken_file(tmp_path, hang_limit):
    result = runner.invoke(app, ["tasks", str(BROKEN / "references"), "--check", "--json"])
    assert result.exit_code == 2
    rows = {Path(r["path"]).stem: r["problem"] for r in json.loads(result.stdout)}
    assert set(rows) == {p.stem for p in REFERENCES} and all(rows.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="says what happens without a GPU")
def test_profile_without_a_gpu_says_so(tmp_path):
    result = runner.invoke(app, ["profile", "mlp"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output and "CUDA" in result.output and "--device cpu" not in result.output


@pytest.mark.parametrize("candidate", ["cpp_compile_error", "crash", "hang"])
def test_broken_candidate_is_a_verdict(candidate, cache):
    path = BROKEN / "candidates" / f"{candidate}.py"
    result = runner.invoke(app, ["verify", str(CPU / "tiny_mlp.py"), str(path), "--device", "cpu",
                                 "--preset", "tiny-debug", "--timeout", "15"])
    output = _assert_clean(result, path, exit_code=1)
    expected = {"cpp_compile_error": "candidate line 12", "crash": "segfault", "hang": "timeout"}[candidate]
    assert expected in output and "FAILED" in output


def test_a_bug_of_ours_is_one_line_and_a_log_file(monkeypatch, tmp_path, capsys):
    import stitchcuda.cli as cli
    from stitchcuda.cli import workspace_commands

    def broken(*args, **kwargs):
        raise RuntimeError("an internal slip")

    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path))
    monkeypatch.setattr(workspace_commands, "diagnose", broken)
    monkeypatch.setattr("sys.argv", ["stitchcuda", "doctor", "--no-ncu-probe"])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    err = capsys.readouterr().err
    assert stopped.value.code == 3 and "internal error: RuntimeError: an internal slip" in err
    assert "Traceback" not in err
    logs = list((tmp_path / "errors").glob("*.log"))
    assert len(logs) == 1 and "Traceback" in logs[0].read_text()


def test_a_run_that_crashes_is_kept_as_failed_with_its_reason(tmp_path):
    from stitchcuda.agents.loop import OptimizeConfig, Optimizer, RunCrashed
    from stitchcuda.agents.offline import OFFLINE
    from stitchcuda.store import RunStore
    from stitchcuda.task import load_task_file
    from stitchcuda.verify import PRESETS

    class BrokenPlanner:
        def plan(self, *args, **kwargs):
            raise RuntimeError("the planner slipped")

    class NoVerifier:
        config, gpu = PRESETS["tiny-debug"], None

    task = load_task_file(CPU / "tiny_mlp.py")
    store = RunStore(tmp_path / "ws")
    config = OptimizeConfig(planner=OFFLINE, coder=OFFLINE, verify=PRESETS["tiny-debug"], knowledge=False)
    with pytest.raises(RunCrashed, match="the planner slipped"):
        Optimizer(task, config, BrokenPlanner(), object(), NoVerifier(), store, profile_reference=False).start()
    run = store.runs()[0]
    assert run.status == "failed" and "RuntimeError: the planner slipped" in run.stop_reason
    assert "Traceback" in (store.run_dir(run.id) / "error.log").read_text()


def test_a_reference_that_asks_for_cuda_by_name_is_not_refused_by_the_check(tmp_path):
    """The check hides the GPU on purpose; `device="cuda"` in the user's inputs is theirs to ask for."""
    from stitchcuda.task import load_task_file
    from stitchcuda.task.probe import check_reference

    path = tmp_path / "cuda_inputs.py"
    path.write_text((CPU / "tiny_mlp.py").read_text().replace("torch.randn(16, 64)",
                                                              'torch.randn(16, 64, device="cuda")'))
    check = check_reference(load_task_file(path))
    assert check.ok and "CUDA" in check.forward


def test_references_checked_side_by_side_keep_their_order_past_a_hang(monkeypatch):
    """Two children share the tasks: the one on the hanging forward is replaced for the rest of its
    share, and every check comes back in the tasks' order."""
    from stitchcuda.task import load_task_file
    from stitchcuda.task.probe import check_references

    monkeypatch.setattr("os.cpu_count", lambda: 4)
    good, hang, raising = (load_task_file(p) for p in (CPU / "tiny_mlp.py", BROKEN / "references" / "hanging_forward.py",
                                                       BROKEN / "references" / "raising_forward.py"))
    tasks = [good, hang, raising, good, good, good]
    checks = check_references(tasks, timeout_s=10)
    assert [c.task for c in checks] == [t.name for t in tasks]
    assert [c.ok for c in checks] == [True, False, False, True, True, True]
    assert "did not finish within 10 s" in checks[1].problem and "line 16" in checks[2].problem


_SECOND_CALL_HANGS = '''
import os
import time
import torch
import torch.nn as nn

with open(os.environ["IMPORTED_BY"], "a") as f:  # which processes ran this file
    f.write(f"{os.getpid()}\\n")


class Model(nn.Module):
    def forward(self, x):
        calls = os.environ["IMPORTED_BY"] + ".calls"  # counted across imports and processes
        called = os.path.exists(calls)
        open(calls, "a").close()
        if called:  # the check's forward returns; the capture's never does
            time.sleep(3600)
        return x * 2


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
'''


def test_a_forward_that_hangs_on_its_second_call_is_stopped_at_the_limit_outside_our_process(tmp_path):
    """The reference check and the capture run in one child under one limit: a forward that returns
    once and then hangs ends the command with exit 2 at the limit, and the command's own process
    never imported the user's file."""
    import subprocess
    import sys
    import time

    task, imported = tmp_path / "hangs_later.py", tmp_path / "imported_by.txt"
    task.write_text(_SECOND_CALL_HANGS)
    env = dict(os.environ, STITCHCUDA_REFERENCE_TIMEOUT="20", IMPORTED_BY=str(imported))
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "stitchcuda.cli", "optimize", str(task), "--workspace",
                              str(tmp_path / "ws")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=tmp_path)
    _, err = child.communicate(timeout=240)
    assert child.returncode == 2, err
    assert "did not finish within 20 s" in err and str(task) in err and "Traceback" not in err
    assert time.monotonic() - started < 120
    assert str(child.pid) not in imported.read_text().split()
