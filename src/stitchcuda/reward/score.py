"""One candidate's reward from its verdict (and a judge, when one is configured)."""

from __future__ import annotations

from typing import Literal

from stitchcuda.reward.combine import RewardBreakdown, combined_reward
from stitchcuda.reward.config import RewardConfig
from stitchcuda.reward.rubric import RubricJudge, judge_messages
from stitchcuda.reward.rule import rule_reward
from stitchcuda.task.record import Task
from stitchcuda.verify.verdict import Verdict


def score_candidate(task: Task, program: str, verdict: Verdict, *, judge: RubricJudge | None = None,
                    config: RewardConfig | None = None, skill: Literal["scratch", "feedback"] = "scratch",
                    feedback: str = "", subtask: str = "") -> RewardBreakdown:
    """Rule reward from the verdict; the rubric only where the rule reward is not already zero
    (the combination would zero it anyway, and a judge call costs)."""
    config = config or RewardConfig()
    rule = rule_reward(verdict, config)
    rubric = None
    if judge is not None and rule.value > 0:
        rubric = judge.score(judge_messages(task_name=task.name, reference=task.source, program=program,
                                            verdict=verdict, skill=skill, feedback=feedback, subtask=subtask))
    return combined_reward(rule, rubric, config)
