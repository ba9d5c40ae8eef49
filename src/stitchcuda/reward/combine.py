"""The combined reward and its every part.

    reward = (clip(speedup, 0, clip) + offset) x (1 + lambda x (r - 0.5))   for a correct candidate
    reward = 0                                                              incorrect, unbuilt, total hack

r is the rubric total normalised to [0, 1] (a neutral judgement gives 0.5, leaving the rule
reward unchanged); a partial hack's rule reward is scaled by ``partial_hack_factor`` first; the
result is capped at ``cap``. The rubric can move a correct candidate's reward by at most
lambda / 2 of itself either way, so it ranks honest work among correct programs but cannot make
an incorrect or hacked one worth anything.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from stitchcuda.reward.config import RewardConfig
from stitchcuda.reward.rubric import RubricScore
from stitchcuda.reward.rule import RuleReward


class RewardBreakdown(BaseModel):
    reward: float
    rule: RuleReward
    rubric: RubricScore | None = Field(None, description="None when no judge was asked (r is then 0.5)")
    rubric_factor: float = Field(description="1 + lambda x (r - 0.5)")
    capped: bool = False
    config: RewardConfig


def combined_reward(rule: RuleReward, rubric: RubricScore | None, config: RewardConfig | None = None) -> RewardBreakdown:
    config = config or RewardConfig()
    r = rubric.normalized if rubric is not None else 0.5
    factor = 1.0 + config.rubric_weight * (r - 0.5)
    value = rule.value * factor if rule.value > 0 else 0.0
    capped = value > config.cap
    return RewardBreakdown(reward=min(value, config.cap), rule=rule, rubric=rubric, rubric_factor=factor,
                           capped=capped, config=config)
