"""`stitchcuda dataset build`, `train`, `runs`, `doctor` and `tasks`: the workspace, the machine, the tasks."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from stitchcuda import store_repair
from stitchcuda.cli.application import (
    KernelBenchOpt,
    LevelOpt,
    ProblemOpt,
    app,
    named_tasks,
    unusable,
)
from stitchcuda.cli.console import (
    doctor_view,
    run_view,
    runs_view,
    tasks_view,
)
from stitchcuda.cli.doctor import diagnose
from stitchcuda.cli.exits import EXIT_FAILED, EXIT_PASSED, EXIT_UNUSABLE
from stitchcuda.cli.terminal import console
from stitchcuda.rl.config import TrainConfig
from stitchcuda.rl.dataset import build_dataset
from stitchcuda.store import RunStore, db_path
from stitchcuda.task import TaskError
from stitchcuda.task.probe import check_references
from stitchcuda.verify.config import ToleranceName

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
        raise unusable("name runs (or all) and/or --tasks SPEC", json_out=json_out)
    if runs_ and not db_path(workspace).exists():
        raise unusable(f"no run store in {workspace} (pass the --workspace of the runs)", json_out=json_out)
    try:
        manifest = build_dataset(workspace, runs_ or [], out, tasks, eval_fraction,
                                 set(eval_tasks.split(",")) if eval_tasks else None, tolerance)
    except (KeyError, TaskError) as exc:
        raise unusable(str(exc.args[0] if isinstance(exc, KeyError) else exc), json_out=json_out) from None
    except ImportError:
        raise unusable("writing Parquet needs pyarrow: pip install 'stitchcuda[train]'", json_out=json_out) from None
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
        raise unusable(str(exc), json_out=json_out) from None
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
    check: Annotated[bool, typer.Option("--check", help="Run SQLite's integrity check of the run store.")] = False,
    repair: Annotated[bool, typer.Option("--repair", help="Recover a damaged run store: the damaged file is kept "
                                                          "beside it, every readable row goes into a new one.")] = False,
) -> None:
    """List the runs of a workspace, or show one: plan, steps, decisions, usage."""
    if not db_path(workspace).exists():
        raise unusable(f"no run store in {workspace} (runs are kept where `stitchcuda optimize` ran, "
                        "or pass --workspace)", json_out=json_out)
    if check or repair:
        _check_or_repair(workspace, repair, json_out)
        return
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
        raise unusable(f"no such run: {exc.args[0]}", json_out=json_out) from None
    state, plans, steps = store.load_state(run_id), store.plans(run_id), store.steps(run_id)
    if store.status(run_id) == "interrupted":
        resume = f"stitchcuda optimize --resume {shlex.quote(run_id)} --workspace {shlex.quote(str(workspace))}"
        state = state.model_copy(update={"status": "interrupted",
                                         "stop_reason": f"its process is gone; resume with: {resume}"})
    if json_out:
        print(json.dumps({"state": state.model_dump(), "plans": [p.model_dump() for p in plans],
                          "steps": [s.model_dump() for s in steps], "llm_calls": store.llm_calls(run_id)},
                         indent=1, default=str))
    else:
        console().print(run_view(state, plans, steps), soft_wrap=True)  # commands it suggests stay on one line, to be pasted


def _check_or_repair(workspace: Path, repair: bool, json_out: bool) -> None:
    found = store_repair.check(workspace)
    if not repair:
        if json_out:
            print(found.model_dump_json(indent=1))
        else:
            print(f"{found.path}: " + ("ok" if found.ok else "damaged\n  " + "\n  ".join(found.problems[:20])))
            if not found.ok:
                print(f"recover it with: stitchcuda runs --repair --workspace {shlex.quote(str(workspace))}")
        raise typer.Exit(EXIT_PASSED if found.ok else EXIT_FAILED)
    if found.ok:
        message = f"{found.path} passes SQLite's integrity check: nothing to repair"
        print(json.dumps({"repaired": False, "check": found.model_dump()}) if json_out else message)
        return
    done = store_repair.repair(workspace)
    if json_out:
        print(json.dumps({"repaired": True, **done.model_dump(), "runs": done.runs}, indent=1))
    else:
        print(f"repaired {done.path}: {done.runs} run(s) came back "
              f"({', '.join(f'{n} {t}' for t, n in done.rows.items() if n) or 'no readable rows'}); "
              f"the damaged file is kept as {done.damaged_copy}")


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
    found = named_tasks(spec, kernelbench, level, problem, json_out, checked=not check)
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


