"""KernelBench's own harness as a second opinion, beside our verdict (``--kernelbench-harness``).

Our Verifier must never be more lenient than KernelBench's harness, and a published result is
read against that harness: so it judges the same reference and candidate too, and a disagreement
is shown, never hidden. It runs in a fresh process of its own (``python -m
stitchcuda.verify.kernelbench_harness``): KernelBench's package patches torch at import, and the
candidate it builds and runs may hang or crash. Whatever happens to it, our verdict stands; the
:class:`~stitchcuda.verify.verdict.SecondOpinion` says what it found, or why it found nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stitchcuda.verify.kernelbench_harness import HarnessReply, HarnessRequest, harness_problem
from stitchcuda.verify.verdict import SecondOpinion
from stitchcuda.verify.workers import WorkerPool, temp_prefix

_TAIL_CHARS = 2000
HARNESS = "stitchcuda.verify.kernelbench_harness"
_POLL_S = 0.1
NO_GPU = "KernelBench's harness needs a CUDA GPU"


def for_verifier(verifier: Any, reference: str, candidate: str, our_correct: bool | None,
                 checkout: str | None = None, clean: bool = False) -> SecondOpinion:
    """The second opinion on ``candidate`` under a :class:`~stitchcuda.verify.Verifier`'s device,
    cache, limits and warm harness processes (the harness builds inside its run: both limits are
    its time). ``clean``: our verdict found the program correct and no hack, so the harness process
    that judges it may judge another after it."""
    config = verifier.config
    checkout = checkout or config.kernelbench_harness
    if not config.device.startswith("cuda"):
        return SecondOpinion(checkout=checkout, error=NO_GPU)
    return judge(checkout, reference, candidate, cache=Path(verifier.cache), env=verifier._env(hide_gpu=False),
                 limit_s=config.build_timeout_s + config.timeout_s, our_correct=our_correct,
                 gate_path=getattr(verifier, "gate_path", None), pool=verifier.harness_pool(checkout), clean=clean)


def judge(checkout: str, reference: str, candidate: str, *, cache: Path, env: dict[str, str] | None = None,
          limit_s: float = 1200.0, our_correct: bool | None = None, gate_path: str | None = None,
          pool: WorkerPool | None = None, clean: bool = False) -> SecondOpinion:
    """KernelBench's verdict from a process of its own (a warm one of ``pool``, else a fresh one),
    killed past ``limit_s``; never raises for what the checkout, the harness or the candidate do.
    The program's extensions are loaded from our build cache ``cache`` (built there by the
    verification before it; built there now otherwise), and the process takes the GPU gate at
    ``gate_path`` around its GPU work."""
    started = time.time()
    try:
        opinion = _judge(checkout, reference, candidate, cache, env, limit_s, gate_path, pool, clean, our_correct)
    except OSError as exc:  # an unwritable cache, no room for the sources: said, not raised
        opinion = SecondOpinion(error=f"KernelBench's harness could not be started: {exc}")
    opinion.checkout = str(checkout)
    opinion.seconds = round(time.time() - started, 2)
    if opinion.error is None and opinion.correct is not None and our_correct is not None and opinion.judgeable:
        opinion.agrees = opinion.correct == our_correct
    return opinion


def _judge(checkout: str, reference: str, candidate: str, cache: Path, env: dict[str, str] | None,
           limit_s: float, gate_path: str | None, pool: WorkerPool | None, clean: bool,
           our_correct: bool | None = None) -> SecondOpinion:
    if why := harness_problem(checkout):  # a wrong path is said at once, without starting a process
        return SecondOpinion(error=why)
    build_dir = build_dir_for(cache, candidate)  # its own builds, kept for the next run
    with _exclusive(build_dir), tempfile.TemporaryDirectory(prefix=temp_prefix("kernelbench")) as tmp:
        work = Path(tmp)
        (work / "reference.py").write_text(reference)
        (work / "candidate.py").write_text(candidate)
        request = HarnessRequest(checkout=str(Path(checkout).expanduser().resolve()),
                                 reference_path=str(work / "reference.py"),
                                 candidate_path=str(work / "candidate.py"),
                                 result_path=str(work / "reply.json"), build_dir=str(build_dir),
                                 cache_root=str(cache), gate_path=gate_path, reusable=clean,
                                 controls=our_correct is not False)
        (work / "request.json").write_text(request.model_dump_json())
        reply_path = Path(request.result_path)
        spawned = time.time()
        if pool is not None:
            worker, _ = pool.take()
            spawned = time.time()
            worker.hand_over(work / "request.json")
            proc = worker.proc
            timed_out = _wait(proc, limit_s, reply_path)
            tail = worker.tail(_TAIL_CHARS)
            reply = _read_reply(reply_path)
            pool.give_back(worker, not timed_out and reply is not None and not reply.retiring)
        else:
            log_path = work / "harness.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", HARNESS, str(work / "request.json")],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=work,
                    env=_child_env(env), start_new_session=True)
                timed_out = _wait(proc, limit_s)
            tail = _tail(log_path)
            reply = _read_reply(reply_path)
    if timed_out:
        return SecondOpinion(error=f"KernelBench's harness ran past its limit of {limit_s:g} s and was killed"
                                   + _last(tail))
    if reply is None:
        return SecondOpinion(error=f"KernelBench's harness process died ({_exit_status(proc.returncode)}) "
                                   "without a verdict" + _last(tail))
    stages = {"start": round(max(reply.ready_at - spawned, 0.0), 3) if reply.ready_at else 0.0, **reply.stages,
              "gpu_wait": round(reply.gate.waited_s, 3)}
    if reply.verdict is None:
        return SecondOpinion(error=reply.error or "KernelBench's harness gave no verdict", stages=stages,
                             gpu_intervals=reply.gate.intervals)
    v = reply.verdict
    return SecondOpinion(compiled=v.compiled, correct=v.correct, runtime_ms=v.runtime_ms, detail=v.detail,
                         correct_true_fp32=v.correct_true_fp32, correct_v01=v.correct_v01,
                         exact_correct=v.exact_correct, reordered_correct=v.reordered_correct,
                         control_detail=v.control_detail, judgeable=v.judgeable,
                         ref_runtime_ms=v.ref_runtime_ms, timed_apart=v.timed_apart, stages=stages,
                         builds_cached=reply.builds_cached, gpu_intervals=reply.gate.intervals)


def build_dir_for(cache: Path, candidate: str) -> Path:
    return Path(cache) / "kernelbench-harness" / hashlib.sha256(candidate.encode()).hexdigest()[:20]


def harness_pool(env: dict[str, str]) -> WorkerPool:
    """Warm harness processes of one environment (one KernelBench checkout each: its package stays
    imported in them)."""
    return WorkerPool(_child_env(env), module=HARNESS)


def _child_env(env: dict[str, str] | None) -> dict[str, str]:
    child = dict(os.environ if env is None else env)
    child["PYTHONUNBUFFERED"] = "1"  # its last words reach the log before a crash
    package_parent = str(Path(__file__).resolve().parents[2])  # this package, whatever the cwd
    paths = [p for p in child.get("PYTHONPATH", "").split(os.pathsep) if p]
    child["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in paths if p != package_parent])
    return child


@contextlib.contextmanager
def _exclusive(build_dir: Path) -> Iterator[None]:
    """One harness run per build folder at a time; then the ``lock`` files left in it by a killed
    build are stale, and are removed (torch's FileBaton would wait on them forever)."""
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir.parent / f"{build_dir.name}.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            for stale in build_dir.rglob("lock"):
                with contextlib.suppress(OSError):
                    stale.unlink()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _wait(proc: subprocess.Popen, limit_s: float, reply: Path | None = None) -> bool:
    """Wait for the process (a warm one: for its ``reply``); past the limit kill its whole group
    (ninja, nvcc): True when killed."""
    deadline = time.time() + limit_s
    try:
        while proc.poll() is None and not (reply is not None and reply.exists()):
            if time.time() > deadline:
                _kill_group(proc)
                return True
            time.sleep(_POLL_S)
    except BaseException:  # interrupted (Ctrl-C): leave no harness running on the GPU behind us
        _kill_group(proc)
        raise
    return False


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _exit_status(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _read_reply(path: Path) -> HarnessReply | None:
    try:
        return HarnessReply.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def _tail(path: Path) -> str:
    try:
        return path.read_bytes()[-_TAIL_CHARS:].decode(errors="replace")
    except OSError:
        return ""


def _last(tail: str) -> str:
    lines = [line.strip() for line in tail.strip().splitlines() if line.strip()]
    return f": {lines[-1][:300]}" if lines else ""
