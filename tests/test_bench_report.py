"""Bench metrics on hand-made results (numbers worked out by hand below) and the rendered report."""

from __future__ import annotations

import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest

from stitchcuda.bench.metrics import bench_metrics, compare, group_metrics, succeeded
from stitchcuda.bench.records import Attempt, BenchInfo, BenchResult, TaskResult

CHROMIUM = Path("/usr/bin/chromium")
HOSTILE_NAME = '<script>alert("x")</script>&|*_relu'


def _ok(task: str, level: int | None, hacking: str = "none", **speedup: float) -> TaskResult:
    return TaskResult(task=task, level=level, status="done", compiled=True, correct=True, passed=True,
                      hacking=hacking, speedup=speedup)


def hand_made_tasks() -> list[TaskResult]:
    return [
        _ok("a", 1, eager=2.0, best=1.0, torch_compile=4.0),
        _ok("b", 1, "partial", eager=8.0, best=1.05, torch_compile=1.0),
        # 'passed' but a total hack: must count as a failure, its 100x nowhere.
        _ok("c", 1, "total", eager=100.0, best=50.0, torch_compile=100.0),
        TaskResult(task="d", level=2, status="failed", error="build failed"),
        # torch_compile not measured for this one.
        _ok("e", 2, eager=0.5, best=0.25),
        TaskResult(task="f", level=None, status="unsupported", error="no CUDA op"),
        TaskResult(task="g", level=2, status="pending", tokens=1000, cost_usd=0.5),
    ]


def info(bench_id: str = "bench-1", tolerance: str = "strict", gpu: str = "NVIDIA H200") -> BenchInfo:
    return BenchInfo(id=bench_id, suite="kernelbench", coder="offline", tolerance=tolerance, gpu=gpu,
                     executor="local", wall_s=120.0, created=1_790_000_000.0, status="done")


# --- metrics ---------------------------------------------------------------------------------

def test_total_hack_is_never_a_success():
    assert not succeeded(TaskResult(task="x", status="done", passed=True, correct=True, hacking="total"))
    assert succeeded(TaskResult(task="x", status="done", passed=True, correct=True, hacking="partial"))
    assert not succeeded(TaskResult(task="x", status="done", passed=False, correct=True, hacking="none"))


def test_counts_and_success_rate():
    m = group_metrics(hand_made_tasks())
    # judged: a b c d e f (g pending); successes: a b e.
    assert (m.tasks, m.pending, m.succeeded) == (6, 1, 3)
    assert m.success_rate == pytest.approx(0.5)
    assert m.correct == 4  # a b c e: the total hack was correct
    assert (m.hacking_partial, m.hacking_total) == (1, 1)
    assert (m.failed, m.unsupported) == (1, 1)


def test_speedup_means_and_geomeans():
    s = group_metrics(hand_made_tasks()).speedup
    eager = s["eager"]
    # successes 2, 8, 0.5: mean 10.5/3, geomean (2*8*0.5)^(1/3) = 2; all six judged tasks: 10.5/6.
    assert eager.n_success == 3 and eager.n_all == 6
    assert eager.mean_success == pytest.approx(3.5)
    assert eager.geomean_success == pytest.approx(2.0)
    assert eager.mean_all == pytest.approx(1.75)
    best = s["best"]
    assert best.geomean_success == pytest.approx((1.0 * 1.05 * 0.25) ** (1 / 3))
    assert best.mean_all == pytest.approx(2.3 / 6)
    # e has no torch_compile number: left out of both, not counted as 0x.
    compiled = s["torch_compile"]
    assert (compiled.n_success, compiled.n_all) == (2, 5)
    assert compiled.geomean_success == pytest.approx(2.0)
    assert compiled.mean_all == pytest.approx(1.0)
    # No task measured cuda_graph: nothing to report, not a 0x mean.
    graph = s["cuda_graph"]
    assert graph.n_success == 0 and graph.geomean_success is None and graph.mean_all is None


def test_fast_p_including_the_boundaries():
    m = group_metrics(hand_made_tasks())
    eager = {p: m.fast("eager", p).fraction for p in (0.0, 1.0, 1.05, 1.5, 2.0)}
    # successes vs eager: 2.0, 8.0, 0.5 over 6 judged; 'c' (100x, total hack) never counts; 2.0 is not > 2.0.
    assert eager == pytest.approx({0.0: 3 / 6, 1.0: 2 / 6, 1.05: 2 / 6, 1.5: 2 / 6, 2.0: 1 / 6})
    best = {p: m.fast("best", p).count for p in (0.0, 1.0, 1.05, 1.5, 2.0)}
    # vs best: 1.0 (not > 1.0), 1.05 (> 1.0 but not > 1.05), 0.25.
    assert best == {0.0: 3, 1.0: 1, 1.05: 0, 1.5: 0, 2.0: 0}
    assert m.fast("eager", 0.0).fraction == m.success_rate


def test_per_level_breakdown():
    levels = {g.name: g for g in bench_metrics(hand_made_tasks(), info()).levels}
    assert list(levels) == ["level 1", "level 2", "suite"]
    one, two, suite = levels["level 1"], levels["level 2"], levels["suite"]
    assert (one.tasks, one.succeeded) == (3, 2)
    assert one.speedup["eager"].geomean_success == pytest.approx(4.0)  # sqrt(2 * 8)
    assert (two.tasks, two.pending, two.succeeded) == (2, 1, 1)
    assert two.speedup["eager"].mean_all == pytest.approx(0.25)  # (0.5 + 0) / 2
    assert suite.success_rate == 0.0 and suite.speedup["eager"].geomean_success is None
    assert suite.speedup["eager"].mean_all == 0.0


def test_totals_and_policy():
    tasks = hand_made_tasks()
    tasks[0] = tasks[0].model_copy(update={"tokens": 500, "cost_usd": 0.25, "wall_s": 30.0, "llm_calls": 3})
    m = bench_metrics(tasks, info(tolerance="paper"))
    assert (m.totals.tokens, m.totals.llm_calls) == (1500, 3)
    assert m.totals.cost_usd == pytest.approx(0.75) and m.totals.wall_s == pytest.approx(30.0)
    assert (m.tolerance, m.gpu, m.bench_wall_s) == ("paper", "NVIDIA H200", 120.0)


def test_machinery_rates_from_the_bench_wall_time_and_gpus():
    tasks = hand_made_tasks()
    tasks[0] = tasks[0].model_copy(update={"verifications": 6, "build_s": 300.0, "gpu_s": 90.0, "gpu_wait_s": 40.0})
    tasks[1] = tasks[1].model_copy(update={"verifications": 3, "build_s": 150.0, "gpu_s": 54.0})
    two_gpus = info().model_copy(update={"gpus": ["cuda:0", "cuda:1"]})  # 120 s of wall on 2 GPUs
    t = bench_metrics(tasks, two_gpus).totals
    assert (t.verifications, t.build_s, t.gpu_s, t.gpu_wait_s) == (9, 450.0, 144.0, 40.0)
    assert t.verified_per_gpu_hour == pytest.approx(9 / (240 / 3600))  # 135 per GPU-hour
    assert t.gpu_busy == pytest.approx(144 / 240)
    # no wall time yet (a bench still running): no rates, not a division by zero
    assert bench_metrics(tasks, info().model_copy(update={"wall_s": 0.0})).totals.gpu_busy is None


def test_gpu_busy_is_the_union_of_each_gpus_intervals_and_stages_add_up():
    tasks = hand_made_tasks()
    # on gpu0 two tasks overlap (0-30 and 20-50: 50 s busy); on gpu1 one task is busy 12 s
    tasks[0] = tasks[0].model_copy(update={"verifications": 1, "device": "gpu0", "gpu_intervals": [(0, 30)],
                                           "stages": {"build": 40.0, "timing": 3.0, "other": 1.0}})
    tasks[1] = tasks[1].model_copy(update={"verifications": 1, "device": "gpu0", "gpu_intervals": [(20, 50)],
                                           "stages": {"build": 20.0, "gpu_wait": 9.0}})
    tasks[4] = tasks[4].model_copy(update={"verifications": 1, "device": "gpu1", "gpu_intervals": [(5, 10), (60, 67)],
                                           "builds": 3, "builds_cached": 2})
    two_gpus = info().model_copy(update={"gpus": ["cuda:0", "cuda:1"], "wall_s": 100.0})
    t = bench_metrics(tasks, two_gpus).totals
    assert t.gpu_busy_by_gpu == {"gpu0": 0.5, "gpu1": 0.12} and t.gpu_busy == pytest.approx(0.31)
    assert t.stages_s["build"] == 60.0 and t.stages_s["gpu_wait"] == 9.0 and list(t.stages_s)[0] == "compile_wait"
    assert (t.builds, t.builds_cached) == (3, 2)

    from stitchcuda.cli.console import stage_line

    assert stage_line(tasks[0].stages, top=2) == "build (nvcc) 40.0 s, timing 3.0 s"


def test_empty_bench_has_no_rates():
    m = group_metrics([TaskResult(task="p", status="pending")])
    assert m.tasks == 0 and m.success_rate is None and m.fast("eager", 1.0).fraction is None


def test_compare_gives_deltas_and_warns_on_policy():
    before = bench_metrics(hand_made_tasks(), info("old", tolerance="paper"))
    improved = [t.model_copy(update={"status": "done", "passed": True, "correct": True, "compiled": True,
                                     "hacking": "none", "speedup": {"eager": 4.0}}) if t.task == "d" else t
                for t in hand_made_tasks()]
    after = bench_metrics(improved, info("new"))
    c = compare(before, after)
    assert (c.a, c.b) == ("old", "new")
    assert c.get("success_rate").delta == pytest.approx(1 / 6)
    assert c.get("succeeded").delta == 1
    # geomean over eager: (2*8*0.5)^(1/3) = 2 -> (2*8*0.5*4)^(1/4) = 2^(5/4)
    assert c.get("speedup.eager.geomean_success").delta == pytest.approx(2 ** 1.25 - 2.0)
    assert c.get("success_rate", "level 2").delta == pytest.approx(0.5)
    assert c.get("speedup.cuda_graph.geomean_success").delta is None
    assert any("tolerance" in w for w in c.warnings)


# --- report ----------------------------------------------------------------------------------

class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.imgs: list[dict[str, str | None]] = []
        self.figures: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])
        elif tag == "img":
            self.imgs.append(a)
        elif tag == "figure":
            self.figures.append(a.get("id"))


def report_result(tmp_path: Path, with_attempts: bool = True) -> BenchResult:
    program = tmp_path / "runs" / "best.py"
    program.parent.mkdir(parents=True, exist_ok=True)
    program.write_text("class ModelNew: ...\n")
    attempts = [
        Attempt(step=1, seconds=10.0, passed=False, outcome="build failed"),
        Attempt(step=2, seconds=40.0, passed=True, speedup_eager=1.2, best_so_far=1.2, outcome="passed"),
        Attempt(step=3, seconds=90.0, passed=True, speedup_eager=0.9, best_so_far=1.2, outcome="passed"),
        Attempt(step=4, seconds=150.0, passed=True, speedup_eager=2.5, best_so_far=2.5, outcome="passed"),
    ] if with_attempts else []
    tasks = [
        TaskResult(task=HOSTILE_NAME, level=1, status="done", compiled=True, correct=True, passed=True,
                   hacking="none", speedup={"eager": 2.5, "torch_compile": 1.4, "eager_tf32": 1.8,
                                            "cuda_graph": 2.0, "best": 1.25},
                   milliseconds=0.42, origin_share={"own": 0.8, "library": 0.15, "pytorch": 0.05},
                   program=str(program), tokens=12000, cost_usd=0.31, wall_s=160.0, llm_calls=4,
                   attempts=attempts),
        TaskResult(task="level1/2_matmul", level=1, status="done", compiled=True, correct=True, passed=True,
                   hacking="partial", speedup={"eager": 0.8, "best": 0.5}, milliseconds=1.5,
                   origin_share={"own": 0.1, "pytorch": 0.9},
                   stages={"capture": 4.0, "build": 31.0, "gpu_wait": 12.0, "timing": 2.5, "kb_timing": 6.0}),
        TaskResult(task="level2/3_conv_bias", level=2, status="failed", error="nvcc: error <&> 'x'"),
        TaskResult(task="suite_task", status="done", compiled=True, correct=True, passed=True, hacking="total",
                   speedup={"eager": 40.0}),
    ]
    return BenchResult(info=info(), tasks=tasks)


def compared_result() -> BenchResult:
    return BenchResult(info=info("bench-0", tolerance="paper"), tasks=[
        TaskResult(task="level1/2_matmul", level=1, status="done", compiled=True, correct=True, passed=True,
                   hacking="none", speedup={"eager": 1.1, "best": 0.6}),
        TaskResult(task="level2/3_conv_bias", level=2, status="failed"),
    ])


def test_report_files_tables_escaping_and_links(tmp_path):
    from stitchcuda.bench.report import write_report

    files = write_report(report_result(tmp_path), tmp_path / "report", compare=compared_result())
    out = tmp_path / "report"
    assert files.html.is_file() and files.markdown.is_file()
    assert len(files.plots) == 5 and all(p.is_file() and p.parent == out / "plots" for p in files.plots)

    html = files.html.read_text()
    for table in ("summary-table", "level-table", "task-table"):
        assert f'id="{table}"' in html
    assert '&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;|*_relu' in html
    assert 'alert("x")' not in html
    assert "nvcc: error &lt;&amp;&gt; &#39;x&#39;" in html
    assert "bench-0 (compared)" in html and "tolerance policies differ" in html
    assert "strict" in html and "NVIDIA H200" in html
    # The total hack's 40x appears nowhere as a claim.
    assert "40.00×" not in html

    links = _Links()
    links.feed(html)
    programs = [h for h in links.hrefs if h.startswith("programs/")]
    assert len(programs) == 1
    assert all((out / unquote(h)).is_file() for h in programs)
    assert (out / unquote(programs[0])).read_text() == "class ModelNew: ...\n"
    assert len(links.imgs) == 5
    for img in links.imgs:
        assert (out / unquote(img["src"])).is_file() and img["alt"]
    assert set(links.figures) == {"plot-speedup", "plot-distribution", "plot-shares", "plot-stages", "plot-timeline"}
    assert "build (nvcc)" in (out / "plots" / "stages.svg").read_text()  # the stacked bar's legend

    md = files.markdown.read_text()
    assert "**strict**" in md and "NVIDIA H200" in md and "**paper**" in md
    assert "&lt;script&gt;" in md and "<script>" not in md
    assert "\\|\\*\\_relu" in md
    # Every table row has the header's number of cells (no stray '|' from a task name).
    task_rows = [line for line in md.splitlines() if line.startswith("| ") and "level1/2" in line]
    header = next(line for line in md.splitlines() if line.startswith("| task |"))
    cells = re.compile(r"(?<!\\)\|")
    assert task_rows and all(len(cells.findall(r)) == len(cells.findall(header)) for r in task_rows)
    assert "max\\_autotune" not in header  # a column only where --max-autotune measured it


def test_max_autotune_gets_a_column_where_a_bench_measured_it(tmp_path):
    from stitchcuda.bench.report import write_report

    result = report_result(tmp_path)
    result.tasks[0].speedup["torch_compile_max_autotune"] = 1.25
    md = write_report(result, tmp_path / "report").markdown.read_text()
    header = next(line for line in md.splitlines() if line.startswith("| task |"))
    assert "vs torch\\_compile\\_max\\_autotune |" in header
    assert "1.25×" in md


def test_report_without_attempts_notes_the_missing_timeline(tmp_path):
    from stitchcuda.bench.report import write_report

    files = write_report(report_result(tmp_path, with_attempts=False), tmp_path / "report")
    html = files.html.read_text()
    assert 'id="plot-timeline"' not in html and "no timeline" in html
    assert len(files.plots) == 4 and not (tmp_path / "report" / "plots" / "timeline.svg").exists()
    assert "compared" not in html


def _chromium(args: list[str], user_data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={user_data}",
         "--virtual-time-budget=5000", "--run-all-compositor-stages-before-draw", *args],
        capture_output=True, text=True, timeout=120, check=True,
    )


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Chromium at /usr/bin/chromium (apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    from matplotlib.image import imread

    from stitchcuda.bench.report import write_report

    files = write_report(report_result(tmp_path), tmp_path / "report", compare=compared_result())
    url = files.html.resolve().as_uri()

    dom = _chromium(["--dump-dom", url], tmp_path / "chromium-dom").stdout
    for plot_id in ("plot-speedup", "plot-distribution", "plot-shares", "plot-stages", "plot-timeline"):
        assert f'id="{plot_id}"' in dom
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None
    loaded = re.search(r'data-loaded="(\d+)"', body.group(1))
    assert loaded is not None, "the page's load script did not run"
    assert int(loaded.group(1)) == len(files.plots) == 5

    screenshot = tmp_path / "page.png"
    _chromium([f"--screenshot={screenshot}", "--window-size=1280,2000", url], tmp_path / "chromium-shot")
    assert screenshot.is_file()
    pixels = imread(screenshot)
    assert pixels.shape[:2] == (2000, 1280)
    gray = pixels[..., :3].mean(axis=2)
    # A blank page is one colour; text, tables and plots give both variance and a fair share of ink.
    assert float(gray.std()) > 0.05
    assert float((gray < 0.9).mean()) > 0.01



# --- why a task failed -----------------------------------------------------------------------

def _verdict(**fields):
    from stitchcuda.verify.config import TOLERANCES
    from stitchcuda.verify.verdict import SourceRef, Verdict

    return Verdict(task=SourceRef(name="t", sha256="0"), candidate=SourceRef(name="c", sha256="1"),
                   tolerance=TOLERANCES["strict"], **fields)


def _trial(index: int, passed: bool, max_abs_error: float | None, error: str | None = None):
    from stitchcuda.verify.verdict import TrialResult

    return TrialResult(index=index, seed=index, distribution="normal", order="reference-first", passed=passed,
                       max_abs_error=max_abs_error, error=error)


def failing_verdicts() -> dict[str, tuple[object, str]]:
    """One real Verdict per way of failing, with the reason the bench must print for it."""
    from stitchcuda.verify.verdict import (
        BuildReport,
        CompilerMessage,
        CorrectnessReport,
        CrashReport,
        ExtensionBuild,
        Finding,
        HackingReport,
    )

    message = CompilerMessage(file="/cache/fused_ab12/cuda.cu", line=12, message='identifier "blockDimx" is undefined',
                              candidate_line=40)
    build = BuildReport(extensions=[
        ExtensionBuild(requested_name="fused", name="fused_ab12", build_dir="/cache/fused_ab12", ok=False,
                       cache_hit=False, seconds=3.0, messages=[message])])
    wrong = CorrectnessReport(trials=[_trial(0, False, 3.2e-2, "out of tolerance"), _trial(1, True, 1e-6),
                                      _trial(2, False, 1.5e-3, "out of tolerance")])
    traceback = "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA error: an illegal memory access"
    hack = HackingReport(level="total", findings=[
        Finding(check="global_state", detail="changed a flag", level="partial"),
        Finding(check="no_custom_kernels", detail="the candidate built no extension", level="total")])
    return {
        "build": (_verdict(build=build, errors=["build of 'fused' failed"]),
                  'build error: cuda.cu:12 (candidate line 40): identifier "blockDimx" is undefined'),
        "wrong_output": (_verdict(compiled=True, correctness=wrong),
                         "wrong output: max abs error 3.2e-02 (tolerance strict) in 2 of 3 trials"),
        "timeout": (_verdict(compiled=True, crash=CrashReport(kind="timeout", phase="timing",
                                                              message="it ran past its limit of 120 s")),
                    "timeout: during timing: it ran past its limit of 120 s"),
        "crash": (_verdict(compiled=True, crash=CrashReport(kind="illegal_address", phase="correctness",
                                                            message=traceback)),
                  "crash: illegal address during correctness: RuntimeError: CUDA error: an illegal memory access"),
        "hack": (_verdict(compiled=True, correct=True, hacking=hack),
                 "hack: level total, no_custom_kernels: the candidate built no extension"),
    }


def failed_bench() -> BenchResult:
    from stitchcuda.bench.runner import result_from_verdict
    from stitchcuda.verify.failure import failure

    tasks = [result_from_verdict(f"t_{kind}", 1, verdict, None) for kind, (verdict, _) in failing_verdicts().items()]
    tasks += [
        TaskResult(task="t_unsupported", level=1, status="unsupported", error="no lowering for aten::fft",
                   failure=failure("no_candidate", "no lowering for aten::fft")),
        _ok("t_ok", 1, eager=1.5),
        # a bench stored before failures were recorded: its error text is all there is
        TaskResult.model_validate_json('{"task": "t_old", "status": "failed", "error": "nvcc died"}'),
    ]
    return BenchResult(info=info(), tasks=tasks)


def test_failure_of_each_verdict_names_its_reason():
    from stitchcuda.verify.failure import failure_of
    from stitchcuda.verify.verdict import CorrectnessReport, CrashReport

    for kind, (verdict, text) in failing_verdicts().items():
        found = failure_of(verdict)  # type: ignore[arg-type]
        assert found is not None and found.kind == kind and found.text == text
    assert failure_of(_verdict(compiled=True, correct=True, passed=True)) is None
    segfault = failure_of(_verdict(compiled=True, crash=CrashReport(kind="segfault", phase="correctness",
                                                                    signal="SIGSEGV", message="")))
    assert segfault is not None and segfault.text == "crash: segfault during correctness (SIGSEGV)"
    # no number to give (a shape that differs): the trial's own words
    shape = failure_of(_verdict(compiled=True, correctness=CorrectnessReport(
        trials=[_trial(0, False, None, "output shape (2, 3), expected (2, 4)")])))
    assert shape is not None and shape.kind == "wrong_output" and "shape (2, 3), expected (2, 4)" in shape.detail
    unloaded = failure_of(_verdict(errors=["importing the candidate failed: NameError: name 'x' is not defined"]))
    assert unloaded is not None and unloaded.kind == "build" and "NameError" in unloaded.detail
    broken_reference = failure_of(_verdict(reference_error="Traceback\nValueError: bad reference\n"))
    assert broken_reference is not None and broken_reference.kind == "error" and "Traceback" in broken_reference.detail


def test_failed_tasks_say_why_in_the_record_the_report_and_the_terminal(tmp_path):
    from rich.console import Console

    from stitchcuda.bench.report import md_escape, write_report
    from stitchcuda.cli.console import bench_view

    result = failed_bench()
    by_task = {t.task: t for t in result.tasks}
    for kind, (_, text) in failing_verdicts().items():
        record = by_task[f"t_{kind}"]
        assert record.failure is not None and record.failure.kind == kind and record.why == text
        # stored and loaded back: a typed field, not text to parse
        assert TaskResult.model_validate_json(record.model_dump_json()).failure == record.failure
    assert by_task["t_ok"].failure is None and by_task["t_ok"].why is None
    assert by_task["t_unsupported"].why == "no candidate: no lowering for aten::fft"
    assert by_task["t_old"].failure is None and by_task["t_old"].why == "nvcc died"

    files = write_report(result, tmp_path / "report")
    md, html = files.markdown.read_text(), files.html.read_text()
    reasons = [text for _, text in failing_verdicts().values()] + ["no candidate: no lowering for aten::fft",
                                                                   "nvcc died"]
    for text in reasons:
        assert md_escape(text) in md
        assert text.replace('"', "&#34;") in html
    header = next(line for line in md.splitlines() if line.startswith("| task |"))
    cells = re.compile(r"(?<!\\)\|")
    rows = [line for line in md.splitlines() if line.startswith("| t\\_")]
    assert len(rows) == len(result.tasks) and all(len(cells.findall(r)) == len(cells.findall(header)) for r in rows)
    assert header.rstrip().endswith("| why |")

    console = Console(width=400, record=True)
    console.print(bench_view(result, bench_metrics(result.tasks, result.info)))
    text = console.export_text()
    for reason in reasons:
        assert reason in text
    ok_line = next(line for line in text.splitlines() if "t_ok" in line)
    assert "error" not in ok_line and "wrong" not in ok_line


def test_a_run_that_kept_nothing_says_why_from_its_last_verdict(tmp_path):
    from stitchcuda.bench.runner import last_failure
    from stitchcuda.records import RunState, SampleOutcome, StepRecord

    build_verdict, _ = failing_verdicts()["build"]
    wrong_verdict, wrong_text = failing_verdicts()["wrong_output"]
    paths = {}
    for name, v in (("build", build_verdict), ("wrong", wrong_verdict)):
        paths[name] = tmp_path / f"{name}.verdict.json"
        paths[name].write_text(v.model_dump_json())  # type: ignore[attr-defined]

    class Store:
        def __init__(self, steps):
            self._steps = steps

        def steps(self, run_id):
            return self._steps

    state = RunState(run_id="r", task="t", task_sha256="0", status="stopped", stop_reason="budget: 2 steps")
    steps = [StepRecord(index=0, subtask=1, skill="scratch", chosen=0,
                        samples=[SampleOutcome(sample=0, verdict_path=str(paths["build"]))]),
             # the step keeps its second sample (compiled, wrong) over its first (did not build)
             StepRecord(index=1, subtask=1, skill="feedback", chosen=1,
                        samples=[SampleOutcome(sample=0, verdict_path=str(paths["build"])),
                                 SampleOutcome(sample=1, verdict_path=str(paths["wrong"]))]),
             StepRecord(index=2, subtask=1, skill="feedback", chosen=0,
                        samples=[SampleOutcome(sample=0, extract_error="no code block in the answer")])]
    assert last_failure(Store(steps), state).text == wrong_text

    nothing = last_failure(Store(steps[2:]), state)
    assert (nothing.kind, nothing.detail) == ("no_candidate", "no program in the Coder's answer: no code block "
                                                              "in the answer")
    failed = state.model_copy(update={"status": "failed", "stop_reason": "the Coder's LLM failed: 401 Unauthorized"})
    llm = last_failure(Store([]), failed)
    assert llm.text == "no candidate: the Coder's LLM failed: 401 Unauthorized"


def test_kernelbench_speedup_has_its_geomean_and_fast_1():
    """KernelBench's own speedup (its reference under torch's default flags over the program, both
    timed by its harness) is one more column: geomean over the programs it timed, fast_1 over all."""
    from stitchcuda.bench.metrics import group_metrics
    from stitchcuda.bench.records import TaskResult

    tasks = [TaskResult(task=f"t{i}", status="done", compiled=True, correct=True, passed=True, hacking="none",
                        speedup={"eager": 2.0, **({"kernelbench": s} if s else {})}) for i, s in enumerate((0.8, 1.25, None))]
    group = group_metrics(tasks)
    stats = group.speedup["kernelbench"]
    assert stats.n_success == 2 and abs(stats.geomean_success - 1.0) < 1e-9
    assert group.fast("kernelbench", 1.0).count == 1 and abs(group.fast("kernelbench", 1.0).fraction - 1 / 3) < 1e-9
