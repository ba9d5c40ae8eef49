"""The rule reward: what the Verifier measured, and nothing an LLM says.

Zero when the candidate does not build, is incorrect, or is a total hack; otherwise the
speedup against the configured baseline, clipped, plus an offset (so a correct but slow
program beats a wrong one), scaled down for a partial hack.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from stitchcuda.reward.config import RewardConfig
from stitchcuda.verify.verdict import Verdict


class RuleReward(BaseModel):
    value: float
    speedup: float | None = Field(None, description="against the configured baseline, as measured")
    gate: str = Field(description="why the value is what it is: passed, partial hack, or why it is zero")


def rule_reward(verdict: Verdict, config: RewardConfig | None = None) -> RuleReward:
    config = config or RewardConfig()
    if not verdict.compiled:
        return RuleReward(value=0.0, gate="did not build or import")
    if verdict.hacking.level == "total":
        return RuleReward(value=0.0, gate="total hack")
    if not verdict.correct:
        return RuleReward(value=0.0, gate="incorrect")
    speedup = verdict.speedup.get(config.baseline)
    if speedup is None:
        return RuleReward(value=0.0, gate=f"no {config.baseline} timing in the verdict")
    value = min(max(speedup, 0.0), config.speedup_clip) + config.offset
    gate = "passed"
    if verdict.hacking.level == "partial":
        value *= config.partial_hack_factor
        gate = "partial hack"
    return RuleReward(value=value, speedup=speedup, gate=gate)
