"""Every weight of the reward, in one record (a TOML/JSON file or the training config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class RewardConfig(BaseModel):
    baseline: Literal["eager", "best"] = Field(
        "eager", description="the speedup the rule reward reads: against eager fp32, or the best baseline "
                             "(TF32, CUDA graph, torch.compile) the tolerance policy accepts")
    speedup_clip: float = Field(5.0, gt=0, description="speedups above this count as this much")
    offset: float = Field(0.3, ge=0, description="added to the clipped speedup: a correct slow program earns more "
                                                 "than a wrong one")
    partial_hack_factor: float = Field(0.5, ge=0, le=1, description="multiplies the rule reward of a candidate "
                                                                    "that leaves heavy compute in PyTorch")
    rubric_weight: float = Field(0.5, ge=0, description="lambda: reward x (1 + lambda x (r - 0.5)), r in [0, 1]")
    cap: float = Field(6.0, gt=0, description="no reward exceeds this")
    judge_retries: int = Field(2, ge=0, description="new judgements asked for after an invalid one, before neutral")

