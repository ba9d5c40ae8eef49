"""One ``stitchcuda optimize`` session: arguments to clients, verifier, store and loop, and back.

The session reports progress through the :data:`~stitchcuda.agents.loop.Reporter` it is given
(the command line passes its live terminal view); it knows nothing of the terminal itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import shlex
from pathlib import Path
from typing import Any

from stitchcuda.agents.compiling import compile_apart
from stitchcuda.agents.knowledge import KnowledgeBase
from stitchcuda.agents.loop import Budget, OptimizeConfig, Optimizer, Reporter, RunCrashed, summarize
from stitchcuda.agents.offline import OFFLINE, OfflineCoder, OfflinePlannerAgent, build_host_ahead
from stitchcuda.agents.routing import RoutingConfig
from stitchcuda.compiler.capture.graph import CaptureError
from stitchcuda.compiler.check import CompileCheck, compile_check
from stitchcuda.compiler.emit.codegen import CodegenOptions, Unsupported
from stitchcuda.files import copy_atomic, write_atomic
from stitchcuda.hints import NO_GPU, OPTIMIZE_OFFLINE, OPTIMIZE_RESUME, OPTIMIZE_WITH_LLM, Hint
from stitchcuda.llm import LLMError, PriceTable, make_client
from stitchcuda.llm.base import LLMConfig
from stitchcuda.records import RunState, SampleOutcome, StepRecord
from stitchcuda.store import RunStore, db_path
from stitchcuda.task import TaskError, load_task_file, resolve_tasks
from stitchcuda.task.probe import check_reference, reference_timeout
from stitchcuda.task.record import Task
from stitchcuda.verify import DeviceUnavailable, Verifier
from stitchcuda.verify.config import PRESETS


class SessionError(ValueError):
    """Unusable arguments; the message says what to change, and ``hints`` what to run instead."""

    def __init__(self, message: str, hints: list[Hint] | None = None, reasons: list[str] | None = None):
        super().__init__(message)
        self.hints = hints or []
        self.reasons = reasons or []  # every reason in full, where the message summarises several


def _task(reference: str | None, kernelbench: Path | None, level: int | None, problem: int | None) -> Task:
    source = str(kernelbench) if kernelbench is not None else reference
    if source is None:
        raise SessionError("name a task (file, bundled name) or pass --kernelbench PATH --level N --problem ID")
    try:
        tasks = resolve_tasks(source, level, problem)
    except TaskError as exc:
        raise SessionError(str(exc)) from None
    if len(tasks) != 1:
        raise SessionError(f"{len(tasks)} tasks match; optimize one at a time (--level N --problem ID)")
    return tasks[0]


def build_config(*, model: str | None, coder: str | None, provider: str, base_url: str | None, api_key_env: str | None,
                 planner_model: str | None, coder_model: str | None, coder_provider: str | None,
                 coder_base_url: str | None, adapter: Path | None, temperature: float, llm_timeout: float,
                 samples: int, tolerance: str, device: str | None, preset: str, max_steps: int,
                 max_llm_calls: int | None, max_tokens: int | None, max_cost: float | None, max_wall: float | None,
                 max_attempts: int, max_replans: int, max_subtasks: int, weights: str = "seeded") -> OptimizeConfig:
    if preset not in PRESETS:
        raise SessionError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    named = bool(model or (planner_model and coder_model))
    if coder == "llm" and not named:
        raise SessionError("--coder llm needs an LLM: name it with --model (or --planner-model and --coder-model)",
                           hints=[OPTIMIZE_WITH_LLM, OPTIMIZE_OFFLINE])
    verify = PRESETS[preset].model_copy(update={"tolerance": tolerance, "weights": weights,
                                                **({"device": device} if device else {})})
    routing = RoutingConfig(max_attempts_per_subtask=max_attempts, max_replans=max_replans)
    budget = Budget(max_steps=max_steps, max_llm_calls=max_llm_calls, max_tokens=max_tokens, max_cost_usd=max_cost,
                    max_wall_s=max_wall)
    if coder == "offline" or (coder is None and not named):
        return OptimizeConfig(planner=OFFLINE, coder=OFFLINE, verify=verify, samples=samples, routing=routing,
                              budget=budget, max_subtasks=max_subtasks, knowledge=False)
    planner = LLMConfig(provider=provider, model=planner_model or model, base_url=base_url,  # type: ignore[arg-type]
                        api_key_env=api_key_env, temperature=temperature, timeout_s=llm_timeout)
    coder = LLMConfig(provider=coder_provider or provider, model=coder_model or model,  # type: ignore[arg-type]
                      base_url=coder_base_url or base_url, api_key_env=api_key_env, temperature=temperature,
                      timeout_s=llm_timeout, adapter=str(adapter) if adapter else None)
    return OptimizeConfig(
        planner=planner, coder=coder, verify=verify, samples=samples, max_subtasks=max_subtasks,
        routing=routing, budget=budget,
    )


def _original_path(state: RunState, stored: Task) -> str | None:
    """The file a resumed run's task came from, while it still holds the same source (commands we
    suggest name the user's file); else the run's own copy."""
    original = Path(state.task_path) if state.task_path else None
    try:
        if original is not None and original.read_text() == stored.source:
            return str(original)
    except (OSError, UnicodeDecodeError):
        pass
    return stored.path


def _generate_without_gpu(task: Task, coder, config: OptimizeConfig, store: RunStore, out: Path | None,
                          why: str, run_id: str | None = None) -> dict:
    """No GPU: the offline Coder still writes the program and nvcc compile-checks it; nothing is
    verified. The run is kept in the store like any other, with the program, its notes (the
    program's docstring) and the compile check. ``run_id``: the run to carry on (a resume): what it
    recorded is kept, and only what it had not finished is done."""
    if run_id is None:
        state = RunState(run_id=store.new_run_id(task.name), task=task.name, task_sha256=task.sha256,
                         task_path=task.path)
        store.create_run(state, config)
    else:
        state = store.load_state(run_id)
        store.claim(run_id)
    run_dir = store.run_dir(state.run_id)
    write_atomic(run_dir / "task.py", task.source)
    kept, checked = run_dir / "program.py", run_dir / "compile_check.json"
    if kept.exists():  # written before it was stopped: the same program, not made again
        program = kept.read_text()
    else:
        try:  # what a one-step run on a GPU gets first: the first variant (the cost model's choices)
            program = coder.compiled.program(CodegenOptions.model_validate(coder.variants[0]))
        except Unsupported as exc:
            raise SessionError(f"the offline Coder does not support {task.name} yet: {exc}",
                               hints=[OPTIMIZE_WITH_LLM]) from None
        write_atomic(kept, program)
    target = out or Path(f"{task.file_stem}_stitchcuda.py")
    write_atomic(target, program)
    if checked.exists():
        check = CompileCheck.model_validate_json(checked.read_text())
    else:
        check = compile_check(program)
        write_atomic(checked, check.model_dump_json(indent=1))
    verify_hint = f"stitchcuda verify {shlex.quote(task.path or task.name)} {shlex.quote(str(target))}"
    store.save_step(state.run_id, StepRecord(index=0, subtask=1, skill="scratch", chosen=0, samples=[SampleOutcome(
        sample=0, sha256=hashlib.sha256(program.encode()).hexdigest(), path=str(kept), compiled=check.status == "compiled",
        feedback=f"not verified (no CUDA GPU); nvcc {check.status}: {check.detail}")]))
    state.status = "unverified"
    state.steps_done = 1
    state.program = str(kept)
    state.stop_reason = f"no CUDA GPU here: program written, nvcc {check.status}; verify it on a GPU: {verify_hint}"
    store.save_state(state)
    return {"run": state.run_id, "task": task.name, "status": "unverified", "stop_reason": "no CUDA GPU here: " + why,
            "output": str(target), "compile_check": check.model_dump(), "best": None,
            "workspace": str(store.root),
            "note": "runtime verification (correctness, timing, hacking checks at run time) needs a CUDA GPU: "
                    f"run `{verify_hint}` on one"}


def run_session(*, reference: str | None, kernelbench: Path | None, level: int | None, problem: int | None,
                workspace: Path, resume: str | None, out: Path | None, prices: Path | None,
                reporter: Reporter | None = None, **options: Any) -> dict:
    """Resume or start one optimize run and return its summary. ``reporter`` hears of every step;
    one that is also a context manager (a live status line) is entered for the run's duration, and
    one with a ``waiting(what)`` context shows what the command waits on before the run starts."""
    store: RunStore | None = None
    if resume is not None:
        if not db_path(workspace).exists():
            raise SessionError(f"cannot resume: no run store in {workspace} (pass the --workspace of the run)")
        store = RunStore(workspace)
        try:
            run_id = store.resolve(resume)
        except KeyError as exc:
            raise SessionError(f"cannot resume: {exc.args[0]} in {workspace}") from None
        config = OptimizeConfig.model_validate(store.load_config(run_id))
        task = load_task_file(store.run_dir(run_id) / "task.py")
        recorded = store.load_state(run_id)
        task = task.model_copy(update={"name": recorded.task, "path": _original_path(recorded, task)})
    else:
        run_id = None
        task = _task(reference, kernelbench, level, problem)
        config = build_config(**options)
    offline = config.coder.provider == "offline"
    waiting = getattr(reporter, "waiting", None) or (lambda what: contextlib.nullcontext())
    limit = reference_timeout()
    if not offline:  # before anything else runs: its inputs, Model and forward, in a child, time-limited
        with waiting(f"checking the reference in a child process (limit {limit:g} s)"):
            check = check_reference(task)
        if check.problem:
            raise SessionError(check.problem)
    verifier = Verifier(config.verify)
    if verifier.gpu is not None:
        verifier.warm_up()  # a worker's start (torch, the CUDA context) overlaps the capture
    if offline:
        build_host_ahead(verifier)  # beside the capture
        try:  # the same check, then the capture, in one child under one limit: no user code runs here
            with waiting(f"checking and capturing {task.name} in a child process (limit {limit:g} s)"):
                compiled = compile_apart(task, config.verify.tolerance, timeout_s=limit, check=True)
            coder_llm = OfflineCoder(task, config.verify.tolerance, compiled)
        except TaskError as exc:
            raise SessionError(str(exc)) from None
        except CaptureError as exc:
            raise SessionError(f"the offline Coder cannot work on {task.name}: {exc}",
                               hints=[OPTIMIZE_WITH_LLM]) from None
        except Unsupported as exc:
            raise SessionError(f"the offline Coder does not support {task.name} yet: {exc.summary()}",
                               hints=[OPTIMIZE_WITH_LLM], reasons=exc.reasons) from None
        planner_llm = OfflinePlannerAgent(task, coder_llm.compiled)
    else:
        try:
            price_table = PriceTable.load(prices) if prices else PriceTable.from_env()
            planner_llm = make_client(config.planner, price_table)
            coder_llm = planner_llm if config.coder == config.planner else make_client(config.coder, price_table)
        except (LLMError, OSError, ValueError) as exc:
            raise SessionError(str(exc)) from None
    try:
        verifier.require_device()
    except DeviceUnavailable as exc:
        if config.coder.provider == "offline":
            return _generate_without_gpu(task, coder_llm, config, store or RunStore(workspace), out, str(exc), run_id)
        raise SessionError(str(exc), hints=NO_GPU["optimize"]) from None
    store = store or RunStore(workspace)  # made only once the arguments are known to be usable
    optimizer = Optimizer(task, config, planner_llm, coder_llm, verifier, store, reporter=reporter,
                          knowledge=KnowledgeBase.default() if config.knowledge else None)
    live = reporter if isinstance(reporter, contextlib.AbstractContextManager) else contextlib.nullcontext()
    try:
        with live:
            state = optimizer.resume(run_id) if run_id else optimizer.start()
    except RunCrashed as exc:  # kept as failed in the store, with the reason and the traceback beside it
        raise SessionError(str(exc), hints=[OPTIMIZE_RESUME]) from None
    summary = summarize(state)
    summary["workspace"] = str(workspace)
    if state.best is not None:
        target = out or Path(f"{task.file_stem}_stitchcuda.py")
        copy_atomic(store.run_dir(state.run_id) / "best.py", target)
        summary["output"] = str(target)
    return summary
