"""A candidate's failure inside the worker, as a record: what kind of crash, where, and its stack.

After a CUDA error the context is unusable, so a phase that sees one records it with :func:`fail`
and stops the run (:class:`CandidateFailed`); the worker then writes what it has and exits.
"""

from __future__ import annotations

import re
import traceback

from stitchcuda.verify.protocol import WorkerResult
from stitchcuda.verify.verdict import CrashReport


def classify_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".lower()
    if "illegal memory access" in text or "illegal address" in text:
        return "illegal_address"
    if "out of memory" in text or type(exc).__name__ == "OutOfMemoryError":
        return "oom"
    if "cuda error" in text or "cudaerror" in text or "device-side assert" in text or "launch failure" in text:
        return "cuda_error"
    return "exception"


def short_traceback(exc: BaseException, limit: int = 6) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-limit)
    return "".join(lines)[-3000:]


class CandidateFailed(Exception):
    """Stops the run: the candidate crashed; the crash record is already filled in."""


def fail(result: WorkerResult, exc: BaseException, phase: str) -> None:
    """Record the crash in ``result`` and stop the verification."""
    result.crash = CrashReport(kind=classify_error(exc), phase=phase, message=short_traceback(exc))
    raise CandidateFailed from exc


_OUR_COPY = re.compile(r"[^\s\"]*/stitchcuda-(?:verify|build|profile)-[^/\s]+/candidate\.py")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')


def readable_tail(tail: str, candidate: str) -> str:
    """A worker's output tail as the user reads it: our copy of the candidate named as the user's
    file ``candidate``, and the frames of a crash dump (faulthandler's, Python's) kept only where
    they are the candidate's own; ours and torch's say nothing the user can act on."""
    lines = []
    for line in _OUR_COPY.sub(candidate, tail).splitlines():
        frame = _FRAME.match(line)
        if (frame and frame[1] != candidate) or line.startswith("Extension modules:"):
            continue
        lines.append(line)
    return "\n".join(lines)
