"""bench: jobs over a suite through the local pool and through Ray (logical GPUs on the CPU),
--evaluate of a folder of solutions, resume after a kill, and the GPU gate."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stitchcuda.bench.solutions import match_solutions
from stitchcuda.cli import app
from stitchcuda.task import load_folder
from stitchcuda.verify.pool import GatedVerifier, GateStats, GpuGate
from tests.conftest import CPU, share_builds

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = FIXTURES / "cpu" / "tiny_mlp.py"


def suite_with_solutions(tmp_path: Path, solutions: dict[str, Path | None]) -> tuple[Path, Path]:
    """A folder of tasks (copies of the tiny MLP reference) and a folder of solutions by task name."""
    tasks, sols = tmp_path / "tasks", tmp_path / "solutions"
    tasks.mkdir()
    sols.mkdir()
    for name, solution in solutions.items():
        shutil.copyfile(REFERENCE, tasks / f"{name}.py")
        if solution is not None:
            shutil.copyfile(solution, sols / f"{name}.py")
    return tasks, sols


def bench(*args: str):
    result = CliRunner().invoke(app, ["bench", *args])
    return result


def test_solutions_match_by_name_and_kernelbench_numbering(tmp_path):
    from stitchcuda.task.record import Task

    tasks = [Task(name="1_Square", source="", level=1, problem_id=1), Task(name="relu", source="")]
    for name in ("level_1_problem_1_sample_0_kernel.py", "level_1_problem_1_sample_3_kernel.py",
                 "relu_stitchcuda.py", "unrelated.py"):
        (tmp_path / name).write_text("")
    rows, unmatched = match_solutions(tasks, tmp_path)
    assert [(t.name, Path(p).name if p else None) for t, p in rows] == [
        ("1_Square#0", "level_1_problem_1_sample_0_kernel.py"), ("1_Square#3", "level_1_problem_1_sample_3_kernel.py"),
        ("relu", "relu_stitchcuda.py")]
    assert unmatched == ["unrelated.py"]


def test_bench_evaluate_locally_then_resume_redoes_nothing_verified(tmp_path, cache, session_builds):
    """One honest C++ solution (a real g++ build in the CPU build pool, then a gated verification
    that hits the cache), one pure-PyTorch (a total hack), one wrong, one missing."""
    share_builds(cache, session_builds)
    tasks, sols = suite_with_solutions(tmp_path, {
        "a_honest": FIXTURES / "agents" / "tiny_mlp_full_cpp.py", "b_pure": FIXTURES / "cpu" / "pure_torch.py",
        "c_wrong": FIXTURES / "cpu" / "wrong.py", "d_missing": None})
    ws = tmp_path / "ws"
    done = bench(str(tasks), "--evaluate", str(sols), "--gpus", "cpu", "--preset", "tiny-debug",
                 "--workspace", str(ws), "--json")
    assert done.exit_code == 0, done.output
    metrics = json.loads(done.stdout)
    overall = metrics["overall"]
    assert (overall["tasks"], overall["succeeded"], overall["hacking_total"]) == (4, 1, 2)  # wrong.py is PyTorch too
    assert metrics["tolerance"] == "strict" and metrics["gpu"] == "cpu" and metrics["weights"] == "seeded"
    phases = metrics["totals"]["verify_phases_s"]  # where the verifications' wall time went
    assert phases["correctness"] > 0 and phases["timing"] > 0 and {"spawn", "cuda_init", "reference"} <= set(phases)
    assert phases["checks"] > 0  # the static checks and the judgement, in the verifying process
    assert metrics["totals"]["stages_s"]["checks"] == pytest.approx(phases["checks"], abs=0.01)
    db = sqlite3.connect(ws / "runs.sqlite")
    rows = dict(db.execute("SELECT task, result FROM bench_tasks").fetchall())
    honest = json.loads(rows["a_honest"])
    assert honest["passed"] and honest["hacking"] == "none" and honest["speedup"]["eager"] > 0
    assert honest["verifications"] == 1 and honest["build_s"] < 1.0  # the build pool built it ahead
    built = json.loads(Path(honest["verdict"]).read_text())["build"]
    assert built["cache_hit"] and built["extensions"][0]["ok"]  # so the verification only loaded it
    assert json.loads(rows["d_missing"])["status"] == "failed"
    assert json.loads(rows["d_missing"])["error"].startswith("no solution")
    assert json.loads(rows["c_wrong"])["correct"] is False
    # every task that did not pass says why, typed, in its row and in --json
    failures = {f["task"]: f for f in metrics["failures"]}
    assert set(failures) == {"b_pure", "c_wrong", "d_missing"} and honest["failure"] is None
    for task, f in failures.items():
        assert json.loads(rows[task])["failure"] == {"kind": f["kind"], "detail": f["detail"]}
    assert failures["b_pure"]["kind"] == "hack" and failures["b_pure"]["detail"].startswith("level total, ")
    assert failures["c_wrong"]["kind"] == "wrong_output"
    assert failures["c_wrong"]["detail"].startswith("max abs error ") and "(tolerance strict)" in failures["c_wrong"]["detail"]
    assert failures["d_missing"]["kind"] == "no_candidate" and failures["d_missing"]["detail"].startswith("no solution")

    # a kill mid-bench: one task still pending; resume verifies it alone
    db.execute("UPDATE bench_tasks SET status = 'pending' WHERE task = 'c_wrong'")
    db.commit()
    first_wall = json.loads(db.execute("SELECT info FROM benches").fetchone()[0])["wall_s"]
    verdicts = {p.name: p.stat().st_mtime_ns for p in ws.glob("benches/*/verdicts/*.json")}
    resumed = bench("--resume", "last", "--workspace", str(ws), "--json")
    assert resumed.exit_code == 0, resumed.output
    after = {p.name: p.stat().st_mtime_ns for p in ws.glob("benches/*/verdicts/*.json")}
    changed = sorted(n for n in after if after[n] != verdicts.get(n))
    assert changed == ["0002-c_wrong.verdict.json"]
    assert json.loads(resumed.stdout)["overall"]["succeeded"] == 1
    assert json.loads(db.execute("SELECT info FROM benches").fetchone()[0])["wall_s"] > first_wall > 0  # adds up

    page = CliRunner().invoke(app, ["report", "last", "--workspace", str(ws), "-o", str(tmp_path / "report")])
    assert page.exit_code == 0, page.output
    assert (tmp_path / "report" / "index.html").exists() and (tmp_path / "report" / "summary.md").exists()


def test_bench_on_ray_with_logical_gpus(tmp_path, cache):
    ray = pytest.importorskip("ray")
    from stitchcuda.agents.session import build_config
    from stitchcuda.bench.runner import BenchConfig, run_bench
    from stitchcuda.bench.store import BenchStore

    tasks, sols = suite_with_solutions(tmp_path, {"b_pure": FIXTURES / "cpu" / "pure_torch.py",
                                                 "c_wrong": FIXTURES / "cpu" / "wrong.py"})
    found = load_folder(tasks)
    rows, _ = match_solutions(found, sols)
    optimize = build_config(model=None, coder="offline", provider="openai", base_url=None, api_key_env=None,
                            planner_model=None, coder_model=None, coder_provider=None, coder_base_url=None,
                            adapter=None, temperature=0.0, llm_timeout=10, samples=1, tolerance="paper",
                            device="cpu", preset="tiny-debug", max_steps=1, max_llm_calls=None, max_tokens=None,
                            max_cost=None, max_wall=None, max_attempts=1, max_replans=0, max_subtasks=1)
    config = BenchConfig(suite="ray-test", optimize=optimize, evaluate=str(sols), gpus=["cpu"], ray="local",
                         runs_per_gpu=2)
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert ray.cluster_resources().get("GPU") == 2  # logical GPUs: the tasks ask for half of one each
        result = run_bench(BenchStore(tmp_path / "ws"), [(t, t.level, p) for t, p in rows], config)
    finally:
        ray.shutdown()
    assert result.info.executor == "ray (local)" and result.info.status == "done"
    by_task = {t.task: t for t in result.tasks}
    assert by_task["b_pure"].hacking == "total" and not by_task["b_pure"].passed
    assert by_task["c_wrong"].compiled and not by_task["c_wrong"].correct
    assert all(t.verifications == 1 for t in result.tasks)


def test_gated_verifier_builds_before_its_workers_take_the_gate_and_judges_failed_builds_itself(tmp_path):
    """A double of the Verifier whose "worker" takes the gate as the real one does (exclusive for
    its timed part): builds take 0.2 s, GPU work 0.1 s. Two jobs on one GPU: the second builds
    while the first holds the GPU, so the pair takes about build + 2 x GPU."""
    from stitchcuda.verify.gate import GateClient
    from stitchcuda.verify.verdict import BuildReport, ExtensionBuild

    class Double:
        def __init__(self):
            self.gpu_intervals, self.verified, self.judged = [], [], []
            self.gate_path = None

        def build(self, candidate):
            time.sleep(0.2)
            ok = "broken" not in candidate.source
            return BuildReport(extensions=[ExtensionBuild(requested_name="x", name="x", build_dir="", ok=ok,
                                                          cache_hit=False, seconds=0.2)])

        def verify(self, task, candidate, on_phase=None, alone=False):
            self.verified.append(candidate.name)
            with GateClient(self.gate_path).section("exclusive"):
                start = time.time()
                time.sleep(0.1)
                self.gpu_intervals.append((start, time.time()))
            return "verdict"

        def judge_build(self, task, candidate, report, seconds):
            self.judged.append(candidate.name)
            return "build failed"

    from stitchcuda.task.record import Candidate, Task

    inner = Double()
    gate = GpuGate("cpu", tmp_path)
    verifiers = [GatedVerifier(inner, gate) for _ in range(2)]
    assert inner.gate_path == str(gate.path)  # its workers take this gate
    source = "class ModelNew:\n    pass\n"
    started = time.time()
    threads = [threading.Thread(target=v.verify, args=(Task(name="t", source=""), Candidate(name=f"c{i}",
                                                                                           source=source)))
               for i, v in enumerate(verifiers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - started
    (a0, a1), (b0, b1) = sorted(inner.gpu_intervals)
    assert a1 <= b0 + 1e-3  # never two on the GPU at once
    assert elapsed < 0.2 + 0.1 + 0.1 + 0.15  # the builds overlapped; serial would be 0.6 s
    assert sum(v.stats.verifications for v in verifiers) == 2 and isinstance(verifiers[0].stats, GateStats)
    assert sum(v.stats.builds for v in verifiers) == 2 and sum(v.stats.builds_cached for v in verifiers) == 0

    broken = GatedVerifier(inner, gate)
    with gate.exclusive():  # the gate is taken: a failed build must not wait for it, nor be built again
        t0 = time.time()
        assert broken.verify(Task(name="t", source=""), Candidate(name="b", source="# broken\n" + source)) \
            == "build failed"
        assert time.time() - t0 < 0.6
    assert broken.stats.gpu_s == 0.0 and inner.judged == ["b"] and "b" not in inner.verified

    builds = []
    inner.build = lambda candidate: builds.append(candidate) or Double.build(inner, candidate)
    alone = GatedVerifier(inner, gate, build_first=False)  # nobody shares the GPU: no separate build
    alone.verify(Task(name="t", source=""), Candidate(name="a", source=source))
    assert builds == [] and alone.stats.verifications == 1 and alone.stats.build_s < 0.1


def test_bench_optimize_records_each_run_and_its_attempts(tmp_path, cache):
    """A bench of one task with the LLM Coder (a scripted server): the optimize run is recorded,
    its attempts become the task's timeline, and the report renders it."""
    from tests.llm_server import ScriptedOpenAIServer
    from tests.test_optimize_loop import PURE_TORCH, plan

    tasks, _ = suite_with_solutions(tmp_path, {"tiny": None})
    ws = tmp_path / "ws"
    with ScriptedOpenAIServer([plan(target=0.01), PURE_TORCH]) as server:
        done = bench(str(tasks), "--model", "scripted-model", "--base-url", server.base_url, "--gpus", "cpu",
                     "--preset", "tiny-debug", "--max-steps", "1", "--workspace", str(ws), "--json")
    assert done.exit_code == 0, done.output
    row = json.loads(sqlite3.connect(ws / "runs.sqlite").execute("SELECT result FROM bench_tasks").fetchone()[0])
    assert row["run_id"] and row["status"] == "done" and row["error"] == "no candidate passed"
    assert row["failure"]["kind"] == "hack" and row["failure"]["detail"].startswith("level total, ")
    assert json.loads(done.stdout)["failures"] == [{"task": "tiny", **row["failure"]}]
    shown = bench("--resume", "last", "--workspace", str(ws))  # nothing left to run: the table alone
    assert shown.exit_code == 0 and "hack: level total" in shown.stdout
    assert row["verifications"] == 1
    # cut after the run recorded its verdict, before the bench recorded the task: the resume
    # verifies nothing again, and the verification still counts as the bench's own
    db = sqlite3.connect(ws / "runs.sqlite")
    db.execute("UPDATE bench_tasks SET status = 'pending'")
    db.commit()
    again = bench("--resume", "last", "--workspace", str(ws), "--json")
    assert again.exit_code == 0, again.output
    redone = json.loads(db.execute("SELECT result FROM bench_tasks").fetchone()[0])
    assert redone["verifications"] == 1 and redone["run_id"] == row["run_id"] and redone["llm_calls"] == 2
    assert json.loads(again.stdout)["totals"]["verifications"] == 1
    assert row["steps"] == 1 and row["llm_calls"] == 2 and row["tokens"] > 0
    assert [(a["step"], a["outcome"]) for a in row["attempts"]] == [(0, "hack (total)")]
    assert json.loads(done.stdout)["overall"]["succeeded"] == 0
    page = CliRunner().invoke(app, ["report", "last", "--workspace", str(ws), "-o", str(tmp_path / "r")])
    assert page.exit_code == 0, page.output
    assert "tiny" in (tmp_path / "r" / "index.html").read_text()

    # the recorded run is training data: its Coder call becomes a skill-1 sample with its verdict
    built = CliRunner().invoke(app, ["dataset", "build", "all", "--workspace", str(ws), "-o", str(tmp_path / "d"),
                                     "--eval-fraction", "0", "--json"])
    assert built.exit_code == 0, built.output
    import pyarrow.parquet as pq

    (sample,) = pq.read_table(tmp_path / "d" / "train.parquet").to_pylist()
    assert sample["skill"] == 1 and sample["completion"] == PURE_TORCH and sample["hacking"] == "total"
    assert json.loads(sample["verdict"])["hacking"]["level"] == "total" and sample["passed"] is False


RACING_TASK = '''
import sys
import torch
import torch.nn as nn

race = sys.modules["_stitchcuda_capture_race"]


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        if {first}:  # building, on the meta device: give the other capture a second to start
            race.building.set()
            race.raced.append(race.other_started.wait(1.0))
        else:
            race.building.wait(5.0)
            race.other_started.set()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(2, 8)]


def get_init_inputs():
    return []
'''


def test_captures_in_threads_do_not_overlap(monkeypatch):
    """A bench captures its tasks in threads. Building a model under ``with torch.device("meta")``
    sets torch's process-wide default device, which corrupted another thread's trace (HF GPT-2 on
    torch 2.11): one capture, from building its model to its last forward, runs at a time."""
    import sys
    import types

    from stitchcuda.compiler.capture.graph import capture
    from stitchcuda.task.record import Task

    race = types.SimpleNamespace(building=threading.Event(), other_started=threading.Event(), raced=[])
    monkeypatch.setitem(sys.modules, "_stitchcuda_capture_race", race)
    tasks = [Task(name=f"t{first}", source=RACING_TASK.format(first=first)) for first in (True, False)]
    graphs: list = []
    threads = [threading.Thread(target=lambda t=t: graphs.append(capture(t))) for t in tasks]
    threads[0].start()
    race.building.wait(5.0)
    threads[1].start()
    for t in threads:
        t.join()
    assert race.raced == [False]  # the second capture did not start while the first built its model
    assert len(graphs) == 2 and all(any(n.op == "aten.relu" for n in g.nodes) for g in graphs)


def test_a_bench_compiles_its_tasks_in_processes_of_their_own():
    """The same compiled task as in this process; a model that kills the capturing process is that
    task's refusal, and the next task compiles in a new pool."""
    from stitchcuda.agents.compiling import compile_apart
    from stitchcuda.agents.offline import OfflineCoder
    from stitchcuda.compiler import compile_task
    from stitchcuda.compiler.capture.graph import CaptureError
    from stitchcuda.compiler.emit.codegen import CodegenOptions
    from stitchcuda.task.record import Task

    task = Task(name="mlp", source=(CPU / "tiny_mlp.py").read_text())
    apart = compile_apart(task, "strict")
    # its first program came with it, emitted there: the bench's threads share one interpreter
    assert apart.sources and apart.seconds["capture"] > 0 and apart.seconds["emit"] > 0
    first = next(iter(apart.sources.values()))
    coder = OfflineCoder(task, "strict", apart)
    assert coder.first_program() is first and apart.seconds["emit"] == coder.compiled.seconds["emit"]
    assert apart.program(CodegenOptions()) == compile_task(task).program(CodegenOptions())
    dying = Task(name="dying", source="import os\nimport torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                 "    def forward(self, x):\n        os._exit(3)\n\n\ndef get_inputs():\n    return [torch.randn(2)]\n\n\n"
                 "def get_init_inputs():\n    return []\n")
    with pytest.raises(CaptureError, match="crashed the process"):
        compile_apart(dying, "strict")
    assert compile_apart(task, "strict").program(CodegenOptions()) == apart.program(CodegenOptions())


def test_bench_says_why_ray_cannot_start(tmp_path, monkeypatch):
    """Ray's own start-up failure (a binary it cannot run) is a clear message and exit 2, not an internal error."""
    import sys
    import types

    class FakeRay(types.ModuleType):
        def is_initialized(self):
            return False

        def init(self, **_):
            raise PermissionError("[Errno 13] Permission denied: '/site/ray/core/src/ray/gcs/gcs_server'")

    monkeypatch.setitem(sys.modules, "ray", FakeRay("ray"))
    shutil.copyfile(REFERENCE, tmp_path / "t.py")
    result = bench(str(tmp_path / "t.py"), "--ray", "local", "--preset", "tiny-debug", "--max-steps", "1",
                   "--workspace", str(tmp_path / "ws"))
    assert result.exit_code == 2, result.output
    assert "Ray could not start its local cluster: PermissionError" in result.output
    assert "gcs_server" in result.output and "internal error" not in result.output


def test_ctrl_c_stops_a_bench_at_once_and_saves_nothing_in_flight(tmp_path, monkeypatch):
    """Ctrl-C with two slots: t0 ended (its slot went to t2), t1 and t2 in their verifications,
    t3-t5 waiting. No waiting job starts, the verifiers' workers are killed (so the running jobs end
    now, not at their tasks' end), what the running jobs make after that is not saved, and
    `--resume` has every unsaved task still to run."""
    from stitchcuda.agents.session import build_config
    from stitchcuda.bench import runner
    from stitchcuda.bench.records import TaskResult
    from stitchcuda.bench.runner import BenchConfig, run_bench
    from stitchcuda.bench.store import BenchStore
    from stitchcuda.verify.workers import WorkersStopped

    killed = threading.Event()
    started: list[str] = []

    class Verifier:  # stands for the verifier whose workers the running jobs wait on
        def stop(self):
            killed.set()

    def verifier_for(*args, **kwargs):
        if not killed.wait(timeout=60):  # a verification in flight: it ends when its worker dies
            raise AssertionError("the bench never stopped its workers")
        raise WorkersStopped("stopped")

    def run_job(job, device=None, built=None):  # the real job's bookkeeping around a verification
        started.append(job.task.name)
        if job.task.name == "t0":
            return TaskResult(task="t0", status="done")
        monkeypatch.setattr(runner, "_verifier_for", verifier_for)
        return real_run_job(job, device, built)

    real_run_job = runner.run_job
    monkeypatch.setattr(runner, "run_job", run_job)
    monkeypatch.setitem(runner._VERIFIERS, "standin", Verifier())
    monkeypatch.setattr(runner, "stop_compiles", lambda: None)

    def on_done(result):
        time.sleep(0.5)  # the other job is in its verification by now
        raise KeyboardInterrupt

    optimize = build_config(model=None, coder="offline", provider="openai", base_url=None, api_key_env=None,
                            planner_model=None, coder_model=None, coder_provider=None, coder_base_url=None,
                            adapter=None, temperature=0.0, llm_timeout=10, samples=1, tolerance="strict",
                            device="cpu", preset="tiny-debug", max_steps=1, max_llm_calls=None, max_tokens=None,
                            max_cost=None, max_wall=None, max_attempts=1, max_replans=0, max_subtasks=1)
    config = BenchConfig(suite="interrupted", optimize=optimize, gpus=["cpu"], runs_per_gpu=2)
    tasks = load_folder(suite_with_solutions(tmp_path, {f"t{i}": None for i in range(6)})[0])
    store = BenchStore(tmp_path / "ws")
    stopped_at = time.time()
    with pytest.raises(KeyboardInterrupt):
        run_bench(store, [(t, None, None) for t in tasks], config, on_done=on_done)
    assert time.time() - stopped_at < 10
    deadline = time.time() + 10
    while len(started) < 3 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the jobs in flight have ended by now, their results unsaved
    assert sorted(started) == ["t0", "t1", "t2"] and killed.is_set()
    bench = store.result(store.resolve("last"))
    assert bench.info.status == "interrupted"
    assert [t.status for t in bench.tasks] == ["pending"] * 6  # t0's stand-in saved nothing either
    assert not runner._VERIFIERS  # a later bench of this process starts its own
