"""What a model carries from one call to the next, and whether its forward draws random numbers.

State: a forward may change tensors its module keeps: a plain attribute it reassigns
(``self.hidden = torch.tanh(...)``), or a buffer (BatchNorm's running statistics in training mode).
Each call then continues from the last, so the Verifier runs the correctness trials as one sequence
of calls from the same starting state for both models, and saves and restores both models' state
around every other call it makes (profiling, the escape probe, timing, the baselines' accuracy, the
post-timing trial), so that each of those checks compares like with like.

Random draws: a forward that draws (``torch.randn`` for an initial state, dropout in training
mode) advances torch's generator. Such a task is verifiable only where its output does not depend
on the draws: the reference run on the same inputs under two seeds must agree within the tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from stitchcuda.verify.correctness import cloned, compare_outputs, detached
from stitchcuda.verify.verdict import SeedCheck


class ModelState:
    """Copies of every buffer and plain tensor attribute of a model's modules (parameters are not
    state: a forward does not change them)."""

    def __init__(self, saved: dict[tuple[str, str], torch.Tensor]):
        self.saved = saved

    @classmethod
    def capture(cls, model: Any) -> ModelState:
        saved: dict[tuple[str, str], torch.Tensor] = {}
        if not isinstance(model, torch.nn.Module):
            return cls(saved)
        with torch.no_grad():
            for path, module in model.named_modules():
                for name, value in _state_tensors(module):
                    saved[(path, name)] = value.detach().clone()
        return cls(saved)

    @property
    def names(self) -> list[str]:
        return [f"{path}.{name}" if path else name for path, name in self.saved]

    def changed(self, model: Any) -> list[str]:
        """The tensors whose value differs from the saved one (reassigned or written in place)."""
        found = []
        for (path, name), before in self.saved.items():
            now = _get(model, path, name)
            if not isinstance(now, torch.Tensor) or now.shape != before.shape or now.dtype != before.dtype \
                    or not torch.equal(now.detach().to(before.device), before):
                found.append(f"{path}.{name}" if path else name)
        return found

    def restore(self, model: Any) -> None:
        """Put every saved value back: in place where the tensor is still of its shape and dtype (a
        program may hold its address), else by reassignment."""
        with torch.no_grad():
            for (path, name), before in self.saved.items():
                owner = model.get_submodule(path) if path else model
                now = getattr(owner, name, None)
                if isinstance(now, torch.Tensor) and now.shape == before.shape and now.dtype == before.dtype:
                    try:
                        now.copy_(before)
                        continue
                    except RuntimeError:  # an output torch.compile's CUDA graphs overwrote: not to be touched
                        pass
                setattr(owner, name, before.clone())


def _state_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for name, value in module._buffers.items():
        if value is not None:
            yield name, value
    for name, value in vars(module).items():
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            yield name, value


def _get(model: Any, path: str, name: str) -> Any:
    try:
        owner = model.get_submodule(path) if path else model
    except AttributeError:
        return None
    return getattr(owner, name, None)


@contextmanager
def kept(*models: Any) -> Iterator[None]:
    """Run the block, then give each model back the state it had before it."""
    states = [(m, ModelState.capture(m)) for m in models]
    try:
        yield
    finally:
        for m, state in states:
            state.restore(m)


def _generator_states(device: torch.device) -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def draws_random(call: Callable[[], Any], device: torch.device) -> tuple[Any, bool]:
    """``call()``'s result, and whether it advanced torch's generator (CPU's or the device's)."""
    before = _generator_states(device)
    out = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    after = _generator_states(device)
    return out, any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def seed_check(ref_model: Any, inputs: list[Any], start: ModelState, seed: int, tolerance: Any) -> SeedCheck:
    """The reference on the same inputs, from the same state, under seeds ``seed`` and ``seed + 1``."""
    outputs = []
    for s in (seed, seed + 1):
        start.restore(ref_model)
        torch.manual_seed(s)
        outputs.append(detached(ref_model(*cloned(inputs))))
    start.restore(ref_model)
    found = compare_outputs(outputs[0], outputs[1], tolerance)
    return SeedCheck(seeds=(seed, seed + 1), agree=found.passed, max_abs_difference=found.max_abs_error,
                     error=None if found.passed else found.error)
