"""The Task record: one PyTorch reference program in KernelBench format."""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import BaseModel, Field

Origin = Literal["file", "folder", "kernelbench", "parquet", "bundled"]


class Task(BaseModel):
    name: str
    source: str = Field(repr=False)
    path: str | None = Field(None, description="where the source was read from, if a file")
    origin: Origin = "file"
    level: int | None = None
    problem_id: int | None = None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def file_stem(self) -> str:
        """The name as one file name: KernelBench's ``L1/3_Batched_matrix`` becomes ``L1_3_Batched_matrix``."""
        return file_stem(self.name)


def file_stem(name: str) -> str:
    """A task or solution name made safe for one path component (no separators, no leading dot)."""
    stem = re.sub(r"[^\w.#+-]", "_", name).lstrip(".")
    return stem or "task"


class Candidate(BaseModel):
    """A program that claims to replace a task's Model with ModelNew."""

    name: str
    source: str = Field(repr=False)
    path: str | None = None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()
