"""Why a program did not pass, as a typed record read from its Verdict.

A bench row, a report and a progress line all say why a task has no passing program; they
read it from here so that "wrong output" or "build error" is decided once, from the verdict's
fields, and never from its error strings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from stitchcuda.verify.verdict import Verdict

FailureKind = Literal["build", "wrong_output", "timeout", "crash", "hack", "no_candidate", "error"]
LABELS: dict[str, str] = {"build": "build error", "wrong_output": "wrong output", "timeout": "timeout",
                          "crash": "crash", "hack": "hack", "no_candidate": "no candidate", "error": "error"}
MAX_DETAIL = 300


class Failure(BaseModel):
    """The reason of a task's last verdict when nothing passed, or why no verdict was ever reached."""

    kind: FailureKind = Field(description="build: did not build or import; wrong_output: ran, output out of "
                                          "tolerance; timeout: ran past its limit; crash: the worker died or "
                                          "raised; hack: correct but a total hack; no_candidate: no program "
                                          "was produced (LLM error, unsupported model, capture failed); "
                                          "error: anything else (the reference failed, the job broke)")
    detail: str = Field("", description="one line: the first compiler error, the largest error, the crash ...")

    @property
    def text(self) -> str:
        """One line for tables and progress lines."""
        return f"{LABELS[self.kind]}: {self.detail}" if self.detail else LABELS[self.kind]


def failure(kind: FailureKind, detail: str | None) -> Failure:
    return Failure(kind=kind, detail=_one_line(detail or ""))


def failure_of(verdict: Verdict) -> Failure | None:
    """Why ``verdict`` did not pass (None when it did). The first cause wins: a build that failed
    never ran, so its outputs say nothing; a crash cut the correctness trials short."""
    if verdict.passed:
        return None
    if verdict.reference_error:
        return failure("error", "unusable task: " + _first_line(verdict.reference_error))
    crash = verdict.crash
    if crash is not None and crash.kind == "timeout":
        return failure("timeout", f"during {crash.phase}: {_last_line(crash.message)}")
    broken = next((e for e in verdict.build.extensions if not e.ok), None)
    if broken is not None:
        first = next((m for m in broken.messages if m.severity == "error"), None)
        if first is None:  # no parsed message: the log's last line is what the compiler said last
            return failure("build", f"{broken.requested_name}: {_last_line(broken.log_tail) or 'failed'}")
        where = Path(first.file).name + (f":{first.line}" if first.line else "")
        line = f" (candidate line {first.candidate_line})" if first.candidate_line else ""
        return failure("build", f"{where}{line}: {first.message}")
    if crash is not None:
        said = _last_line(crash.message)
        return failure("crash", f"{crash.kind.replace('_', ' ')} during {crash.phase}"
                                + (f" ({crash.signal})" if crash.signal else "") + (f": {said}" if said else ""))
    if verdict.static_only:
        if verdict.hacking.level == "total":
            return _hack(verdict)
        return failure("error", verdict.errors[0] if verdict.errors else "static checks only: nothing was run")
    if not verdict.compiled:  # an import error, or a source with no ModelNew: it never loaded
        return failure("build", verdict.errors[0] if verdict.errors else "the candidate did not load")
    if not verdict.correct:
        wrong = _wrong_output(verdict)
        if wrong is not None:
            return wrong
        return failure("error", verdict.errors[0] if verdict.errors else "not judged correct")
    if verdict.hacking.level == "total":
        return _hack(verdict)
    # correct and no total hack, yet not passed: a global flag changed (see judge)
    return failure("error", verdict.errors[0] if verdict.errors else "did not pass")


def _wrong_output(verdict: Verdict) -> Failure | None:
    c = verdict.correctness
    bad = [t for t in c.trials if not t.passed]
    if not bad:
        return None
    errors = [t.max_abs_error for t in bad if t.max_abs_error is not None]
    tolerance = verdict.tolerance.name
    if errors:
        detail = f"max abs error {max(errors):.1e} (tolerance {tolerance})"
    else:  # no number to give: a shape, dtype or count that differs
        detail = f"{bad[0].error or 'outputs differ'} (tolerance {tolerance})"
    detail += f" in {len(bad)} of {len(c.trials)} trials"
    if c.passes_with_copied_weights:
        detail += "; right with the reference's weights copied in: parameters not created as the reference's"
    return failure("wrong_output", detail)


def _hack(verdict: Verdict) -> Failure:
    findings = verdict.hacking.findings
    first = next((f for f in findings if f.level == "total"), findings[0] if findings else None)
    found = f", {first.check}: {first.detail}" if first else ""
    return failure("hack", f"level {verdict.hacking.level}{found}")


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_DETAIL else flat[: MAX_DETAIL - 1] + "…"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.strip().splitlines() if line.strip()), "")


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.strip().splitlines()) if line.strip()), "")
