"""`stitchcuda optimize`, `bench` and `report`: runs of the agents, one task or a suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from stitchcuda.agents.session import SessionError, build_config, run_session
from stitchcuda.bench.metrics import bench_metrics
from stitchcuda.bench.report import write_report
from stitchcuda.bench.runner import BenchConfig, BenchError, run_bench
from stitchcuda.bench.solutions import match_solutions
from stitchcuda.bench.store import BenchStore
from stitchcuda.cli.application import (
    CoderKind,
    HarnessOpt,
    KernelBenchOpt,
    LevelOpt,
    MaxAutotuneOpt,
    ProblemOpt,
    Provider,
    WeightsOpt,
    app,
    named_tasks,
    unusable,
    usable_tasks,
)
from stitchcuda.cli.console import (
    LiveReporter,
    bench_view,
    optimize_summary_view,
)
from stitchcuda.cli.exits import EXIT_FAILED, EXIT_PASSED
from stitchcuda.cli.terminal import console
from stitchcuda.hints import NO_GPU
from stitchcuda.store import db_path
from stitchcuda.task.record import Task
from stitchcuda.verify.config import PRESETS, ToleranceName
from stitchcuda.verify.kernelbench_harness import harness_problem
from stitchcuda.verify.pool import default_gpus


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
    """Plan, write and verify an end-to-end CUDA program for REFERENCE, LLM-free or with --model; keep the best."""
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
        raise unusable(str(exc), exc.hints, json_out, exc.reasons) from None
    if json_out:
        print(json.dumps(summary, indent=1))
    else:
        console().print(optimize_summary_view(summary), soft_wrap=True)  # commands it suggests stay on one line, to be pasted
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
    max_autotune: MaxAutotuneOpt = False,
    skip_unusable: Annotated[bool, typer.Option(
        "--skip-unusable", help="Leave out tasks whose reference does not run (named on stderr) instead of "
                                "stopping.")] = False,
) -> None:
    """Run the system over a suite (one optimize run per task) or verify a folder of solutions; resumable."""
    jobs: list[tuple[Task, int | None, str | None]] = []
    if resume is not None:
        if not db_path(workspace).exists():
            raise unusable(f"cannot resume: no run store in {workspace} (pass the --workspace of the bench)",
                            json_out=json_out)
        store = BenchStore(workspace)
        try:
            bench_id = store.resolve(resume)
        except KeyError as exc:
            raise unusable(f"cannot resume: {exc.args[0]} in {workspace}", json_out=json_out) from None
        config = BenchConfig.model_validate_json(store.config_json(bench_id))
    else:
        found = usable_tasks(named_tasks(suite, kernelbench, level, None, json_out, checked=False), json_out,
                        skip=skip_unusable)
        if not found:
            raise unusable("no usable task is left", json_out=json_out)
        devices = ["cpu"] if gpus == "cpu" else [f"cuda:{g.strip()}" for g in gpus.split(",")] if gpus \
            else default_gpus()
        if not devices and ray is None:
            raise unusable("no GPU is visible here: a bench verifies its programs on GPUs", NO_GPU["bench"],
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
            raise unusable(str(exc), exc.hints, json_out) from None
        optimize.verify.compile_max_autotune = max_autotune
        if kernelbench_harness is not None:
            optimize.verify.kernelbench_harness = str(kernelbench_harness.expanduser().resolve())
            if why := harness_problem(kernelbench_harness):  # said up front too; the bench still runs
                console(stderr=True).print(Text(f"warning: --kernelbench-harness: {why}", style="yellow"))
        label = f"{kernelbench.name} level {level}" if kernelbench else suite
        config = BenchConfig(suite=label, optimize=optimize, evaluate=str(evaluate) if evaluate else None,
                             gpus=devices, ray=ray, runs_per_gpu=runs_per_gpu)
        if evaluate is not None:
            if not evaluate.is_dir():
                raise unusable(f"--evaluate {evaluate}: not a folder", json_out=json_out)
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
                          highlight=False, soft_wrap=True)

    try:
        result = run_bench(store, jobs, config, on_done=on_done, resume=resume)
    except (BenchError, SessionError) as exc:
        raise unusable(str(exc), getattr(exc, "hints", None), json_out) from None
    metrics = bench_metrics(result.tasks, result.info)
    if json_out:  # the metrics, and why each task that did not pass failed
        failures = [{"task": t.task, **t.failure.model_dump(),  # the detail is one line; every reason in full:
                     **({"reasons": _reasons(t.error)} if t.failure.kind == "no_candidate" and t.error else {})}
                    for t in result.tasks if t.failure is not None]
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
        raise unusable(f"no run store in {workspace} (pass the --workspace of the bench)")
    store = BenchStore(workspace)
    try:
        first = store.result(store.resolve(bench_id))
        other = store.result(store.resolve(compare)) if compare else None
    except KeyError as exc:
        raise unusable(f"no such bench: {exc.args[0]}") from None
    target = out or store.bench_dir(first.info.id) / "report"
    files = write_report(first, target, compare=other)
    console().print(f"wrote {files.html}\nwrote {files.markdown}", highlight=False)


def _reasons(error: str) -> list[str]:
    """The compiler's reasons, one each ("; " joins them); a task the Verifier found unusable is
    one reason, whatever its message holds."""
    return [error] if error.startswith("unusable task") else error.split("; ")
