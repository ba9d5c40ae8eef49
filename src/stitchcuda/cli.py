"""The ``stitchcuda`` command.

Exit codes are part of the interface: 0 success (for ``verify``: the candidate passed),
1 a negative result (``verify``: it did not pass; ``doctor``: a check failed), 2 unusable
arguments or tasks.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer
from pydantic import ValidationError
from rich.text import Text

from stitchcuda.agents.session import SessionError, build_config, run_session
from stitchcuda.bench.metrics import bench_metrics
from stitchcuda.bench.report import write_report
from stitchcuda.bench.runner import BenchConfig, BenchError, run_bench
from stitchcuda.bench.solutions import match_solutions
from stitchcuda.bench.store import BenchStore
from stitchcuda.console import (
    LiveReporter,
    bench_view,
    doctor_view,
    optimize_summary_view,
    profile_view,
    reward_view,
    run_view,
    runs_view,
    tasks_view,
    verdict_view,
)
from stitchcuda.doctor import diagnose
from stitchcuda.hints import BENCH_SKIP_UNUSABLE, NO_GPU, TASKS_CHECK, Hint, render
from stitchcuda.llm import LLMConfig, LLMError, make_client
from stitchcuda.reward import RewardConfig, RubricJudge
from stitchcuda.reward.score import score_candidate
from stitchcuda.rl.config import TrainConfig
from stitchcuda.rl.dataset import build_dataset
from stitchcuda.store import RunStore, db_path
from stitchcuda.task import TaskError, load_candidate, resolve_tasks
from stitchcuda.task.probe import check_references
from stitchcuda.task.record import Task
from stitchcuda.terminal import console
from stitchcuda.verify import DeviceUnavailable, Verifier, VerifyConfig
from stitchcuda.verify.config import PRESETS, ToleranceName, WeightsConvention
from stitchcuda.verify.kernelbench_harness import harness_problem
from stitchcuda.verify.pool import default_gpus
from stitchcuda.verify.verdict import Verdict

app = typer.Typer(
    name="stitchcuda",
    help="Turn a PyTorch program into a faster, verified end-to-end CUDA program.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_PASSED, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2

LevelOpt = Annotated[int | None, typer.Option("--level", help="KernelBench level (for a checkout or parquet file).")]
ProblemOpt = Annotated[int | None, typer.Option("--problem", help="KernelBench problem id within the level.")]
KernelBenchOpt = Annotated[
    Path | None,
    typer.Option("--kernelbench", help="A KernelBench checkout or its parquet file; tasks are then picked "
                                       "with --level and --problem.", show_default=False),
]
HarnessOpt = Annotated[Path | None, typer.Option(
    "--kernelbench-harness", metavar="PATH", show_default=False, help="A KernelBench checkout: its own "
    "eval_kernel_against_ref also judges each candidate (own process, GPU), shown beside our verdict, which counts.")]
WeightsOpt = Annotated[WeightsConvention, typer.Option(
    help="seeded: ModelNew built under the reference's seed, nothing copied (KernelBench's convention); "
         "copy: the reference's state_dict loaded into ModelNew, to verify against given weights.")]


def _unusable(message: str, hints: list[Hint] | None = None, json_out: bool = False) -> typer.Exit:
    """Exit 2 with ``message`` (and what to try instead): on stderr, or as a JSON error on stdout
    with ``--json``, so a script reading stdout always gets JSON."""
    hints = hints or []
    if json_out:
        print(json.dumps({"error": message, "exit_code": EXIT_UNUSABLE,
                          "hints": [h.model_dump() for h in hints]}, indent=1))
    else:
        text = Text("error: ", style="bold red")
        text.append(message + render(hints))
        console(stderr=True).print(text, highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_UNUSABLE)


def _tasks(spec: str | None, kernelbench: Path | None, level: int | None, problem: int | None,
           json_out: bool = False, checked: bool = True) -> list[Task]:
    """The tasks ``spec`` names. ``checked=False`` keeps files that do not parse, for a caller that
    checks every reference itself and names each unusable one (bench, ``tasks --check``)."""
    source = str(kernelbench) if kernelbench is not None else spec
    if source is None:
        raise _unusable("name a task (file, folder, bundled name) or pass --kernelbench PATH --level N",
                        json_out=json_out)
    if kernelbench is not None and not kernelbench.expanduser().exists():
        raise _unusable(f"--kernelbench {kernelbench}: no such file or folder (give a KernelBench checkout or "
                        "its parquet file)", json_out=json_out)
    try:
        return resolve_tasks(source, level, problem, checked=checked)
    except TaskError as exc:
        raise _unusable(str(exc), json_out=json_out) from None


def _one_task(tasks: list[Task], json_out: bool) -> Task:
    if len(tasks) != 1:
        raise _unusable(f"{len(tasks)} tasks match; narrow it to one with --problem ID", json_out=json_out)
    return tasks[0]


def _usable(tasks: list[Task], json_out: bool, skip: bool = False) -> list[Task]:
    """The tasks whose reference imports, builds and runs one forward (on the meta device, within
    a time limit), checked before anything else: any other is an unusable task, named with its
    file and line. ``skip`` leaves those out (said on stderr) instead of stopping."""
    with console(stderr=True).status(f"checking {len(tasks)} reference(s)" if len(tasks) > 1
                                     else "checking the reference"):
        checks = check_references(tasks)
    problems = [c.problem for c in checks if c.problem]
    if problems and not skip:
        many = len(tasks) > 1
        head = f"{len(problems)} of {len(tasks)} tasks are unusable:\n" if many else ""
        raise _unusable(head + "\n".join(problems), hints=[BENCH_SKIP_UNUSABLE, TASKS_CHECK] if many else [],
                        json_out=json_out)
    for problem in problems:
        console(stderr=True).print(Text(f"skipped: {problem}", style="yellow"), soft_wrap=True)
    return [t for t, c in zip(tasks, checks, strict=True) if c.ok]


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
) -> None:
    """Build, check and time CANDIDATE against REFERENCE in a fresh worker process."""
    if kernelbench is not None and candidate is None:
        reference, candidate = "", Path(reference)  # `verify --kernelbench KB --level 1 --problem 3 CAND`
    if candidate is None:
        raise _unusable("missing CANDIDATE: stitchcuda verify REFERENCE CANDIDATE", json_out=json_out)
    if preset not in PRESETS:
        raise _unusable(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}", json_out=json_out)
    task = _one_task(_tasks(reference or None, kernelbench, level, problem, json_out), json_out)
    try:
        cand = load_candidate(candidate)
    except TaskError as exc:
        raise _unusable(str(exc), json_out=json_out) from None

    updates: dict = {"tolerance": tolerance, "weights": weights}
    if trials is not None:
        updates["trials"] = trials
    if device is not None:
        updates["device"] = device
    if no_compile_baseline:
        updates["compile_baseline"] = False
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
        _usable([task], json_out)
        try:
            verifier.require_device()
        except DeviceUnavailable as exc:
            raise _unusable(str(exc), NO_GPU["verify"], json_out) from None
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
    """The reference's profile for planning: GPU time per operator and module, launches, idle
    share, copies and syncs, FLOPs and bytes against this GPU's roofline."""
    task = _one_task(_tasks(reference, kernelbench, level, problem, json_out), json_out)
    _usable([task], json_out)
    if not device.startswith("cuda"):
        raise _unusable(f"--device {device}: profiling reads GPU kernels, so it needs a CUDA device (cuda:N)",
                        NO_GPU["profile"], json_out)
    verifier = Verifier(VerifyConfig(device=device))
    try:
        verifier.require_device()
    except DeviceUnavailable as exc:
        raise _unusable(str(exc), NO_GPU["profile"], json_out) from None
    with console(stderr=True).status(f"profiling {task.name}"):
        result = verifier.profile(task)
    if result.reference_error or result.crash or result.reference_profile is None:
        why = result.reference_error or (result.crash.message if result.crash else "; ".join(result.errors))
        raise _unusable(f"the reference could not be profiled: {why}", json_out=json_out)
    if json_out:
        print(result.reference_profile.model_dump_json(indent=1))
    else:
        console().print(profile_view(task.name, result.reference_profile))


Provider = Literal["openai", "anthropic", "hf"]
CoderKind = Literal["llm", "offline"]


@app.command()
def optimize(
    reference: Annotated[str | None, typer.Argument(
        help="The PyTorch reference: a KernelBench-format .py file or a bundled task name.")] = None,
    model: Annotated[str | None, typer.Option(help="The LLM for every agent (e.g. Qwen/Qwen3-32B, gpt-5).")] = None,
    coder: Annotated[CoderKind | None, typer.Option(
        help="llm: the agents over --model; offline: StitchCUDA's LLM-free Planner and Coder "
             "(the default when no model is named).")] = None,
    provider: Annotated[Provider, typer.Option(help="openai: any OpenAI-compatible server (vLLM, SGLang, "
                                                    "hosted APIs); anthropic; hf: a local Hugging Face model.")] = "openai",
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server, e.g. http://localhost:8000/v1.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable with the key "
                                                          "(default OPENAI_API_KEY / ANTHROPIC_API_KEY).")] = None,
    planner_model: Annotated[str | None, typer.Option(help="A different model for the Planner.")] = None,
    coder_model: Annotated[str | None, typer.Option(help="A different model for the Coder.")] = None,
    coder_provider: Annotated[Provider | None, typer.Option(help="The Coder's provider, if not --provider.")] = None,
    coder_base_url: Annotated[str | None, typer.Option(help="The Coder's server, if not --base-url.")] = None,
    adapter: Annotated[Path | None, typer.Option(help="A PEFT LoRA adapter for the Coder (with --coder-provider hf).")] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.7,
    llm_timeout: Annotated[float, typer.Option(help="Seconds per LLM call before it is retried.")] = 600.0,
    prices: Annotated[Path | None, typer.Option(help="Price table (JSON/TOML, USD per 1M tokens) for cost.")] = None,
    samples: Annotated[int, typer.Option(min=1, help="Coder samples per step, verified in parallel.")] = 1,
    tolerance: Annotated[ToleranceName, typer.Option(help="strict (1e-4 fp32) or paper (1e-2).")] = "strict",
    weights: WeightsOpt = "seeded",
    device: Annotated[str | None, typer.Option(help="cuda:N (cpu for C++-only debugging).")] = None,
    preset: Annotated[str, typer.Option(help=f"Verifier defaults: {', '.join(PRESETS)}.")] = "quick",
    max_steps: Annotated[int, typer.Option(min=1, help="Budget: Coder steps.")] = 24,
    max_llm_calls: Annotated[int | None, typer.Option(min=1, help="Budget: LLM calls.")] = None,
    max_tokens: Annotated[int | None, typer.Option(min=1, help="Budget: prompt + completion tokens.")] = None,
    max_cost: Annotated[float | None, typer.Option(help="Budget: USD, from the price table.")] = None,
    max_wall: Annotated[float | None, typer.Option(help="Budget: seconds of wall time.")] = None,
    max_attempts: Annotated[int, typer.Option(min=1, help="Steps per subtask before moving on or replanning.")] = 6,
    max_replans: Annotated[int, typer.Option(min=0, help="Replans allowed.")] = 2,
    max_subtasks: Annotated[int, typer.Option(min=1, help="Subtasks per plan.")] = 4,
    workspace: Annotated[Path, typer.Option(help="Where the run store and artifacts live.")] = Path(".stitchcuda"),
    resume: Annotated[str | None, typer.Option(help="Resume a run (id, unique prefix, or 'last').")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the best program here "
                                                               "(default ./<task>_stitchcuda.py).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the run's summary as JSON.")] = False,
    kernelbench: KernelBenchOpt = None,
    level: LevelOpt = None,
    problem: ProblemOpt = None,
) -> None:
    """Plan, write and verify an end-to-end CUDA program for REFERENCE with an LLM; keep the best."""
    try:
        summary = run_session(
            reference=reference, kernelbench=kernelbench, level=level, problem=problem, model=model, coder=coder,
            provider=provider, base_url=base_url, api_key_env=api_key_env, planner_model=planner_model,
            coder_model=coder_model, coder_provider=coder_provider, coder_base_url=coder_base_url, adapter=adapter,
            temperature=temperature, llm_timeout=llm_timeout, prices=prices, samples=samples, tolerance=tolerance,
            weights=weights,
            device=device, preset=preset, max_steps=max_steps, max_llm_calls=max_llm_calls, max_tokens=max_tokens,
            max_cost=max_cost, max_wall=max_wall, max_attempts=max_attempts, max_replans=max_replans,
            max_subtasks=max_subtasks, workspace=workspace, resume=resume, out=out,
            reporter=LiveReporter(quiet=json_out),
        )
    except SessionError as exc:
        raise _unusable(str(exc), exc.hints, json_out) from None
    if json_out:
        print(json.dumps(summary, indent=1))
    else:
        console().print(optimize_summary_view(summary))
    if summary["status"] == "unverified":  # written (and compile-checked) without a GPU: said, not verified
        raise typer.Exit(EXIT_FAILED if summary["compile_check"]["status"] == "failed" else EXIT_PASSED)
    raise typer.Exit(EXIT_PASSED if summary.get("best") else EXIT_FAILED)


@app.command()
def bench(
    suite: Annotated[str, typer.Argument(
        help="suite (the bundled tasks), a folder of tasks, a parquet file, a KernelBench checkout "
             "with --level, or task names and paths separated by commas.")] = "suite",
    kernelbench: KernelBenchOpt = None,
    level: LevelOpt = None,
    evaluate: Annotated[Path | None, typer.Option(
        help="Verify a folder of existing solutions (<task>.py or KernelBench's "
             "level_L_problem_P_sample_S.py) instead of optimizing.")] = None,
    coder: Annotated[CoderKind | None, typer.Option(help="offline (default without --model) or llm.")] = None,
    model: Annotated[str | None, typer.Option(help="The LLM for every agent.")] = None,
    provider: Annotated[Provider, typer.Option(help="openai (any compatible server), anthropic, hf.")] = "openai",
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server URL.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable with the key.")] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.7,
    llm_timeout: Annotated[float, typer.Option(help="Seconds per LLM call before it is retried.")] = 600.0,
    samples: Annotated[int, typer.Option(min=1, help="Coder samples per step.")] = 1,
    tolerance: Annotated[ToleranceName, typer.Option(help="strict (1e-4 fp32) or paper (1e-2).")] = "strict",
    weights: WeightsOpt = "seeded",
    preset: Annotated[str, typer.Option(help=f"Verifier defaults: {', '.join(PRESETS)} (quick has no torch.compile "
                                             "baseline).")] = "default",
    max_steps: Annotated[int, typer.Option(min=1, help="Budget per task: Coder steps.")] = 24,
    max_wall: Annotated[float | None, typer.Option(help="Budget per task: seconds.")] = None,
    max_cost: Annotated[float | None, typer.Option(help="Budget per task: USD.")] = None,
    gpus: Annotated[str | None, typer.Option(
        help="GPUs to use, e.g. 0,1 (default: every visible GPU); cpu for C++-only debugging.")] = None,
    runs_per_gpu: Annotated[int, typer.Option(min=1, help="Tasks sharing a GPU, so builds overlap "
                                                           "verifications.")] = 2,
    ray: Annotated[str | None, typer.Option(
        help="Run on a Ray cluster: its address (auto, ray://host:10001) or local.")] = None,
    workspace: Annotated[Path, typer.Option(help="Where the run store and artifacts live.")] = Path(".stitchcuda"),
    resume: Annotated[str | None, typer.Option(help="Resume a bench (id, unique prefix, or 'last').")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the bench's metrics as JSON.")] = False,
    kernelbench_harness: HarnessOpt = None,
    skip_unusable: Annotated[bool, typer.Option(
        "--skip-unusable", help="Leave out tasks whose reference does not run (named on stderr) instead of "
                                "stopping.")] = False,
) -> None:
    """Run the system over a suite (one optimize run per task) or verify a folder of solutions; resumable."""
    jobs: list[tuple[Task, int | None, str | None]] = []
    if resume is not None:
        if not db_path(workspace).exists():
            raise _unusable(f"cannot resume: no run store in {workspace} (pass the --workspace of the bench)",
                            json_out=json_out)
        store = BenchStore(workspace)
        try:
            bench_id = store.resolve(resume)
        except KeyError as exc:
            raise _unusable(f"cannot resume: {exc.args[0]} in {workspace}", json_out=json_out) from None
        config = BenchConfig.model_validate_json(store.config_json(bench_id))
    else:
        found = _usable(_tasks(suite, kernelbench, level, None, json_out, checked=False), json_out,
                        skip=skip_unusable)
        if not found:
            raise _unusable("no usable task is left", json_out=json_out)
        devices = ["cpu"] if gpus == "cpu" else [f"cuda:{g.strip()}" for g in gpus.split(",")] if gpus \
            else default_gpus()
        if not devices and ray is None:
            raise _unusable("no GPU is visible here: a bench verifies its programs on GPUs", NO_GPU["bench"],
                            json_out)
        devices = devices or ["cuda:0"]  # the cluster's workers have the GPUs
        store = BenchStore(workspace)
        try:
            optimize = build_config(
                model=model, coder=coder, provider=provider, base_url=base_url, api_key_env=api_key_env,
                planner_model=None, coder_model=None, coder_provider=None, coder_base_url=None, adapter=None,
                temperature=temperature, llm_timeout=llm_timeout, samples=samples, tolerance=tolerance,
                weights=weights,
                device=devices[0], preset=preset, max_steps=max_steps, max_llm_calls=None, max_tokens=None,
                max_cost=max_cost, max_wall=max_wall, max_attempts=6, max_replans=2, max_subtasks=4)
        except SessionError as exc:
            raise _unusable(str(exc), exc.hints, json_out) from None
        if kernelbench_harness is not None:
            optimize.verify.kernelbench_harness = str(kernelbench_harness.expanduser().resolve())
            if why := harness_problem(kernelbench_harness):  # said up front too; the bench still runs
                console(stderr=True).print(Text(f"warning: --kernelbench-harness: {why}", style="yellow"))
        label = f"{kernelbench.name} level {level}" if kernelbench else suite
        config = BenchConfig(suite=label, optimize=optimize, evaluate=str(evaluate) if evaluate else None,
                             gpus=devices, ray=ray, runs_per_gpu=runs_per_gpu)
        if evaluate is not None:
            if not evaluate.is_dir():
                raise _unusable(f"--evaluate {evaluate}: not a folder", json_out=json_out)
            rows, unmatched = match_solutions(found, evaluate)
            if unmatched:
                console(stderr=True).print(Text(f"{len(unmatched)} file(s) in {evaluate} match no task: "
                                                + ", ".join(unmatched[:8]), style="yellow"))
            jobs = [(t, t.level, path or str(evaluate.resolve() / f"{t.file_stem}.py")) for t, path in rows]
        else:
            jobs = [(t, t.level, None) for t in found]
    progress = console(stderr=True)

    def on_done(result) -> None:
        if not json_out:
            best = result.speedup.get("eager")
            why = result.why
            progress.print(f"{result.task}: {result.status}" + (f", {best:.2f}x vs eager" if best else "")
                          + (f", hacking {result.hacking}" if result.hacking else "")
                          + (f" ({why[:160]})" if why else ""),
                          highlight=False, soft_wrap=True, markup=False)

    try:
        result = run_bench(store, jobs, config, on_done=on_done, resume=resume)
    except (BenchError, SessionError) as exc:
        raise _unusable(str(exc), getattr(exc, "hints", None), json_out) from None
    metrics = bench_metrics(result.tasks, result.info)
    if json_out:  # the metrics, and why each task that did not pass failed
        failures = [{"task": t.task, **t.failure.model_dump()} for t in result.tasks if t.failure is not None]
        print(json.dumps(json.loads(metrics.model_dump_json()) | {"failures": failures}, indent=1))
    else:
        console().print(bench_view(result, metrics))
        console().print(f"report: stitchcuda report {result.info.id} --workspace {workspace}", highlight=False)


@app.command()
def report(
    bench_id: Annotated[str, typer.Argument(help="A bench (id, unique prefix, or 'last').")] = "last",
    compare: Annotated[str | None, typer.Option(help="Another bench to compare with.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder for the page (default "
                                                                 "<workspace>/benches/<id>/report).")] = None,
    workspace: Annotated[Path, typer.Option(help="Where the run store lives.")] = Path(".stitchcuda"),
) -> None:
    """Write a bench's report: a static HTML page with plots, and a Markdown summary beside it."""
    if not db_path(workspace).exists():
        raise _unusable(f"no run store in {workspace} (pass the --workspace of the bench)")
    store = BenchStore(workspace)
    try:
        first = store.result(store.resolve(bench_id))
        other = store.result(store.resolve(compare)) if compare else None
    except KeyError as exc:
        raise _unusable(f"no such bench: {exc.args[0]}") from None
    target = out or store.bench_dir(first.info.id) / "report"
    files = write_report(first, target, compare=other)
    console().print(f"wrote {files.html}\nwrote {files.markdown}", highlight=False)


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
    task = _one_task(_tasks(reference, None, None, None, json_out), json_out)
    _usable([task], json_out)
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
                raise _unusable(str(exc), NO_GPU["reward"], json_out) from None
            with console(stderr=True).status(f"verifying {candidate.name}"):
                verdict = verifier.verify(task, program)
        judge = None
        if judge_model:
            judge = RubricJudge(make_client(LLMConfig(provider=judge_provider, model=judge_model,
                                                      base_url=judge_base_url, api_key_env=api_key_env,
                                                      temperature=0.0)), retries=weights.judge_retries)
    except (TaskError, LLMError, OSError, ValueError) as exc:
        raise _unusable(str(exc), json_out=json_out) from None
    breakdown = score_candidate(task, program.source, verdict, judge=judge, config=weights,
                                skill="feedback" if skill == 2 else "scratch",
                                feedback=feedback.read_text() if feedback else "")
    if json_out:
        print(breakdown.model_dump_json(indent=1))
        return
    console().print(reward_view(breakdown))


dataset_app = typer.Typer(help="Skill datasets for training the Coder.", no_args_is_help=True)
app.add_typer(dataset_app, name="dataset")


@dataset_app.command("build")
def dataset_build(
    runs_: Annotated[list[str] | None, typer.Argument(
        metavar="RUNS...", help="Runs whose Coder calls become samples (ids, unique prefixes, or all).")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for train.parquet, eval.parquet, "
                                                          "manifest.json.")] = Path("dataset"),
    tasks: Annotated[list[str] | None, typer.Option(
        "--tasks", help="Also skill-1 prompts for these tasks (suite, a folder, a file); repeatable.")] = None,
    eval_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of tasks held out for "
                                                                        "evaluation (by a stable hash).")] = 0.2,
    eval_tasks: Annotated[str | None, typer.Option(help="Comma-separated task names held out instead.")] = None,
    tolerance: Annotated[ToleranceName, typer.Option(help="The tolerance named in task prompts.")] = "strict",
    workspace: Annotated[Path, typer.Option(help="Where the run store lives.")] = Path(".stitchcuda"),
    json_out: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
) -> None:
    """Build skill-1 and skill-2 samples from recorded runs (and task lists), split by task."""
    if not runs_ and not tasks:
        raise _unusable("name runs (or all) and/or --tasks SPEC")
    if runs_ and not db_path(workspace).exists():
        raise _unusable(f"no run store in {workspace} (pass the --workspace of the runs)")
    try:
        manifest = build_dataset(workspace, runs_ or [], out, tasks, eval_fraction,
                                 set(eval_tasks.split(",")) if eval_tasks else None, tolerance)
    except (KeyError, TaskError) as exc:
        raise _unusable(str(exc.args[0] if isinstance(exc, KeyError) else exc)) from None
    except ImportError:
        raise _unusable("writing Parquet needs pyarrow: pip install 'stitchcuda[train]'") from None
    if json_out:
        print(manifest.model_dump_json(indent=1))
    else:
        console().print(f"train: {manifest.samples['train']} samples ({len(manifest.tasks['train'])} tasks), "
                        f"eval: {manifest.samples['eval']} ({len(manifest.tasks['eval'])} tasks), "
                        f"{manifest.duplicates_dropped} duplicates dropped -> {out}", highlight=False)


@app.command()
def train(
    config: Annotated[Path, typer.Argument(help="A training config (TOML or JSON); see configs/train/.")],
    resume: Annotated[bool, typer.Option(help="Continue from the last checkpoint in output_dir.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the run's summary as JSON.")] = False,
) -> None:
    """GRPO + LoRA on the Coder's two skills, rewarded by real verifications and the rubric."""
    # the trainer reaches TRL, PEFT and transformers (the optional [train] extra): only this command
    # loads it, so that every other command runs where they are not installed
    from stitchcuda.rl.train import TrainError
    from stitchcuda.rl.train import train as run_training

    try:
        loaded = TrainConfig.load(config)
        # the trainer's progress and log lines go to stderr, so that --json leaves stdout to the summary
        with contextlib.redirect_stdout(sys.stderr):
            summary = run_training(loaded, resume=resume)
    except (OSError, ValueError, ValidationError, TrainError) as exc:
        raise _unusable(str(exc)) from None
    if json_out:
        print(json.dumps(summary, indent=1, default=str))
    else:
        console().print(summary)
    raise typer.Exit(EXIT_PASSED if summary["status"] == "done" else EXIT_FAILED)


@app.command()
def runs(
    run: Annotated[str | None, typer.Argument(help="Show one run (id, unique prefix or 'last').")] = None,
    workspace: Annotated[Path, typer.Option(help="Where the run store lives.")] = Path(".stitchcuda"),
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the runs of a workspace, or show one: plan, steps, decisions, usage."""
    if not db_path(workspace).exists():
        raise _unusable(f"no run store in {workspace} (runs are kept where `stitchcuda optimize` ran, "
                        "or pass --workspace)")
    store = RunStore(workspace)
    if run is None:
        found = store.runs()
        if json_out:
            print(json.dumps([r.model_dump() for r in found], indent=1))
        else:
            console().print(runs_view(found))
        return
    try:
        run_id = store.resolve(run)
    except KeyError as exc:
        raise _unusable(f"no such run: {exc.args[0]}") from None
    state, plans, steps = store.load_state(run_id), store.plans(run_id), store.steps(run_id)
    if json_out:
        print(json.dumps({"state": state.model_dump(), "plans": [p.model_dump() for p in plans],
                          "steps": [s.model_dump() for s in steps], "llm_calls": store.llm_calls(run_id)},
                         indent=1, default=str))
    else:
        console().print(run_view(state, plans, steps))


@app.command()
def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    no_ncu_probe: Annotated[bool, typer.Option("--no-ncu-probe", help="Skip profiling a probe kernel.")] = False,
    fetch_headers: Annotated[bool, typer.Option(
        "--fetch-headers", help="First fetch the CUDA library headers missing here (cuBLAS, cuSPARSE, cuSOLVER, "
                                "cuDNN) into the header cache, once: pip downloads NVIDIA's wheels (up to about "
                                "1.4 GB) and only their headers (about 2.4 MB) are kept.")] = False,
) -> None:
    """What this machine can do: GPU, nvcc, torch, CUDA headers, ncu counters, build cache; each problem with its fix."""
    doing = "fetching the missing CUDA library headers with pip, then checking the machine" if fetch_headers \
        else "checking the machine"
    with console(stderr=True).status(doing):
        report = diagnose(probe_ncu=not no_ncu_probe, fetch_headers=fetch_headers)
    if json_out:
        print(report.model_dump_json(indent=1))
    else:
        console().print(doctor_view(report))
    raise typer.Exit(EXIT_PASSED if report.ok else EXIT_FAILED)


@app.command()
def tasks(
    spec: Annotated[str, typer.Argument(
        help="suite (the bundled tasks), a bundled name, a .py file, a folder, or a parquet file.")] = "suite",
    json_out: Annotated[bool, typer.Option("--json", help="Print the tasks as JSON (with sources).")] = False,
    kernelbench: KernelBenchOpt = None,
    level: LevelOpt = None,
    problem: ProblemOpt = None,
    check: Annotated[bool, typer.Option("--check", help="Import each task and run its input functions.")] = False,
) -> None:
    """List tasks: the bundled suite, a folder, a KernelBench checkout or its parquet file."""
    # with --check, a file that does not parse is a row of the table, not the end of the listing
    found = _tasks(spec, kernelbench, level, problem, json_out, checked=not check)
    problems: dict[str, str] = {}
    if check:
        with console(stderr=True).status(f"checking {len(found)} task(s)"):
            problems = {c.task: c.problem for c in check_references(found) if c.problem}
    if json_out:
        rows = [t.model_dump() | {"sha256": t.sha256} | ({"problem": problems.get(t.name)} if check else {})
                for t in found]
        print(json.dumps(rows, indent=1))
    else:
        console().print(tasks_view(found, problems if check else None))
    raise typer.Exit(EXIT_UNUSABLE if problems else EXIT_PASSED)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
