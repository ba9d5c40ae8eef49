"""The ``stitchcuda`` application and what its commands share: exit codes (``exits.py``), options,
and the one way a command says its input is unusable (a message, with hints; JSON with ``--json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.text import Text

from stitchcuda.cli.exits import EXIT_UNUSABLE
from stitchcuda.cli.terminal import console
from stitchcuda.hints import BENCH_SKIP_UNUSABLE, TASKS_CHECK, Hint, render
from stitchcuda.task import TaskError, resolve_tasks
from stitchcuda.task.probe import check_references
from stitchcuda.task.record import Task
from stitchcuda.verify.config import WeightsConvention

Provider = Literal["openai", "anthropic", "hf"]
CoderKind = Literal["llm", "offline"]


def _flags_take_no_value() -> None:
    """Typer's rich help prints every option's type, flags included (``--json <bool>``), which reads
    as if the flag took a value; its plain help leaves flags bare. Show flags bare in both. (Typer
    before 0.29 has no such method and prints no types: nothing to change.)"""
    from typer.core import TyperOption

    typed = getattr(TyperOption, "display_type_rich", None)
    if typed is None:
        return

    def display_type_rich(self, ctx):  # type: ignore[no-untyped-def]
        return None if self.is_flag and not self.count else typed(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()

app = typer.Typer(
    name="stitchcuda",
    help="Turn a PyTorch program into a faster, verified end-to-end CUDA program.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from stitchcuda import __version__

        print(f"stitchcuda {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Turn a PyTorch program into a faster, verified end-to-end CUDA program."""


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
MaxAutotuneOpt = Annotated[bool, typer.Option(
    "--max-autotune", help="Also time torch.compile(mode='max-autotune') as a baseline: minutes to compile, so cut "
    "at 300 s (then named over its limit) and cached per task and GPU.")]
WeightsOpt = Annotated[WeightsConvention, typer.Option(
    help="seeded: ModelNew built under the reference's seed, nothing copied (KernelBench's convention); "
         "copy: the reference's state_dict loaded into ModelNew, to verify against given weights.")]


def unusable(message: str, hints: list[Hint] | None = None, json_out: bool = False,
             reasons: list[str] | None = None) -> typer.Exit:
    """Exit 2 with ``message`` (and what to try instead): on stderr, or as a JSON error on stdout
    with ``--json``, so a script reading stdout always gets JSON. ``reasons``: every reason in full
    where ``message`` summarises several (all of them in the JSON, their count on the terminal)."""
    hints = hints or []
    if json_out:
        print(json.dumps({"error": message, "exit_code": EXIT_UNUSABLE, "reasons": reasons or [message],
                          "hints": [h.model_dump() for h in hints]}, indent=1))
    else:
        text = Text("error: ", style="bold red")
        more = f"\n({len(reasons)} reasons in all; --json lists every one)" if reasons and len(reasons) > 1 else ""
        text.append(message + more + render(hints))
        console(stderr=True).print(text, highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_UNUSABLE)


def named_tasks(spec: str | None, kernelbench: Path | None, level: int | None, problem: int | None,
           json_out: bool = False, checked: bool = True) -> list[Task]:
    """The tasks ``spec`` names. ``checked=False`` keeps files that do not parse, for a caller that
    checks every reference itself and names each unusable one (bench, ``tasks --check``)."""
    source = str(kernelbench) if kernelbench is not None else spec
    if source is None:
        raise unusable("name a task (file, folder, bundled name) or pass --kernelbench PATH --level N",
                        json_out=json_out)
    if kernelbench is not None and not kernelbench.expanduser().exists():
        raise unusable(f"--kernelbench {kernelbench}: no such file or folder (give a KernelBench checkout or "
                        "its parquet file)", json_out=json_out)
    try:
        return resolve_tasks(source, level, problem, checked=checked)
    except TaskError as exc:
        raise unusable(str(exc), json_out=json_out) from None


def one_task(tasks: list[Task], json_out: bool) -> Task:
    if len(tasks) != 1:
        raise unusable(f"{len(tasks)} tasks match; narrow it to one with --problem ID", json_out=json_out)
    return tasks[0]


def usable_tasks(tasks: list[Task], json_out: bool, skip: bool = False) -> list[Task]:
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
        raise unusable(head + "\n".join(problems), hints=[BENCH_SKIP_UNUSABLE, TASKS_CHECK] if many else [],
                        json_out=json_out)
    for problem in problems:
        console(stderr=True).print(Text(f"skipped: {problem}", style="yellow"), soft_wrap=True)
    return [t for t, c in zip(tasks, checks, strict=True) if c.ok]


