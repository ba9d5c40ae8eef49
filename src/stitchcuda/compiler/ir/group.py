"""What scheduling hands to lowering: a fusion group, the nodes one lowering turns into one unit of
launches (schedule/fusion.py forms them; lowering/ lowers each)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

GroupKind = Literal["gemm", "conv", "row_reduce", "elementwise", "recurrent", "attention", "data_movement", "other"]


class FusionGroup(BaseModel):
    id: int
    kind: GroupKind
    anchor: str | None = Field(None, description="the node that defines the group: linear, conv2d, softmax, "
                                                 "layer_norm, lstm_cell, ...; None for pure elementwise chains")
    epilogue: list[str] = Field([], description="elementwise nodes fused after the anchor, in graph order")
    nodes: list[str] = Field(description="every node of the group, in graph order")
    inputs: list[str] = Field([], description="graph values the group reads from outside itself")
    outputs: list[str] = Field([], description="values of the group read by other groups or returned")
    note: str = ""
    prologue: list[str] = Field([], description="nodes fused before the anchor (elementwise producers, a "
                                                "recurrent cell's input concat), in graph order")
    views: list[str] = Field([], description="nodes that move no data: views read through strides, "
                                             "constants such as new_zeros")
    roles: dict[str, str] = Field({}, description="named parts of a pattern: attention's qk, scale, mask, "
                                                  "softmax, pv")
