"""Renders a bench result as a static HTML page and a Markdown summary, with SVG plots.

The page works opened straight from disk: CSS inline, plots as files beside it, programs
copied into ``programs/`` and linked relatively, and no script or font from the network. Its
one inline script counts the plots that loaded into ``<body data-loaded>``, so a headless
browser can check the page without anything injected into it.

Every number is formatted here, once, and shared by both templates; the templates only lay
it out. Task-supplied strings are escaped by Jinja's autoescape in HTML and by ``md_escape``
in Markdown.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from pydantic import BaseModel, Field

from stitchcuda.bench import plots as bench_plots
from stitchcuda.bench.metrics import (
    BenchMetrics,
    MetricsComparison,
    bench_metrics,
    flatten,
    flatten_totals,
    measured_speedup,
    succeeded,
)
from stitchcuda.bench.metrics import compare as compare_metrics  # write_report's argument takes the name
from stitchcuda.bench.records import BASELINES, BenchResult, TaskResult
from stitchcuda.files import copy_atomic, write_atomic
from stitchcuda.templating import environment
from stitchcuda.verify.stages import LABELS as STAGE_LABELS

TEMPLATES = Path(__file__).parent / "templates"
DASH = "–"
SHARE_ORIGINS = ("own", "library", "pytorch")
MAX_ERROR_CHARS = 300
PLOT_FILES = ("speedup.svg", "distribution.svg", "shares.svg", "timeline.svg")


class ReportFiles(BaseModel):
    html: Path
    markdown: Path
    plots: list[Path]
    programs: dict[str, Path] = {}


class SummaryRow(BaseModel):
    key: str
    label: str
    value: str
    other: str | None = None
    delta: str | None = None


class LevelRow(BaseModel):
    key: str
    label: str
    values: list[str]


class TaskRow(BaseModel):
    task: str
    level: str
    status: str
    compiled: str
    correct: str
    hacking: str
    arithmetic: str
    succeeded: bool
    speedup: dict[str, str]
    milliseconds: str
    shares: dict[str, str]
    tokens: str
    cost: str
    wall: str
    program_href: str | None
    why: str | None = Field(None, description="why nothing passed (TaskResult.why)")
    error: str | None = Field(None, description="why the run itself failed, where ``why`` does not say it")
    kernelbench: str = DASH
    kernelbench_disagrees: bool = False


class HarnessSummary(BaseModel):
    """How often KernelBench's own harness agreed with our verdicts (``--kernelbench-harness``)."""

    agree: int
    judged: int = 0
    not_judged: int = 0

    @property
    def line(self) -> str:
        text = f"KernelBench's harness agrees {self.agree}/{self.judged}"
        if self.judged > self.agree:
            text += f", disagrees on {self.judged - self.agree}"
        return text + (f"; {self.not_judged} not judged by it (see the task's cell)" if self.not_judged else "")


# --- formatting ------------------------------------------------------------------------------

def _kind(key: str) -> str:
    if key == "success_rate" or key.startswith("fast_"):
        return "rate"
    if key.startswith("speedup."):
        return "speedup"
    seconds = ("totals.wall_s", "totals.build_s", "totals.gpu_s", "totals.gpu_wait_s")
    if key.startswith(("totals.verify_phase.", "totals.stage.")):
        return "seconds"
    if key.startswith("totals.gpu_busy."):
        return "rate"
    return {"totals.cost_usd": "usd", "totals.gpu_busy": "rate", **dict.fromkeys(seconds, "seconds")}.get(key, "count")


def format_value(key: str, value: float | None) -> str:
    if value is None:
        return DASH
    kind = _kind(key)
    if kind == "rate":
        return f"{value:.1%}"
    if kind == "speedup":
        return f"{value:.2f}×"
    if kind == "usd":
        return f"${value:,.2f}"
    if kind == "seconds":
        return f"{value:,.0f} s"
    return f"{value:,.0f}"


def format_delta(key: str, delta: float | None) -> str:
    if delta is None:
        return DASH
    kind = _kind(key)
    if kind == "rate":
        return f"{delta * 100:+.1f} pp"
    if kind == "speedup":
        return f"{delta:+.2f}×"
    if kind == "usd":
        return f"{'+' if delta >= 0 else '-'}${abs(delta):,.2f}"
    if kind == "seconds":
        return f"{delta:+,.0f} s"
    return f"{delta:+,.0f}"


def metric_label(key: str) -> str:
    fixed = {
        "tasks": "tasks judged (denominator of every rate)",
        "pending": "tasks pending (not in any rate)",
        "succeeded": "succeeded (passed, not a total hack)",
        "success_rate": "success rate",
        "correct": "correct (hack or not)",
        "failed": "runs failed",
        "unsupported": "unsupported",
        "hacking_partial": "partial hacks",
        "hacking_total": "total hacks",
        "totals.tokens": "tokens",
        "totals.cost_usd": "cost",
        "totals.wall_s": "wall time, summed over tasks",
        "totals.llm_calls": "LLM calls",
        "totals.verifications": "candidates verified",
        "totals.build_s": "building, summed (CPU, GPU hidden)",
        "totals.gpu_s": "verifying, summed (GPU held)",
        "totals.gpu_wait_s": "built and waiting for the GPU, summed",
        "totals.verified_per_gpu_hour": "verified candidates per GPU-hour",
        "totals.gpu_busy": "GPU held by verifications (share of bench wall time x GPUs)",
        "totals.builds": "extensions built or loaded",
        "totals.builds_cached": "of them from the build cache",
    }
    if key in fixed:
        return fixed[key]
    if key.startswith("totals.stage."):
        return f"stage: {STAGE_LABELS.get(key.rsplit('.', 1)[1], key.rsplit('.', 1)[1])}, summed"
    if key.startswith("totals.gpu_busy."):
        return f"GPU busy, {key.rsplit('.', 1)[1]}"
    if key.startswith("totals.verify_phase."):
        return f"verifying: {key.rsplit('.', 1)[1].replace('_', ' ')}, summed"
    if key.startswith("speedup."):
        _, baseline, stat = key.split(".")
        return {
            "geomean_success": f"geomean speedup vs {baseline} (successful tasks)",
            "mean_success": f"mean speedup vs {baseline} (successful tasks)",
            "mean_all": f"mean speedup vs {baseline} (all tasks, failed = 0×)",
        }[stat]
    if key.startswith("fast_"):
        name, baseline = key.rsplit(".", 1)
        return f"{name} vs {baseline}"
    return key


def md_escape(text: object) -> str:
    """Escape a string for a Markdown table cell: no markup, no HTML, no broken rows."""
    s = " ".join(str(text).split())
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|#!{}$~])", r"\\\1", s)


# --- view model ------------------------------------------------------------------------------

def summary_rows(metrics: BenchMetrics, comparison: MetricsComparison | None = None) -> list[SummaryRow]:
    flat = {**flatten(metrics.overall), **flatten_totals(metrics.totals)}
    rows = []
    for key, value in flat.items():
        row = SummaryRow(key=key, label=metric_label(key), value=format_value(key, value))
        if comparison is not None:
            group = "totals" if key.startswith("totals.") else "all"
            d = comparison.get(key, group)
            # comparison is (compared run -> this run): a is the other, delta is this minus other.
            row.other = format_value(key, d.a)
            row.delta = format_delta(key, d.delta)
        rows.append(row)
    return rows


def level_rows(metrics: BenchMetrics) -> list[LevelRow]:
    """One row per metric, one value per level, in the order of ``metrics.levels``; none for a
    bench of a single level, whose breakdown would repeat the summary."""
    if len(metrics.levels) < 2:
        return []
    flats = [flatten(g) for g in metrics.levels]
    return [LevelRow(key=key, label=metric_label(key), values=[format_value(key, f.get(key)) for f in flats])
            for key in flats[0]]


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def task_row(task: TaskResult, program_href: str | None) -> TaskRow:
    ok = succeeded(task)
    speedup = {}
    for b in BASELINES:
        value = measured_speedup(task, b) if ok else None
        # Only a successful program's speedup is a claim; a failed or hacked one shows a dash.
        speedup[b] = DASH if value is None else f"{value:.2f}×"
    why = task.why
    # a run that failed (its LLM, say) after verdicts that failed too: both reasons are news
    error = task.error if task.status == "failed" and task.error and task.error not in (why or "") else None
    return TaskRow(
        task=task.task,
        level=DASH if task.level is None else str(task.level),
        status=task.status,
        compiled=_yes_no(task.compiled),
        correct=_yes_no(task.correct),
        hacking=task.hacking or DASH,
        arithmetic=task.arithmetic or DASH,
        succeeded=ok,
        speedup=speedup,
        milliseconds=DASH if task.milliseconds is None else f"{task.milliseconds:.3f}",
        shares={o: f"{task.origin_share[o]:.0%}" if o in task.origin_share else DASH for o in SHARE_ORIGINS},
        tokens=f"{task.tokens:,}",
        cost=f"${task.cost_usd:,.2f}",
        wall=f"{task.wall_s:,.0f} s",
        program_href=program_href,
        why=_cut(why),
        error=_cut(error),
        kernelbench=_opinion_cell(task),
        kernelbench_disagrees=task.second_opinion is not None and task.second_opinion.agrees is False,
    )


def _cut(text: str | None) -> str | None:
    return text[: MAX_ERROR_CHARS - 1] + "…" if text and len(text) > MAX_ERROR_CHARS else text


def _opinion_cell(task: TaskResult) -> str:
    o = task.second_opinion
    if o is None:
        return DASH
    if o.error is not None:
        return f"not judged: {o.error[:MAX_ERROR_CHARS]}"
    if not o.judgeable:
        return (f"not judgeable: {o.failed_control} misses its true-fp32 reference too, its tolerance is below "
                "that reference's own rounding spread here")
    text = "correct" if o.correct else "INCORRECT" if o.compiled else "INCORRECT (did not compile)"
    if o.correct_true_fp32:
        text += " (correct against a true-fp32 reference: its own runs cuDNN in TF32)"
    elif o.correct_v01 is not None:
        text += f" at its fp32 1e-4 ({'correct' if o.correct_v01 else 'incorrect too'} at its v0.1 tolerance 1e-2)"
    if o.speedup is not None:
        text += f"; its speedup {o.speedup:.2f}x" + (" (timed apart)" if o.timed_apart else "")
    return text + (" – DISAGREES" if o.agrees is False else "")


def harness_summary(tasks: list[TaskResult]) -> HarnessSummary | None:
    """None when the bench ran without KernelBench's harness: its report then has no such column."""
    opinions = [t.second_opinion for t in tasks if t.second_opinion is not None]
    if not opinions:
        return None
    judged = [o for o in opinions if o.agrees is not None]
    return HarnessSummary(agree=sum(bool(o.agrees) for o in judged), judged=len(judged),
                          not_judged=len(opinions) - len(judged))


def _safe_stem(name: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return stem or "task"


def copy_programs(tasks: list[TaskResult], programs_dir: Path) -> dict[str, Path]:
    """Copy each task's best program to ``programs_dir/<task>.<ext>``; tasks are keyed by name."""
    copied: dict[str, Path] = {}
    used: set[str] = set()
    for task in tasks:
        if not task.program:
            continue
        source = Path(task.program).expanduser()
        if not source.is_file():
            continue
        stem = _safe_stem(task.task)
        suffix = source.suffix or ".py"
        name, n = f"{stem}{suffix}", 2
        # Task names that differ only in characters we replace must not overwrite each other.
        while name in used:
            name, n = f"{stem}-{n}{suffix}", n + 1
        used.add(name)
        programs_dir.mkdir(parents=True, exist_ok=True)
        target = programs_dir / name
        copy_atomic(source, target)
        copied[task.task] = target
    return copied


def _when(timestamp: float) -> str:
    if not timestamp:
        return DASH
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


# --- rendering -------------------------------------------------------------------------------

def write_report(result: BenchResult, out_dir: Path, compare: BenchResult | None = None) -> ReportFiles:
    """Write ``index.html``, ``summary.md``, ``plots/*.svg`` and ``programs/`` into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_dir = out_dir / "plots"
    # A plot with nothing to draw this time must not leave last report's file looking current.
    for name in PLOT_FILES:
        (plot_dir / name).unlink(missing_ok=True)

    metrics = bench_metrics(result.tasks, result.info)
    other = bench_metrics(compare.tasks, compare.info) if compare is not None else None
    comparison = compare_metrics(other, metrics) if other is not None else None

    programs = copy_programs(result.tasks, out_dir / "programs")
    drawn, plot_notes = bench_plots.draw_all(result.tasks, metrics.overall, plot_dir,
                                             compare.tasks if compare is not None else None)
    rows = [task_row(t, quote(programs[t.task].relative_to(out_dir).as_posix()) if t.task in programs else None)
            for t in result.tasks]
    values = dict(
        info=result.info,
        other_info=compare.info if compare is not None else None,
        metrics=metrics,
        comparison=comparison,
        summary=summary_rows(metrics, comparison),
        level_names=[g.name for g in metrics.levels],
        levels=level_rows(metrics),
        tasks=rows,
        harness=harness_summary(result.tasks),
        baselines=[b for b in BASELINES if any(b in t.speedup for t in result.tasks)],  # those it measured
        share_origins=SHARE_ORIGINS,
        plots=[{"id": p.id, "src": p.path.relative_to(out_dir).as_posix(), "alt": p.alt, "caption": p.caption}
               for p in drawn],
        plot_notes=plot_notes,
        created=_when(result.info.created),
        generated=datetime.now(tz=UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )
    html = out_dir / "index.html"
    markdown = out_dir / "summary.md"
    env = environment(TEMPLATES, md=md_escape)
    write_atomic(html, env.get_template("report.html.j2").render(**values))
    write_atomic(markdown, env.get_template("summary.md.j2").render(**values))
    return ReportFiles(html=html, markdown=markdown, plots=[p.path for p in drawn], programs=programs)
