"""Rewards for candidates: a rule reward from the Verifier's verdict, a rubric an LLM judge
scores, and their combination (see :mod:`stitchcuda.reward.combine`)."""

from stitchcuda.reward.combine import RewardBreakdown, combined_reward
from stitchcuda.reward.config import RewardConfig
from stitchcuda.reward.rubric import DIMENSIONS, RubricJudge, RubricScore
from stitchcuda.reward.rule import RuleReward, rule_reward

__all__ = ["DIMENSIONS", "RewardBreakdown", "RewardConfig", "RubricJudge", "RubricScore", "RuleReward",
           "combined_reward", "rule_reward"]
