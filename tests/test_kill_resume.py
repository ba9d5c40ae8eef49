"""`stitchcuda optimize` killed (SIGKILL, or Ctrl-C to its process group) at moments drawn from a
fixed seed once its run is stored, all over one store: no run stays `running`, the killed run
resumes to the end an unkilled run reaches, no output file is ever truncated, and the store passes
its check. Two paths, each over a store of its own: without a GPU the offline Coder writes and
compile-checks the program; with ``--device cpu`` the whole loop runs, plan, steps and verdicts."""

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
from tests.conftest import CPU, sampled

OLD_PROGRAM = "# the program an earlier run wrote\n" * 1000
# the 30 kills: which signal, and when, as a share of an unkilled run's time once its run is stored;
# one in three on the --device cpu loop
KILLS = [f"{i}-{'SIGKILL' if i % 2 else 'SIGINT'}-{random.Random(45 + i).random():.3f}-{'loop' if i % 3 == 2 else 'nogpu'}"
         for i in range(30)]
# the loop runs a small MLP: the suite's mlp took 7 s a step in its reference on a CPU
PATHS = {"nogpu": ("mlp",), "loop": (str(CPU / "tiny_mlp.py"), "--device", "cpu", "--max-steps", "3")}


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


def _end(summary: dict) -> dict:
    """What a run's summary says of its end, without what differs between any two runs."""
    check = summary.get("compile_check") or {}
    return {k: summary.get(k) for k in ("status", "steps", "replans", "stop_reason", "best")} | {
        "compile_check": (check.get("status"), check.get("detail"))}


_UNKILLED: dict[str, tuple] = {}


@pytest.fixture(scope="module")
def unkilled(tmp_path_factory):
    """Per path, one run to the end: its summary, its program (or None) and how long it ran once its
    run was stored; made the first time a kill on that path asks for it."""

    def get(path: str) -> tuple:
        if path not in _UNKILLED:
            root = tmp_path_factory.mktemp(f"kills-{path}")
            workspace, out = root / "ws", root / "unkilled.py"
            child = _optimize(workspace, out, *PATHS[path])
            while _stored(workspace) == 0 and child.poll() is None:
                time.sleep(0.05)
            stored = time.monotonic()
            summary, err = child.communicate(timeout=600)
            assert child.returncode in (0, 1), err  # 1: the loop kept no program (its CUDA cannot run on a CPU)
            _UNKILLED[path] = (root, workspace, json.loads(summary) | {"rc": child.returncode},
                               out.read_text() if out.exists() else None, time.monotonic() - stored)
        return _UNKILLED[path]

    return get


@pytest.mark.parametrize("kill", sampled(KILLS, 2, seed=42))  # by default both signals and both paths
def test_a_killed_run_is_interrupted_and_resumes_to_the_same_end(unkilled, kill):
    index, how, moment, path = kill.split("-")
    root, workspace, summary, program, length = unkilled(path)
    moment = float(moment)
    out = root / f"kill{index}.py"
    out.write_text(OLD_PROGRAM)
    before = _stored(workspace)
    child = _optimize(workspace, out, *PATHS[path])
    while _stored(workspace) == before and child.poll() is None:
        time.sleep(0.02)
    time.sleep(moment * length)
    if child.poll() is None:
        if how == "SIGKILL":
            child.kill()
        else:
            os.killpg(child.pid, signal.SIGINT)
    _, err = child.communicate(timeout=300)
    assert child.returncode in (summary["rc"], 130, -signal.SIGKILL), err
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
    assert resumed.returncode == summary["rc"], resumed.stderr
    ended = json.loads(resumed.stdout)
    assert ended["run"] == killed["id"]  # that run, not a new one
    assert _end(ended) == _end(summary)
    if program is not None:
        assert out.read_text() == program
        # the command it suggests names the task's file, as the unkilled run's did, not the run's copy
        assert ended["note"].replace(str(out), "OUT") == summary["note"].replace(str(root / "unkilled.py"), "OUT")
    after = _runs(workspace)
    assert len(after) == len(runs) and after[0]["status"] == summary["status"]
    assert store_repair.check(workspace).ok
