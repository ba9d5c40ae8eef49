"""``stitchcuda bench``: one optimize run (or, with ``--evaluate``, one verification) per task,
spread over GPUs, recorded in the run store and resumable.

Execution. A job is one task. Each GPU takes ``runs_per_gpu`` jobs at once (2 by default) and
a GPU gate (:mod:`stitchcuda.verify.pool`: an flock per physical GPU, so it holds across threads
and processes) lets only one of them use the GPU at a time: a candidate is built first, on CPU cores with the GPU
hidden, and only its verification (correctness, timing, profile; the build is then a cache hit)
takes the gate. While one job verifies, the other builds, so the GPU does not wait for nvcc
whenever a build can run ahead. A failed build never takes the gate. With ``--evaluate`` every
candidate is known at the start, so a CPU build pool builds them all ahead, in job order.

The same job function runs in a local thread pool (the default) or as Ray tasks
(``--ray ADDRESS``) with ``num_gpus = 1 / runs_per_gpu`` and ``max_retries=0``: candidate code
that crashes a worker is a verdict, never retried. Jobs write their own rows, so the workspace
must be a folder every Ray node sees.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from stitchcuda import machine
from stitchcuda.agents.compiling import compile_apart, stop_compiles
from stitchcuda.agents.loop import OptimizeConfig, Optimizer
from stitchcuda.agents.offline import OfflineCoder, OfflinePlannerAgent, build_host_ahead
from stitchcuda.bench.records import Attempt, BenchInfo, BenchResult, TaskResult
from stitchcuda.bench.store import BenchRow, BenchStore
from stitchcuda.compiler.capture.graph import CaptureError
from stitchcuda.compiler.emit.codegen import Unsupported
from stitchcuda.files import write_atomic
from stitchcuda.llm import PriceTable, make_client
from stitchcuda.store import RunStore
from stitchcuda.task import TaskError, load_candidate
from stitchcuda.task.record import Task
from stitchcuda.verify import Verifier
from stitchcuda.verify.failure import Failure, failure, failure_of
from stitchcuda.verify.pool import GatedVerifier, GpuGate, RayStartError, start_ray
from stitchcuda.verify.second_opinion import for_verifier
from stitchcuda.verify.stages import task_stages
from stitchcuda.verify.verdict import BuildReport, Verdict


class BenchError(ValueError):
    """Unusable bench arguments; the message says what to change."""


class BenchConfig(BaseModel):
    suite: str = Field(description="what was benched: suite, a folder, a KernelBench level")
    optimize: OptimizeConfig
    evaluate: str | None = Field(None, description="a folder of existing solutions to verify instead of optimizing")
    gpus: list[str] = Field(description="devices, e.g. cuda:0, cuda:1 (or cpu for C++-only debugging)")
    ray: str | None = Field(None, description="Ray address (auto, ray://host:10001, or local for a fresh one)")
    runs_per_gpu: int = Field(2, ge=1, description="jobs sharing one GPU, so builds overlap verifications")


class Job(BaseModel):
    bench_id: str
    idx: int
    task: Task
    level: int | None = None
    candidate: str | None = None
    run_id: str | None = Field(None, description="an optimize run to resume")
    config: BenchConfig
    workspace: str


# ----------------------------------------------------------------------------- one job

_VERIFIERS: dict[str, Any] = {}  # one per configuration in this process: its next worker waits warm
_VERIFIERS_LOCK = threading.Lock()
# set when the bench is interrupted: what a job in flight still makes of its task is not saved (its
# workers were killed under it), so the task stays pending and `--resume` runs it again
_STOPPING = threading.Event()


def _verifier_for(config: BenchConfig, device: str, workspace: str, second_opinion: bool = True) -> GatedVerifier:
    verify = config.optimize.verify.model_copy(update={"device": device})
    if not second_opinion:  # an optimize run asks KernelBench's harness of its best program only (_optimize)
        verify.kernelbench_harness = None
    key = verify.model_dump_json()
    with _VERIFIERS_LOCK:
        if key not in _VERIFIERS:
            _VERIFIERS[key] = Verifier(verify)
        inner = _VERIFIERS[key]
    return GatedVerifier(inner, GpuGate(device, Path(workspace) / "gpu-locks"), build_first=config.runs_per_gpu > 1)


def _job_device(config: BenchConfig, assigned: str | None) -> str:
    if assigned is not None:
        return assigned
    return "cpu" if config.gpus and config.gpus[0] == "cpu" else "cuda:0"  # a Ray task sees its own GPU as 0


def prebuild(job: Job) -> tuple[str, Any] | None:
    """Build an --evaluate job's candidate on CPU cores (GPU hidden) before any GPU is free for
    it: (its sha256, the build report), or None when it cannot be loaded (its job will say why)."""
    if job.candidate is None or not Path(job.candidate).exists():
        return None
    try:
        candidate = load_candidate(job.candidate)
        verify = job.config.optimize.verify.model_copy(update={"device": _job_device(job.config, None)})
        key = "build:" + verify.model_dump_json()
        with _VERIFIERS_LOCK:  # its build workers stay warm for the next job's build
            if key not in _VERIFIERS:
                _VERIFIERS[key] = Verifier(verify)
            verifier = _VERIFIERS[key]
        return candidate.sha256, verifier.build(candidate)
    except (TaskError, OSError):
        return None


def run_job(job: Job, device: str | None = None, built: tuple[str, Any] | None = None) -> TaskResult:
    """Run one task; never raises for what the task or its candidates do (that is the result).
    ``built``: what :func:`prebuild` made of the job's candidate, so its build is not redone."""
    started = time.time()
    config = job.config
    device = _job_device(config, device)
    try:
        verifier = _verifier_for(config, device, job.workspace, second_opinion=job.candidate is not None)
        verifier.inner.warm_up()  # overlaps the worker's start with this job's capture and builds
        if config.optimize.coder.provider == "offline" and job.candidate is None:
            build_host_ahead(verifier.inner)
        if built is not None:
            verifier.prebuilt[built[0]] = built[1]
        compiling: dict[str, float] = {}
        result = _evaluate(job, verifier) if job.candidate is not None else _optimize(job, verifier, compiling)
        stats = verifier.stats
        result.verifications += stats.verifications  # on top of those a resumed run had recorded
        result.build_s, result.gpu_s, result.gpu_wait_s = stats.build_s, stats.gpu_s, stats.wait_s
        result.verify_phases_s = dict(stats.phases)
        result.builds, result.builds_cached = stats.builds, stats.builds_cached
        result.gpu_intervals = list(stats.gpu_intervals)
        result.device = verifier.gate.path.stem
    except Exception as exc:  # a broken job must not take the bench down with it
        why = f"{type(exc).__name__}: {exc}"
        result = TaskResult(task=job.task.name, level=job.level, run_id=job.run_id, status="failed", error=why,
                            failure=failure("error", why))
        stats, compiling = None, {}
    if result.status != "done" or job.candidate is not None:
        result.wall_s = result.wall_s or time.time() - started
    if stats is not None:
        result.stages = task_stages(time.time() - started, compiling, stats)
    if _STOPPING.is_set():
        return result
    store = BenchStore(job.workspace)
    try:
        store.save_result(job.bench_id, job.idx, result)
    finally:
        store.close()
    return result


def _stop_in_flight() -> None:
    """An interrupt: no result is saved from now on, and every verifier's workers are killed, so
    the jobs in flight end within seconds instead of running their tasks to the end."""
    _STOPPING.set()
    with _VERIFIERS_LOCK:
        verifiers = list(_VERIFIERS.values())
        _VERIFIERS.clear()  # a later bench in this process starts its own
    for verifier in verifiers:
        verifier.stop()
    stop_compiles()


def result_from_verdict(task: str, level: int | None, verdict: Any, program: str | None) -> TaskResult:
    timing = verdict.timing
    return TaskResult(
        task=task, level=level, status="done", compiled=verdict.compiled, correct=verdict.correct,
        passed=verdict.passed, hacking=verdict.hacking.level if verdict.compiled else None,
        speedup=dict(verdict.speedup), milliseconds=timing.candidate.median_ms if timing else None,
        origin_share=dict(verdict.profile.origin_share) if verdict.profile else {}, program=program,
        precision=verdict.precision.summary, arithmetic=verdict.precision.arithmetic,
        error=None if verdict.passed else (verdict.errors or [None])[0], failure=failure_of(verdict),
        wall_s=verdict.wall.total_s, second_opinion=verdict.second_opinion)


def _evaluate(job: Job, verifier: GatedVerifier) -> TaskResult:
    if not Path(job.candidate).exists():  # type: ignore[arg-type]
        why = f"no solution: {Path(job.candidate).parent} has no file for this task"  # type: ignore[arg-type]
        return TaskResult(task=job.task.name, level=job.level, status="failed", error=why,
                          failure=failure("no_candidate", why))
    try:
        candidate = load_candidate(job.candidate)  # type: ignore[arg-type]
    except TaskError as exc:
        return TaskResult(task=job.task.name, level=job.level, status="failed", error=str(exc),
                          program=job.candidate, failure=failure("error", str(exc)))
    verdict = verifier.verify(job.task, candidate)
    out = Path(job.workspace) / "benches" / job.bench_id / "verdicts"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{job.idx:04d}-{job.task.file_stem}.verdict.json"
    write_atomic(path, verdict.model_dump_json(indent=1))
    result = result_from_verdict(job.task.name, job.level, verdict, job.candidate)
    result.verdict = str(path)
    return result


def _agents(task: Task, config: OptimizeConfig, compiling: dict[str, float], apart: bool) -> tuple[Any, Any] | str:
    """(planner, coder) for the task, or why the offline Coder cannot take it. ``compiling``: the
    offline Coder's capture, lowering and emit times, kept current (it is the Coder's own record).
    ``apart``: compile in the bench's compile processes (jobs in threads; a Ray job has its own)."""
    if config.coder.provider == "offline":
        started = time.perf_counter()
        try:
            tolerance = config.verify.tolerance
            coder = OfflineCoder(task, tolerance, compile_apart(task, tolerance) if apart else None)
            # waiting for a compile process: the pool's queue, apart from the compile itself
            compiling["compile_wait"] = max(time.perf_counter() - started - sum(coder.compiled.seconds.values()), 0.0)
        except CaptureError as exc:
            compiling["capture"] = time.perf_counter() - started
            return f"graph capture failed: {exc}"
        except Unsupported as exc:
            compiling["lower"] = time.perf_counter() - started
            return str(exc)  # every reason: the bench's store keeps them all, its views cut to fit
        compiling.update(coder.compiled.seconds)
        coder.compiled.seconds = compiling  # later lowerings and emits land here too
        return OfflinePlannerAgent(task, coder.compiled), coder
    prices = PriceTable.from_env()
    planner = make_client(config.planner, prices)
    coder = planner if config.coder == config.planner else make_client(config.coder, prices)
    return planner, coder


def _optimize(job: Job, verifier: GatedVerifier, compiling: dict[str, float]) -> TaskResult:
    config = job.config.optimize
    agents = _agents(job.task, config, compiling, apart=job.config.ray is None)
    if isinstance(agents, str):
        return TaskResult(task=job.task.name, level=job.level, status="unsupported", error=agents,
                          failure=failure("no_candidate", agents))
    planner, coder = agents
    store = RunStore(job.workspace)
    bench_store = BenchStore(job.workspace)
    recorded: list[str] = []

    def report(state: Any, message: str) -> None:
        if not recorded:  # the run has its id from its first report on: a killed bench resumes it
            recorded.append(state.run_id)
            bench_store.set_run(job.bench_id, job.idx, state.run_id)

    optimizer = Optimizer(job.task, config, planner, coder, verifier, store, reporter=report)
    try:
        # A bench cut after a run's verdicts were recorded, but before its task was, resumes the run
        # without verifying them again: they count as this bench's verifications all the same (its
        # wall time holds them), or a bench measured in parts would undercount its throughput.
        earlier = _verdicts_recorded(store, job.run_id) if job.run_id else 0
        state = optimizer.resume(job.run_id) if job.run_id else optimizer.start()
        result = result_from_run(store, state, job.level)
        result.verifications = earlier
        harness = config.verify.kernelbench_harness
        if harness and result.program and Path(result.program).is_file():
            # its process takes the GPU gate itself, shared for its trials and exclusive for its timing
            result.second_opinion = for_verifier(verifier.inner, job.task.source, Path(result.program).read_text(),
                                                 result.correct, checkout=harness,
                                                 clean=result.correct and result.hacking == "none")
            verifier.count_second_opinion(result.second_opinion)
            if result.second_opinion.speedup is not None:
                result.speedup["kernelbench"] = result.second_opinion.speedup
        return result
    finally:
        store.close()
        bench_store.close()


def _verdicts_recorded(store: RunStore, run_id: str) -> int:
    try:
        return sum(1 for step in store.steps(run_id) for sample in step.samples if sample.verdict_path)
    except KeyError:  # a run the store never recorded: the resume will say so
        return 0


def result_from_run(store: Any, state: Any, level: int | None) -> TaskResult:
    result = TaskResult(task=state.task, level=level, run_id=state.run_id,
                        status="done" if state.status in ("done", "stopped") else "failed",
                        error=None if state.status in ("done", "stopped") else state.stop_reason,
                        steps=state.steps_done, llm_calls=state.llm_calls,
                        tokens=state.prompt_tokens + state.completion_tokens, cost_usd=state.cost_usd,
                        wall_s=state.seconds)
    best_so_far: float | None = None
    for step in store.steps(state.run_id):
        if step.chosen is None or step.chosen >= len(step.samples):
            continue
        o = step.samples[step.chosen]
        if o.passed and o.hacking != "total" and o.speedup_eager is not None:
            best_so_far = max(best_so_far or 0.0, o.speedup_eager)
        outcome = ("passed" if o.passed else "hack (total)" if o.hacking == "total" else "incorrect" if o.compiled
                   else "build failed" if o.path else "no program")
        result.attempts.append(Attempt(step=step.index, seconds=0.0, passed=o.passed, speedup_eager=o.speedup_eager,
                                       best_so_far=best_so_far, outcome=outcome))
    at = store.step_times(state.run_id)
    for a in result.attempts:
        a.seconds = round(at.get(a.step, 0.0), 2)
    if state.best is None:
        result.error = result.error or "no candidate passed"
        result.failure = last_failure(store, state)
        return result
    result.program = str(store.run_dir(state.run_id) / "best.py")
    verdict_path = Path(state.best.path).with_suffix(".verdict.json")
    if verdict_path.exists():
        v = Verdict.model_validate_json(verdict_path.read_text())
        best = result_from_verdict(state.task, level, v, result.program)
        result.compiled, result.correct, result.passed, result.hacking = (best.compiled, best.correct, best.passed,
                                                                          best.hacking)
        result.speedup, result.milliseconds, result.origin_share, result.precision, result.arithmetic = (
            best.speedup, best.milliseconds, best.origin_share, best.precision, best.arithmetic)
        result.verdict = str(verdict_path)
    else:
        result.passed = result.correct = result.compiled = True
        result.hacking = state.best.hacking  # type: ignore[assignment]
        result.speedup = {"eager": state.best.speedup_eager}
        result.milliseconds = state.best.milliseconds
    return result


def last_failure(store: Any, state: Any) -> Failure:
    """Why a run kept no program: the reason of its last verdict (a step's kept sample before its
    others), or, when nothing was ever verified, why no candidate came (the run's stop reason, or
    the last Coder answer's LLM or extraction error)."""
    steps = store.steps(state.run_id)
    for step in reversed(steps):
        for o in sorted(step.samples, key=lambda o: (o.sample != step.chosen, -o.sample)):
            if o.verdict_path and Path(o.verdict_path).is_file():
                found = failure_of(Verdict.model_validate_json(Path(o.verdict_path).read_text()))
                if found is not None:
                    return found
    answers = [o for step in steps for o in step.samples if o.llm_error or o.extract_error]
    last = answers[-1] if answers else None
    why = (state.stop_reason if state.status == "failed" else None) or (
        f"the Coder's LLM: {last.llm_error}" if last and last.llm_error
        else f"no program in the Coder's answer: {last.extract_error}" if last
        else f"no candidate was verified ({state.stop_reason or state.status})")
    return failure("no_candidate", why)


# ----------------------------------------------------------------------------- executors

def _local(jobs: list[Job], config: BenchConfig, on_done: Callable[[TaskResult], None]) -> None:
    """Threads: ``runs_per_gpu`` slots per device, each job on the slot it takes. Candidates known
    up front (--evaluate) are all handed to a CPU build pool at once, in job order, so builds run
    as far ahead of the GPUs as the cores allow."""
    slots: queue.Queue[str] = queue.Queue()
    for device in config.gpus:
        for _ in range(config.runs_per_gpu):
            slots.put(device)
    build_jobs = config.optimize.verify.build_jobs or max(1, machine.usable_cores() // 2)
    builders = ThreadPoolExecutor(max_workers=build_jobs) if any(j.candidate for j in jobs) else None
    builds = {j.idx: builders.submit(prebuild, j) for j in jobs if j.candidate} if builders else {}

    def on_slot(job: Job) -> TaskResult:
        built = builds[job.idx].result() if job.idx in builds else None  # before taking a GPU slot
        device = slots.get()
        try:
            return run_job(job, device, built)
        finally:
            slots.put(device)

    pool = ThreadPoolExecutor(max_workers=max(1, len(config.gpus) * config.runs_per_gpu))
    try:
        for done in as_completed([pool.submit(on_slot, j) for j in jobs]):
            on_done(done.result())
    except BaseException:  # Ctrl-C: the queued jobs never start, the running ones are cut short
        pool.shutdown(wait=False, cancel_futures=True)
        _stop_in_flight()
        raise
    finally:
        pool.shutdown(wait=False)
        if builders is not None:
            builders.shutdown(wait=False, cancel_futures=True)


def _ray(jobs: list[Job], config: BenchConfig, on_done: Callable[[TaskResult], None]) -> None:
    """Ray tasks with a share of one GPU each; ``max_retries=0``: a crash is a verdict, not a retry."""
    try:
        start_ray(config.ray)
    except RayStartError as exc:
        raise BenchError(str(exc)) from None
    import ray
    share = 1.0 / config.runs_per_gpu
    remote = ray.remote(num_gpus=share, num_cpus=1, max_retries=0)(_ray_job)
    # --evaluate: each candidate is built by a CPU task first; its GPU task waits for that build
    # (on one node, or with a shared build cache, the GPU task's own build is then a cache hit)
    build = ray.remote(num_cpus=1, max_retries=0)(_ray_build)
    pending = {remote.remote(j.model_dump_json(), build.remote(j.model_dump_json()) if j.candidate else None): j
               for j in jobs}
    try:
        _collect(pending, on_done)
    except BaseException:  # Ctrl-C: the queued tasks never start, the running ones are killed unsaved
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise


def _collect(pending: dict[Any, Job], on_done: Callable[[TaskResult], None]) -> None:
    """Each Ray task's result as it ends (``pending`` loses it then)."""
    import ray
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            job = pending.pop(ref)
            try:
                result = TaskResult.model_validate_json(ray.get(ref))
            except Exception as exc:  # the worker process itself died: that is this task's result
                why = f"the Ray worker died: {type(exc).__name__}: {str(exc)[:300]}"
                result = TaskResult(task=job.task.name, level=job.level, status="failed", error=why,
                                    failure=failure("crash", why))
                BenchStore(job.workspace).save_result(job.bench_id, job.idx, result)
            on_done(result)


def _ray_build(job_json: str) -> tuple[str, str] | None:
    built = prebuild(Job.model_validate_json(job_json))
    return (built[0], built[1].model_dump_json()) if built else None


def _ray_job(job_json: str, built: tuple[str, str] | None = None) -> str:
    job = Job.model_validate_json(job_json)
    report = (built[0], BuildReport.model_validate_json(built[1])) if built else None
    return run_job(job, built=report).model_dump_json()


# ----------------------------------------------------------------------------- the bench

def _gpu_name(config: BenchConfig) -> str:
    if config.gpus and config.gpus[0].startswith("cuda"):
        gpu = machine.physical_gpu(config.gpus[0])
        if gpu is not None:
            return gpu.name
    return "cpu" if config.gpus == ["cpu"] else "unknown"


def run_bench(store: BenchStore, jobs_for: list[tuple[Task, int | None, str | None]], config: BenchConfig,
              on_done: Callable[[TaskResult], None] | None = None, resume: str | None = None) -> BenchResult:
    """Start a bench over ``jobs_for`` (task, level, candidate path), or resume bench ``resume``."""
    workspace = str(store.root)
    if resume is None:
        bench_id = store.new_id(config.suite)
        coder = config.optimize.coder.model if config.optimize.coder.provider != "offline" else "offline"
        info = BenchInfo(id=bench_id, suite=config.suite, coder="evaluate" if config.evaluate else coder,
                         tolerance=config.optimize.verify.tolerance, weights=config.optimize.verify.weights,
                         gpu=_gpu_name(config), gpus=config.gpus, executor=f"ray ({config.ray})" if config.ray
                         else "local", samples=config.optimize.samples)
        rows = [BenchRow(i, TaskResult(task=t.name, level=lvl), t.source, cand)
                for i, (t, lvl, cand) in enumerate(jobs_for)]
        store.create(info, config.model_dump_json(), rows)
        for i, (t, _, _) in enumerate(jobs_for):
            (store.bench_dir(bench_id) / "tasks").mkdir(exist_ok=True)
            write_atomic(store.bench_dir(bench_id) / "tasks" / f"{i:04d}-{t.file_stem}.py", t.source)
    else:
        bench_id = store.resolve(resume)
        info = store.info(bench_id)
    jobs = []
    for row, run_id, status in store.rows(bench_id):
        if status in ("done", "failed", "unsupported"):
            continue  # nothing verified is redone
        task = Task(name=row.result.task, source=row.reference, origin="file")
        jobs.append(Job(bench_id=bench_id, idx=row.idx, task=task, level=row.result.level, candidate=row.candidate,
                        run_id=run_id, config=config, workspace=workspace))
    info.status = "running"
    store.save_info(info)
    started, earlier = time.time(), info.wall_s

    def finished(result: TaskResult) -> None:
        # kept current, so that a bench killed from outside (a timeout's SIGTERM) still has its time
        info.wall_s = earlier + time.time() - started
        store.save_info(info)
        if on_done is not None:
            on_done(result)

    _STOPPING.clear()  # an earlier bench of this process was interrupted: this one saves its results
    try:
        (_ray if config.ray else _local)(jobs, config, finished)
        info.status = "done"
    except KeyboardInterrupt:
        info.status = "interrupted"
        raise
    finally:
        info.wall_s = earlier + time.time() - started
        store.save_info(info)
    return store.result(bench_id)
