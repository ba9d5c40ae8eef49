"""The ``stitchcuda`` command.

Exit codes are part of the interface: 0 success (for ``verify``: the candidate passed),
1 a negative result (``verify``: it did not pass; ``doctor``: a check failed), 2 unusable
arguments or tasks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from stitchcuda.task import TaskError, load_candidate, resolve_tasks
from stitchcuda.task.record import Task
from stitchcuda.verify.config import PRESETS, ToleranceName

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


def _unusable(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_UNUSABLE)


def _tasks(spec: str | None, kernelbench: Path | None, level: int | None, problem: int | None) -> list[Task]:
    source = str(kernelbench) if kernelbench is not None else spec
    if source is None:
        raise _unusable("name a task (file, folder, bundled name) or pass --kernelbench PATH --level N")
    try:
        return resolve_tasks(source, level, problem)
    except TaskError as exc:
        raise _unusable(str(exc)) from None


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
) -> None:
    """Build, check and time CANDIDATE against REFERENCE in a fresh worker process."""
    from stitchcuda.console import verdict_view
    from stitchcuda.verify import DeviceUnavailable, Verifier

    if kernelbench is not None and candidate is None:
        reference, candidate = "", Path(reference)  # `verify --kernelbench KB --level 1 --problem 3 CAND`
    if candidate is None:
        raise _unusable("missing CANDIDATE: stitchcuda verify REFERENCE CANDIDATE")
    if preset not in PRESETS:
        raise _unusable(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    tasks = _tasks(reference or None, kernelbench, level, problem)
    if len(tasks) != 1:
        raise _unusable(f"{len(tasks)} tasks match; narrow it to one (--level N --problem ID)")
    try:
        cand = load_candidate(candidate)
    except TaskError as exc:
        raise _unusable(str(exc)) from None

    updates: dict = {"tolerance": tolerance}
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
    config = PRESETS[preset].model_copy(update=updates)

    verifier = Verifier(config)
    if static_only:
        verdict = verifier.verify_static(tasks[0], cand)
    else:
        try:
            verifier.require_device()
        except DeviceUnavailable as exc:
            raise _unusable(str(exc)) from None
        with Console(stderr=True).status("starting the worker") as status:
            verdict = verifier.verify(tasks[0], cand, on_phase=lambda p: status.update(f"verifying: {p}"))
    if json_out:
        print(verdict.model_dump_json(indent=1))
    else:
        Console().print(verdict_view(verdict))
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
    from stitchcuda.console import profile_view
    from stitchcuda.verify import DeviceUnavailable, Verifier, VerifyConfig

    tasks = _tasks(reference, kernelbench, level, problem)
    if len(tasks) != 1:
        raise _unusable(f"{len(tasks)} tasks match; narrow it to one (--level N --problem ID)")
    verifier = Verifier(VerifyConfig(device=device))
    try:
        verifier.require_device()
    except DeviceUnavailable as exc:
        raise _unusable(str(exc)) from None
    with Console(stderr=True).status(f"profiling {tasks[0].name}"):
        result = verifier.profile(tasks[0])
    if result.reference_error or result.crash or result.reference_profile is None:
        why = result.reference_error or (result.crash.message if result.crash else "; ".join(result.errors))
        raise _unusable(f"the reference could not be profiled: {why}")
    if json_out:
        print(result.reference_profile.model_dump_json(indent=1))
    else:
        Console().print(profile_view(tasks[0].name, result.reference_profile))


@app.command()
def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    no_ncu_probe: Annotated[bool, typer.Option("--no-ncu-probe", help="Skip profiling a probe kernel.")] = False,
) -> None:
    """What this machine can do: GPU, nvcc, torch, ncu counters, build cache; each problem with its fix."""
    from stitchcuda.console import doctor_view
    from stitchcuda.doctor import diagnose

    with Console(stderr=True).status("checking the machine"):
        report = diagnose(probe_ncu=not no_ncu_probe)
    if json_out:
        print(report.model_dump_json(indent=1))
    else:
        Console().print(doctor_view(report))
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
    from stitchcuda.console import tasks_view
    from stitchcuda.task import probe_reference

    found = _tasks(spec, kernelbench, level, problem)
    problems: dict[str, str] = {}
    if check:
        for t in found:
            try:
                probe_reference(t.source, label=t.name)
            except TaskError as exc:
                problems[t.name] = str(exc)
    if json_out:
        import json

        rows = [t.model_dump() | {"sha256": t.sha256} | ({"problem": problems.get(t.name)} if check else {})
                for t in found]
        print(json.dumps(rows, indent=1))
    else:
        Console().print(tasks_view(found, problems if check else None))
    raise typer.Exit(EXIT_UNUSABLE if problems else EXIT_PASSED)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
