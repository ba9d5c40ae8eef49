"""The bench report's plots, drawn with matplotlib and saved as SVG.

Figures are built with ``matplotlib.figure.Figure`` rather than pyplot: no backend is
selected, no global figure registry fills up, and nothing needs a display, so reports can be
written from a headless machine or a worker thread. matplotlib is imported inside each
function so that importing the bench package stays cheap.

Only successful tasks have a speedup here: a failed or hacked task is drawn as a gap, never as
0x, the same rule the metrics follow.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from stitchcuda.bench.metrics import GroupMetrics, measured_speedup, succeeded
from stitchcuda.bench.records import BASELINES, TaskResult
from stitchcuda.files import write_atomic
from stitchcuda.verify.stages import LABELS, STAGES

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BASELINE_COLORS = {
    "eager": "#4c72b0",
    "torch_compile": "#dd8452",
    "torch_compile_max_autotune": "#937860",
    "eager_tf32": "#55a868",
    "cuda_graph": "#c44e52",
    "best": "#8172b3",
}
ORIGIN_COLORS = {"own": "#2a9d8f", "library": "#e9c46a", "pytorch": "#e76f51", "unattributed": "#adb5bd"}
FAILED_LABEL_COLOR = "#999999"
# Small multiples beyond this many tasks make an unreadable, multi-megabyte SVG.
MAX_TIMELINE_TASKS = 40
MAX_LABEL_CHARS = 32


class Plot(BaseModel):
    id: str
    path: Path
    alt: str
    caption: str


def _label(text: str) -> str:
    # '$' would start mathtext and can make savefig raise on a task name.
    short = text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "…"
    return short.replace("$", r"\$")


def _save(fig: Figure, path: Path) -> Path:
    import matplotlib

    path.parent.mkdir(parents=True, exist_ok=True)
    # A fixed hash salt and no date keep the SVG identical for identical data.
    buffer = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "stitchcuda", "svg.fonttype": "path"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    write_atomic(path, buffer.getvalue())
    return path


def _speedup_axis(ax: Axes, values: list[float]) -> None:
    """Log axis with plain tick labels (2×, not 2×10^0) and room around the data and the 1.0 line."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    low, high = min([*values, 1.0]) / 1.3, max([*values, 1.0]) * 1.3
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    # Coarsest mantissas that still give three labels: a narrow range (0.9x to 1.2x) needs fine ones.
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.1, 1.2, 1.3, 1.5, 1.7, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [m * 10.0**e for e in range(-4, 5) for m in mantissas if low <= m * 10.0**e <= high]
        if len(ticks) >= 3:
            break
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}×"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _task_axis(ax: Axes, tasks: list[TaskResult]) -> None:
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels([_label(t.task) for t in tasks], rotation=60, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(tasks) - 0.4)
    for tick, task in zip(ax.get_xticklabels(), tasks, strict=True):
        if not succeeded(task):
            tick.set_color(FAILED_LABEL_COLOR)


def _width(n_tasks: int, per_task: float) -> float:
    return min(max(7.0, 1.5 + n_tasks * per_task), 60.0)


def speedup_per_task(tasks: list[TaskResult], path: Path) -> Plot | None:
    """Grouped bars, one group per task, one bar per baseline, drawn from 1.0x on a log axis."""
    from matplotlib.figure import Figure

    baselines = [b for b in BASELINES if any(succeeded(t) and measured_speedup(t, b) for t in tasks)]
    if not baselines:
        return None
    fig = Figure(figsize=(_width(len(tasks), 0.1 * len(baselines) + 0.15), 4.8), layout="constrained")
    ax = fig.add_subplot()
    bar_width = 0.8 / len(baselines)
    drawn: list[float] = []
    for i, baseline in enumerate(baselines):
        xs, bottoms, heights = [], [], []
        for x, task in enumerate(tasks):
            value = measured_speedup(task, baseline) if succeeded(task) else None
            if value is None:
                continue
            # Bars grow from 1.0x so slowdowns point down and speedups up.
            xs.append(x - 0.4 + bar_width * (i + 0.5))
            bottoms.append(min(1.0, value))
            heights.append(abs(value - 1.0) or 1e-3)
            drawn.append(value)
        ax.bar(xs, heights, bar_width, bottom=bottoms, color=BASELINE_COLORS.get(baseline), label=f"vs {baseline}")
    _speedup_axis(ax, drawn)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("speedup (log scale)")
    _task_axis(ax, tasks)
    ax.legend(fontsize=8, ncols=min(len(baselines), 5), loc="lower left", bbox_to_anchor=(0, 1.01), frameon=False)
    ax.grid(axis="y", which="both", alpha=0.25)
    _save(fig, path)
    n_missing = sum(1 for t in tasks if not succeeded(t))
    return Plot(
        id="plot-speedup",
        path=path,
        alt=f"Bar chart of the speedup of each of {len(tasks)} tasks against the baselines "
        f"{', '.join(baselines)}, on a log scale with a line at 1.0x; "
        f"{n_missing} tasks without a successful program have no bars.",
        caption="Speedup per task against each baseline (log scale; bars start at 1.0×). "
        "Grey task names did not succeed and have no bars.",
    )


def _sorted_curve(ax: Axes, tasks: list[TaskResult], label: str, style: str) -> list[float]:
    judged = [t for t in tasks if t.status != "pending"]
    values = sorted((s for t in judged if succeeded(t) and (s := measured_speedup(t, "eager"))), reverse=True)
    if not values:
        return []
    # x is the fraction of ALL judged tasks, so the curve ends at the success rate.
    xs = [(i + 1) / len(judged) for i in range(len(values))]
    ax.step([0.0, *xs], [values[0], *values], where="pre", linestyle=style, label=label)
    return values


def speedup_distribution(tasks: list[TaskResult], group: GroupMetrics, path: Path,
                         compare: list[TaskResult] | None = None) -> Plot | None:
    """Sorted speedups over eager against the fraction of tasks, with the fast_p points marked."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    drawn = _sorted_curve(ax, tasks, "this run", "-")
    if compare is not None:
        drawn += _sorted_curve(ax, compare, "compared run", "--")
    if not drawn:
        return None
    marks = [f.p for f in group.fast_p if f.baseline == "eager" and f.p > 0]
    _speedup_axis(ax, drawn + marks)
    ax.axhline(1.0, color="black", linewidth=0.8)
    for f in group.fast_p:
        if f.baseline != "eager" or f.p == 0 or f.fraction is None:
            continue
        ax.axhline(f.p, color="grey", linewidth=0.6, linestyle=":")
        ax.plot([f.fraction], [f.p], "o", color="black", markersize=4)
        # fast_1 and fast_1.05 sit almost on one line: put the 1.0 label under its point.
        ax.annotate(f"{f.key} = {f.fraction:.0%}", (f.fraction, f.p), xytext=(6, -11 if f.p == 1.0 else 4),
                    textcoords="offset points", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of all tasks (failed tasks count, with no speedup)")
    ax.set_ylabel("speedup over eager (log scale)")
    ax.grid(which="both", alpha=0.25)
    ax.legend(fontsize=8)
    _save(fig, path)
    marks = ", ".join(f"{f.key} {f.fraction:.0%}" for f in group.fast_p
                      if f.baseline == "eager" and f.fraction is not None)
    return Plot(
        id="plot-distribution",
        path=path,
        alt="Sorted speedups over eager against the fraction of all tasks, log scale, "
        f"with fast_p points marked: {marks}.",
        caption="Speedup over eager, sorted, against the fraction of all tasks; "
        "the curve ends at the success rate. Dots mark fast_p: the fraction of tasks faster than p.",
    )


def time_shares(tasks: list[TaskResult], path: Path) -> Plot | None:
    """Stacked bars of each task's GPU time split by kernel origin."""
    from matplotlib.figure import Figure

    if not any(t.origin_share for t in tasks):
        return None
    origins = [o for o in ORIGIN_COLORS if any(o in t.origin_share for t in tasks)]
    origins += sorted({o for t in tasks for o in t.origin_share} - set(origins))
    fig = Figure(figsize=(_width(len(tasks), 0.3), 4.5), layout="constrained")
    ax = fig.add_subplot()
    bottoms = [0.0] * len(tasks)
    for origin in origins:
        heights = [t.origin_share.get(origin, 0.0) if t.origin_share else 0.0 for t in tasks]
        ax.bar(range(len(tasks)), heights, 0.7, bottom=bottoms, color=ORIGIN_COLORS.get(origin), label=origin)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("share of GPU time")
    _task_axis(ax, tasks)
    ax.legend(fontsize=8, ncols=len(origins), loc="upper left", bbox_to_anchor=(0, 1.12))
    _save(fig, path)
    n_without = sum(1 for t in tasks if not t.origin_share)
    return Plot(
        id="plot-shares",
        path=path,
        alt=f"Stacked bars of each task's GPU time share by kernel origin ({', '.join(origins)}); "
        f"{n_without} tasks have no profile and no bar.",
        caption="Share of the best program's GPU time in its own kernels, library kernels (cuBLAS, cuDNN...) "
        "and PyTorch's kernels.",
    )


# a color per stage (verify/stages.py), grouped: compiling greens, builds brown, waiting grey, our
# verification blues, KernelBench purples
STAGE_COLORS = {"compile_wait": "#d9f0d3", "capture": "#1b7837", "lower": "#5aae61", "emit": "#a6dba0", "profile": "#e9c46a",
                "build": "#8c510a", "checks": "#dfc27d", "gpu_wait": "#bdbdbd", "spawn": "#c6dbef", "cuda_init": "#9ecae1",
                "reference": "#6baed6", "construct": "#5a9fd4", "correctness": "#4292c6", "weights_trial": "#2171b5",
                "fp64": "#08519c",
                "program_profile": "#f4a261", "baselines": "#e76f51", "timing": "#d62828", "ncu": "#6a040f",
                "kb_start": "#dadaeb", "kb_build": "#bcbddc", "kb_correctness": "#9e9ac8", "kb_timing": "#6a51a3",
                "other": "#f0f0f0"}


def stage_times(tasks: list[TaskResult], path: Path) -> Plot | None:
    """Stacked bars of each task's wall time by stage, from its file to its verdict."""
    from matplotlib.figure import Figure

    if not any(t.stages for t in tasks):
        return None
    used = [s for s in STAGES if any(t.stages.get(s, 0.0) > 0 for t in tasks)]
    fig = Figure(figsize=(_width(len(tasks), 0.3), 5.0), layout="constrained")
    ax = fig.add_subplot()
    bottoms = [0.0] * len(tasks)
    for stage in used:
        heights = [t.stages.get(stage, 0.0) for t in tasks]
        ax.bar(range(len(tasks)), heights, 0.7, bottom=bottoms, color=STAGE_COLORS.get(stage), label=LABELS[stage],
               edgecolor="#888888" if stage == "other" else None, linewidth=0.3)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("seconds")
    _task_axis(ax, tasks)
    ax.legend(fontsize=7, ncols=min(len(used), 6), loc="lower left", bbox_to_anchor=(0, 1.0))
    _save(fig, path)
    return Plot(
        id="plot-stages",
        path=path,
        alt=f"Stacked bars of each task's wall time by stage ({', '.join(LABELS[s] for s in used)}); "
        f"{sum(1 for t in tasks if not t.stages)} tasks recorded none.",
        caption="Where each task's wall time went, from its file to its verdict: compiling, building, waiting for "
        "the GPU, our verification's stages and KernelBench's. Stages of several verifications add up.",
    )


def attempts_timeline(tasks: list[TaskResult], path: Path) -> Plot | None:
    """Small multiples: each attempt's speedup over eager against time, with the best so far."""
    from matplotlib.figure import Figure

    with_attempts = [t for t in tasks if t.attempts]
    if not with_attempts:
        return None
    shown = sorted(with_attempts, key=lambda t: len(t.attempts), reverse=True)[:MAX_TIMELINE_TASKS]
    shown.sort(key=lambda t: tasks.index(t))
    ncols = min(4, len(shown))
    nrows = -(-len(shown) // ncols)
    fig = Figure(figsize=(3.2 * ncols, 2.4 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    for ax, task in zip(axes.flat, shown, strict=False):
        _draw_attempts(ax, task)
    fig.supxlabel("seconds since the run started", fontsize=9)
    fig.supylabel("speedup over eager (log scale)", fontsize=9)
    _save(fig, path)
    note = "" if len(shown) == len(with_attempts) else (
        f" Showing the {len(shown)} tasks with the most attempts of {len(with_attempts)}.")
    return Plot(
        id="plot-timeline",
        path=path,
        alt=f"Timelines of agent attempts for {len(shown)} tasks: each attempt's speedup over eager "
        "against seconds, with a step line of the best speedup so far.",
        caption="Agent attempts over time: dots are passing attempts, crosses at the bottom are attempts "
        "without a passing speedup, the step line is the best so far." + note,
    )


def _draw_attempts(ax: Axes, task: TaskResult) -> None:
    attempts = sorted(task.attempts, key=lambda a: a.seconds)
    passing = [(a.seconds, a.speedup_eager) for a in attempts
               if a.passed and a.speedup_eager is not None and a.speedup_eager > 0]
    failing = [a.seconds for a in attempts if not (a.passed and a.speedup_eager and a.speedup_eager > 0)]
    best_xs, best_ys, running = [], [], None
    for a in attempts:
        if a.passed and a.speedup_eager and a.speedup_eager > 0:
            running = max(running or 0.0, a.speedup_eager)
        best = a.best_so_far if a.best_so_far is not None else running
        if best is not None and best > 0:
            best_xs.append(a.seconds)
            best_ys.append(best)
    if best_xs:
        ax.step(best_xs, best_ys, where="post", color=BASELINE_COLORS["best"], linewidth=1.2)
    if passing:
        ax.plot([s for s, _ in passing], [v for _, v in passing], "o", color=BASELINE_COLORS["eager"], markersize=4)
    if failing:
        # Attempts without a speedup sit on the bottom edge, outside the data scale, not at 0x.
        ax.plot(failing, [0.02] * len(failing), "x", color="#c44e52", markersize=4,
                transform=ax.get_xaxis_transform(), clip_on=False)
    if passing or best_xs:
        _speedup_axis(ax, [v for _, v in passing] + best_ys)
        ax.axhline(1.0, color="black", linewidth=0.6)
    # from the run's start, so the time to the first attempt shows (one attempt alone would
    # otherwise sit on an axis a few seconds wide)
    ax.set_xlim(0, max([a.seconds * 1.08 for a in attempts] + [1.0]))
    ax.set_title(_label(task.task), fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.25)


def draw_all(tasks: list[TaskResult], group: GroupMetrics, plot_dir: Path,
             compare: list[TaskResult] | None = None) -> tuple[list[Plot], list[str]]:
    """Every plot the report shows, and a note for each one that had nothing to draw."""
    drawn: list[Plot] = []
    notes: list[str] = []
    for plot, missing in (
        (speedup_per_task(tasks, plot_dir / "speedup.svg"), "No task has a successful speedup to plot."),
        (speedup_distribution(tasks, group, plot_dir / "distribution.svg", compare),
         "No successful speedup over eager to plot a distribution of."),
        (time_shares(tasks, plot_dir / "shares.svg"), "No task has a GPU time profile (origin shares)."),
        (stage_times(tasks, plot_dir / "stages.svg"), "No task recorded its stage times."),
        (attempts_timeline(tasks, plot_dir / "timeline.svg"),
         "No task recorded agent attempts (an offline or --evaluate bench), so there is no timeline."),
    ):
        if plot is None:
            notes.append(missing)
        else:
            drawn.append(plot)
    return drawn, notes
