"""KernelBench's harness as a second opinion: the process that runs it, against a fake KernelBench
checkout written here (so that no GPU is needed), the record it gives, and where it is shown."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stitchcuda.verify.second_opinion import NO_GPU, judge
from stitchcuda.verify.verdict import SecondOpinion
from tests.conftest import CPU

REAL_CHECKOUT = Path(__file__).resolve().parents[2] / "shared" / "kernelbench"
REFERENCE = (CPU / "tiny_mlp.py").read_text()
CANDIDATE = (CPU / "pure_torch.py").read_text()

# What KernelBench's eval.py gives: an object with these attributes. The fake judges a candidate
# incorrect when it holds the word WRONG, and reports the arguments it was called with.
FAKE_EVAL = '''
class KernelExecResult:
    def __init__(self, compiled, correctness, runtime=-1.0, metadata=None):
        self.compiled, self.correctness, self.runtime, self.metadata = compiled, correctness, runtime, metadata or {}
        self.ref_runtime = 0.75 if correctness and runtime > 0 else -1.0


def set_seed(seed):
    import torch
    torch.manual_seed(seed)


def load_original_model_and_inputs(src, context):
    exec(src, context)
    return context["Model"], context["get_init_inputs"], context["get_inputs"]


def load_custom_model(src, context, build_directory=None):
    exec(src, context)
    return context["ModelNew"]


def eval_kernel_against_ref(original_model_src, custom_model_src, seed_num=42, num_correct_trials=1,
                            num_perf_trials=10, measure_performance=False, timing_method="cuda_event",
                            verbose=False, build_dir=None, device=None, backend="cuda", precision=None):
    BEFORE
    seen = f"trials={num_correct_trials} perf={num_perf_trials} seed={seed_num} build_dir={build_dir}"
    return KernelExecResult(True, "WRONG" not in custom_model_src, 0.5,
                            {"seen": seen, "correctness_trials": "(5 / 5)", "hardware": "fake"})
'''


# Its timing module: the reference (Model) takes 0.9 ms a call, any ModelNew 0.6
FAKE_TIMING = '''
def get_timing_function(method):
    def timed(model, inputs, num_trials=10, verbose=False, device=None):
        model(*inputs)
        return [0.6 if type(model).__name__ == "ModelNew" else 0.9] * num_trials
    return timed


def get_timing_stats(elapsed, device=None):
    return {"mean": sum(elapsed) / len(elapsed)}


def measure_ref_program_time(name, src, num_trials=100, device=None, **kwargs):
    from kernelbench.eval import load_original_model_and_inputs
    model_cls, get_init_inputs, get_inputs = load_original_model_and_inputs(src, {})
    elapsed = get_timing_function("cuda_event")(model_cls(*get_init_inputs()), get_inputs(), num_trials)
    return get_timing_stats(elapsed)
'''


def fake_checkout(root: Path, top: str = "", before: str = "pass") -> Path:
    """A KernelBench checkout with ``top`` at the head of its eval.py and ``before`` run first in
    its eval_kernel_against_ref."""
    package = root / "src" / "kernelbench"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "eval.py").write_text(top + "\n" + FAKE_EVAL.replace("BEFORE", before))
    (package / "timing.py").write_text(FAKE_TIMING)
    return root


def _judge(checkout: Path, tmp_path: Path, candidate: str = CANDIDATE, limit_s: float = 120.0,
           our_correct: bool | None = True) -> SecondOpinion:
    return judge(str(checkout), REFERENCE, candidate, cache=tmp_path / "cache", limit_s=limit_s,
                 our_correct=our_correct)


def test_verdict_from_its_own_process_with_kernelbench_defaults(tmp_path):
    checkout = fake_checkout(tmp_path / "kb")
    opinion = _judge(checkout, tmp_path)
    assert opinion.error is None, opinion.error
    assert opinion.compiled and opinion.correct and opinion.agrees is True and opinion.runtime_ms == 0.5
    assert opinion.ref_runtime_ms == 0.75 and opinion.speedup == pytest.approx(1.5) and not opinion.timed_apart
    assert opinion.source == "kernelbench" and opinion.checkout == str(checkout) and opinion.seconds > 0
    # KernelBench's scripts' settings, and a build folder of its own under our cache
    assert "trials=5 perf=100 seed=42" in opinion.detail
    assert f"build_dir={tmp_path / 'cache' / 'kernelbench-harness'}" in opinion.detail
    assert "correctness_trials" not in opinion.detail and "hardware" not in opinion.detail

    wrong = _judge(checkout, tmp_path, candidate=CANDIDATE + "\n# WRONG\n", our_correct=True)
    assert wrong.compiled and wrong.correct is False and wrong.agrees is False and wrong.error is None
    assert _judge(checkout, tmp_path, candidate=CANDIDATE + "\n# WRONG\n", our_correct=False).agrees is True


def test_an_incorrect_is_asked_again_against_a_true_fp32_reference(tmp_path):
    """KernelBench's reference runs cuDNN convolutions in TF32 (torch's default): its "incorrect"
    is asked again with TF32 off, and both answers are kept; ours still decides."""
    before = ("import torch\n    if 'TF32REF' in custom_model_src and torch.backends.cudnn.allow_tf32:\n"
              "        return KernelExecResult(True, False, -1.0, {'max_difference': '0.000555'})")
    checkout = fake_checkout(tmp_path / "kb", before=before)
    opinion = _judge(checkout, tmp_path, candidate=CANDIDATE + "\n# TF32REF\n")
    assert opinion.correct is False and opinion.correct_true_fp32 is True and opinion.agrees is False
    assert "0.000555" in opinion.detail
    # its eval timed nothing: both timed by its own timing function, under torch's default flags
    assert opinion.timed_apart and (opinion.ref_runtime_ms, opinion.runtime_ms) == pytest.approx((0.9, 0.6))
    assert opinion.speedup == pytest.approx(1.5)
    wrong = _judge(checkout, tmp_path, candidate=CANDIDATE + "\n# WRONG\n")
    assert wrong.correct is False and wrong.correct_true_fp32 is False
    assert _judge(checkout, tmp_path).correct_true_fp32 is None  # correct: not asked again

    from stitchcuda.cli.console import second_opinion_view
    from stitchcuda.verify.verdict import Verdict

    lines = [t.plain for t in second_opinion_view(Verdict.model_construct(correct=True, second_opinion=opinion))]
    assert any("against a true-fp32 reference" in t and t.endswith("correct") for t in lines)
    assert any("KernelBench's speedup 1.50x" in t and "timed by its timing function" in t for t in lines)


def test_llm_client_imports_get_stand_ins(tmp_path):
    # KernelBench's utilities import litellm, dotenv and openai at the top; evaluating needs none
    top = "import litellm\nfrom dotenv import load_dotenv\nload_dotenv()\nfrom openai import OpenAI\nimport requests"
    opinion = _judge(fake_checkout(tmp_path / "kb", top=top), tmp_path)
    assert opinion.error is None and opinion.correct, opinion.error


def test_a_harness_that_fails_to_import_is_said(tmp_path):
    top = "raise ImportError('No module named flash_attn')"
    opinion = _judge(fake_checkout(tmp_path / "kb", top=top), tmp_path)
    assert "did not load" in opinion.error and "ImportError: No module named flash_attn" in opinion.error
    assert opinion.compiled is None and opinion.correct is None and opinion.agrees is None


def test_a_hang_is_killed_at_the_limit(tmp_path):
    opinion = _judge(fake_checkout(tmp_path / "kb", before="import time; time.sleep(600)"), tmp_path, limit_s=8)
    assert "ran past its limit of 8 s" in opinion.error and opinion.agrees is None
    assert opinion.seconds < 30


def test_a_crash_is_read_from_the_exit_status(tmp_path):
    before = "import os, sys; print('about to abort', flush=True); os.abort()"
    opinion = _judge(fake_checkout(tmp_path / "kb", before=before), tmp_path)
    assert "died (SIGABRT) without a verdict" in opinion.error and "about to abort" in opinion.error
    assert opinion.correct is None and opinion.agrees is None


def test_no_result_from_the_harness_is_no_judgement(tmp_path):
    # KernelBench returns None for "retry" (a lock met in its build): not a verdict of incorrect
    opinion = _judge(fake_checkout(tmp_path / "kb", before="return None"), tmp_path)
    assert "returned no result" in opinion.error and opinion.correct is None and opinion.agrees is None


def test_a_checkout_without_the_harness_is_said_at_once(tmp_path):
    (tmp_path / "empty").mkdir()
    opinion = _judge(tmp_path / "empty", tmp_path)
    assert "has no KernelBench harness (src/kernelbench/eval.py)" in opinion.error
    assert not (tmp_path / "cache").exists()  # nothing was started


def test_the_verifier_on_a_cpu_device_says_it_needs_a_gpu(tmp_path, cache):
    from stitchcuda.task import load_candidate, resolve_tasks
    from stitchcuda.verify import PRESETS, Verifier

    config = PRESETS["tiny-debug"].model_copy(update={"kernelbench_harness": str(fake_checkout(tmp_path / "kb"))})
    task = resolve_tasks(str(CPU / "tiny_mlp.py"), None, None)[0]
    verdict = Verifier(config).verify(task, load_candidate(CPU / "pure_torch.py"))
    assert verdict.correct  # ours is kept, whatever the second opinion
    assert verdict.second_opinion is not None and verdict.second_opinion.error == NO_GPU
    assert verdict.second_opinion.agrees is None
    assert json.loads(verdict.model_dump_json())["second_opinion"]["error"] == NO_GPU


def test_cli_static_only_with_a_bad_harness_path_does_not_crash(tmp_path, cache):
    from stitchcuda.cli import app

    result = CliRunner().invoke(app, ["verify", str(CPU / "tiny_mlp.py"), str(CPU / "pure_torch.py"), "--json",
                                      "--static-only", "--kernelbench-harness", str(tmp_path / "nowhere")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 1  # a total hack, found statically; nothing ran, so no second opinion
    assert json.loads(result.stdout)["second_opinion"] is None
    for command in ("verify", "bench"):
        assert "--kernelbench-harness" in CliRunner().invoke(app, [command, "--help"], terminal_width=200).output


def _verdict(correct: bool, opinion: SecondOpinion):
    from stitchcuda.verify import TOLERANCES, Verdict
    from stitchcuda.verify.verdict import SourceRef

    return Verdict(task=SourceRef(name="t", sha256="0"), candidate=SourceRef(name="c", sha256="1"),
                   tolerance=TOLERANCES["strict"], compiled=True, correct=correct, passed=correct,
                   second_opinion=opinion)


def _render(renderable) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_verify_output_shows_both_and_highlights_a_disagreement():
    from stitchcuda.cli.console import verdict_view

    fails = SecondOpinion(compiled=True, correct=False, agrees=False, detail="max_difference: 0.3")
    text = _render(verdict_view(_verdict(True, fails)))
    assert "KernelBench harness: INCORRECT (max_difference: 0.3)" in text
    assert "DISAGREES: we pass, KernelBench fails" in text
    agrees = SecondOpinion(compiled=True, correct=True, agrees=True, runtime_ms=0.25, seconds=3)
    text = _render(verdict_view(_verdict(True, agrees)))
    assert "KernelBench harness: correct" in text and "DISAGREES" not in text
    text = _render(verdict_view(_verdict(False, SecondOpinion(error=NO_GPU))))
    assert f"KernelBench harness: could not judge ({NO_GPU})" in text


def test_a_bench_row_carries_the_second_opinion():
    from stitchcuda.bench.records import TaskResult
    from stitchcuda.bench.runner import result_from_verdict

    opinion = SecondOpinion(compiled=True, correct=False, agrees=False)
    row = result_from_verdict("t", 1, _verdict(True, opinion), "prog.py")
    assert row.second_opinion == opinion
    assert TaskResult.model_validate_json(row.model_dump_json()).second_opinion == opinion  # stored and read back


def _bench(with_opinions: bool):
    from stitchcuda.bench.records import BenchInfo, BenchResult, TaskResult

    opinions = [SecondOpinion(compiled=True, correct=True, agrees=True),
                SecondOpinion(compiled=True, correct=False, agrees=False),
                SecondOpinion(error="KernelBench's harness ran past its limit of 9 s and was killed"), None]
    tasks = [TaskResult(task=f"t{i}", status="done", compiled=True, correct=True, passed=True, hacking="none",
                        speedup={"eager": 1.5}, second_opinion=o if with_opinions else None)
             for i, o in enumerate(opinions)]
    info = BenchInfo(id="bench-kb", suite="suite", coder="evaluate", tolerance="strict", status="done")
    return BenchResult(info=info, tasks=tasks)


def test_report_has_a_kernelbench_column_and_the_agreement_count(tmp_path):
    from stitchcuda.bench.metrics import bench_metrics
    from stitchcuda.bench.report import write_report
    from stitchcuda.cli.console import bench_view

    result = _bench(with_opinions=True)
    files = write_report(result, tmp_path / "report")
    html = files.html.read_text()
    assert "<th>KernelBench</th>" in html and "agrees 1/2, disagrees on 1" in html
    assert "1 not judged by it" in html
    assert re.search(r'class="kernelbench disagrees">INCORRECT – DISAGREES<', html)
    assert "not judged: KernelBench&#39;s harness ran past its limit" in html
    md = files.markdown.read_text()
    assert "agrees 1/2" in md and "**INCORRECT – DISAGREES**" in md
    header = next(line for line in md.splitlines() if line.startswith("| task |"))
    cells = re.compile(r"(?<!\\)\|")
    rows = [line for line in md.splitlines() if re.match(r"\| t\d \|", line)]
    assert len(rows) == 4 and all(len(cells.findall(r)) == len(cells.findall(header)) for r in rows)

    text = _render(bench_view(result, bench_metrics(result.tasks, result.info)))
    assert "KernelBench harness agrees 1/2, 1 DISAGREE; 1 not judged by it" in text

    plain = write_report(_bench(with_opinions=False), tmp_path / "plain")
    assert "<th>KernelBench</th>" not in plain.html.read_text() and "agrees" not in plain.markdown.read_text()


@pytest.mark.skipif(not (REAL_CHECKOUT / "src" / "kernelbench" / "eval.py").is_file(),
                    reason="no KernelBench checkout at ../shared/kernelbench")
def test_the_real_harness_imports_without_its_llm_clients():
    # in a process of its own: KernelBench's package patches torch.randn when imported
    code = ("import importlib.util as u, sys\n"
            "missing = [n for n in ('litellm', 'dotenv') if u.find_spec(n) is None]\n"
            "from stitchcuda.verify.kernelbench_harness import load_eval\n"
            f"harness = load_eval({str(REAL_CHECKOUT)!r})\n"
            "assert callable(harness.eval_kernel_against_ref)\n"
            "assert all(not getattr(sys.modules[n], '__file__', None) for n in missing), missing\n"
            "print('LOADED', missing)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "LOADED" in done.stdout, done.stderr[-2000:]


def test_the_harness_loads_the_extensions_our_build_made_and_times_inside_the_exclusive_section(tmp_path):
    """KernelBench's eval builds the program as it loads it; its process is served our build of the
    same source from the cache (no second compiler run), and its timing runs alone on the GPU."""
    from stitchcuda.task import load_candidate
    from stitchcuda.verify import PRESETS, Verifier
    from stitchcuda.verify.gate import GpuGate

    candidate = load_candidate(CPU / "cpp_extension.py")
    config = PRESETS["tiny-debug"].model_copy(update={"device": "cpu"})
    verifier = Verifier(config, cache=tmp_path / "cache")
    report = verifier.build(candidate)
    assert report.ok and not report.cache_hit  # our build, in our cache
    # its eval loads the program as KernelBench does (exec with TORCH_EXTENSIONS_DIR set) and times it
    before = ("ModelNew = load_custom_model(custom_model_src, {}, build_dir)\n"
              "    import kernelbench.timing as t\n    t.get_timing_function('cuda_event')(lambda *a: None, [], 3)")
    checkout = fake_checkout(tmp_path / "kb", before=before)
    gate = GpuGate("cpu", tmp_path / "locks")
    reference = (CPU / "tiny_mlp.py").read_text()
    opinion = judge(str(checkout), reference, candidate.source, cache=tmp_path / "cache", limit_s=300,
                    env=verifier._env(hide_gpu=True), gate_path=str(gate.path))
    assert opinion.error is None and opinion.correct, opinion.error
    assert opinion.builds_cached is True  # loaded, not compiled again
    assert not list((tmp_path / "cache" / "kernelbench-harness").rglob("*.so"))  # torch built nothing of its own
    assert set(opinion.stages) == {"start", "build", "correctness", "timing", "gpu_wait"}
    assert opinion.stages["start"] > 0 and opinion.stages["build"] < 20
    # its timing alone; nothing here moves to a CUDA device, so no shared section was ever taken
    assert len(opinion.gpu_intervals) == 1


def test_a_harness_call_takes_the_shared_section_only_from_its_first_move_to_the_gpu(tmp_path):
    """KernelBench builds both models (their random init, on the CPU) before it moves either to the
    GPU: that time must not hold the gate, or every other process's timing waits behind it. The
    tripwires are gone once fired, and after the call."""
    import torch

    from stitchcuda.verify.gate import GpuGate
    from stitchcuda.verify.kernelbench_harness import HarnessRequest, _Session

    gate = GpuGate("cpu", tmp_path / "locks")
    session = _Session(HarnessRequest(checkout="kb", reference_path="r", candidate_path="c", result_path="o",
                                      gate_path=str(gate.path)))
    originals = (torch.Tensor.to, torch.Tensor.cuda, torch.nn.Module.to, torch.nn.Module.cuda)
    with session.gpu_from_first_move():
        model = torch.nn.Linear(4, 4).to("cpu")  # construction and CPU moves: no gate
        torch.ones(2).to(torch.float64)
        assert session.gate.held is None
        with pytest.raises((RuntimeError, AssertionError)):  # no CUDA on this machine: the move itself fails
            model.to(device="cuda")
        assert session.gate.held == "shared"
        assert (torch.Tensor.to, torch.Tensor.cuda, torch.nn.Module.to, torch.nn.Module.cuda) == originals
    assert session.gate.held is None and len(session.gate.use.intervals) == 1
    with session.gpu_from_first_move(), pytest.raises((RuntimeError, AssertionError)):
        torch.ones(2).cuda()  # a tensor's move trips it too
    assert len(session.gate.use.intervals) == 2
    assert (torch.Tensor.to, torch.Tensor.cuda, torch.nn.Module.to, torch.nn.Module.cuda) == originals


def test_integer_inputs_are_cast_back_for_kernelbench_whose_harness_makes_every_input_float32():
    """KernelBench casts every input to float32, token ids too: both models, wrapped, cast them back
    first; the classes keep their constructors (``super(Model, self)`` included) and state_dict keys."""
    import torch

    from stitchcuda.verify.kernelbench_harness import _wrap_forward, integer_inputs

    reference = (
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def __init__(self):\n        super(Model, self).__init__()\n        self.table = nn.Embedding(50, 8)\n\n"
        "    def forward(self, ids, mask):\n        return self.table(ids) * mask.unsqueeze(-1)\n\n\n"
        "def get_inputs():\n    return [torch.randint(0, 50, (2, 5)), torch.ones(2, 5, dtype=torch.bool)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    restored = integer_inputs(reference)
    assert restored == {0: "torch.int64", 1: "torch.bool"}
    scope: dict = {}
    exec(_wrap_forward(reference, "Model", restored, flatten=False), scope)
    torch.manual_seed(0)
    model = scope["Model"]()
    assert list(model.state_dict()) == ["table.weight"]
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    out = model(ids.float(), torch.ones(2, 5))  # what KernelBench's harness hands it
    assert torch.equal(out, model.table(ids))


def test_an_incorrect_at_its_fp32_tolerance_is_asked_again_at_its_v01_tolerance(tmp_path):
    """Its harness now judges fp32 at 1e-4, which TF32 arithmetic (tolerance paper) misses by design;
    v0/v0.1 took 1e-2, the tolerance of published results. Asked there, the program is timed apart."""
    top = "def get_tolerance_for_precision(precision):\n    return 1e-4\n"
    before = ("if 'TF32ARITH' in custom_model_src and get_tolerance_for_precision(precision) < 1e-2:\n"
              "        return KernelExecResult(True, False, -1.0, {'max_difference': '0.002'})")
    checkout = fake_checkout(tmp_path / "kb", top=top, before=before)
    opinion = _judge(checkout, tmp_path, candidate=CANDIDATE + "\n# TF32ARITH\n")
    assert opinion.correct is False and opinion.correct_true_fp32 is False and opinion.correct_v01 is True
    assert opinion.timed_apart and opinion.speedup == pytest.approx(1.5) and opinion.agrees is False
    wrong = _judge(checkout, tmp_path, candidate=CANDIDATE + "\n# WRONG\n")
    assert wrong.correct_v01 is False and wrong.speedup is None
    assert _judge(checkout, tmp_path).correct_v01 is None  # correct: not asked again

    from stitchcuda.cli.console import second_opinion_view
    from stitchcuda.verify.verdict import Verdict

    lines = [t.plain for t in second_opinion_view(Verdict.model_construct(correct=True, second_opinion=opinion))]
    assert any("v0/v0.1 fp32 tolerance 1e-2" in t and t.endswith("correct") for t in lines)


def test_a_warm_harness_process_judges_clean_programs_one_after_another(tmp_path):
    """Kept warm (KernelBench's package imported once), a harness process judges the next program
    only after a clean one: ours found it correct and no hack, and KernelBench judged it correct."""
    import os

    from stitchcuda.verify.second_opinion import harness_pool

    checkout = str(fake_checkout(tmp_path / "kb"))
    pool = harness_pool(dict(os.environ))

    def ask(candidate: str = CANDIDATE, clean: bool = True) -> SecondOpinion:
        return judge(checkout, REFERENCE, candidate, cache=tmp_path / "cache", pool=pool, clean=clean)

    try:
        first = ask()
        kept = [w.proc.pid for w in pool._idle]
        second = ask()
        reused = [w.proc.pid for w in pool._idle]
        wrong = ask(CANDIDATE + "\n# WRONG\n")  # KernelBench says incorrect: its process retires
        after_wrong = [w.proc.pid for w in pool._idle]
        hacked = ask(clean=False)  # ours found something: retired whatever KernelBench says
        after_hacked = [w.proc.pid for w in pool._idle]
    finally:
        pool.close()
    assert first.correct and second.correct and wrong.correct is False and hacked.correct
    assert len(kept) == 1 and reused == kept and after_wrong == [] and after_hacked == []
    assert second.stages["start"] < first.stages["start"]  # no process start, no imports


def test_an_incorrect_at_both_references_is_asked_of_two_controls(tmp_path):
    """Where the fp32 reference's own rounding spread is beyond the tolerance (a deep network in
    training mode), no fp32 program can pass: the reference run channels-last and the exact answer
    (the reference in float64) are asked as controls, and where one fails too the verdict is not
    judgeable rather than a disagreement. A program that is wrong where both pass stays wrong."""
    top = "def get_tolerance_for_precision(precision):\n    return 1e-4\n"
    # the fake harness rejects every candidate holding ILLCOND, and every one holding EXACTONLY but
    # the channels-last control, by 0.000512; a program holding FAROFF by 0.5
    before = ("if 'ILLCOND' in custom_model_src or ('EXACTONLY' in custom_model_src and "
              "'channels_last' not in custom_model_src):\n"
              "        miss = '0.5' if 'FAROFF' in custom_model_src and 'a control' not in custom_model_src else '0.000512'\n"
              "        return KernelExecResult(True, False, -1.0, {'max_difference': [miss, '0.0001']})")
    checkout = fake_checkout(tmp_path / "kb", top=top, before=before)

    def ask(marker: str, in_reference: bool = True, program: str = "") -> SecondOpinion:
        reference = REFERENCE + (f"\n# {marker}\n" if in_reference else "")
        return judge(str(checkout), reference, CANDIDATE + f"\n# {marker} {program}\n", cache=tmp_path / "cache",
                     our_correct=True)

    reordered = ask("ILLCOND")
    assert reordered.correct is False and reordered.correct_true_fp32 is False
    assert reordered.reordered_correct is False and reordered.exact_correct is None  # the first failed: enough
    assert "0.000512" in reordered.control_detail and not reordered.judgeable and reordered.agrees is None
    assert reordered.timed_apart and reordered.speedup == pytest.approx(1.5)  # its speedup still counts
    exact = ask("EXACTONLY")
    assert exact.reordered_correct is True and exact.exact_correct is False and not exact.judgeable

    # a control failed, but the program missed by far more: its verdict stands
    far = ask("ILLCOND", program="FAROFF")
    assert far.reordered_correct is False and far.judgeable and far.agrees is False
    # both controls pass: the program's miss is its own
    wrong = ask("ILLCOND", in_reference=False)
    assert wrong.reordered_correct is True and wrong.exact_correct is True and wrong.judgeable
    assert wrong.agrees is False
    assert _judge(checkout, tmp_path).exact_correct is None  # correct: not asked

    from stitchcuda.bench.records import TaskResult
    from stitchcuda.bench.report import _opinion_cell
    from stitchcuda.cli.console import second_opinion_view
    from stitchcuda.verify.verdict import Verdict

    lines = [t.plain for t in second_opinion_view(Verdict.model_construct(correct=True, second_opinion=reordered))]
    assert any("channels-last" in t and "incorrect too" in t for t in lines)
    assert any(t.strip().startswith("not judgeable") for t in lines)
    cell = _opinion_cell(TaskResult.model_construct(second_opinion=reordered))
    assert cell.startswith("not judgeable") and "channels-last" in cell


def _model_and_control(source: str):
    """The reference's Model and the control's ModelNew from a control's source, each built under
    seed 42 as KernelBench's harness builds them."""
    import torch

    scope: dict = {}
    exec(compile(source, "control.py", "exec"), scope)
    torch.manual_seed(42)
    model = scope["Model"]()
    torch.manual_seed(42)
    return model, scope["ModelNew"]()


def test_the_exact_control_is_the_reference_in_float64_and_keeps_its_state():
    """The control's outputs are the fp64 reference's, rounded; the state a call leaves (batch-norm
    running statistics, a hidden state kept between calls) advances as the reference's does."""
    import torch

    from stitchcuda.verify.harness_controls import exact_control

    reference = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.hidden = torch.zeros(2, 8)

    def forward(self, x):
        self.hidden = torch.tanh(self.cell(x) + self.hidden)
        return self.norm(self.hidden), x.shape[0]


def get_inputs():
    return [torch.randn(2, 8)]


def get_init_inputs():
    return []
'''
    model, control = _model_and_control(exact_control(reference))
    exact = __import__("copy").deepcopy(model).double()
    x = torch.randn(2, 8)
    for call in range(3):
        with torch.no_grad():
            want, count = exact(x.double())
            got, n = control(x)
        assert got.dtype == torch.float32 and n == count == 2
        # its state is kept in the reference's float32 between calls: exact on the first call, then
        # within float32's rounding
        assert torch.equal(got, want.float()) if call == 0 else torch.allclose(got, want.float(), atol=1e-6)
        assert torch.allclose(control.hidden, exact.hidden.float(), atol=1e-6) and control.hidden.dtype == torch.float32
    assert torch.allclose(control.norm.running_mean, exact.norm.running_mean.float(), atol=1e-6)
    assert int(control.norm.num_batches_tracked) == 3


def test_the_exact_answer_is_not_asked_where_ours_found_the_program_wrong(tmp_path):
    top = "def get_tolerance_for_precision(precision):\n    return 1e-4\n"
    checkout = fake_checkout(tmp_path / "kb", top=top)
    opinion = _judge(checkout, tmp_path, candidate=CANDIDATE + "\n# WRONG\n", our_correct=False)
    assert opinion.correct is False and opinion.correct_true_fp32 is False and opinion.exact_correct is None
    assert opinion.agrees is True


def test_the_reordered_control_is_the_reference_channels_last_in_fp32():
    import torch

    from stitchcuda.verify.harness_controls import reordered_control

    reference = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.norm = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.norm(self.conv(x))


def get_inputs():
    return [torch.randn(2, 3, 9, 9)]


def get_init_inputs():
    return []
'''
    model, control = _model_and_control(reordered_control(reference))
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        want, got = model(x), control(x)
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-5)
    assert control.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert int(control.norm.num_batches_tracked) == 1  # its own state advances as the reference's
