"""A damaged, read-only or uncreatable run store is the user's to fix: exit 2, the path, and how."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pydantic import BaseModel

from stitchcuda import store_repair
from stitchcuda.records import RunState
from stitchcuda.store import RunStore, StoreError, db_path

RUNS = 45  # under the listing's default limit of 50


class _Config(BaseModel):
    note: str = "x" * 2000  # rows big enough to spread the store over many pages


def _store_with_runs(workspace) -> list[str]:
    store = RunStore(workspace)
    ids = []
    for i in range(RUNS):
        state = RunState(run_id=f"run-{i:03d}", task=f"task{i}", task_sha256="0" * 64, status="done")
        store.create_run(state, _Config())
        ids.append(state.run_id)
    store.close()  # the last connection checkpoints the write-ahead log into the file
    return ids


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stitchcuda.cli", *args], capture_output=True, text=True, timeout=300)


def _damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "cut":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "zeroed page":
        page = int.from_bytes(data[16:18], "big")
        at = data.index(b'"run_id":"run-030"') // page * page  # a leaf of the runs table
        data[at: at + page] = bytes(page)
        path.write_bytes(bytes(data))
    else:
        path.write_text("not a database at all\n")


@pytest.mark.parametrize("how", ["cut", "zeroed page", "wrong file"])
def test_a_damaged_store_says_how_to_recover_and_recovers_what_it_can(tmp_path, how):
    workspace = tmp_path / "ws"
    _store_with_runs(workspace)
    _damage(db_path(workspace), how)
    listing = _cli("runs", "--workspace", str(workspace))
    assert listing.returncode == 2, listing.stderr
    assert "damaged" in listing.stderr and str(db_path(workspace)) in listing.stderr
    assert "runs --check" in listing.stderr and "Traceback" not in listing.stderr
    as_json = _cli("runs", "--workspace", str(workspace), "--json")
    assert as_json.returncode == 2 and "damaged" in json.loads(as_json.stdout)["error"]

    found = store_repair.check(workspace)
    assert not found.ok and found.problems
    done = store_repair.repair(workspace)
    assert os.path.exists(done.damaged_copy)
    after = RunStore(workspace).runs(limit=1000)
    assert len(after) == done.runs and all(r.id.startswith("run-") for r in after)
    if how == "zeroed page":  # one page lost: the rest came back
        assert RUNS - 5 <= done.runs < RUNS
    elif how == "wrong file":
        assert done.runs == 0
    assert store_repair.check(workspace).ok


def test_check_and_repair_from_the_command_line(tmp_path):
    workspace = tmp_path / "ws"
    _store_with_runs(workspace)
    assert _cli("runs", "--check", "--workspace", str(workspace)).returncode == 0
    _damage(db_path(workspace), "zeroed page")
    checked = _cli("runs", "--check", "--workspace", str(workspace))
    assert checked.returncode == 1 and "damaged" in checked.stdout and "--repair" in checked.stdout
    repaired = _cli("runs", "--repair", "--workspace", str(workspace))
    assert repaired.returncode == 0 and "run(s) came back" in repaired.stdout and "damaged-" in repaired.stdout
    listing = _cli("runs", "--workspace", str(workspace), "--json")
    assert listing.returncode == 0 and len(json.loads(listing.stdout)) >= RUNS - 5


def test_a_read_only_store_lists_and_refuses_writes_with_its_path(tmp_path, monkeypatch):
    """Listing a store this process may not write works; recording a run says which file is read-only.
    (Permissions are simulated: as root, every file is writable.)"""
    workspace = tmp_path / "ws"
    ids = _store_with_runs(workspace)
    monkeypatch.setattr("stitchcuda.store.os.access", lambda path, mode: mode != os.W_OK)
    store = RunStore(workspace)
    assert sorted(r.id for r in store.runs(limit=1000)) == ids
    with pytest.raises(StoreError, match=f"{db_path(workspace)} is read-only"):
        store.create_run(RunState(run_id="new", task="t", task_sha256="0" * 64), _Config())
    store.close()
    monkeypatch.undo()
    assert len(RunStore(workspace).runs(limit=1000)) == RUNS  # nothing recorded was lost


def test_a_workspace_that_cannot_be_created_is_an_unusable_argument(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = _cli("optimize", "mlp", "--workspace", str(blocker / "ws"), "--device", "cpu", "--max-steps", "1")
    assert done.returncode == 2 and "cannot create the workspace" in done.stderr and str(blocker) in done.stderr
    assert "Traceback" not in done.stderr
