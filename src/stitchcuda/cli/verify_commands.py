"""`stitchcuda verify`, `profile` and `reward`: one candidate (or the reference alone) on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from stitchcuda.cli.application import (
    HarnessOpt,
    KernelBenchOpt,
    LevelOpt,
    MaxAutotuneOpt,
    ProblemOpt,
    Provider,
    WeightsOpt,
    app,
    named_tasks,
    one_task,
    unusable,
    usable_tasks,
)
from stitchcuda.cli.console import (
    profile_view,
    reward_view,
    verdict_view,
)
from stitchcuda.cli.exits import EXIT_FAILED, EXIT_PASSED, EXIT_UNUSABLE
from stitchcuda.cli.terminal import console
from stitchcuda.hints import NO_GPU
from stitchcuda.llm import LLMConfig, LLMError, make_client
from stitchcuda.reward import RewardConfig, RubricJudge
from stitchcuda.reward.score import score_candidate
from stitchcuda.task import TaskError, load_candidate
from stitchcuda.verify import DeviceUnavailable, Verifier, VerifyConfig
from stitchcuda.verify.config import PRESETS, ToleranceName
from stitchcuda.verify.verdict import Verdict


@app.command()
def verify(
    reference: Annotated[str, typer.Argument(
        help="The PyTorch reference: a KernelBench-format .py file or a bundled task name "
             "(see `stitchcuda tasks`). With --kernelbench, give only the candidate.")],
    candidate: Annotated[Path | None, typer.Argument(help="The candidate .py file defining ModelNew.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON Verdict on stdout.")] = False,
    tolerance: Annotated[ToleranceName, typer.Option(
        help="strict: atol=rtol=1e-4 for fp32 (KernelBench today); paper: 1e-2 (published papers).")] = "strict",
    trials: Annotated[int | None, typer.Option(min=1, help="Correctness trials (fresh seed and inputs each).")] = None,
    weights: WeightsOpt = "seeded",
    device: Annotated[str | None, typer.Option(help="cuda:N (or cpu, for debugging without a GPU).")] = None,
    no_compile_baseline: Annotated[bool, typer.Option(
        "--no-compile-baseline", help="Skip the torch.compile baseline (slow the first time).")] = False,
    timeout: Annotated[float | None, typer.Option(help="Worker wall-clock limit in seconds, builds excluded.")] = None,
    preset: Annotated[str, typer.Option(help=f"Defaults to start from: {', '.join(PRESETS)}.")] = "default",
    static_only: Annotated[bool, typer.Option(
        "--static-only", help="Only the static hacking checks (no build, no GPU); exit 0 unless a total hack.")] = False,
    ncu: Annotated[bool, typer.Option(
        "--ncu", help="Also read the top kernels' hardware counters with Nsight Compute (slower).")] = False,
    kernelbench: KernelBenchOpt = None,
    level: LevelOpt = None,
    problem: ProblemOpt = None,
    kernelbench_harness: HarnessOpt = None,
    max_autotune: MaxAutotuneOpt = False,
) -> None:
    """Build, check and time CANDIDATE against REFERENCE in a fresh worker process."""
    if kernelbench is not None and candidate is None:
        reference, candidate = "", Path(reference)  # `verify --kernelbench KB --level 1 --problem 3 CAND`
    if candidate is None:
        raise unusable("missing CANDIDATE: stitchcuda verify REFERENCE CANDIDATE", json_out=json_out)
    if preset not in PRESETS:
        raise unusable(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}", json_out=json_out)
    task = one_task(named_tasks(reference or None, kernelbench, level, problem, json_out), json_out)
    try:
        cand = load_candidate(candidate)
    except TaskError as exc:
        raise unusable(str(exc), json_out=json_out) from None

    updates: dict = {"tolerance": tolerance, "weights": weights}
    if trials is not None:
        updates["trials"] = trials
    if device is not None:
        updates["device"] = device
    if no_compile_baseline:
        updates["compile_baseline"] = False
    if max_autotune:
        updates["compile_max_autotune"] = True
    if timeout is not None:
        updates["timeout_s"] = timeout
    if ncu:
        updates["ncu"] = True
    if kernelbench_harness is not None:  # a wrong path is said beside the verdict, which it never stops
        updates["kernelbench_harness"] = str(kernelbench_harness.expanduser().resolve())
    config = PRESETS[preset].model_copy(update=updates)

    verifier = Verifier(config)
    if static_only:  # reads the candidate's source alone: the reference never runs
        verdict = verifier.verify_static(task, cand)
    else:
        usable_tasks([task], json_out)
        try:
            verifier.require_device()
        except DeviceUnavailable as exc:
            raise unusable(str(exc), NO_GPU["verify"], json_out) from None
        with console(stderr=True).status("starting the worker") as status:
            verdict = verifier.verify(task, cand, on_phase=lambda p: status.update(f"verifying: {p}"))
    if json_out:
        print(verdict.model_dump_json(indent=1))
    else:
        console().print(verdict_view(verdict))
    if verdict.reference_error:
        raise typer.Exit(EXIT_UNUSABLE)
    if static_only:  # nothing ran: success means no total hack was found
        raise typer.Exit(EXIT_PASSED if verdict.hacking.level != "total" and not verdict.errors else EXIT_FAILED)
    raise typer.Exit(EXIT_PASSED if verdict.passed else EXIT_FAILED)


@app.command()
def profile(
    reference: Annotated[str, typer.Argument(help="A KernelBench-format .py file or a bundled task name.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
    device: Annotated[str, typer.Option(help="cuda:N")] = "cuda:0",
    kernelbench: KernelBenchOpt = None,
    level: LevelOpt = None,
    problem: ProblemOpt = None,
) -> None:
    """The reference's profile for planning: GPU time per operator and module, launches, idle share, copies, syncs.

    And its FLOPs and bytes against this GPU's roofline."""
    task = one_task(named_tasks(reference, kernelbench, level, problem, json_out), json_out)
    usable_tasks([task], json_out)
    if not device.startswith("cuda"):
        raise unusable(f"--device {device}: profiling reads GPU kernels, so it needs a CUDA device (cuda:N)",
                        NO_GPU["profile"], json_out)
    verifier = Verifier(VerifyConfig(device=device))
    try:
        verifier.require_device()
    except DeviceUnavailable as exc:
        raise unusable(str(exc), NO_GPU["profile"], json_out) from None
    with console(stderr=True).status(f"profiling {task.name}"):
        result = verifier.profile(task)
    if result.reference_error or result.crash or result.reference_profile is None:
        why = result.reference_error or (result.crash.message if result.crash else "; ".join(result.errors))
        raise unusable(f"the reference could not be profiled: {why}", json_out=json_out)
    if json_out:
        print(result.reference_profile.model_dump_json(indent=1))
    else:
        console().print(profile_view(task.name, result.reference_profile))


@app.command()
def reward(
    reference: Annotated[str, typer.Argument(help="The PyTorch reference (.py file or bundled task name).")],
    candidate: Annotated[Path, typer.Argument(help="The candidate program (.py with ModelNew).")],
    skill: Annotated[int, typer.Option(min=1, max=2, help="1: from-scratch generation; 2: feedback-driven "
                                                          "optimisation (give --feedback).")] = 1,
    feedback: Annotated[Path | None, typer.Option(help="The feedback the Coder was given (skill 2).")] = None,
    verdict_file: Annotated[Path | None, typer.Option("--verdict", help="Reuse this verdict JSON instead of "
                                                                         "verifying again.")] = None,
    judge_model: Annotated[str | None, typer.Option(help="The rubric judge (any LLM); without one the rubric "
                                                         "is not asked and counts as neutral.")] = None,
    judge_provider: Annotated[Provider, typer.Option(help="openai (any compatible server), anthropic, hf.")] = "openai",
    judge_base_url: Annotated[str | None, typer.Option(help="The judge's OpenAI-compatible server.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable with the judge's key.")] = None,
    config: Annotated[Path | None, typer.Option(help="Reward weights (JSON), see RewardConfig.")] = None,
    tolerance: Annotated[ToleranceName, typer.Option(help="strict (1e-4 fp32) or paper (1e-2).")] = "strict",
    device: Annotated[str | None, typer.Option(help="cuda:N (cpu for C++-only debugging).")] = None,
    preset: Annotated[str, typer.Option(help=f"Verifier defaults: {', '.join(PRESETS)}.")] = "quick",
    json_out: Annotated[bool, typer.Option("--json", help="Print every part of the reward as JSON.")] = False,
) -> None:
    """Every part of one candidate's reward: the rule reward from a verification, the rubric, the combination."""
    task = one_task(named_tasks(reference, None, None, None, json_out), json_out)
    usable_tasks([task], json_out)
    try:
        program = load_candidate(candidate)
        weights = RewardConfig.model_validate_json(config.read_text()) if config else RewardConfig()
        if verdict_file is not None:
            verdict = Verdict.model_validate_json(verdict_file.read_text())
        else:
            verify_config = PRESETS[preset].model_copy(update={"tolerance": tolerance, **({"device": device}
                                                                                         if device else {})})
            verifier = Verifier(verify_config)
            try:
                verifier.require_device()
            except DeviceUnavailable as exc:
                raise unusable(str(exc), NO_GPU["reward"], json_out) from None
            with console(stderr=True).status(f"verifying {candidate.name}"):
                verdict = verifier.verify(task, program)
        judge = None
        if judge_model:
            judge = RubricJudge(make_client(LLMConfig(provider=judge_provider, model=judge_model,
                                                      base_url=judge_base_url, api_key_env=api_key_env,
                                                      temperature=0.0)), retries=weights.judge_retries)
    except (TaskError, LLMError, OSError, ValueError) as exc:
        raise unusable(str(exc), json_out=json_out) from None
    breakdown = score_candidate(task, program.source, verdict, judge=judge, config=weights,
                                skill="feedback" if skill == 2 else "scratch",
                                feedback=feedback.read_text() if feedback else "")
    if json_out:
        print(breakdown.model_dump_json(indent=1))
        return
    console().print(reward_view(breakdown))


