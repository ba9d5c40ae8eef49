"""The command line: exit codes, JSON output, listings."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from stitchcuda.cli import app
from tests.conftest import CPU, FIXTURES

runner = CliRunner()
TINY = str(CPU / "tiny_mlp.py")


def verify(*args: str):
    return runner.invoke(app, ["verify", *args, "--preset", "tiny-debug"])


def test_verify_json_and_exit_code_for_a_hack(cache):
    result = verify(TINY, str(CPU / "pure_torch.py"), "--json", "--trials", "3", "--tolerance", "paper")
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.stdout)
    assert verdict["correct"] and not verdict["passed"] and verdict["hacking"]["level"] == "total"
    assert len(verdict["correctness"]["trials"]) == 3 and verdict["tolerance"]["name"] == "paper"


def test_verify_human_output(cache):
    result = verify(TINY, str(CPU / "wrong.py"))
    assert result.exit_code == 1
    assert "FAILED" in result.stdout and "Wrong result" in result.stdout


def test_unusable_arguments_exit_2(cache):
    assert verify("no_such_task", str(CPU / "wrong.py")).exit_code == 2
    missing = verify(TINY, str(CPU / "missing.py"))
    assert missing.exit_code == 2 and "does not exist" in missing.output
    assert verify(str(FIXTURES / "tasks" / "no_get_inputs.py"), str(CPU / "wrong.py")).exit_code == 2
    assert verify(str(CPU / "reference_broken.py"), str(CPU / "pure_torch.py")).exit_code == 2
    assert runner.invoke(app, ["verify", TINY, str(CPU / "wrong.py"), "--tolerance", "loose"]).exit_code == 2


def test_tasks_listing():
    result = runner.invoke(app, ["tasks", "--json"])
    assert result.exit_code == 0
    names = [t["name"] for t in json.loads(result.stdout)]
    assert "mlp" in names and "transformer_block" in names and len(names) >= 12


def test_tasks_check_reports_broken_tasks():
    result = runner.invoke(app, ["tasks", str(FIXTURES / "tasks" / "returns_nontensor.py"), "--check", "--json"])
    assert result.exit_code == 2
    assert "non-tensors" in json.loads(result.stdout)[0]["problem"]


def test_doctor_json():
    result = runner.invoke(app, ["doctor", "--json", "--no-ncu-probe"])
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert {"gpu", "torch", "nvcc", "ncu", "cache"} <= set(checks)
    assert all(c["fix"] for c in checks.values() if c["status"] == "fail")
    assert result.exit_code == (1 if any(c["status"] == "fail" for c in checks.values()) else 0)


def test_missing_gpu_is_an_unusable_argument(cache, monkeypatch):
    from stitchcuda import machine

    monkeypatch.setattr(machine, "gpus", lambda: ())
    result = runner.invoke(app, ["verify", TINY, str(CPU / "pure_torch.py"), "--device", "cuda:0"])
    assert result.exit_code == 2 and "--device cpu" in result.output


def test_version():
    from stitchcuda import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"stitchcuda {__version__}"


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path):
    """The console script's handler is in place before torch is imported (seconds), so a Ctrl-C
    then is the same one line as later, never a traceback."""
    import signal
    import subprocess
    import sys
    import time

    # Ctrl-C as a terminal delivers it: a test run in the background inherits SIGINT ignored
    child = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "stitchcuda.cli", "tasks", "suite"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    lines = []
    while time.monotonic() < deadline:  # interrupt once the app's imports have begun
        line = child.stderr.readline()
        lines.append(line)
        if "stitchcuda.cli.application" in line or "torch" in line:
            break
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("import time:"))
    assert child.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted"


def test_an_unusable_option_value_is_a_json_error_with_json(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "stitchcuda.cli", "optimize", "mlp", "--tolerance", "bogus", "--json",
                           "--workspace", str(tmp_path / "ws")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert error["exit_code"] == 2 and "'bogus' is not one of 'strict', 'paper'" in error["error"]
    assert "Value error" not in error["error"] and "Traceback" not in done.stderr


def test_suggested_commands_are_shell_quoted_and_never_wrapped(tmp_path, cache):
    """A task file named with spaces gives a run ID with spaces: the command printed for it pastes
    as one argument, on one line however narrow the terminal."""
    import re

    task = tmp_path / "my model.py"
    task.write_text((CPU / "tiny_mlp.py").read_text())
    result = CliRunner().invoke(app, ["optimize", str(task), "--workspace", str(tmp_path / "ws"),
                                      "-o", str(tmp_path / "out.py")], env={"COLUMNS": "50"})
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "stitchcuda runs " in line)
    assert " " in re.search(r"stitchcuda runs '([^']+)'", line).group(1)


def test_flags_show_no_type_in_any_commands_help():
    """A flag takes no value: `--json`, not `--json <bool>`, in every command's help."""
    import typer.main

    group = typer.main.get_command(app)
    names = [[]] + [[name] for name in group.commands]
    names += [[name, sub] for name, command in group.commands.items() for sub in getattr(command, "commands", {})]
    for name in names:
        shown = runner.invoke(app, [*name, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, (name, shown.output)
        assert "--help" in shown.output and "<bool>" not in shown.output, name
    assert "<int" in runner.invoke(app, ["optimize", "--help"], env={"COLUMNS": "200"}).output  # other types stay


def test_the_cli_imports_under_a_typer_without_display_type_rich():
    """Typer before 0.29 has no ``TyperOption.display_type_rich`` (and prints no types): the help
    override must leave it alone, not fail at import as it did on a GPU image's older typer."""
    code = ("import typer.core\n"
            "for cls in typer.core.TyperOption.__mro__:\n"
            "    if 'display_type_rich' in vars(cls):\n"
            "        delattr(cls, 'display_type_rich')\n"
            "assert not hasattr(typer.core.TyperOption, 'display_type_rich')\n"
            "import stitchcuda.cli.application\n"
            "print('IMPORTED')\n")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "IMPORTED" in done.stdout, done.stderr[-1500:]
