"""Fusion groups: which operators of the captured graph become one kernel (or one library call).

The offline Planner decides the groups; the offline Coder generates one kernel (or library call
plus fused epilogue) per group. (Work in progress: the record is fixed, ``fuse`` is being written.)
"""

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
