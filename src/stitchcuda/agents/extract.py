"""Taking a program or a plan out of an LLM's answer; a malformed answer is a reason, not a crash."""

from __future__ import annotations

import ast
import json
import re

from pydantic import ValidationError

from stitchcuda.agents.records import Plan

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S)


class ExtractError(ValueError):
    """The answer holds no usable program or plan; the message says why (it goes back to the LLM)."""


def _blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, body, closed) per fenced block."""
    found = []
    for match in _FENCE.finditer(text):
        closed = text[match.end() - 3:match.end()] == "```"
        found.append((match[1].lower(), match[2], closed))
    return found


def extract_program(answer: str, finish_reason: str | None = None) -> str:
    text = _THINK.sub("", answer or "").strip()
    if not text:
        raise ExtractError("the answer is empty")
    blocks = [b for b in _blocks(text) if "class ModelNew" in b[1]]
    if blocks:
        lang, body, closed = blocks[-1]
        if not closed:
            cut = " (the model stopped at its token limit)" if finish_reason == "length" else ""
            raise ExtractError(f"the code block is cut off before its closing ```{cut}; write a shorter program")
        source = body
    elif "class ModelNew" in text and "```" not in text:
        source = text  # a bare program
    else:
        raise ExtractError("no ```python block defining `class ModelNew` in the answer")
    try:
        ast.parse(source)
    except SyntaxError as exc:
        raise ExtractError(f"the program does not parse: line {exc.lineno}: {exc.msg}") from None
    return source.rstrip() + "\n"


def _json_text(text: str) -> str:
    for lang, body, _ in reversed(_blocks(text)):
        if lang in ("json", "") and body.strip().startswith("{"):
            return body
    start = text.find("{")
    if start < 0:
        raise ExtractError("no JSON object in the answer")
    depth = 0
    for i, ch in enumerate(text[start:], start):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return text[start:i + 1]
    raise ExtractError("the JSON object is not closed")


def extract_plan(answer: str) -> Plan:
    text = _THINK.sub("", answer or "").strip()
    try:
        data = json.loads(_json_text(text))
    except json.JSONDecodeError as exc:
        raise ExtractError(f"the plan is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ExtractError("the plan must be a JSON object with 'subtasks'")
    for i, sub in enumerate(data.get("subtasks") or [], 1):
        if isinstance(sub, dict):
            sub.setdefault("id", i)
    try:
        plan = Plan.model_validate({k: v for k, v in data.items() if k in ("rationale", "subtasks")})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise ExtractError(f"the plan does not fit the schema: {problems}") from None
    for i, sub in enumerate(plan.subtasks, 1):
        sub.id = i
    return plan
