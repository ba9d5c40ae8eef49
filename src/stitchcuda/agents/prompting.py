"""Renders the agents' prompts from the Jinja2 templates in ``prompts/``."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from stitchcuda.llm.base import Message

PROMPTS = Path(__file__).parent / "prompts"


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(PROMPTS), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def render(name: str, **values: Any) -> str:
    return _env().get_template(f"{name}.j2").render(**values).strip() + "\n"


def conversation(system: str, user: str, **values: Any) -> list[Message]:
    return [Message(role="system", content=render(system, **values)),
            Message(role="user", content=render(user, **values))]
