"""The offline Planner on CPU: graph capture, fusion groups and the Plan on every bundled task."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from stitchcuda.agents.offline_planner import OfflinePlanner, describe
from stitchcuda.compiler.capture.graph import OpGraph, capture
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.schedule.fusion import fuse
from stitchcuda.task import resolve_tasks
from stitchcuda.task.record import Task
from stitchcuda.verify.verdict import OpStat, ProgramProfile

TASKS = {t.name: t for t in resolve_tasks("suite")}


@functools.cache
def planned(name: str):
    graph = capture(TASKS[name])
    plan, groups = OfflinePlanner().plan(TASKS[name], graph=graph)
    return graph, plan, groups


def produced_by(graph: OpGraph) -> dict[str, str]:
    """value -> the node that makes it (getitems resolved to their multi-output node)."""
    found = {n.name: n.name for n in graph.nodes}
    found.update({v: src for v, (src, _) in graph.getitems.items()})
    return found


def check_groups(graph: OpGraph, groups: list[FusionGroup]) -> None:
    names = [n.name for n in graph.nodes]
    order = {n: i for i, n in enumerate(names)}
    seen = Counter(m for g in groups for m in g.nodes)
    assert set(seen) == set(names), "every node in a group"
    assert all(c == 1 for c in seen.values()), f"nodes in several groups: {[n for n, c in seen.items() if c > 1]}"
    assert [g.id for g in groups] == list(range(len(groups)))
    placeholders = {p.name for p in graph.placeholders}
    producer = produced_by(graph)
    owner = {m: g.id for g in groups for m in g.nodes}
    available = set(placeholders)
    for g in groups:
        assert g.nodes == sorted(g.nodes, key=order.__getitem__), f"group {g.id} not in graph order"
        inside = set(g.nodes)
        for part in (g.epilogue, g.prologue, g.views, list(g.roles.values())):
            assert set(part) <= inside
        if g.anchor is not None:
            assert g.anchor in inside
        reads = {v for m in g.nodes for v in graph.node(m).inputs()}
        outside_reads = {v for v in reads if v in placeholders or producer[v] not in inside}
        assert set(g.inputs) == outside_reads, f"group {g.id} inputs"
        missing = [v for v in g.inputs if v not in available]
        assert not missing, f"group {g.id} reads {missing} before any earlier group writes them"
        for v in g.outputs:
            assert v in producer and producer[v] in inside, f"group {g.id} outputs {v} it does not make"
        available.update(g.outputs)
    # Every value read by another group, or returned, is an output of the group that makes it.
    for n in graph.nodes:
        for v in n.inputs():
            if v in producer and owner[producer[v]] != owner[n.name]:
                assert v in groups[owner[producer[v]]].outputs, f"{v} crosses groups but is not an output"
    for v in graph.outputs:
        if v not in placeholders:
            assert v in groups[owner[producer[v]]].outputs


@pytest.mark.parametrize("name", sorted(TASKS))
def test_capture_fuse_plan(name):
    graph, plan, groups = planned(name)
    assert graph.nodes
    check_groups(graph, groups)

    assert plan.source == "offline"
    shares = [s.time_share for s in plan.subtasks]
    assert sum(shares) == pytest.approx(1.0, abs=0.01)
    assert shares == sorted(shares, reverse=True)
    real = {n.op for n in graph.nodes}
    for s in plan.subtasks:
        assert s.operators and all(op.replace("::", ".", 1) in real for op in s.operators), s.operators
        assert s.fusion and s.layout.startswith("fp32") and s.target_speedup >= 1.0
    assert "CUDA graph" in plan.subtasks[-1].host and "preallocated" in plan.subtasks[-1].host
    covered = {op for s in plan.subtasks for op in s.operators}
    assert covered == {op.replace(".", "::", 1) for op in real}

    text = describe(groups, graph)
    assert text.startswith(f"{len(groups)} fusion groups over {len(graph.nodes)} operators")
    assert len(text.splitlines()) <= 62


def test_captures_in_threads_do_not_collide():
    # a local bench plans several tasks in threads of one process; torch.export keeps global
    # state, and before the capture lock every one of these failed on the first GPU bench
    from concurrent.futures import ThreadPoolExecutor

    from stitchcuda.compiler.capture.describe import graph_text

    names = ["mlp", "swiglu_ffn", "small_cnn", "norm_softmax_gate", "causal_attention", "squeeze_excitation"]
    with ThreadPoolExecutor(len(names)) as pool:
        graphs = list(pool.map(lambda n: capture(TASKS[n]), names))
        texts = list(pool.map(lambda n: graph_text(TASKS[n]), names))
    assert [g.task for g in graphs] == names and all(g.nodes for g in graphs)
    assert all(text and why is None for text, why in texts)


def test_mlp_gemms_with_gelu_epilogues():
    graph, _, groups = planned("mlp")
    assert [g.kind for g in groups] == ["gemm"] * 3
    assert [graph.node(g.anchor).op for g in groups] == ["aten.linear"] * 3
    assert [[graph.node(e).op for e in g.epilogue] for g in groups] == [["aten.gelu"], ["aten.gelu"], []]


def test_norm_softmax_gate_is_one_or_two_row_kernels():
    graph, _, groups = planned("norm_softmax_gate")
    assert len(groups) <= 2
    assert {g.kind for g in groups} == {"row_reduce"}


@pytest.mark.parametrize("name", ["transformer_block", "causal_attention"])
def test_attention_is_fused(name):
    graph, plan, groups = planned(name)
    attention = [g for g in groups if g.kind == "attention"]
    if attention:
        g = attention[0]
        assert graph.node(g.roles["qk"]).op in ("aten.matmul", "aten.bmm")
        assert graph.node(g.roles["pv"]).op in ("aten.matmul", "aten.bmm")
        assert graph.node(g.roles["softmax"]).op == "aten.softmax"
    else:  # at least a softmax row kernel between two batched matmuls
        kinds = [(g.kind, graph.node(g.anchor).op if g.anchor else None) for g in groups]
        at = next(i for i, k in enumerate(kinds) if k == ("row_reduce", "aten.softmax"))
        assert kinds[at - 1][1] in ("aten.matmul", "aten.bmm") and kinds[at + 1][1] in ("aten.matmul", "aten.bmm")
    assert any("attention" in s.title for s in plan.subtasks)


@pytest.mark.parametrize("name,cell", [("lstm_sequence", "aten.lstm_cell"), ("gru_decoder", "aten.gru_cell")])
def test_recurrent_groups(name, cell):
    graph, plan, groups = planned(name)
    recurrent = [g for g in groups if g.kind == "recurrent"]
    assert len(recurrent) == sum(n.op == cell for n in graph.nodes)
    assert all(graph.node(g.anchor).op == cell for g in recurrent)
    assert "batched" in recurrent[0].note
    assert any(s.title.startswith(f"{len(recurrent)} recurrent") for s in plan.subtasks)


def test_conv_epilogues_fold_eval_batch_norm():
    graph, _, groups = planned("conv_residual_block")
    assert [g.kind for g in groups] == ["conv", "conv"]
    assert [graph.node(e).op for e in groups[1].epilogue] == ["aten.batch_norm", "aten.add", "aten.relu"]
    kept = fuse(graph, fold_batch_norm=False)
    check_groups(graph, kept)
    assert [g.kind for g in kept].count("row_reduce") == 2


def test_shared_value_stops_the_epilogue():
    source = '''
import torch
from torch import nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 32)

    def forward(self, x):
        h = self.a(x)
        y = torch.relu(h)
        z = self.b(y) + h
        return torch.sigmoid(self.c(z)), y

def get_inputs():
    return [torch.randn(8, 64)]

def get_init_inputs():
    return []
'''
    graph = capture(Task(name="shared", source=source))
    groups = fuse(graph)
    check_groups(graph, groups)
    first = groups[0]
    assert first.anchor == "linear" and first.epilogue == [] and first.outputs == ["linear"]
    by_anchor = {g.anchor: g for g in groups}
    assert [graph.node(e).op for e in by_anchor["linear_1"].epilogue] == ["aten.add"]
    assert [graph.node(e).op for e in by_anchor["linear_2"].epilogue] == ["aten.sigmoid"]
    relu = next(g for g in groups if "relu" in g.nodes)
    assert "relu" in relu.outputs  # returned and read by linear_1


def test_profile_orders_the_subtasks():
    task = TASKS["mlp_mixer_block"]
    graph = planned("mlp_mixer_block")[0]
    estimate, _ = OfflinePlanner().plan(task, graph=graph)
    assert "GEMM" in estimate.subtasks[0].title
    profile = ProgramProfile(gpu_time_us=1000.0, ops=[
        OpStat(name="aten::native_layer_norm", calls=2, gpu_us=900.0, share=0.9),
        OpStat(name="aten::addmm", calls=4, gpu_us=100.0, share=0.1),
    ])
    measured, _ = OfflinePlanner().plan(task, graph=graph, profile=profile)
    assert "row-reduction" in measured.subtasks[0].title
    assert measured.subtasks[0].time_share > 0.5
    assert "profile" in measured.rationale


def test_optimize_offline_without_a_gpu_writes_the_program_and_says_so(tmp_path, monkeypatch):
    """`stitchcuda optimize mlp` with no model and no GPU: the offline Coder writes the program,
    compile-checks it where the machine allows, and says that verification needs a GPU."""
    import json

    from typer.testing import CliRunner

    from stitchcuda import machine
    from stitchcuda.cli import app
    from stitchcuda.compiler import check
    from stitchcuda.verify.judge import hacking_level
    from stitchcuda.verify.static_checks import static_findings

    monkeypatch.setattr(machine, "gpus", lambda: ())
    # nvcc takes a minute here; tests/test_offline_codegen.py compiles the same programs
    skipped = check.CompileCheck(status="skipped", detail="not compiled in this test")
    monkeypatch.setattr("stitchcuda.agents.session.compile_check", lambda program: skipped)
    out = tmp_path / "mlp_fast.py"
    result = CliRunner().invoke(app, ["optimize", "mlp", "--workspace", str(tmp_path / "ws"), "-o", str(out),
                                      "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "unverified" and "needs a CUDA GPU" in summary["note"]
    assert hacking_level(static_findings(out.read_text()).findings) == "none"
    # the run is kept like any other: listed, with its program and compile check
    from stitchcuda.store import RunStore

    runs = RunStore(tmp_path / "ws").runs()
    assert [(r.id, r.status) for r in runs] == [(summary["run"], "unverified")]
    run_dir = tmp_path / "ws" / "runs" / summary["run"]
    assert (run_dir / "program.py").read_text() == out.read_text()
    assert json.loads((run_dir / "compile_check.json").read_text())["status"] == "skipped"
    listed = CliRunner().invoke(app, ["runs", "--workspace", str(tmp_path / "ws")])
    assert listed.exit_code == 0 and "unverified" in listed.output


def _verdict(correct: bool = True, ms: float | None = None, top: str | None = None, idle: float = 0.0,
             launches: int = 0, errors: tuple[str, ...] = ()):
    """A Verifier verdict with only the fields the offline Coder reads."""
    from stitchcuda.verify.config import TOLERANCES
    from stitchcuda.verify.verdict import (
        KernelStat,
        ProgramProfile,
        SourceRef,
        TimingReport,
        TimingStats,
        Verdict,
    )

    timing = None
    if ms is not None:
        stats = TimingStats(median_ms=ms, mean_ms=ms, min_ms=ms, max_ms=ms, q25_ms=ms, q75_ms=ms, std_ms=0.0,
                            spread_pct=0.0, trials=10)
        timing = TimingReport(method="test", candidate=stats, baselines={})
    kernels = [KernelStat(name="k", origin=top, calls=1, total_us=100.0, share=0.6)] if top else []
    profile = ProgramProfile(gpu_time_us=100.0, idle_share=idle, launches=launches, kernels=kernels)
    return Verdict(task=SourceRef(name="t", sha256="0"), candidate=SourceRef(name="c", sha256="1"), tolerance=TOLERANCES["strict"],
                   compiled=True, correct=correct, timing=timing, profile=profile, errors=list(errors))


def test_offline_coder_picks_the_next_variant_from_the_verdict():
    from stitchcuda.agents.offline import Signals, choose_next, variants

    opts = variants("strict")
    assert opts[0]["cost_model"] and opts[0]["split_tf32"] and opts[0]["cutlass"]  # the model picks per operator
    assert opts[1]["split_tf32"] and opts[2]["cutlass"] and opts[3]["cublaslt"] and not opts[4]["cublaslt"]
    assert opts[0]["graph"] and not any(o["cutlass"] for o in opts if o["split_tf32"] and not o["cost_model"])
    assert choose_next(opts, [], Signals()) == 0
    library = Signals.from_verdict(_verdict(ms=1.2, top="library"))
    assert choose_next(opts, [0], library) == 1  # the other GEMM path
    wrong = Signals.from_verdict(_verdict(correct=False, errors=("incorrect in 2 of 5 trials: max abs diff 3e-4",)))
    after = opts[choose_next(opts, [0], wrong, base=0)]
    assert not after["split_tf32"] and not after["cutlass"] and after["cublaslt"]  # the model's mix wrong: fp32 next
    own = Signals.from_verdict(_verdict(ms=1.2, top="own"))
    nxt = choose_next(opts, [0, 1, 2], own, base=2)
    assert (opts[nxt]["block"], opts[nxt]["vector_width"]) != (opts[2]["block"], opts[2]["vector_width"])
    failed = Signals.from_verdict(_verdict(correct=False, errors=(
        "build of 'x' failed at program.cu:120: identifier cublasLtMatmulDescCreate undefined",)))
    assert not opts[choose_next(opts, [1], failed)]["cublaslt"]
    no_graph = [i for i, o in enumerate(opts) if not o["graph"]]
    launch = Signals.from_verdict(_verdict(ms=0.9, idle=0.45, launches=120))
    assert opts[choose_next(opts, [no_graph[0]], launch)]["graph"]
    assert choose_next(opts, list(range(len(opts))), Signals()) == len(opts) - 1  # used up: the last again
    paper = variants("paper")
    assert paper[0]["tf32"] and not variants("strict")[0]["tf32"]
    # under TF32 only the cost model splits (a transposed or 3-d convolution): a split that failed
    # rules out the model's variants, not just the split_tf32 ones (none under paper)
    split_failed = Signals(failure="build of 'x' failed at program.cu:88: sc_split_conv: too many resources")
    assert not paper[choose_next(paper, [0, 1, 2, 3], split_failed, base=0)]["cost_model"]  # bf16's model next else


def test_strict_tries_plain_tf32_second_where_a_library_kernel_leads_and_drops_it_when_wrong():
    """Eager with TF32 passed 1e-4 on the suite's lm_head_nll, mlp and swiglu_ffn at 2-3x our
    3xTF32: the search tries the TF32 twin of the first variant next (the model estimates it
    fastest), the Verifier keeps it only within the tolerance, and a miss rules TF32 out."""
    from stitchcuda.agents.offline import Signals, choose_next, variants

    opts = variants("strict")
    estimates = [0.4 if o["tf32"] else 1.0 for o in opts]
    library = Signals(top_origin="library")
    nxt = choose_next(opts, [0], library, base=0, estimates=estimates)
    assert opts[nxt] == {**opts[0], "tf32": True, "split_tf32": False}
    wrong = Signals(failure="incorrect in 3 of 5 trials: max abs diff 2e-4")
    after = choose_next(opts, [0, nxt], wrong, base=0, estimates=estimates)
    assert not opts[after]["tf32"]
    own = Signals(top_origin="own", library_share=0.2)  # our own kernel on top: another block size or width first
    assert not opts[choose_next(opts, [0], own, base=0, estimates=estimates)]["tf32"]
    shared = Signals(top_origin="own", library_share=0.45)  # ours on top, but much of the time in the library
    assert opts[choose_next(opts, [0], shared, base=0, estimates=estimates)]["tf32"]


def test_offline_coder_searches_from_the_fastest_verified_variant():
    """After cuBLAS beat cuBLASLt, the next variant keeps cuBLAS and changes one other option (a
    GPU run went back to cuBLASLt with scalar kernels, two changes at once, and lost 17%)."""
    from stitchcuda.agents.extract import extract_program
    from stitchcuda.agents.offline import OfflineCoder, Signals, choose_next, variant_of, variants
    from stitchcuda.agents.records import CoderRequest

    opts = variants("strict")
    nxt = choose_next(opts, [0, 1, 2, 3], Signals.from_verdict(_verdict(ms=0.83, top="library")), base=3)
    assert not opts[nxt]["cublaslt"] and sum(opts[nxt][k] != v for k, v in opts[3].items()) == 1
    # every option on every other: 60 in fp32 arithmetic, 48 in plain TF32 (no split); attention as
    # its products, then each again with attention as one kernel
    assert len({tuple(sorted(o.items())) for o in opts}) == len(opts) == 2 * (60 + 48)
    assert not any(o["tf32"] for o in opts[:60]) and all(o["tf32"] and not o["split_tf32"] for o in opts[60:108])
    assert not any(o["fused_attention"] for o in opts[:108]) and all(o["fused_attention"] for o in opts[108:])
    # TF32: four paths (its own cost model, cuBLASLt, CUTLASS, cuBLAS; no split), bf16: the model's only
    assert len(variants("paper")) == 2 * (12 * 4 + 12 + 60)

    task = TASKS["mlp"]
    coder = OfflineCoder(task, "strict")
    assert len(coder.variants) == 60 + 48  # no attention: its one-kernel variants are the same programs
    # a program written before an option existed names the variant with that option at its default
    older = {k: v for k, v in opts[5].items() if k != "fused_attention"}
    assert variant_of(f"  Options {older}\n", opts) == 5
    answers = [coder.answer(CoderRequest(skill="scratch")) for _ in range(5)]  # nothing shown: a walk
    # the cost model, then the paths the model estimates fastest first: its TF32 twin and the other
    # TF32 paths, each one change from the one before
    walk = [variant_of(a.text, coder.variants) for a in answers]
    assert walk[:2] == [0, 60] and all(coder.variants[i]["tf32"] for i in walk[1:])
    # the loop kept the fourth as the fastest, so the step starts from it: the search goes on from it
    program = extract_program(answers[3].text)
    request = CoderRequest(skill="optimize", program=program, verdict=_verdict(ms=0.8, top="own"))
    chosen = coder.variants[variant_of(coder.answer(request).text, coder.variants)]
    changed = {k for k, v in chosen.items() if coder.variants[walk[3]][k] != v}
    assert changed in ({"block"}, {"vector_width"})  # our kernel on top: another block size or width


def test_offline_coder_goes_on_from_the_fastest_it_was_shown():
    """Moving to the next subtask, the loop carries the last program even when it was slower;
    the Coder remembers the times the verdicts gave and searches from the fastest."""
    from stitchcuda.agents.extract import extract_program
    from stitchcuda.agents.offline import GEMM_PATH, OfflineCoder, variant_of
    from stitchcuda.agents.records import CoderRequest

    task = TASKS["mlp"]
    coder = OfflineCoder(task, "strict")
    programs = [extract_program(coder.answer(CoderRequest(skill="scratch")).text) for _ in range(2)]

    def carrying(i: int, ms: float) -> CoderRequest:
        return CoderRequest(skill="scratch", program=programs[i], verdict=_verdict(ms=ms))

    second = variant_of(programs[1], coder.variants)  # the TF32 twin of the first (the model's fastest)
    assert second == 60
    coder.answer(carrying(0, 2.116))  # the first, timed
    chosen = variant_of(coder.answer(carrying(1, 2.218)).text, coder.variants)
    assert coder.verified_ms == {0: 2.116, second: 2.218}
    assert chosen is not None and chosen not in (0, second)
    base = coder.variants[0]  # the fastest: the next differs from it in one option
    path = (*GEMM_PATH, "tf32")
    assert sum(coder.variants[chosen][k] != v for k, v in base.items() if k not in path) + any(
        coder.variants[chosen][k] != base[k] for k in path) == 1


def test_the_loop_hands_a_typed_coder_the_program_and_its_verdict(tmp_path):
    """The loop asks a TypedCoder with a CoderRequest (program text and the Verdict record on it),
    and still logs the prompt it would have sent an LLM."""
    from stitchcuda.agents.loop import OptimizeConfig, Optimizer
    from stitchcuda.agents.offline import OFFLINE
    from stitchcuda.agents.records import CoderRequest, RunState
    from stitchcuda.llm.base import Completion, Usage
    from stitchcuda.store import RunStore
    from stitchcuda.verify import PRESETS

    class Recording:
        config = OFFLINE

        def __init__(self):
            self.requests: list[CoderRequest] = []

        def answer(self, request: CoderRequest) -> Completion:
            self.requests.append(request)
            return Completion(text="```python\nx = 1\n```", model="m", usage=Usage(), seconds=0.0,
                              finish_reason="stop")

        def samples_wanted(self, request: CoderRequest) -> int:
            return 1

        def complete(self, messages, **kw):
            raise AssertionError("a typed Coder is asked with the request, not the prompt")

    task = TASKS["mlp"]
    program = tmp_path / "step000-s0.py"
    program.write_text("# the program\n")
    verdict = _verdict(ms=0.8, top="own")
    program.with_suffix(".verdict.json").write_text(verdict.model_dump_json())
    coder = Recording()
    config = OptimizeConfig(planner=OFFLINE, coder=OFFLINE, verify=PRESETS["tiny-debug"])
    store = RunStore(tmp_path / "ws")
    opt = Optimizer(task, config, coder, coder, None, store, profile_reference=False)
    state = RunState(run_id=store.new_run_id(task.name), task=task.name, task_sha256=task.sha256,
                     plan=planned("mlp")[1], program=str(program), program_feedback="Correct. 0.800 ms",
                     program_verdict=str(program.with_suffix(".verdict.json")), last_action="optimize")
    store.create_run(state, config)
    request = opt._coder_request(state, "feedback", fixing=False)
    assert request.skill == "optimize" and request.program == "# the program\n"
    assert request.verdict is not None and request.verdict.timing.candidate.median_ms == 0.8
    answer, _, error = opt._ask(state, 0, 0, opt._coder_prompt(state, state.plan.subtasks[0], "feedback", False),
                                request)
    assert error is None and "x = 1" in answer and coder.requests == [request]
    (_, _, _, logged, _), = store.coder_calls(state.run_id)
    assert "# the program" in logged[-1]["content"]  # the prompt is in the log all the same


def test_the_llm_planner_reads_the_compiler_capture_in_the_model_mode(tmp_path):
    """One capture for every agent: the Planner's graph is the compiler's core-ATen graph, in the
    mode the task leaves the model (training-mode BatchNorm), with recurrent steps folded."""
    from stitchcuda.compiler.capture.describe import graph_text
    from stitchcuda.task import load_task_file

    text, why = graph_text(TASKS["lstm_sequence"])
    assert why is None and "x128 {" in text and "[cell1]" in text and "[cell2]" in text
    assert len(text.splitlines()) < 12

    path = tmp_path / "bn_train.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.bn = nn.BatchNorm2d(8)\n\n"
        "    def forward(self, x):\n        return torch.relu(self.bn(x))\n\n"
        "def get_inputs():\n    return [torch.randn(4, 8, 5, 5)]\n\n"
        "def get_init_inputs():\n    return []\n")
    text, why = graph_text(load_task_file(path))
    assert why is None and "_native_batch_norm_legit_functional" in text and "[bn]" in text

    path.write_text(path.read_text().replace("return torch.relu(self.bn(x))", "return torch.dropout(x, 0.5, True)"))
    text, why = graph_text(load_task_file(path))
    assert why is None and text.startswith("random draws each call: rand float32[4,8,5,5]")
    path.write_text(path.read_text().replace("return torch.dropout(x, 0.5, True)", "return torch.poisson(x.abs())"))
    text, why = graph_text(load_task_file(path))
    assert text is None and "aten.poisson" in why  # the Planner is told why, and the run goes on without it


def test_the_first_program_is_built_while_the_planner_profiles(tmp_path):
    """The offline Coder knows its first program before the plan: a run on a GPU builds it in the
    background at its start, so the first verification finds it in the build cache."""
    import threading

    from stitchcuda.agents.loop import OptimizeConfig, Optimizer
    from stitchcuda.agents.offline import OFFLINE, OfflineCoder
    from stitchcuda.agents.records import CoderRequest, RunState
    from stitchcuda.task import resolve_tasks

    task = resolve_tasks("mlp")[0]
    coder = OfflineCoder(task)
    built, done = [], threading.Event()

    class Verifier:
        gpu = None

        def build(self, candidate):
            built.append(candidate.source)
            done.set()

    verifier = Verifier()
    optimizer = Optimizer(task, OptimizeConfig(planner=OFFLINE, coder=OFFLINE), coder, coder, verifier, store=None)
    state = RunState(run_id="r", task=task.name, task_sha256=task.sha256)
    optimizer._build_ahead(state)  # no GPU: nothing built ahead
    assert not done.wait(0.5) and built == []
    verifier.gpu = "H100"
    optimizer._build_ahead(state)
    assert done.wait(30) and built[0] in coder.answer(CoderRequest(skill="scratch")).text


def test_a_first_step_verifies_the_arithmetic_no_model_predicts_beside_the_first_program():
    """One step keeps the fastest program that passes every trial: under strict the first program
    (3xTF32 where the cost model picks it) goes with its plain-TF32 twin and its true-fp32 twin;
    under paper with its bf16 twin; a model without products or convolutions with none; a model
    with attention also with its twin that runs attention as one kernel."""
    from stitchcuda.agents.offline import OfflineCoder, variant_of
    from stitchcuda.agents.records import CoderRequest

    first = CoderRequest(skill="scratch")
    strict = OfflineCoder(TASKS["mlp"], "strict")
    assert strict.samples_wanted(first) == 3
    # answered in any order, as the loop's threads may: sample 0 is still the first variant
    walk = {s: variant_of(strict.answer(first.model_copy(update={"sample": s})).text, strict.variants)
            for s in (2, 0, 1)}
    base = strict.variants[0]
    assert walk[0] == 0
    assert strict.variants[walk[1]] == {**base, "tf32": True, "split_tf32": False}
    assert strict.variants[walk[2]] == {**base, "cost_model": False, "split_tf32": False, "cutlass": False}
    # a later step is one sample, from the verdicts
    assert strict.samples_wanted(CoderRequest(skill="optimize", program="x", verdict=_verdict(ms=1.0))) == 1
    paper = OfflineCoder(TASKS["mlp"], "paper")
    assert paper.samples_wanted(first) == 2
    assert paper.variants[paper.companions()[0]] == {**paper.variants[0], "bf16": True}
    pointwise = Task(name="gelu_only", source="import torch\n\nclass Model(torch.nn.Module):\n"
                     "    def forward(self, x):\n        return torch.nn.functional.gelu(x) * 2\n\n"
                     "def get_inputs():\n    return [torch.randn(64, 64)]\n\n"
                     "def get_init_inputs():\n    return []\n")
    assert OfflineCoder(pointwise, "strict").samples_wanted(first) == 1
    # with attention, also the first program with attention as one kernel
    attention = OfflineCoder(TASKS["causal_attention"], "strict")
    twins = [attention.variants[i] for i in attention.companions()]
    assert {**attention.variants[0], "fused_attention": True} in twins
    assert attention.samples_wanted(first) == 1 + len(twins)
