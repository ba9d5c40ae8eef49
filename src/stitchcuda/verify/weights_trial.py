"""The trial with new weights: does the candidate compute with the weights it holds now?

A user builds ``ModelNew`` and then loads trained weights into it; an optimizer step changes them
in place. A program that made something of its weights once (a split, a transpose, a converted
copy, at construction or at its first call) and keeps using it after they changed computes with
stale weights. Neither KernelBench nor the other trials see it: their weights never change.

Both models run once on the same inputs (a program that caches on its first call has cached),
then get one perturbed copy of the reference's state_dict (every floating tensor, parameters and
buffers, each element scaled by 1 + 0.2u and, where the tensor is all zeros, moved by 0.05u, u
uniform in [-1, 1]) through ``load_state_dict``, then run again on the same inputs. The caller
restores both models' weights and state afterwards.
"""

from __future__ import annotations

from collections import OrderedDict
from types import ModuleType
from typing import Any

import torch

from stitchcuda.verify.conditioning import Fp64Reference, reconsider
from stitchcuda.verify.correctness import (
    cloned,
    compare_outputs,
    detached,
    flatten_output,
    make_trial_inputs,
    on_device,
)
from stitchcuda.verify.protocol import WorkerRequest
from stitchcuda.verify.trials import same_state_layout
from stitchcuda.verify.verdict import WeightsTrial

# Where the trials needed the fp64 judgement (ill-conditioned outputs), the candidate follows its
# weights when its gap to the reference is this small a share of how far the new weights moved it.
FOLLOW_SHARE = 0.05


def perturbed(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A copy of ``state`` with every floating tensor moved (see the module's docstring). The noise is
    drawn where each tensor lives, from a generator seeded per device: on the CPU, a ConvNeXt's
    float64 draws took 10-20 s of a verification while it held the GPU."""
    generators: dict[torch.device, torch.Generator] = {}
    out = like(state)
    for key, value in state.items():
        if not value.is_floating_point():
            out[key] = value.clone()
            continue
        if value.device not in generators:
            generators[value.device] = torch.Generator(value.device).manual_seed(seed)
        u = torch.rand(value.shape, generator=generators[value.device], device=value.device, dtype=torch.float32)
        u = (u * 2 - 1).to(value.dtype)
        moved = value * (1 + 0.2 * u)
        out[key] = moved + 0.05 * u if not bool(value.ne(0).any()) else moved
    return out


def like(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An empty state_dict carrying ``state``'s ``_metadata`` (module versions): a module that checks
    its version as it loads (torchvision's MNASNet) refuses a plain dict."""
    out: dict[str, torch.Tensor] = OrderedDict()
    if (metadata := getattr(state, "_metadata", None)) is not None:
        out._metadata = metadata  # type: ignore[attr-defined]
    return out


# The outputs before the load are kept as this many sampled elements per output, so that the trial
# holds two full outputs at a time, as any trial does (L1/63's outputs are 16 GiB each).
SAMPLE = 1 << 20


def _sampled(out: Any) -> list[torch.Tensor] | None:
    """Each output's elements at fixed positions (all of them up to :data:`SAMPLE`), as float64."""
    tensors = flatten_output(out)
    if tensors is None:
        return None
    picked = []
    for x in tensors:
        flat = x.reshape(-1)
        if flat.numel() > SAMPLE:
            flat = flat[sample_positions(flat.numel(), flat.device)]
        picked.append(flat.double().clone())
    return picked


def sample_positions(numel: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """:data:`SAMPLE` evenly spread positions in ``[0, numel)``, in int64 arithmetic: a float32
    linspace rounds its last position up to ``numel`` past 2^24 elements (an out-of-bounds index:
    a device-side assert on KernelBench's L1/50, 74M outputs)."""
    return torch.arange(SAMPLE, device=device, dtype=torch.int64) * (numel - 1) // (SAMPLE - 1)


def _gap(a: list[torch.Tensor] | None, b: list[torch.Tensor] | None) -> float | None:
    if a is None or b is None or len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return None
    return max(((x - y).abs().max().item() for x, y in zip(a, b, strict=True) if x.numel()), default=0.0)


def follows_weights(request: WorkerRequest, reference: ModuleType, ref_model: Any, new_model: Any,
                    device: torch.device, draws: bool, conditioned: bool, fp64: bool = False) -> WeightsTrial:
    """Run the trial (module docstring) and say what it found. ``draws``: the reference draws random
    numbers (both run under one seed); ``conditioned``: the trials judged against fp64; ``fp64``: the
    reference can be re-run in fp64, to judge a comparison the new weights left beyond the tolerance
    (Inception v3's logits went from 1e2 to 1e12: the trials passed exactly, and this one failed at
    a relative error of 6e-7)."""
    if not same_state_layout(ref_model, new_model):
        return WeightsTrial(skipped="the candidate's state_dict does not have the reference's keys and shapes "
                                    "(KernelBench accepts that), so the same weights cannot be loaded into both")
    seed = request.config.seed + 7
    inputs = make_trial_inputs(reference.get_inputs, seed, "given", device)

    def call(model: Any) -> Any:
        if draws:
            torch.manual_seed(seed)
        return detached(model(*cloned(inputs)))

    ref_before = _sampled(call(ref_model))
    new_before = _sampled(on_device(call(new_model), device))
    new_weights = perturbed(ref_model.state_dict(), seed)
    ref_model.load_state_dict(new_weights)
    new_model.load_state_dict(new_weights)
    del new_weights
    ref_after = call(ref_model)
    moved = _gap(ref_before, _sampled(ref_after))
    new_after = on_device(call(new_model), device)
    comparison = compare_outputs(ref_after, new_after, request.config.tol)
    check = None
    if fp64:  # the fp64 model is made now, from the new weights; also where the trials needed it (an
        # ill-conditioned model stays so after the perturbation, and its share of the move may not tell)
        check = reconsider(comparison, ref_after, new_after, inputs, Fp64Reference(ref_model), request.config.tol)
    gap = comparison.max_abs_error if comparison.max_abs_error is not None else _gap(_sampled(ref_after),
                                                                                     _sampled(new_after))
    passed = comparison.passed or bool(conditioned and gap is not None and moved and gap <= FOLLOW_SHARE * moved)
    stale_gap = _gap(new_before, _sampled(new_after))
    stale = not passed and stale_gap is not None and moved is not None and stale_gap < 0.5 * moved
    return WeightsTrial(ran=True, passed=passed, max_abs_error=gap, output_moved=moved, stale=stale,
                        conditioning=check)


def weights_error(trial: WeightsTrial) -> str:
    """The verdict's error for a failed trial."""
    gap = f"{trial.max_abs_error:.3g}" if trial.max_abs_error is not None else "not comparable"
    moved = f"{trial.output_moved:.3g}" if trial.output_moved is not None else "?"
    what = ("its output stayed where the old weights put it: it computes with a copy made before (at "
            "construction or at its first call) and never sees the change; derive such copies from the current "
            "weights, or check the parameters' data_ptr() and _version each call") if trial.stale else (
            "it does not compute the reference's function of the new weights")
    return (f"wrong after new weights were loaded: both models got the same perturbed state_dict through "
            f"load_state_dict between two calls, which moved the reference's output by {moved}; the candidate "
            f"is then {gap} from it: {what}")
