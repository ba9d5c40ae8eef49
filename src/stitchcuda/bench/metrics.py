"""Bench metrics: success, hacking and speedup statistics over a list of task results.

Conventions, made explicit because papers differ on them:

- A task *succeeds* when its best program passed (compiled, correct) and is not a total hack.
  ``hacking == "total"`` overrides ``passed``: a record that somehow says both is a failure.
- Tasks still ``pending`` have not been judged: they are left out of every rate and counted
  apart. Failed and unsupported tasks stay in the denominators: a suite that skips what it
  cannot do must not look better for it.
- The geometric mean over successful tasks is the KernelBench convention and the headline
  number. It cannot count a failed task (log 0), so it always reads together with the
  success rate; the mean over all tasks, with a failed task counted as 0x, is the one number
  that punishes failures.
- ``fast_p`` is the fraction of all (non-pending) tasks that succeed with a speedup above
  ``p``; ``fast_0`` is the success rate. ``p = 1.05`` guards against timing noise near 1.0x.
- A speedup is *measured* when it is a finite number above 0; anything else (a missing
  baseline, NaN from a broken timing) is treated as absent, never as a number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, Field

from stitchcuda.bench.records import BASELINES, BenchInfo, TaskResult
from stitchcuda.verify.stages import gpu_busy, total_stages

FAST_P_THRESHOLDS = (0.0, 1.0, 1.05, 1.5, 2.0)
FAST_P_BASELINES = ("eager", "best", "kernelbench")
SUITE_GROUP = "suite"


class SpeedupStats(BaseModel):
    """Speedup of the successful programs against one baseline."""

    baseline: str
    n_success: int = Field(description="successful tasks with a measured speedup against this baseline")
    mean_success: float | None = Field(None, description="arithmetic mean over those successful tasks")
    geomean_success: float | None = Field(
        None,
        description="geometric mean over those successful tasks (the KernelBench convention). "
        "The geomean over all tasks with failed ones excluded is this same number: "
        "a failed task has no speedup whose log could be taken.",
    )
    n_all: int = Field(
        description="tasks counted by mean_all: every non-pending task, except successful ones "
        "whose speedup against this baseline was not measured"
    )
    mean_all: float | None = Field(
        None,
        description="arithmetic mean over all non-pending tasks, a task that did not succeed counting 0x; "
        "None when no successful task measured this baseline",
    )


class FastP(BaseModel):
    """fast_p: how many of all tasks succeed with a speedup above p."""

    baseline: str
    p: float
    count: int = Field(description="successful tasks with speedup > p (for p = 0: all successful tasks)")
    fraction: float | None = Field(None, description="count over all non-pending tasks; None when there are none")

    @property
    def key(self) -> str:
        return f"fast_{self.p:g}"


class GroupMetrics(BaseModel):
    """The metrics of one group of tasks: the whole bench, or one KernelBench level."""

    name: str
    tasks: int = Field(description="non-pending tasks: the denominator of every rate")
    pending: int = Field(description="tasks not yet judged, excluded from all rates")
    succeeded: int = Field(description="passed and not a total hack")
    success_rate: float | None = Field(None, description="succeeded / tasks; None when tasks is 0")
    correct: int = Field(description="tasks whose best program was correct, hack or not")
    failed: int = Field(description="tasks with status 'failed' (the run itself failed)")
    unsupported: int = Field(description="tasks with status 'unsupported'")
    hacking_partial: int
    hacking_total: int
    speedup: dict[str, SpeedupStats] = Field(description="per baseline name (see BASELINES)")
    fast_p: list[FastP] = Field(description="per baseline in FAST_P_BASELINES and p in FAST_P_THRESHOLDS")

    def fast(self, baseline: str, p: float) -> FastP:
        return next(f for f in self.fast_p if f.baseline == baseline and f.p == p)


class Totals(BaseModel):
    """What the bench spent, summed over every task including pending ones (their spend is real)."""

    tokens: int = 0
    cost_usd: float = 0.0
    wall_s: float = Field(0.0, description="sum of per-task wall time; more than the bench's wall time when tasks ran in parallel")
    llm_calls: int = 0
    # the machinery: is the GPU kept busy, or does it wait for nvcc?
    verifications: int = 0
    build_s: float = Field(0.0, description="building candidates with the GPU hidden, summed (CPU time)")
    gpu_s: float = Field(0.0, description="verifications holding a GPU, summed")
    gpu_wait_s: float = Field(0.0, description="built candidates waiting for a GPU, summed")
    verified_per_gpu_hour: float | None = Field(None, description="verifications per hour of the bench's wall time "
                                                                  "and GPU; None before a wall time is known")
    gpu_busy: float | None = Field(None, description="share of the bench's wall time in which any stage used a GPU "
                                                     "(the union of the gate's intervals), averaged over its GPUs")
    gpu_busy_by_gpu: dict[str, float] = Field({}, description="the same share for each GPU (gpu0, gpu1, ...)")
    verify_phases_s: dict[str, float] = Field({}, description="where the verifications' wall time went, by phase, "
                                                              "summed over every task")
    stages_s: dict[str, float] = Field({}, description="where the tasks' wall time went, by stage "
                                                       "(verify/stages.py), summed over every task")
    builds: int = Field(0, description="extensions the verifications loaded or built")
    builds_cached: int = Field(0, description="of which the build cache already held")


class BenchMetrics(BaseModel):
    """Everything a report states about one bench, with the policy it was measured under."""

    bench_id: str
    suite: str
    coder: str
    tolerance: str = Field(description="the tolerance policy every verdict was judged under")
    weights: str = Field("seeded", description="how ModelNew got its parameters: seeded (KernelBench's convention) "
                                               "or copy")
    gpu: str
    overall: GroupMetrics
    levels: list[GroupMetrics] = Field(description="one group per KernelBench level; tasks without a level in 'suite'")
    totals: Totals
    bench_wall_s: float = Field(0.0, description="the bench's own wall time, from BenchInfo")


class MetricDelta(BaseModel):
    group: str
    metric: str = Field(description="a key of flatten()")
    a: float | None
    b: float | None
    delta: float | None = Field(None, description="b - a; None when either side is missing")


class MetricsComparison(BaseModel):
    a: str = Field(description="bench id of the first run")
    b: str = Field(description="bench id of the second run")
    deltas: list[MetricDelta]
    warnings: list[str] = Field([], description="why the two runs may not be comparable")

    def get(self, metric: str, group: str = "all") -> MetricDelta:
        return next(d for d in self.deltas if d.group == group and d.metric == metric)


def succeeded(task: TaskResult) -> bool:
    return task.passed and task.hacking != "total"


def measured_speedup(task: TaskResult, baseline: str) -> float | None:
    value = task.speedup.get(baseline)
    if value is None or not math.isfinite(value) or value <= 0:
        return None
    return value


def geomean(values: Iterable[float]) -> float | None:
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def speedup_stats(tasks: list[TaskResult], baseline: str) -> SpeedupStats:
    judged = [t for t in tasks if t.status != "pending"]
    successes = [s for t in judged if succeeded(t) and (s := measured_speedup(t, baseline)) is not None]
    # A successful task whose baseline was not measured is unknown, not 0x: leave it out.
    unknown = sum(1 for t in judged if succeeded(t) and measured_speedup(t, baseline) is None)
    n_all = len(judged) - unknown
    # A baseline no successful task measured (not run in this bench) has no mean over all either:
    # 0x would blame the coder for a missing measurement.
    never_measured = unknown > 0 and not successes
    return SpeedupStats(
        baseline=baseline,
        n_success=len(successes),
        mean_success=_mean(successes),
        geomean_success=geomean(successes),
        n_all=n_all,
        mean_all=sum(successes) / n_all if n_all and not never_measured else None,
    )


def fast_p(tasks: list[TaskResult], baseline: str, p: float) -> FastP:
    judged = [t for t in tasks if t.status != "pending"]
    if p == 0:
        # fast_0 is defined as the success rate, measured speedup or not.
        count = sum(1 for t in judged if succeeded(t))
    else:
        count = sum(1 for t in judged if succeeded(t) and (measured_speedup(t, baseline) or 0.0) > p)
    return FastP(baseline=baseline, p=p, count=count, fraction=count / len(judged) if judged else None)


def group_metrics(tasks: list[TaskResult], name: str = "all") -> GroupMetrics:
    judged = [t for t in tasks if t.status != "pending"]
    n_succeeded = sum(1 for t in judged if succeeded(t))
    return GroupMetrics(
        name=name,
        tasks=len(judged),
        pending=len(tasks) - len(judged),
        succeeded=n_succeeded,
        success_rate=n_succeeded / len(judged) if judged else None,
        correct=sum(1 for t in judged if t.correct),
        failed=sum(1 for t in judged if t.status == "failed"),
        unsupported=sum(1 for t in judged if t.status == "unsupported"),
        hacking_partial=sum(1 for t in judged if t.hacking == "partial"),
        hacking_total=sum(1 for t in judged if t.hacking == "total"),
        speedup={b: speedup_stats(tasks, b) for b in BASELINES},
        fast_p=[fast_p(tasks, b, p) for b in FAST_P_BASELINES for p in FAST_P_THRESHOLDS],
    )


def level_name(level: int | None) -> str:
    return SUITE_GROUP if level is None else f"level {level}"


def level_groups(tasks: list[TaskResult]) -> list[GroupMetrics]:
    levels = sorted({t.level for t in tasks}, key=lambda lv: (lv is None, lv or 0))
    return [group_metrics([t for t in tasks if t.level == lv], level_name(lv)) for lv in levels]


def totals(tasks: list[TaskResult], wall_s: float = 0.0, gpus: int = 1) -> Totals:
    """Sums over the tasks; with the bench's own wall time and GPU count, the machinery's rates."""
    made = Totals(
        tokens=sum(t.tokens for t in tasks),
        cost_usd=sum(t.cost_usd for t in tasks),
        wall_s=sum(t.wall_s for t in tasks),
        llm_calls=sum(t.llm_calls for t in tasks),
        verifications=sum(t.verifications for t in tasks),
        build_s=sum(t.build_s for t in tasks),
        gpu_s=sum(t.gpu_s for t in tasks),
        gpu_wait_s=sum(t.gpu_wait_s for t in tasks),
        verify_phases_s={phase: sum(t.verify_phases_s.get(phase, 0.0) for t in tasks)
                         for phase in dict.fromkeys(p for t in tasks for p in t.verify_phases_s)},
        stages_s=total_stages(t.stages for t in tasks) if any(t.stages for t in tasks) else {},
        builds=sum(t.builds for t in tasks),
        builds_cached=sum(t.builds_cached for t in tasks),
    )
    if wall_s > 0:
        gpu_seconds = wall_s * max(gpus, 1)
        made.verified_per_gpu_hour = made.verifications * 3600 / gpu_seconds
        intervals: dict[str, list[tuple[float, float]]] = {}
        for t in tasks:
            if t.device and t.gpu_intervals:
                intervals.setdefault(t.device, []).extend(t.gpu_intervals)
        made.gpu_busy_by_gpu = gpu_busy(intervals, wall_s)
        # benches stored before the gate's intervals: the GPU time held, over the GPUs' wall time
        made.gpu_busy = (sum(made.gpu_busy_by_gpu.values()) / max(gpus, 1) if made.gpu_busy_by_gpu
                         else made.gpu_s / gpu_seconds)
    return made


def bench_metrics(tasks: list[TaskResult], info: BenchInfo) -> BenchMetrics:
    return BenchMetrics(
        bench_id=info.id,
        suite=info.suite,
        coder=info.coder,
        tolerance=info.tolerance,
        weights=info.weights,
        gpu=info.gpu,
        overall=group_metrics(tasks),
        levels=level_groups(tasks),
        totals=totals(tasks, info.wall_s, len(info.gpus)),
        bench_wall_s=info.wall_s,
    )


def flatten(group: GroupMetrics) -> dict[str, float | None]:
    """One group's metrics as ordered ``key -> number``; the keys compare() and reports use."""
    flat: dict[str, float | None] = {
        "tasks": group.tasks,
        "pending": group.pending,
        "succeeded": group.succeeded,
        "success_rate": group.success_rate,
        "correct": group.correct,
        "failed": group.failed,
        "unsupported": group.unsupported,
        "hacking_partial": group.hacking_partial,
        "hacking_total": group.hacking_total,
    }
    for baseline, stats in group.speedup.items():
        flat[f"speedup.{baseline}.geomean_success"] = stats.geomean_success
        flat[f"speedup.{baseline}.mean_success"] = stats.mean_success
        flat[f"speedup.{baseline}.mean_all"] = stats.mean_all
    for f in group.fast_p:
        flat[f"{f.key}.{f.baseline}"] = f.fraction
    return flat


def flatten_totals(t: Totals) -> dict[str, float | None]:
    flat = {f"totals.{k}": v for k, v in t.model_dump(exclude={"verify_phases_s", "stages_s", "gpu_busy_by_gpu"}).items()}
    return (flat | {f"totals.verify_phase.{k}": v for k, v in t.verify_phases_s.items()}
            | {f"totals.stage.{k}": v for k, v in t.stages_s.items()}
            | {f"totals.gpu_busy.{k}": v for k, v in t.gpu_busy_by_gpu.items()})


def _deltas(group: str, a: dict[str, float | None], b: dict[str, float | None]) -> list[MetricDelta]:
    keys = list(a) + [k for k in b if k not in a]
    out = []
    for key in keys:
        va, vb = a.get(key), b.get(key)
        out.append(MetricDelta(group=group, metric=key, a=va, b=vb,
                               delta=None if va is None or vb is None else vb - va))
    return out


def compare(a: BenchMetrics, b: BenchMetrics) -> MetricsComparison:
    """Per-metric deltas ``b - a`` for the whole bench, each level present in either, and totals."""
    deltas = _deltas("all", flatten(a.overall), flatten(b.overall))
    levels_a = {g.name: g for g in a.levels}
    levels_b = {g.name: g for g in b.levels}
    for name in list(levels_a) + [n for n in levels_b if n not in levels_a]:
        flat_a = flatten(levels_a[name]) if name in levels_a else {}
        flat_b = flatten(levels_b[name]) if name in levels_b else {}
        deltas += _deltas(name, flat_a, flat_b)
    deltas += _deltas("totals", flatten_totals(a.totals), flatten_totals(b.totals))

    # Numbers from different policies or devices differ for reasons other than the coder.
    warnings = []
    if a.tolerance != b.tolerance:
        warnings.append(f"tolerance policies differ: {a.tolerance} in {a.bench_id}, {b.tolerance} in {b.bench_id}")
    if a.weights != b.weights:
        warnings.append(f"weight conventions differ: {a.weights} in {a.bench_id}, {b.weights} in {b.bench_id}")
    if a.gpu != b.gpu:
        warnings.append(f"GPUs differ: {a.gpu} in {a.bench_id}, {b.gpu} in {b.bench_id}")
    if a.suite != b.suite:
        warnings.append(f"suites differ: {a.suite} in {a.bench_id}, {b.suite} in {b.bench_id}")
    return MetricsComparison(a=a.bench_id, b=b.bench_id, deltas=deltas, warnings=warnings)
