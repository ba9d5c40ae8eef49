"""benchmarks/ray_scaling.py's verdict on three runs: the scaling and Ray-overhead goals and the
task-by-task agreement (the runs themselves need GPUs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("ray_scaling", Path(__file__).parents[1] / "benchmarks/ray_scaling.py")
ray_scaling = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ray_scaling)


def _row(mode: str, gpus: int, wall: float, outcomes: dict) -> dict:
    return {"mode": mode, "gpus": gpus, "wall_s": wall, "per_gpu_hour": 100.0, "gpu_busy": 0.5, "verifications": 6,
            "correct": 6, "tasks": 6, "partial": 0, "total": 0, "outcomes": outcomes}


def test_goals_met_and_missed(capsys):
    same = {"mlp": (True, "none"), "nsg": (True, "none")}
    assert ray_scaling.table([_row("ray", 2, 55, same), _row("local", 2, 52, same),
                              _row("local-1gpu", 1, 100, same)]) == []
    assert "1.92x" in capsys.readouterr().out
    missed = ray_scaling.table([_row("ray", 2, 70, same), _row("local", 2, 60, same),
                                _row("local-1gpu", 1, 90, {**same, "nsg": (False, "none")})])
    assert missed == ["scaling", "ray", "agreement"]
    assert "they differ on: ['nsg']" in capsys.readouterr().out


def test_a_failed_mode_is_reported_not_compared(capsys):
    rows = [{"mode": "ray", "error": "--ray needs Ray: pip install 'stitchcuda[ray]'", "wall_s": 1.0},
            _row("local", 2, 52, {}), _row("local-1gpu", 1, 100, {})]
    assert ray_scaling.table(rows) == []
    assert "ray          failed: --ray needs Ray" in capsys.readouterr().out


def test_table_from_files_of_separate_runs(tmp_path, monkeypatch, capsys):
    """Modes run in separate calls (or on separate machines) leave mode-*.json files; --table draws the
    table from them without a GPU, and outcomes that went through JSON still compare equal."""
    import json
    import sys

    same = {"mlp": [True, "none"], "nsg": [True, "none"]}
    for row in (_row("ray", 2, 55, same), _row("local", 2, 52, same), _row("local-1gpu", 1, 100, same)):
        (tmp_path / f"mode-{row['mode']}.json").write_text(json.dumps(row))
    monkeypatch.setattr(sys, "argv", ["ray_scaling.py", "--table", "--out", str(tmp_path)])
    try:
        ray_scaling.main()
    except SystemExit as exc:
        assert exc.code == 0
    printed = capsys.readouterr().out
    assert "1.92x" in printed and "agree on every task" in printed
    assert printed.index("ray ") < printed.index("local ") < printed.index("local-1gpu")


def test_a_cut_bench_says_how_far_it_got(tmp_path, capsys):
    """A mode cut at its limit reports its finished tasks, the slowest with their largest stages, and
    the stages summed, from the bench's store."""
    from stitchcuda.bench.records import BenchInfo, TaskResult
    from stitchcuda.bench.store import BenchRow, BenchStore

    store = BenchStore(tmp_path)
    store.create(BenchInfo(id="bench-1", suite="zoo", coder="offline", tolerance="strict"), "{}",
                 [BenchRow(i, TaskResult(task=name), f"{name}.py", None) for i, name in enumerate(("a", "b", "c"))])
    store.save_result("bench-1", 0, TaskResult(task="a", status="done", wall_s=30.0,
                                               stages={"build": 20.0, "timing": 4.0, "capture": 6.0}))
    store.save_result("bench-1", 1, TaskResult(task="b", status="done", wall_s=90.0,
                                               stages={"baselines": 70.0, "build": 15.0, "timing": 5.0}))
    store.close()
    got = ray_scaling.progress(tmp_path)
    assert got["done"] == 2 and got["tasks"] == 3
    assert got["stages_s"]["build"] == 35.0 and got["slowest"][0]["task"] == "b"
    assert list(got["slowest"][0]["stages"]) == ["baselines", "build", "timing"]
    row = {"mode": "local", "error": "cut at 540 s: carry it on with --resume", "wall_s": 540.0, "progress": got}
    ray_scaling.table([row])
    printed = capsys.readouterr().out
    assert "2/3 tasks finished" in printed and "baselines 70 s" in printed and "b 90 s; a 30 s" in printed
    assert ray_scaling.progress(tmp_path / "nothing") == {}
