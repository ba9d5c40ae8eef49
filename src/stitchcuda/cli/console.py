"""Human-readable views of our records for the terminal (Rich). The JSON views are the records."""

from __future__ import annotations

import contextlib
import shlex

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from stitchcuda.cli.doctor import DoctorReport
from stitchcuda.cli.terminal import console
from stitchcuda.task.record import Task
from stitchcuda.verify.crash import readable_tail
from stitchcuda.verify.stages import LABELS
from stitchcuda.verify.verdict import ProgramProfile, Verdict

_STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def _names(names: list[str], shown: int = 4) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _yes_no(value: bool) -> Text:
    return Text("yes", style="green") if value else Text("no", style="bold red")


def verdict_view(v: Verdict) -> Group:
    if v.static_only:
        style = {"none": "green", "partial": "yellow", "total": "bold red"}[v.hacking.level]
        headline = Text(f"STATIC CHECKS ONLY (nothing built or run): hacking level {v.hacking.level}", style=style)
    elif v.reference_error:
        headline = Text("UNUSABLE TASK: " + v.reference_error.strip().splitlines()[0][:300], style="bold red")
    elif v.passed:
        headline = Text("PASSED", style="bold green")
    else:
        headline = Text("FAILED", style="bold red")
    summary = Table.grid(padding=(0, 2))
    summary.add_row("task", v.task.name, "candidate", v.candidate.path or v.candidate.name)
    if v.static_only:  # nothing was built or run: neither a yes nor a no
        summary.add_row("compiled", Text("not built", style="dim"), "correct", Text("not run", style="dim"))
    else:
        summary.add_row("compiled", _yes_no(v.compiled), "correct", _yes_no(v.correct))
    hack_style = {"none": "green", "partial": "yellow", "total": "bold red"}[v.hacking.level]
    summary.add_row("hacking", Text(v.hacking.level, style=hack_style), "tolerance",
                    f"{v.tolerance.name} (fp32 atol/rtol {v.tolerance.fp32_atol:g})")
    summary.add_row("device", v.device.name, "precision", v.precision.summary)
    summary.add_row("weights", _WEIGHTS.get(v.correctness.weights, v.correctness.weights),
                    "arithmetic", v.precision.arithmetic or "unknown")
    if v.correctness.state:
        summary.add_row("state", Text(_names(v.correctness.state) + ": one sequence of calls from one starting "
                                      "state; saved and restored around profiling, timing and the post-timing trial",
                                      overflow="fold"))
    if v.correctness.random_draws is not None:
        d = v.correctness.random_draws
        summary.add_row("random", f"the reference draws random numbers; seeds {d.seeds[0]} and {d.seeds[1]} agree "
                                  f"within the tolerance (max abs {d.max_abs_difference or 0:.2g})")
    w = v.correctness.weights_follow
    if w is not None:
        text = (Text("skipped: " + w.skipped, style="dim") if not w.ran else Text(
            f"same perturbed state_dict loaded into both between two calls (it moved the reference's output by "
            f"{_num(w.output_moved)}): {'followed' if w.passed else 'stale' if w.stale else 'wrong'}, max abs "
            f"{_num(w.max_abs_error)}", style="green" if w.passed else "bold red"))
        text.overflow = "fold"
        summary.add_row("new weights", text)
    if v.estimate is not None:
        e = v.estimate
        measured = [f"library kernels {e.measured_library_ms:.3f} ms" if e.measured_library_ms is not None else "",
                    f"forward {e.measured_forward_ms:.3f} ms" if e.measured_forward_ms is not None else ""]
        measured_text = "; measured: " + ", ".join(m for m in measured if m) if any(measured) else ""
        paths = ", ".join(f"{k} {n}" for k, n in e.paths.items())
        summary.add_row("estimate", Text(f"cost model ({e.table} table{', assumed' if e.assumed else ''}): "
                                         f"{e.operators} products and convolutions {e.ms:.3f} ms ({paths})"
                                         + measured_text, overflow="fold"))
    parts: list = [headline, summary]
    if v.second_opinion is not None:
        parts.extend(second_opinion_view(v))

    if v.errors:
        parts.append(Text("\n".join(f"- {e}" for e in v.errors), style="red"))
    if v.crash and v.crash.output_tail.strip():  # the whole tail stays in --json
        readable = readable_tail(v.crash.output_tail, v.candidate.path or v.candidate.name)
        tail = "\n".join(readable.strip().splitlines()[-15:])
        parts.append(Panel(Text(tail), title=f"output tail ({v.crash.kind})", border_style="red"))

    if v.correctness.trials:
        trials = Table(title="correctness", title_justify="left")
        for col in ("trial", "inputs", "order", "ok", "max abs", "max rel", "rel L2"):
            trials.add_column(col)
        for t in v.correctness.trials:
            trials.add_row(str(t.index), t.distribution, t.order, _yes_no(t.passed),
                           _num(t.max_abs_error), _num(t.max_rel_error), _num(t.rel_l2_error))
        parts.append(trials)
        for t in v.correctness.trials:
            if t.conditioning is not None:
                c = t.conditioning
                parts.append(Text(
                    f"trial {t.index}: the fp32 reference itself misses its fp64 value by {c.reference_max_abs:.3g} "
                    f"(rel L2 {c.reference_rel_l2:.2g}), beyond the tolerance; judged against fp64 the candidate "
                    f"misses by {c.candidate_max_abs:.3g} (rel L2 {c.candidate_rel_l2:.2g}): "
                    f"{'within' if c.passed else 'beyond'} {c.factor:g}x the reference's own error",
                    style="green" if c.passed else "red"))

    if v.timing:
        timing = Table(title=f"timing ({v.timing.method})", title_justify="left")
        for col in ("program", "median ms", "spread %", "trials", "speedup"):
            timing.add_column(col, justify="right" if col != "program" else "left")
        c = v.timing.candidate
        timing.add_row("candidate", f"{c.median_ms:.4f}", f"{c.spread_pct:.1f}", str(c.trials), "")
        for name, b in v.timing.baselines.items():
            label = name + (f" as {b.mode}" if b.mode else "") + (" (cached)" if b.cached else "")
            if b.stats:
                timing.add_row(label, f"{b.stats.median_ms:.4f}", f"{b.stats.spread_pct:.1f}", str(b.stats.trials),
                               f"{v.speedup.get(name, 0):.2f}x")
            else:
                timing.add_row(label, "-", "-", "-", Text(b.error or "not measured", style="yellow"))
        if "best" in v.speedup:
            timing.add_row("best baseline", "", "", "", Text(f"{v.speedup['best']:.2f}x", style="bold"))
        parts.append(timing)

    kernels = [(ext, k) for ext in v.build.extensions for k in ext.kernels]
    if v.build.extensions:
        build = Table(title=f"build ({v.build.seconds:.1f} s, {'cached' if v.build.cache_hit else 'compiled'})",
                      title_justify="left")
        for col in ("kernel", "regs", "spill B", "smem B", "stack B"):
            build.add_column(col)
        for _, k in kernels:
            build.add_row(k.kernel[:60], str(k.registers), str(k.spill_stores_bytes + k.spill_loads_bytes),
                          str(k.shared_bytes), str(k.stack_frame_bytes))
        if kernels:
            parts.append(build)
    if v.profile:
        p = v.profile
        shares = ", ".join(f"{k} {s:.0%}" for k, s in p.origin_share.items())
        coverage = f", operator coverage {v.hacking.operator_coverage:.0%}" if v.hacking.operator_coverage is not None else ""
        parts.append(Text(f"profile: GPU time {shares}{coverage}; {p.launches} launches, idle {p.idle_share:.0%}",
                          style="dim"))
    if v.counters.kernels:
        counters = Table(title=f"Nsight Compute ({v.counters.seconds:.0f} s)", title_justify="left")
        for col in ("kernel", "origin", "us", "SM %", "mem %", "DRAM %", "occ %", "regs", "bound"):
            counters.add_column(col)
        for k in v.counters.kernels:
            counters.add_row(k.name[:50], k.origin, f"{k.duration_us:.0f}", f"{k.sm_pct:.0f}", f"{k.memory_pct:.0f}",
                             f"{k.dram_pct:.0f}", f"{k.occupancy_pct:.0f}" if k.occupancy_pct is not None else "-", str(k.registers or "-"), k.label)
        parts.append(counters)
    elif v.counters.status != "not_requested":
        parts.append(Text(f"ncu {v.counters.status}: {v.counters.detail}", style="yellow"))
    if v.counters.estimate:
        parts.append(Text(f"estimate: {v.counters.estimate}", style="dim"))
    if v.feedback:
        # Text, not markup: compiler output quotes source such as `x[i]`, which Rich would eat as a tag
        parts.append(Panel(Text(v.feedback), title="feedback", border_style="cyan"))
    w = v.wall
    split = ", ".join(f"{name.replace('_', ' ')} {s:.1f}" for name, s in w.split().items() if s or name != "ncu")
    parts.append(Text(f"wall {w.total_s:.1f} s{' (worker started ahead)' if w.warm_start else ''}: {split}",
                      style="dim"))
    return Group(*parts)


def second_opinion_view(v: Verdict) -> list[Text]:
    """KernelBench's harness beside our verdict; a disagreement stands out, never blends in."""
    o = v.second_opinion
    if o is None:
        return []
    if o.error is not None:
        return [Text(f"KernelBench harness: could not judge ({o.error})", style="yellow")]
    if o.correct:
        line = Text("KernelBench harness: correct", style="green")
        line.append(f" ({o.runtime_ms:.4f} ms mean, {o.seconds:.0f} s)" if o.runtime_ms else f" ({o.seconds:.0f} s)",
                    style="dim")
    else:
        why = "did not compile" if not o.compiled else (o.detail or "outputs differ")
        line = Text(f"KernelBench harness: INCORRECT ({why[:300]})", style="red")
    parts = [line]
    if o.correct_true_fp32 is not None:
        parts.append(Text("  against a true-fp32 reference (its own runs cuDNN convolutions in TF32): "
                          + ("correct" if o.correct_true_fp32 else "incorrect too"),
                          style="yellow" if o.correct_true_fp32 else "red"))
    if o.correct_v01 is not None:
        parts.append(Text("  at its v0/v0.1 fp32 tolerance 1e-2 (published results; it now takes 1e-4, which TF32 "
                          "and bf16 miss): " + ("correct" if o.correct_v01 else "incorrect too"),
                          style="yellow" if o.correct_v01 else "red"))
    for value, what in ((o.reordered_correct, "the reference itself run channels-last in fp32"),
                        (o.exact_correct, "the exact answer (the reference in float64, rounded to float32)")):
        if value is not None:
            parts.append(Text(f"  {what}, against its true-fp32 reference: " + ("correct" if value else "incorrect too"),
                              style="yellow"))
    if not o.judgeable:
        parts.append(Text(f"  not judgeable: {o.failed_control} missed by at least a quarter of the program's miss; "
                          "its tolerance is below its fp32 reference's own rounding spread on this task, so its "
                          "verdict says nothing of the program", style="yellow"))
    if o.speedup is not None:
        ours = v.speedup.get("eager")
        parts.append(Text(f"  KernelBench's speedup {o.speedup:.2f}x (its reference {o.ref_runtime_ms:.4f} ms under "
                          f"torch's default flags, the program {o.runtime_ms:.4f} ms"
                          + (", timed by its timing function after it judged the program wrong: its eval times "
                             "nothing then" if o.timed_apart else ", timed in its eval")
                          + ")" + (f"; ours over eager fp32 {ours:.2f}x" if ours else ""),
                          style="bold" if o.speedup >= 1 else "yellow"))
    if o.agrees is False:
        ours, theirs = ("pass", "fails") if v.correct else ("fail", "passes")
        parts.append(Text(f"DISAGREES: we {ours}, KernelBench {theirs} (correctness)", style="bold red"))
    return parts


def profile_view(name: str, p: ProgramProfile) -> Group:
    parts: list = [Text(f"profile of {name}: {p.gpu_time_us / 1e3:.3f} ms of GPU time, {p.launches} kernel "
                        f"launches, GPU idle {p.idle_share:.0%} of the {p.window_us / 1e3:.3f} ms window, "
                        f"{sum(p.copies.values())} copies, {p.syncs} syncs", style="bold")]
    for title, rows in (("operators", p.ops), ("modules", p.modules)):
        if rows:
            table = Table(title=title, title_justify="left")
            for col in ("name", "GPU us", "share", "calls", "kernels", "shapes"):
                table.add_column(col, overflow="fold")
            for r in rows:
                table.add_row(r.name, f"{r.gpu_us:.0f}", f"{r.share:.1%}", str(r.calls), str(r.kernels),
                              "; ".join(r.shapes)[:80])
            parts.append(table)
    if p.kernels:
        table = Table(title="kernels", title_justify="left")
        for col in ("kernel", "origin", "GPU us", "share", "calls"):
            table.add_column(col, overflow="fold")
        for k in p.kernels:
            table.add_row(k.name[:80], k.origin, f"{k.total_us:.0f}", f"{k.share:.1%}", str(k.calls))
        parts.append(table)
    if p.roofline:
        r = p.roofline
        parts.append(Text(
            f"roofline: {r.flops / 1e9:.2f} GFLOP, {r.min_bytes / 2**20:.1f} MiB minimum traffic; floor "
            f"{r.floor_ms:.4f} ms (compute {r.compute_floor_ms:.4f} at {max(r.peaks.fp32_tflops, r.peaks.tf32_tflops, r.peaks.bf16_tflops):.0f} "
            f"TFLOP/s, memory {r.memory_floor_ms:.4f} at {r.peaks.copy_gbps:.0f} GB/s); measured peaks fp32 "
            f"{r.peaks.fp32_tflops:.0f}, tf32 {r.peaks.tf32_tflops:.0f}, bf16 {r.peaks.bf16_tflops:.0f} TFLOP/s"
            + (f"; the candidate's {r.arithmetic}: peak {r.arithmetic_tflops:g} TFLOP/s ({r.arithmetic_peak}), floor "
               f"{r.arithmetic_floor_ms:.4f} ms" if r.arithmetic_tflops and r.arithmetic_floor_ms else "")))
    return Group(*parts)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def doctor_view(report: DoctorReport) -> Table:
    table = Table(title="stitchcuda doctor", title_justify="left")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for c in report.checks:
        table.add_row(c.name, Text(c.status, style=_STATUS_STYLE[c.status]), c.detail, c.fix or "")
    return table


def tasks_view(tasks: list[Task], problems: dict[str, str] | None = None) -> Table:
    table = Table(title=f"{len(tasks)} task(s)", title_justify="left")
    columns = ["name", "origin", "level", "problem", "lines", "sha256"] + (["check"] if problems is not None else [])
    for col in columns:
        table.add_column(col, overflow="fold")
    for t in tasks:
        row: list = [t.name, t.origin, str(t.level or ""), str(t.problem_id if t.problem_id is not None else ""),
                     str(t.source.count("\n") + 1), t.sha256[:12]]
        if problems is not None:
            problem = problems.get(t.name)
            row.append(Text(problem, style="red") if problem else Text("ok", style="green"))
        table.add_row(*row)
    return table


class LiveReporter:
    """Live progress of an optimize run on stderr: a status line (subtask, step, best speedup,
    tokens, cost) under a log of what happened; silent with ``quiet``."""

    def __init__(self, quiet: bool = False):
        self.console = console(stderr=True)
        self.quiet = quiet
        self._status = None

    def __enter__(self) -> LiveReporter:
        if not self.quiet:
            self._status = self.console.status("starting")
            self._status.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def waiting(self, what: str) -> contextlib.AbstractContextManager:
        """A status line while the command waits on something before the run exists (the reference's
        check and capture, in a child)."""
        return contextlib.nullcontext() if self.quiet else self.console.status(what)

    def __call__(self, state, message: str) -> None:
        if self.quiet:
            return
        plan = state.plan
        subtask = (f"subtask {state.subtask_index + 1}/{len(plan.subtasks)}: "
                   f"{plan.subtasks[min(state.subtask_index, len(plan.subtasks) - 1)].title[:40]}") if plan else "planning"
        best = f"best {state.best.speedup_eager:.2f}x ({state.best.hacking})" if state.best else "no verified program yet"
        tokens = state.prompt_tokens + state.completion_tokens
        line = (f"{subtask} | step {state.steps_done + 1}, attempt {state.attempts_on_subtask + 1} | {best} | "
                f"{tokens:,} tokens, ${state.cost_usd:.2f}")
        self.console.log(message, highlight=False)
        if self._status is not None:
            self._status.update(line)


def optimize_summary_view(summary: dict) -> Group:
    if summary["status"] == "unverified":
        check = summary["compile_check"]
        return Group(
            Text(f"{summary['task']}: program written to {summary['output']}, NOT VERIFIED", style="bold yellow"),
            Text(f"nvcc: {check['status']}: {check['detail']}", style="red" if check["status"] == "failed" else ""),
            Text(summary["note"]),
            Text(f"run {summary['run']} kept: `stitchcuda runs {shlex.quote(summary['run'])}`" if summary.get("run")
                 else "",
                 style="dim"))
    best = summary.get("best")
    style = {"done": "bold green", "stopped": "yellow", "failed": "bold red"}.get(summary["status"], "")
    head = Text(f"run {summary['run']} {summary['status']}: {summary.get('stop_reason') or ''}", style=style)
    grid = Table.grid(padding=(0, 2))
    grid.add_row("task", summary["task"], "steps", str(summary["steps"]), "replans", str(summary["replans"]))
    grid.add_row("LLM calls", str(summary["llm_calls"]), "tokens", f"{summary['tokens']:,}",
                 "cost", f"${summary['cost_usd']:.2f}")
    parts: list = [head, grid]
    if not best:
        parts.append(Text("no verified program: see `stitchcuda runs " + shlex.quote(summary["run"]) + "`", style="red"))
        return Group(*parts)
    table = Table(title="best program", title_justify="left")
    for col in ("against", "speedup"):
        table.add_column(col)
    for name, value in (best.get("speedup") or {"eager": best["speedup_eager"]}).items():
        table.add_row(name, f"{value:.2f}x")
    parts.append(table)
    coverage = best.get("operator_coverage")
    parts.append(Text(
        f"{best.get('milliseconds') or 0:.3f} ms on {best.get('device', '?')}; hacking {best['hacking']}; arithmetic "
        f"{best.get('arithmetic', '?')}; precision {best.get('precision', '?')}; operator coverage {f'{coverage:.0%}' if coverage is not None else '?'}; "
        f"tolerance {best.get('tolerance', '?')}"))
    if summary.get("output"):
        parts.append(Text(f"written to {summary['output']}", style="bold"))
    return Group(*parts)


def runs_view(runs) -> Table:
    table = Table(title=f"{len(runs)} run(s)", title_justify="left")
    for col in ("run", "task", "status", "steps", "best", "LLM calls", "cost", "why it ended"):
        table.add_column(col, overflow="fold")
    for r in runs:
        table.add_row(r.id, r.task, r.status, str(r.steps), f"{r.best_speedup:.2f}x" if r.best_speedup else "-",
                      str(r.llm_calls), f"${r.cost_usd:.2f}", r.stop_reason or "")
    return table


def run_view(state, plans, steps) -> Group:
    parts: list = [Text(f"run {state.run_id} ({state.task}): {state.status} {state.stop_reason or ''}", style="bold")]
    for plan in plans:
        table = Table(title=f"plan v{plan.version} ({plan.source}): {plan.rationale[:100]}", title_justify="left")
        for col in ("#", "subtask", "operators", "share", "target"):
            table.add_column(col, overflow="fold")
        for s in plan.subtasks:
            table.add_row(str(s.id), s.title, ", ".join(s.operators)[:60], f"{s.time_share:.0%}",
                          f"{s.target_speedup:.2f}x")
        parts.append(table)
    table = Table(title="steps", title_justify="left")
    for col in ("step", "subtask", "skill", "kept", "result", "decision"):
        table.add_column(col, overflow="fold")
    for st in steps:
        kept = next((o for o in st.samples if o.sample == st.chosen), None)
        if kept is None:
            result = "-"
        elif kept.passed:
            result = f"passed {kept.speedup_eager or 0:.2f}x ({kept.hacking})"
        else:
            result = (kept.llm_error or kept.extract_error or (kept.feedback.splitlines() or ["failed"])[0])[:80]
        decision = f"{st.decision.action}: {st.decision.reason[:70]}" if st.decision else "-"
        table.add_row(str(st.index + 1), str(st.subtask), st.skill, f"{len(st.samples)} sample(s)", result, decision)
    parts.append(table)
    best = state.best
    if best is None and state.status == "unverified":
        parts.append(Text(f"program (not verified: no GPU where it ran): {state.program}", style="yellow"))
    else:
        parts.append(Text(f"best: {best.speedup_eager:.2f}x vs eager ({best.hacking}) at {best.path}" if best
                          else "best: none", style="green" if best else "red"))
    parts.append(Text(f"{state.llm_calls} LLM calls, {state.prompt_tokens + state.completion_tokens:,} tokens, "
                      f"${state.cost_usd:.2f}, {state.seconds:.0f} s", style="dim"))
    if state.stages:
        parts.append(Text(f"where the {state.seconds:.0f} s went: {stage_line(state.stages, top=None)}", style="dim"))
    return Group(*parts)


def stage_line(stages: dict[str, float], top: int | None = 4) -> str:
    """``stages`` (verify/stages.py) as "build 120 s, waiting for the GPU 40 s, ...", largest first;
    the ``top`` largest only, when given."""
    shown = sorted(((v, k) for k, v in stages.items() if v >= 0.05), reverse=True)
    if top is not None:
        shown = shown[:top]
    return ", ".join(f"{LABELS.get(k, k)} {v:,.1f} s" for v, k in shown) or "-"


_WEIGHTS = {"seeded": "seeded: built under the reference's seed, nothing copied (KernelBench's convention)",
            "copied": "copied: the reference's state_dict loaded into ModelNew (--weights copy)",
            "none": "-"}


def bench_view(result, metrics) -> Group:
    """A bench's tasks and its headline metrics (BenchResult, BenchMetrics)."""
    info = result.info
    table = Table(title=f"bench {info.id}: {info.suite}, {info.coder}, {info.gpu}, tolerance {info.tolerance}, "
                        f"weights {info.weights}",
                  title_justify="left")
    harness = any(t.second_opinion is not None for t in result.tasks)
    why = any(_why(t) for t in result.tasks)
    stages = any(t.stages for t in result.tasks)
    autotune = any("torch_compile_max_autotune" in t.speedup for t in result.tasks)
    for col in ("task", "status", "correct", "hacking", "vs eager", "vs compile") + (
            ("vs max-autotune",) if autotune else ()) + ("vs best", "ms", "wall") + (
            ("where the wall time went",) if stages else ()) + (
            ("KernelBench",) if harness else ()) + (("why",) if why else ()):
        table.add_column(col, overflow="fold")

    def x(value: float | None) -> str:
        return f"{value:.2f}x" if value else "-"

    for t in result.tasks:
        table.add_row(t.task, t.status, _yes_no(t.correct) if t.status == "done" else "-", t.hacking or "-",
                      x(t.speedup.get("eager")), x(t.speedup.get("torch_compile")),
                      *((x(t.speedup.get("torch_compile_max_autotune")),) if autotune else ()), x(t.speedup.get("best")),
                      f"{t.milliseconds:.3f}" if t.milliseconds else "-", f"{t.wall_s:.0f} s",
                      *((stage_line(t.stages, top=3),) if stages else ()),
                      *((_opinion_cell(t.second_opinion),) if harness else ()),
                      *((Text(_why(t), style="red"),) if why else ()))
    o = metrics.overall
    lines = [f"success {o.succeeded}/{o.tasks}, hacking partial {o.hacking_partial}, total {o.hacking_total}",
             "geomean over successful tasks: " + ", ".join(
                 f"{name} {x(s.geomean_success)}" for name, s in ((n, o.speedup.get(n)) for n in
                                                                   ("eager", "torch_compile",
                                                                    "torch_compile_max_autotune", "best"))
                 if s and (s.n_success or name != "torch_compile_max_autotune")),
             "fast_1.0 / 1.05 / 2.0 vs eager: " + " / ".join(
                 f"{o.fast('eager', p).count}" for p in (1.0, 1.05, 2.0))]
    if harness:
        opinions = [t.second_opinion for t in result.tasks if t.second_opinion is not None]
        judged = [o for o in opinions if o.agrees is not None]
        agree = sum(bool(o.agrees) for o in judged)
        lines.append(f"KernelBench harness agrees {agree}/{len(judged)}"
                     + (f", {len(judged) - agree} DISAGREE" if agree < len(judged) else "")
                     + (f"; {len(opinions) - len(judged)} not judged by it" if len(opinions) > len(judged) else ""))
    m = metrics.totals
    if m.verifications:
        busy = ", ".join(f"{gpu} {share:.0%}" for gpu, share in m.gpu_busy_by_gpu.items())
        lines.append(f"machinery: {m.verifications} verified, builds {m.build_s:,.0f} s (CPU, {m.builds_cached} of "
                     f"{m.builds} extensions from the cache), in the GPU's sections {m.gpu_s:,.0f} s, waiting for the "
                     f"GPU {m.gpu_wait_s:,.0f} s"
                     + (f"; {m.verified_per_gpu_hour:.0f} verified per GPU-hour, GPU busy {m.gpu_busy:.0%} of the "
                        f"wall time" + (f" ({busy})" if busy else "") if m.verified_per_gpu_hour is not None else ""))
        if any(m.stages_s.values()):
            lines.append("where the tasks' time went (summed): " + stage_line(m.stages_s, top=None))
        elif any(m.verify_phases_s.values()):
            per = {k: v / m.verifications for k, v in m.verify_phases_s.items() if v}
            lines.append("per verification: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in per.items()))
    return Group(table, Text("\n".join(lines)))


_WHY_CHARS = 160


def _why(t) -> str:
    """The task's reason for failing (TaskResult.why), cut to fit a table cell; '' when none."""
    text = t.why or ""
    return text if len(text) <= _WHY_CHARS else text[: _WHY_CHARS - 1] + "…"


def _opinion_cell(o) -> Text:
    if o is None:
        return Text("-")
    if o.error is not None:
        return Text("error", style="yellow")
    if not o.judgeable:
        return Text("not judgeable (a control fails it too)", style="yellow")
    text = "correct" if o.correct else "INCORRECT" + (" (fp32 ref: correct)" if o.correct_true_fp32 else
                                                      " (v0.1 1e-2: correct)" if o.correct_v01 else "")
    return Text(text + (" DISAGREES" if o.agrees is False else ""),
                style="bold red" if o.agrees is False else "green" if o.correct else "red")


def reward_view(b) -> Table:
    """A RewardBreakdown, part by part."""
    table = Table(title=f"reward {b.reward:.3f}" + (" (capped)" if b.capped else ""), title_justify="left")
    table.add_column("part")
    table.add_column("value")
    table.add_column("why", overflow="fold")
    rule = b.rule
    table.add_row("rule", f"{rule.value:.3f}", f"{rule.gate}" + (f", speedup {rule.speedup:.2f}x vs "
                                                                 f"{b.config.baseline}" if rule.speedup else ""))
    if b.rubric is None:
        table.add_row("rubric", "-", "not asked (no judge, or the rule reward is zero): r = 0.5")
    else:
        for key, score in b.rubric.scores.items():
            table.add_row(f"  {key}", str(score), b.rubric.reasons.get(key, "neutral: no valid judgement"))
        table.add_row("rubric r", f"{b.rubric.normalized:.3f}", "neutral" if b.rubric.neutral else
                      f"{b.rubric.attempts} attempt(s)")
    table.add_row("factor", f"{b.rubric_factor:.3f}", f"1 + {b.config.rubric_weight} x (r - 0.5)")
    return table
