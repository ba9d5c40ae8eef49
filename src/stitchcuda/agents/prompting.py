"""Renders the agents' prompts from the Jinja2 templates in ``prompts/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stitchcuda.llm.base import Message
from stitchcuda.templating import environment

PROMPTS = Path(__file__).parent / "prompts"


def render(name: str, **values: Any) -> str:
    return environment(PROMPTS).get_template(f"{name}.j2").render(**values).strip() + "\n"


def conversation(system: str, user: str, **values: Any) -> list[Message]:
    return [Message(role="system", content=render(system, **values)),
            Message(role="user", content=render(user, **values))]
