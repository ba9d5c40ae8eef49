"""The rubric reward: an LLM judge scores four dimensions, each 1-5 against written anchors.

The judge sees the reference, the program, the feedback the Coder was given (skill 2) and the
Verifier's own findings (hacking level and findings, kernel time shares by origin, operator
coverage). Its answer must be one JSON object with a score and a short reason per dimension;
an answer that is not (or a failed call) is asked for again up to ``judge_retries`` times, then
the judgement is neutral (3 everywhere) and says so, so a training run can count them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from stitchcuda.llm.base import LLMClient, LLMError, Message
from stitchcuda.templating import environment
from stitchcuda.verify.verdict import Verdict

PROMPTS = Path(__file__).parent / "prompts"
NEUTRAL = 3


class Dimension(BaseModel):
    key: str
    title: str
    question: str
    anchors: list[tuple[int, str]]


DIMENSIONS: list[Dimension] = [
    Dimension(key="anti_hacking", title="Anti-hacking",
              question="Does the candidate really compute the reference's function with its own kernels (or "
                       "cuBLAS / cuDNN called from its own C++), and is its timing honest?",
              anchors=[(1, "the output does not come from its own computation: PyTorch does the work, a fallback "
                           "path, cached or constant outputs, the reference called, timing tampered with"),
                       (2, "its own kernels exist but PyTorch still does most of the heavy compute"),
                       (3, "its own kernels do the main compute; a noticeable heavy operator stays in PyTorch"),
                       (4, "all heavy compute is its own or library calls from its C++; only shape ops and "
                           "allocation in Python"),
                       (5, "as 4, and nothing in it could change results between calls or cheat the measurement "
                           "(no global flag changes, no unsynchronised streams, no hidden state)")]),
    Dimension(key="cuda_engineering", title="CUDA engineering",
              question="How well is the CUDA written for this GPU: memory access, shared memory and tiling, "
                       "vectorised loads, tensor cores or library GEMMs with epilogues, fusion, host "
                       "orchestration (preallocation, CUDA graphs, few launches)?",
              anchors=[(1, "naive: one thread per output with uncoalesced reads, or serial loops on the GPU"),
                       (2, "coalesced but unfused: one kernel per PyTorch operator, intermediates round-trip "
                           "through global memory"),
                       (3, "sensible fusion of elementwise work, library GEMMs, coalesced access"),
                       (4, "fusion across operators where it pays (epilogues, row reductions in registers, "
                           "warp-level reductions), vectorised access, preallocated buffers"),
                       (5, "as 4, and the whole forward is orchestrated: few launches or a CUDA graph, tiling or "
                           "tensor cores matched to the shapes, no needless host synchronisation")]),
    Dimension(key="operator_coverage", title="Operator coverage",
              question="How much of the reference's work, weighted by its GPU time, does the candidate's own "
                       "code cover?",
              anchors=[(1, "almost none of the time-dominant operators"),
                       (2, "a minority of the reference's time (small elementwise parts only)"),
                       (3, "about half of the time, or the dominant operator but little else"),
                       (4, "most of the time; a minor operator left to PyTorch"),
                       (5, "all of the reference's operators")]),
    Dimension(key="skill_compliance", title="Skill compliance",
              question="Did the candidate do what its task asked: for from-scratch generation, a complete "
                       "program with the reference's interface; for feedback-driven optimisation, changes that "
                       "act on the feedback it was given?",
              anchors=[(1, "ignores the task: wrong interface, incomplete, or unrelated to the feedback"),
                       (2, "partly: the interface is right but the feedback (or the task) is mostly ignored"),
                       (3, "addresses the task or the feedback's main point in a basic way"),
                       (4, "addresses the feedback's points (or the whole task) directly and correctly"),
                       (5, "as 4, and with evidence of understanding: the bottleneck the feedback names is the one "
                           "attacked, nothing unrelated is broken")]),
]
KEYS = [d.key for d in DIMENSIONS]


class DimensionScore(BaseModel):
    score: int = Field(ge=1, le=5)
    reason: str = Field(min_length=1, max_length=2000)


class JudgeAnswer(BaseModel):
    anti_hacking: DimensionScore
    cuda_engineering: DimensionScore
    operator_coverage: DimensionScore
    skill_compliance: DimensionScore


class RubricScore(BaseModel):
    scores: dict[str, int] = Field(description="per dimension, 1-5")
    reasons: dict[str, str] = {}
    normalized: float = Field(description="the four scores' sum mapped to [0, 1]: (sum - 4) / 16")
    neutral: bool = Field(False, description="no valid judgement was had: every score is the neutral 3")
    attempts: int = 0
    errors: list[str] = Field([], description="why earlier judgements were refused")
    tokens: int = 0

    @classmethod
    def of(cls, scores: dict[str, int], **extra: Any) -> RubricScore:
        return cls(scores=scores, normalized=(sum(scores.values()) - len(scores)) / (4 * len(scores)), **extra)


def judge_messages(*, task_name: str, reference: str, program: str, verdict: Verdict | None,
                   skill: Literal["scratch", "feedback"] = "scratch", feedback: str = "",
                   subtask: str = "") -> list[Message]:
    """The judge's prompt, rendered from ``prompts/judge_*.j2``."""
    shares = ", ".join(f"{k} {v:.0%}" for k, v in (verdict.hacking.origin_share if verdict else {}).items())
    coverage = verdict.hacking.operator_coverage if verdict else None
    values = dict(
        dimensions=DIMENSIONS, task_name=task_name, reference=reference.strip(), program=program.strip(),
        skill=skill, feedback=feedback.strip() or "(none)", subtask=subtask,
        compiled=bool(verdict and verdict.compiled), correct=bool(verdict and verdict.correct),
        speedup=verdict.speedup.get("eager") if verdict else None,
        hacking_level=verdict.hacking.level if verdict else "not verified",
        findings=[f"{f.check} ({f.level}): {f.detail}" for f in (verdict.hacking.findings if verdict else [])],
        shares=shares, coverage=f"{coverage:.0%}" if coverage is not None else "")
    env = environment(PROMPTS)
    return [Message(role="system", content=env.get_template("judge_system.j2").render(**values).strip() + "\n"),
            Message(role="user", content=env.get_template("judge_user.j2").render(**values).strip() + "\n")]


def parse_judgement(text: str) -> JudgeAnswer:
    """The JSON object in the judge's answer (a ```json fence or bare), validated; raises ValueError."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.S).strip()
    fenced = re.findall(r"```(?:json)?\s*(\{.*?\})\s*```", text, flags=re.S)
    candidates = fenced or ([text[text.index("{"): text.rindex("}") + 1]] if "{" in text and "}" in text else [])
    if not candidates:
        raise ValueError("no JSON object in the answer")
    try:
        data = json.loads(candidates[-1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"the JSON does not parse: {exc.msg} at {exc.pos}") from None
    try:
        return JudgeAnswer.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"invalid judgement: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


class RubricJudge:
    """Scores candidates with any client of the LLM layer."""

    def __init__(self, client: LLMClient, retries: int = 2, max_tokens: int = 2048):
        self.client, self.retries, self.max_tokens = client, retries, max_tokens

    def score(self, messages: list[Message]) -> RubricScore:
        errors: list[str] = []
        tokens = 0
        asked = list(messages)
        for attempt in range(1, self.retries + 2):
            try:
                answer = self.client.complete(asked, max_tokens=self.max_tokens, temperature=0.0)
            except LLMError as exc:
                errors.append(f"the judge's call failed: {exc}")
                continue
            tokens += answer.usage.total_tokens
            try:
                judged = parse_judgement(answer.text)
            except ValueError as exc:
                errors.append(str(exc))
                # ask again, saying what was wrong with the last answer
                asked = [*messages, Message(role="assistant", content=answer.text[:4000]),
                         Message(role="user", content=f"That answer was unusable ({exc}). Answer again with "
                                                      "only the JSON object, every score an integer 1-5.")]
                continue
            scores = {k: getattr(judged, k).score for k in KEYS}
            reasons = {k: getattr(judged, k).reason for k in KEYS}
            return RubricScore.of(scores, reasons=reasons, attempts=attempt, errors=errors, tokens=tokens)
        return RubricScore.of({k: NEUTRAL for k in KEYS}, neutral=True, attempts=self.retries + 1, errors=errors,
                              tokens=tokens)
