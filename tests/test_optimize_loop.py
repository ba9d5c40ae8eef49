"""The whole optimize loop on the CPU: a scripted LLM behind a real OpenAI-compatible HTTP server
(real SDK, real HTTP), real builds (C++ extensions with g++) and real verifications in workers.

One build cache serves the module, so each distinct C++ source compiles once (~30 s each on a
2-core machine); the scenarios reuse them.
"""

from __future__ import annotations

import json

import pytest

from stitchcuda.agents.loop import Budget, OptimizeConfig, Optimizer
from stitchcuda.agents.routing import RoutingConfig
from stitchcuda.llm.openai_backend import OpenAIChatClient
from stitchcuda.store import RunStore
from stitchcuda.task import load_task_file
from stitchcuda.verify import PRESETS, Verifier
from tests.conftest import CPU, FIXTURES, share_builds
from tests.llm_server import Delay, Reply, ScriptedOpenAIServer

pytestmark = pytest.mark.nvcc  # builds C++ extensions: slow on a CPU machine

AGENTS = FIXTURES / "agents"


def fenced(path) -> str:
    return f"Here is the program.\n```python\n{path.read_text()}```\n"


BROKEN = fenced(AGENTS / "tiny_mlp_broken.py")
PURE_TORCH = fenced(CPU / "pure_torch.py")
RELU_ONLY = fenced(CPU / "cpp_extension.py")  # correct, ReLU in C++, the GEMMs still in PyTorch (partial)
FULL = fenced(AGENTS / "tiny_mlp_full_cpp.py")  # correct, everything in its own C++


def plan(target: float, title: str = "the whole MLP in C++") -> str:
    return "```json\n" + json.dumps({"rationale": "GEMMs dominate; fuse bias and ReLU into them.", "subtasks": [
        {"title": title, "operators": ["aten::addmm", "aten::relu"], "fusion": "bias+ReLU in the GEMM epilogue",
         "time_share": 1.0, "target_speedup": target}]}) + "\n```"


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory, session_builds):
    return share_builds(tmp_path_factory.mktemp("optimize-cache"), session_builds)


@pytest.fixture
def verifier(shared_cache, monkeypatch):
    monkeypatch.setenv("STITCHCUDA_CACHE", str(shared_cache))
    return Verifier(PRESETS["tiny-debug"].model_copy(update={"timeout_s": 120}), cache=shared_cache)


@pytest.fixture
def task():
    return load_task_file(CPU / "tiny_mlp.py")


def optimizer(task, server, verifier, store, stagnation: int = 2, **budget):
    llm = OpenAIChatClient(server.config(timeout_s=5, max_retries=1))
    config = OptimizeConfig(planner=llm.config, coder=llm.config, verify=verifier.config,
                            routing=RoutingConfig(max_attempts_per_subtask=8, replan_after_stagnation=stagnation,
                                                  max_replans=1),
                            budget=Budget(**budget))
    return Optimizer(task, config, llm, llm, verifier, store, profile_reference=False)


def test_plan_fix_hack_optimize_replan_done(task, verifier, tmp_path):
    events = []
    with ScriptedOpenAIServer() as server:
        server.script([
            "I would rather not plan.",  # garbage: the Planner asks again
            plan(target=50.0),
            BROKEN,  # step 1: does not build -> fix
            PURE_TORCH,  # step 2: correct but a total hack -> rejected, fix
            RELU_ONLY,  # step 3: correct, partial -> optimize
            RELU_ONLY,  # step 4: the same program: verdict reused, no gain
            RELU_ONLY,  # step 5: still no gain -> replan (stagnation)
            plan(target=0.01, title="the whole MLP in C++, fused"),
            FULL,  # step 6: correct, no PyTorch compute, meets the target -> done
        ])
        store = RunStore(tmp_path / "ws")
        opt = optimizer(task, server, verifier, store)
        opt.report = lambda state, message: events.append(message)
        state = opt.start()
        requests = server.requests

    assert state.status == "done", (state.stop_reason, events)
    steps = store.steps(state.run_id)
    actions = [s.decision.action for s in steps]
    assert actions == ["fix", "fix", "optimize", "optimize", "replan", "done"], [s.decision for s in steps]
    assert [s.skill for s in steps] == ["scratch", "feedback", "feedback", "feedback", "feedback", "scratch"]
    first, second = steps[0].samples[0], steps[1].samples[0]
    assert not first.compiled and "relu_kernel_that_does_not_exist" in first.feedback
    assert second.correct and second.hacking == "total" and "total hack" in steps[1].decision.reason
    assert steps[2].samples[0].passed and steps[2].samples[0].hacking == "partial"
    assert steps[3].samples[0].verdict_path == steps[2].samples[0].verdict_path  # reused, not verified again
    assert "stagnation" in steps[4].decision.reason
    assert state.best is not None and state.best.hacking == "none" and state.best.path.endswith("step005-s0.py")
    assert [p.version for p in store.plans(state.run_id)] == [1, 2] and state.replans == 1

    # what the Coder was told: the build error for the fix, the verifier's feedback for the optimize
    fix_prompt = requests[3]["messages"][1]["content"]
    assert "relu_kernel_that_does_not_exist" in fix_prompt and "fix it" in fix_prompt
    assert "make it faster" in requests[5]["messages"][1]["content"]
    replan_prompt = requests[7]["messages"][1]["content"]
    assert "Replanning" in replan_prompt and "stagnation" in replan_prompt
    assert "That answer could not be used" in requests[1]["messages"][-1]["content"]

    run_dir = store.run_dir(state.run_id)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best"]["hacking"] == "none" and "eager" in summary["best"]["speedup"]
    assert (run_dir / "best.py").read_text() == (AGENTS / "tiny_mlp_full_cpp.py").read_text()
    calls = store.llm_calls(state.run_id)
    assert len(calls) == 9 and all(c["prompt_tokens"] > 0 for c in calls) and state.llm_calls == 9


def test_timeout_garbage_and_budget_stop(task, verifier, tmp_path):
    with ScriptedOpenAIServer() as server:
        server.script([
            plan(target=50.0),
            Delay(30, then=RELU_ONLY), Delay(30, then=RELU_ONLY),  # times out, retried once, times out again
            Reply("Sorry, here is prose and no code.", finish_reason="stop"),  # garbage
            RELU_ONLY,
        ])
        store = RunStore(tmp_path / "ws")
        state = optimizer(task, server, verifier, store, max_llm_calls=4).start()
    steps = store.steps(state.run_id)
    assert state.status == "stopped" and "4 LLM calls" in state.stop_reason
    assert "timed out" in (steps[0].samples[0].llm_error or "")
    assert "no ```python block" in (steps[1].samples[0].extract_error or "")
    assert steps[2].samples[0].passed and state.best is not None  # the best so far is kept
    assert (store.run_dir(state.run_id) / "best.py").exists()


class Killed(Exception):
    pass


def test_crash_mid_step_then_resume_redoes_nothing(task, verifier, tmp_path):
    verified = []

    class CrashingVerifier:
        """The real verifier, but the run dies while the second program is being verified."""

        def __init__(self, inner, crash_on: int | None):
            self.inner, self.crash_on, self.config, self.gpu = inner, crash_on, inner.config, None

        def prebuild(self, candidates):
            return self.inner.prebuild(candidates)

        def verify(self, task, candidate):
            verified.append(candidate.name)
            if len(verified) == self.crash_on:
                raise KeyboardInterrupt  # as a kill would: nothing after this point is saved
            return self.inner.verify(task, candidate)

    with ScriptedOpenAIServer() as server:
        server.script([plan(target=50.0), RELU_ONLY, FULL])
        store = RunStore(tmp_path / "ws")
        opt = optimizer(task, server, CrashingVerifier(verifier, crash_on=2), store)
        with pytest.raises(KeyboardInterrupt):
            opt.start()
        run_id = store.resolve("last")
        assert store.load_state(run_id).steps_done == 1 and len(server.requests) == 3

        server.script([FULL])  # the step after the interrupted one
        # (CPU timings decide whether step 2 counts as a gain: keep stagnation from asking for a replan)
        again = optimizer(task, server, CrashingVerifier(verifier, crash_on=None), RunStore(tmp_path / "ws"),
                          stagnation=5, max_steps=3)
        state = again.resume(run_id)
        # the interrupted step's answer was stored: not asked again; step 1's verdict was not redone
        assert len(server.requests) == 4, [r["messages"][-1]["content"][:80] for r in server.requests]
        assert verified == ["step000-s0", "step001-s0", "step001-s0"]
    assert state.steps_done == 3 and store.load_state(run_id).status in ("stopped", "done")


def test_cli_optimize_then_runs(task, verifier, tmp_path):
    """What a user types: `stitchcuda optimize ... --base-url URL --model M`, then `stitchcuda runs`."""
    from typer.testing import CliRunner

    from stitchcuda.cli import app

    cli = CliRunner()
    workspace, out = tmp_path / "ws", tmp_path / "tiny_fast.py"
    with ScriptedOpenAIServer([plan(target=0.01), FULL]) as server:
        result = cli.invoke(app, ["optimize", str(CPU / "tiny_mlp.py"), "--base-url", server.base_url, "--model",
                                  "scripted-model", "--device", "cpu", "--preset", "tiny-debug", "--workspace",
                                  str(workspace), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "done" and summary["best"]["hacking"] == "none" and out.exists()
    listing = cli.invoke(app, ["runs", "--workspace", str(workspace), "--json"])
    assert json.loads(listing.stdout)[0]["id"] == summary["run"]
    shown = cli.invoke(app, ["runs", "last", "--workspace", str(workspace)])
    assert shown.exit_code == 0 and "done" in shown.stdout
    assert "where the" in shown.stdout and "went:" in shown.stdout  # where its time went, largest first
    from stitchcuda.store import RunStore

    stages = RunStore(workspace).load_state(summary["run"]).stages
    assert stages["correctness"] > 0 and stages["timing"] > 0 and "other" in stages

    # an unreachable server: the run fails with a message that names it, and can be resumed later
    failed = cli.invoke(app, ["optimize", str(CPU / "tiny_mlp.py"), "--base-url", "http://127.0.0.1:9/v1",
                              "--model", "m", "--device", "cpu", "--preset", "tiny-debug", "--workspace",
                              str(workspace), "--llm-timeout", "2", "--json"])
    assert failed.exit_code == 1
    assert json.loads(failed.stdout)["status"] == "failed" and "127.0.0.1:9" in json.loads(failed.stdout)["stop_reason"]
