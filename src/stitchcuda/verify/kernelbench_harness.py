"""KernelBench's own ``eval_kernel_against_ref`` as a second opinion, loaded from the user's checkout.

KernelBench's package imports an LLM client (litellm, openai) and dotenv at the top of its
utilities, none of which its evaluation needs. Those modules are given empty stand-ins for the
import, only where they are not installed, so the harness loads on a machine that has only torch.
Call :func:`run_harness` in a process of its own: it builds and runs the candidate.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

from pydantic import BaseModel

# what KernelBench's modules import at the top without using it to evaluate
_UNUSED_AT_EVAL = {"dotenv": {"load_dotenv": lambda *a, **k: False}, "litellm": {"completion": None},
                   "openai": {"OpenAI": None}, "tqdm": {"tqdm": lambda it=None, *a, **k: it}}


class HarnessError(RuntimeError):
    """KernelBench's harness could not be found or loaded; the message says why."""


class HarnessVerdict(BaseModel):
    """What ``eval_kernel_against_ref`` said of one candidate."""

    compiled: bool
    correct: bool
    runtime_ms: float | None = None
    detail: str = ""


def harness_root(checkout: str | Path) -> Path:
    """The folder holding the ``kernelbench`` package of a KernelBench checkout."""
    root = Path(checkout).expanduser().resolve()
    for candidate in (root / "src", root):
        if (candidate / "kernelbench" / "eval.py").is_file():
            return candidate
    raise HarnessError(f"{root} has no KernelBench harness (src/kernelbench/eval.py): a checkout of "
                       "github.com/ScalingIntelligence/KernelBench has one")


def load_eval(checkout: str | Path) -> Any:
    """KernelBench's ``kernelbench.eval`` module."""
    root = harness_root(checkout)
    for name, attrs in _UNUSED_AT_EVAL.items():
        try:
            importlib.import_module(name)
        except ImportError:
            stand_in = types.ModuleType(name)
            stand_in.__dict__.update(attrs)
            sys.modules[name] = stand_in
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        return importlib.import_module("kernelbench.eval")
    except Exception as exc:  # a harness of another version, a missing dependency: say which
        raise HarnessError(f"KernelBench's harness in {root} did not load: {type(exc).__name__}: {exc}") from exc


def run_harness(checkout: str | Path, reference: str, candidate: str, *, trials: int = 5,
                perf_trials: int = 20, build_dir: str | None = None,
                measure_performance: bool = True, tf32: bool | None = None) -> HarnessVerdict:
    """KernelBench's verdict on ``candidate`` against ``reference`` with its defaults (seed 42, fp32,
    its tolerance), ``trials`` correctness trials and, with ``measure_performance``, its CUDA-event
    timing.

    ``tf32=None`` leaves torch's global flags as KernelBench leaves them: cuDNN convolutions then
    run in TF32 (``torch.backends.cudnn.allow_tf32`` is on by default), so the reference itself
    is off by about 1e-3 from fp32 and an fp32-exact convolution can miss KernelBench's 1e-4.
    ``tf32=False`` judges against a true-fp32 reference, as our Verifier does."""
    import torch

    if tf32 is not None:
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
    harness = load_eval(checkout)
    result = harness.eval_kernel_against_ref(
        reference, candidate, num_correct_trials=trials, num_perf_trials=perf_trials, measure_performance=measure_performance,
        build_dir=build_dir, device=torch.device("cuda:0"), backend="cuda", precision=torch.float32)
    if result is None:
        return HarnessVerdict(compiled=False, correct=False, detail="the harness returned no result (a lock "
                                                                   "or a build it could not finish)")
    runtime = getattr(result, "runtime", -1.0)
    meta = getattr(result, "metadata", {}) or {}
    detail = "; ".join(f"{k}: {str(v)[:200]}" for k, v in meta.items()
                       if k not in ("hardware", "device", "correctness_trials"))
    return HarnessVerdict(compiled=bool(result.compiled), correct=bool(result.correctness),
                          runtime_ms=float(runtime) if runtime and runtime > 0 else None, detail=detail[:600])
