"""`stitchcuda optimize` killed (SIGKILL, or Ctrl-C to its process group) at moments drawn from a
fixed seed once its run is stored, all over one store: no run stays `running`, the killed run
resumes to the end an unkilled run reaches, no output file is ever truncated, and the store passes
its check. This machine has no GPU: the offline Coder writes and compile-checks the program."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from stitchcuda import store_repair
from tests.conftest import sampled

OLD_PROGRAM = "# the program an earlier run wrote\n" * 1000
# the 30 kills: which signal, and when, as a share of an unkilled run's time once its run is stored
KILLS = [f"{i}-{'SIGKILL' if i % 2 else 'SIGINT'}-{random.Random(45 + i).random():.3f}" for i in range(30)]


def _optimize(workspace, out, *more: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stitchcuda.cli", "optimize", *more, "--workspace", str(workspace),
                             "-o", str(out), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,  # Ctrl-C as a terminal delivers it, even where this
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # runs in the background


def _runs(workspace) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "stitchcuda.cli", "runs", "--workspace", str(workspace), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _stored(workspace) -> int:
    try:
        db = sqlite3.connect(f"file:{workspace / 'runs.sqlite'}?mode=ro", uri=True)
        try:
            return db.execute("SELECT count(*) FROM runs").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0


@pytest.fixture(scope="module")
def unkilled(tmp_path_factory):
    """One run to the end: its program, and how long it ran once its run was stored."""
    root = tmp_path_factory.mktemp("kills")
    workspace, out = root / "ws", root / "unkilled.py"
    child = _optimize(workspace, out, "mlp")
    while _stored(workspace) == 0 and child.poll() is None:
        time.sleep(0.05)
    stored = time.monotonic()
    _, err = child.communicate(timeout=600)
    assert child.returncode == 0, err
    return root, workspace, out.read_text(), time.monotonic() - stored


@pytest.mark.parametrize("kill", sampled(KILLS, 2, seed=45))  # by default one Ctrl-C and one SIGKILL
def test_a_killed_run_is_interrupted_and_resumes_to_the_same_end(unkilled, kill):
    root, workspace, program, length = unkilled
    index, how, moment = kill.split("-")
    moment = float(moment)
    out = root / f"kill{index}.py"
    out.write_text(OLD_PROGRAM)
    before = _stored(workspace)
    child = _optimize(workspace, out, "mlp")
    while _stored(workspace) == before and child.poll() is None:
        time.sleep(0.02)
    time.sleep(moment * length)
    if child.poll() is None:
        if how == "SIGKILL":
            child.kill()
        else:
            os.killpg(child.pid, signal.SIGINT)
    _, err = child.communicate(timeout=300)
    assert child.returncode in (0, 130, -signal.SIGKILL), err
    assert "Traceback" not in err
    if child.returncode == 130:  # Ctrl-C: one line
        assert err.strip().splitlines()[-1] == "interrupted"
    assert out.read_text() in (OLD_PROGRAM, program)  # whole, old or new: never cut
    runs = _runs(workspace)
    assert not [r for r in runs if r["status"] == "running"]
    killed = runs[0]  # the newest
    resumed = subprocess.run([sys.executable, "-m", "stitchcuda.cli", "optimize", "--resume", killed["id"],
                              "--workspace", str(workspace), "-o", str(out), "--json"],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["run"] == killed["id"]  # that run, not a new one
    assert out.read_text() == program
    after = _runs(workspace)
    assert len(after) == len(runs) and after[0]["status"] == "unverified"
    assert store_repair.check(workspace).ok
