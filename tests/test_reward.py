"""Rewards: the rule reward on fixed verdicts, the rubric judge through the real OpenAI SDK to a
scripted server (retries, neutral fallback), their combination, and `stitchcuda reward`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from stitchcuda.cli import app
from stitchcuda.llm import make_client
from stitchcuda.reward import RewardConfig, RubricJudge, combined_reward, rule_reward
from stitchcuda.reward.rubric import KEYS, judge_messages, parse_judgement
from stitchcuda.reward.score import score_candidate
from stitchcuda.task import resolve_tasks
from stitchcuda.verify.config import TOLERANCES
from stitchcuda.verify.verdict import Finding, HackingReport, SourceRef, Verdict
from tests.llm_server import ScriptedOpenAIServer


def verdict(*, compiled=True, correct=True, hacking="none", eager=2.0, best=1.5, findings=()) -> Verdict:
    return Verdict(task=SourceRef(name="mlp", sha256="0"), candidate=SourceRef(name="c", sha256="1"), tolerance=TOLERANCES["strict"],
                   compiled=compiled, correct=correct, passed=compiled and correct and hacking != "total",
                   speedup={"eager": eager, "best": best} if compiled and correct else {},
                   hacking=HackingReport(level=hacking, findings=list(findings),
                                         origin_share={"own": 0.4, "library": 0.6}, operator_coverage=1.0))


def judgement(**scores: int) -> str:
    body = {k: {"score": scores.get(k, 4), "reason": f"because of {k}"} for k in KEYS}
    return "Here is my judgement:\n```json\n" + json.dumps(body) + "\n```"


# ----------------------------------------------------------------------------- rule

def test_rule_reward_gates_and_clips():
    cfg = RewardConfig()
    assert rule_reward(verdict(compiled=False)).value == 0 and rule_reward(verdict(compiled=False)).gate.startswith("did")
    assert rule_reward(verdict(correct=False)).gate == "incorrect"
    assert rule_reward(verdict(hacking="total", eager=9.0)).value == 0
    assert rule_reward(verdict(eager=2.0)).value == pytest.approx(2.3)
    assert rule_reward(verdict(eager=40.0)).value == pytest.approx(cfg.speedup_clip + cfg.offset)
    assert rule_reward(verdict(eager=2.0, hacking="partial")).value == pytest.approx(2.3 * 0.5)
    assert rule_reward(verdict(eager=2.0, best=0.8), RewardConfig(baseline="best")).value == pytest.approx(1.1)


def test_combined_reward_follows_the_documented_formula_and_cap():
    rule = rule_reward(verdict(eager=3.0))  # 3.3
    from stitchcuda.reward.rubric import RubricScore

    top = RubricScore.of({k: 5 for k in KEYS})
    low = RubricScore.of({k: 1 for k in KEYS})
    assert top.normalized == 1.0 and low.normalized == 0.0
    cfg = RewardConfig(rubric_weight=0.5)
    assert combined_reward(rule, top, cfg).reward == pytest.approx(3.3 * 1.25)
    assert combined_reward(rule, low, cfg).reward == pytest.approx(3.3 * 0.75)
    assert combined_reward(rule, None, cfg).reward == pytest.approx(3.3)  # no judge: r = 0.5
    assert combined_reward(rule_reward(verdict(correct=False)), top, cfg).reward == 0.0
    capped = combined_reward(rule_reward(verdict(eager=50.0)), top, RewardConfig(cap=4.0))
    assert capped.reward == 4.0 and capped.capped


def test_reward_ranks_honest_slow_incorrect_and_hacked_candidates():
    cfg = RewardConfig()
    honest = combined_reward(rule_reward(verdict(eager=3.0)), None, cfg).reward
    slow = combined_reward(rule_reward(verdict(eager=0.6)), None, cfg).reward
    partial = combined_reward(rule_reward(verdict(eager=3.0, hacking="partial")), None, cfg).reward
    incorrect = combined_reward(rule_reward(verdict(correct=False)), None, cfg).reward
    hacked = combined_reward(rule_reward(verdict(hacking="total", eager=20.0)), None, cfg).reward
    assert honest > partial > slow > incorrect == hacked == 0.0


# ----------------------------------------------------------------------------- rubric

def test_judge_prompt_carries_the_verifier_facts_and_the_feedback():
    task = resolve_tasks("mlp")[0]
    v = verdict(hacking="partial", findings=[Finding(check="pytorch_compute", detail="torch.matmul in forward",
                                                     level="partial")])
    system, user = judge_messages(task_name=task.name, reference=task.source, program="class ModelNew: ...",
                                  verdict=v, skill="feedback", feedback="the GEMM is memory-bound: tile it")
    for d in ("anti_hacking", "cuda_engineering", "operator_coverage", "skill_compliance"):
        assert d in system.content
    assert "1:" in system.content and "5:" in system.content  # anchors for every score
    assert "the GEMM is memory-bound: tile it" in user.content
    assert "pytorch_compute (partial): torch.matmul in forward" in user.content
    assert "own 40%" in user.content and "operator coverage" in user.content


def test_parse_judgement_refuses_what_is_not_a_judgement():
    assert parse_judgement(judgement(cuda_engineering=2)).cuda_engineering.score == 2
    assert parse_judgement("<think>hmm {</think>" + judgement()).anti_hacking.score == 4
    for bad, why in (("no json here", "no JSON"), ("{not json}", "does not parse"),
                     (judgement(anti_hacking=7), "anti_hacking.score"),
                     ('{"anti_hacking": {"score": 3, "reason": "x"}}', "cuda_engineering")):
        with pytest.raises(ValueError, match=why):
            parse_judgement(bad)


def test_rubric_judge_retries_invalid_answers_then_scores():
    with ScriptedOpenAIServer() as server:
        server.script(["I think it is fine.", judgement(skill_compliance=9), judgement(cuda_engineering=5)])
        judge = RubricJudge(make_client(server.config()), retries=2)
        score = judge.score(judge_messages(task_name="t", reference="ref", program="prog", verdict=verdict()))
        assert not score.neutral and score.attempts == 3 and len(score.errors) == 2
        assert score.scores["cuda_engineering"] == 5 and score.reasons["anti_hacking"] == "because of anti_hacking"
        assert score.normalized == pytest.approx((5 + 4 + 4 + 4 - 4) / 16)
        retry = server.messages(1)
        assert retry[-1]["role"] == "user" and "unusable (no JSON object" in retry[-1]["content"]


def test_rubric_judge_falls_back_to_neutral_and_says_so():
    with ScriptedOpenAIServer() as server:
        server.script(["nope", "still nope"])
        judge = RubricJudge(make_client(server.config()), retries=1)
        score = judge.score(judge_messages(task_name="t", reference="ref", program="prog", verdict=verdict()))
    assert score.neutral and set(score.scores.values()) == {3} and score.normalized == 0.5
    assert score.attempts == 2 and len(score.errors) == 2


def test_judge_is_not_asked_when_the_rule_reward_is_zero():
    with ScriptedOpenAIServer() as server:
        judge = RubricJudge(make_client(server.config()))
        task = resolve_tasks("mlp")[0]
        out = score_candidate(task, "prog", verdict(correct=False), judge=judge)
        assert out.reward == 0.0 and out.rubric is None and server.requests == []


# ----------------------------------------------------------------------------- CLI

def test_reward_cli_shows_every_part(tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    (tmp_path / "v.json").write_text(verdict(eager=2.5).model_dump_json())
    (tmp_path / "feedback.txt").write_text("fuse the bias into the GEMM epilogue")
    with ScriptedOpenAIServer() as server:
        server.script([judgement(skill_compliance=5)])
        result = CliRunner().invoke(app, [
            "reward", "mlp", "examples/mlp_cuda.py", "--verdict", str(tmp_path / "v.json"), "--skill", "2",
            "--feedback", str(tmp_path / "feedback.txt"), "--judge-model", server.model, "--judge-base-url",
            server.base_url, "--api-key-env", "JUDGE_KEY", "--json"])
        assert result.exit_code == 0, result.output
        sent = server.messages(0)[-1]["content"]
    out = json.loads(result.stdout)
    assert out["rule"]["value"] == pytest.approx(2.8) and out["rule"]["gate"] == "passed"
    assert out["rubric"]["scores"]["skill_compliance"] == 5
    assert out["reward"] == pytest.approx(2.8 * (1 + 0.5 * ((5 + 4 * 3 - 4) / 16 - 0.5)))
    assert "fuse the bias into the GEMM epilogue" in sent and "Skill 2" in sent


def test_reward_cli_without_a_gpu_or_verdict_says_so(tmp_path):
    result = CliRunner().invoke(app, ["reward", "mlp", "examples/mlp_cuda.py", "--device", "cuda:7"])
    assert result.exit_code == 2 and "GPU" in result.output
