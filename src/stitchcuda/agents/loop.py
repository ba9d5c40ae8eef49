"""The optimization loop: Planner -> Coder -> Verifier -> route, step by step, resumable.

Every step is written to the run store before the next begins: the LLM's answers as they
arrive, each sample's verdict as it is reached, then the step's decision and the run's state.
A killed run resumes from the last saved state; a step that was in flight reuses the answers
and verdicts already stored, so nothing verified is verified again and no answer is asked for
twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, Field

from stitchcuda.agents.coder import TypedCoder, feedback_prompt, scratch_prompt
from stitchcuda.agents.extract import ExtractError, extract_program
from stitchcuda.agents.knowledge import format_hits, identifiers_in_compiler_error
from stitchcuda.agents.planner import PlanContext, Planner
from stitchcuda.agents.records import Best, CoderRequest, Plan, RunState, SampleOutcome, StepRecord
from stitchcuda.agents.routing import RoutingConfig, accepted, route
from stitchcuda.compiler.capture.describe import graph_text
from stitchcuda.files import copy_atomic, write_atomic
from stitchcuda.llm.base import Completion, LLMClient, LLMConfig, LLMError, LLMTimeout, Message
from stitchcuda.store import HEARTBEAT_S, RunStore
from stitchcuda.task.record import Candidate, Task
from stitchcuda.verify import stages
from stitchcuda.verify.config import VerifyConfig
from stitchcuda.verify.verdict import ProgramProfile, Verdict
from stitchcuda.verify.workers import WorkersStopped

Reporter = Callable[[RunState, str], None]


class Budget(BaseModel):
    """The run stops cleanly, keeping its best program, when any of these is reached."""

    max_steps: int = Field(24, ge=1)
    max_llm_calls: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    max_cost_usd: float | None = Field(None, gt=0)
    max_wall_s: float | None = Field(None, gt=0)


class OptimizeConfig(BaseModel):
    planner: LLMConfig
    coder: LLMConfig
    verify: VerifyConfig = VerifyConfig()
    routing: RoutingConfig = RoutingConfig()
    budget: Budget = Budget()
    samples: int = Field(1, ge=1, description="Coder samples per step, verified in parallel builds, best kept")
    max_subtasks: int = Field(4, ge=1)
    knowledge: bool = True


class RunCrashed(RuntimeError):
    """The run stopped on an error of ours or of the machine; it is kept as failed, with the reason
    and the traceback (``error.log`` in its folder), and can be resumed."""


class LLMFailure(RuntimeError):
    """An LLM failure that retrying will not fix: the run stops, resumable once it is fixed."""


class TaskUnusable(RuntimeError):
    """The Verifier found the task itself unverifiable (its reference fails, or its output depends on
    the random numbers it draws): no program can fix that, so the run stops with the reason."""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def outcome_from(verdict: Verdict, sample: int, path: str, verdict_path: str) -> SampleOutcome:
    return SampleOutcome(
        sample=sample, sha256=verdict.candidate.sha256, path=path, passed=verdict.passed, correct=verdict.correct,
        compiled=verdict.compiled, hacking=verdict.hacking.level, speedup_eager=verdict.speedup.get("eager"),
        speedup_best=verdict.speedup.get("best"),
        milliseconds=verdict.timing.candidate.median_ms if verdict.timing else None,
        feedback=verdict.feedback or "; ".join(verdict.errors[:3]), verdict_path=verdict_path,
    )


def _rank(o: SampleOutcome) -> tuple:
    return (accepted(o), o.hacking == "none", o.correct, o.compiled, o.speedup_eager or 0.0,
            o.extract_error is None and o.llm_error is None)


class Optimizer:
    def __init__(self, task: Task, config: OptimizeConfig, planner: LLMClient | Planner, coder: LLMClient, verifier,
                 store: RunStore, reporter: Reporter | None = None, knowledge=None,
                 profile_reference: bool = True):
        """``planner`` is an LLM (wrapped in the LLM Planner) or any object with the Planner's
        ``plan`` method (the offline Planner); ``coder`` answers like an LLM."""
        self.task = task
        self.config = config
        self.planner = planner if hasattr(planner, "plan") else Planner(planner, max_subtasks=config.max_subtasks)
        self.coder = coder
        self.verifier = verifier
        self.store = store
        self.report = reporter or (lambda state, message: None)
        self.knowledge = knowledge
        self.profile_reference = profile_reference
        self._ctx: PlanContext | None = None

    # -- entry points -----------------------------------------------------------------------------

    def start(self) -> RunState:
        state = RunState(run_id=self.store.new_run_id(self.task.name), task=self.task.name,
                         task_sha256=self.task.sha256, task_path=self.task.path)
        self.store.create_run(state, self.config)
        write_atomic(self.store.run_dir(state.run_id) / "task.py", self.task.source)
        return self.run(state)

    def resume(self, run_id: str) -> RunState:
        """Carry run ``run_id`` on from its last recorded step: stopped, failed, or interrupted (left
        running by a process that is gone). Raises StoreError while a live process runs it."""
        state = self.store.load_state(run_id)
        if state.task_sha256 != self.task.sha256:
            raise ValueError(f"run {run_id} optimized another version of {state.task!r}; resume it with its task")
        self.store.claim(run_id)
        if state.status in ("stopped", "failed", "unverified"):
            state.status, state.stop_reason = "running", None
        return self.run(state)

    def run(self, state: RunState) -> RunState:
        started = time.time() - state.seconds
        compiled = {k: state.stages.get(k, 0.0) for k in ("capture", "lower", "emit")}  # before this process's
        beating = threading.Event()
        threading.Thread(target=self._heartbeat, args=(state.run_id, beating), name="run-heartbeat",
                         daemon=True).start()
        try:
            if state.plan is None:
                self._build_ahead(state)
                self.report(state, "planning")
                self._make_plan(state, previous=None, why="")
            while state.status == "running":
                stop = self._over_budget(state, started)
                if stop:
                    state.status, state.stop_reason = "stopped", f"budget: {stop}"
                    break
                self._step(state)
                state.seconds = time.time() - started
                self._close_stages(state, compiled)
                self.store.save_state(state)
        except LLMFailure as exc:
            state.status, state.stop_reason = "failed", str(exc)
        except TaskUnusable as exc:
            state.status, state.stop_reason = "failed", f"unusable task: {exc}"
        except LLMError as exc:  # the Planner's LLM: same rule, the run stops and can be resumed
            state.status, state.stop_reason = "failed", f"the Planner's LLM failed: {exc}"
        except (KeyboardInterrupt, WorkersStopped):  # Ctrl-C here, or in the bench that runs this loop
            state.status, state.stop_reason = "stopped", "interrupted; resume with --resume " + shlex.quote(state.run_id)
            raise
        except Exception as exc:
            log = self.store.run_dir(state.run_id) / "error.log"
            log.write_text(traceback.format_exc())
            state.status = "failed"
            state.stop_reason = f"crashed: {type(exc).__name__}: {str(exc)[:300]} (traceback in {log})"
            raise RunCrashed(f"run {state.run_id} failed: {state.stop_reason}; it is kept in the run store "
                             f"(`stitchcuda runs {state.run_id}`)") from exc
        finally:
            beating.set()
            state.seconds = time.time() - started
            self._close_stages(state, compiled)
            self.store.save_state(state)
            self._write_best(state)
            self.report(state, f"{state.status}: {state.stop_reason or ''}")
        return state

    def _heartbeat(self, run_id: str, done: threading.Event) -> None:
        """The run's process says it is alive (``stitchcuda runs`` on another host tells a live run
        from one whose process is gone by it) until the run ends."""
        while not done.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):  # a busy or read-only store: the next beat may land
                self.store.beat(run_id)

    def _build_ahead(self, state: RunState) -> None:
        """A Coder that knows its first program before the plan (the offline compiler) has it built
        while the Planner profiles the reference: the first verification then finds the build in
        the cache (the same source builds the same extensions)."""
        first = getattr(self.coder, "first_program", None)
        build = getattr(self.verifier, "build", None)
        if first is None or build is None or state.steps_done or getattr(self.verifier, "gpu", None) is None:
            return  # on a CPU the programs' CUDA cannot link: nothing worth building twice
        try:
            source = first()
        except Exception:  # the step itself will say why it cannot write one
            return
        candidate = Candidate(name="first-program", source=source)
        threading.Thread(target=build, args=(candidate,), name="build-ahead", daemon=True).start()

    def _close_stages(self, state: RunState, compiled: dict[str, float]) -> None:
        """The run's stages so far: the offline Coder's compile times in this process on top of those
        of the processes before it (a resumed run compiles again), the rest as verdicts added them."""
        seconds = getattr(getattr(self.coder, "compiled", None), "seconds", None) or {}
        state.stages = state.stages | {k: compiled[k] + seconds.get(k, 0.0) for k in compiled}
        state.stages = stages.close(state.stages, state.seconds)

    # -- context for the Planner ------------------------------------------------------------------

    def context(self, state: RunState) -> PlanContext:
        if self._ctx is not None:
            return self._ctx
        run_dir = self.store.run_dir(state.run_id)
        cached = run_dir / "reference_profile.json"
        profile, note = None, "profiling was not requested"
        if cached.exists():
            profile = ProgramProfile.model_validate_json(cached.read_text())
        elif self.profile_reference and self.config.verify.device.startswith("cuda"):
            self.report(state, "profiling the reference")
            profiled = time.time()
            result = self.verifier.profile(self.task)
            waited = result.gate.waited_s
            state.stages["profile"] = state.stages.get("profile", 0.0) + time.time() - profiled - waited
            state.stages["gpu_wait"] = state.stages.get("gpu_wait", 0.0) + waited
            profile = result.reference_profile
            if profile is not None:
                write_atomic(cached, profile.model_dump_json(indent=1))
            else:
                note = "the profile failed: " + (result.reference_error or "; ".join(result.errors))[:200]
        elif self.profile_reference:
            note = "no CUDA device: the reference was not profiled"
        # the offline Coder's capture when it has one: one graph for every agent
        compiled = getattr(self.coder, "compiled", None)
        graph, why = graph_text(self.task, compiled.graph if compiled is not None else None)
        notes = ""
        if self.knowledge is not None:
            ops = " ".join(o.name for o in profile.ops[:6]) if profile else self.task.name
            notes = self._notes(f"plan fusion {ops} cuda graph preallocated buffers", k=3)
        self._ctx = PlanContext(self.task, self._machine(), profile, note, graph or f"not available: {why}",
                                notes, self.config.verify.tolerance)
        return self._ctx

    def _machine(self) -> str:
        gpu = getattr(self.verifier, "gpu", None)
        if gpu is None:
            return f"device {self.config.verify.device} (no CUDA GPU)"
        return (f"{gpu.name}, compute capability {gpu.compute_capability}, "
                f"{(gpu.memory_mib or 0) / 1024:.0f} GiB; CUDA C++ built with nvcc for sm_{gpu.compute_capability.replace('.', '')}")

    def _notes(self, query: str, k: int = 3, api: list[str] | None = None) -> str:
        if self.knowledge is None:
            return ""
        hits = self.knowledge.lookup_api(api) if api else []
        hits += self.knowledge.search(query, k=k, kind="note")
        return format_hits(hits, max_chars=6000)

    # -- planning ----------------------------------------------------------------------------------

    def _make_plan(self, state: RunState, previous: Plan | None, why: str) -> None:
        ctx = self.context(state)
        plan, problem = self.planner.plan(ctx, self._call_hook(state, None, "planner"), previous=previous, why=why,
                                          failures=state.failures, best=state.best)
        if problem:
            state.failures.append(problem)
            self.report(state, problem + "; going on with a one-subtask plan")
        self.store.add_plan(state.run_id, plan)
        state.plan = plan
        state.subtask_index = 0
        state.attempts_on_subtask = state.failures_in_row = state.no_improvement = 0
        state.subtask_best = None
        state.last_action = None
        state.fix_program, state.fix_feedback, state.fix_verdict = None, "", None
        if state.best is not None:  # a new plan starts from the best verified program
            state.program, state.program_feedback = state.best.path, ""
            state.program_verdict = str(Path(state.best.path).with_suffix(".verdict.json"))

    # -- one step ----------------------------------------------------------------------------------

    def _step(self, state: RunState) -> None:
        assert state.plan is not None
        index = state.steps_done
        subtask = state.plan.subtasks[state.subtask_index]
        last = state.subtask_index == len(state.plan.subtasks) - 1
        action = state.last_action
        fixing = action == "fix" and state.fix_program is not None
        skill = "feedback" if (action == "optimize" and state.program) or fixing else "scratch"
        step = self.store.step(state.run_id, index) or StepRecord(index=index, subtask=subtask.id, skill=skill)
        messages = self._coder_prompt(state, subtask, skill, fixing)
        request = self._coder_request(state, skill, fixing)
        self.report(state, f"step {index + 1}: subtask {subtask.id}/{len(state.plan.subtasks)} "
                           f"({skill}{', fix' if fixing else ''})")
        # the Coder's own wish (the offline Coder's twins) where its programs run; a CPU device
        # cannot run them, so there one program a step says as much
        on_gpu = self.config.verify.device.startswith("cuda")
        wanted = self.coder.samples_wanted(request) if on_gpu and isinstance(self.coder, TypedCoder) else 1
        step.samples = self._samples(state, index, messages, request, max(self.config.samples, wanted))
        chosen = max(step.samples, key=_rank) if step.samples else None
        step.chosen = chosen.sample if chosen else None
        decision = route(state, chosen, subtask, last, self.config.routing)
        step.decision = decision
        self.store.save_step(state.run_id, step)
        self._apply(state, chosen, decision)
        state.steps_done += 1
        self.report(state, f"step {index + 1}: {decision.action} ({decision.reason})")

    def _coder_prompt(self, state: RunState, subtask, skill: str, fixing: bool) -> list[Message]:
        tolerance = self.config.verify.tolerance
        note = state.note
        if skill == "scratch":
            program = Path(state.program).read_text() if state.program else None
            status = state.program_feedback.splitlines()[0] if state.program_feedback else ""
            notes = self._notes(f"{subtask.title} {' '.join(subtask.operators)} {subtask.fusion}")
            return scratch_prompt(self.task, state.plan, subtask, program, status, notes, tolerance, note,  # type: ignore[arg-type]
                                  weights=self.config.verify.weights)
        path = state.fix_program if fixing else state.program
        feedback = state.fix_feedback if fixing else state.program_feedback
        api: list[str] = []
        if fixing and self.knowledge is not None:
            api = identifiers_in_compiler_error(feedback)
        notes = self._notes(feedback.splitlines()[0] if feedback else subtask.title, k=2, api=api)
        return feedback_prompt(self.task, subtask, Path(path).read_text(), feedback,  # type: ignore[arg-type]
                               "fix" if fixing else "optimize", notes, tolerance, note, weights=self.config.verify.weights)

    def _coder_request(self, state: RunState, skill: str, fixing: bool) -> CoderRequest:
        path, verdict = (state.fix_program, state.fix_verdict) if fixing else (state.program, state.program_verdict)
        found = None
        if verdict and Path(verdict).is_file():
            found = Verdict.model_validate_json(Path(verdict).read_text())
        return CoderRequest(skill="scratch" if skill == "scratch" else "fix" if fixing else "optimize",
                            program=Path(path).read_text() if path else None, verdict=found)

    def _samples(self, state: RunState, index: int, messages: list[Message],
                 request: CoderRequest | None = None, count: int = 1) -> list[SampleOutcome]:
        run_dir = self.store.run_dir(state.run_id)
        answers: dict[int, tuple[str | None, str | None, str | None]] = {
            s: (a, None, None) for s, a in self.store.llm_answers(state.run_id, index).items()}
        missing = [s for s in range(count) if s not in answers]
        if missing:
            with ThreadPoolExecutor(max_workers=len(missing)) as pool:
                for sample, got in zip(missing, pool.map(lambda s: self._ask(state, index, s, messages, request), missing),
                                       strict=True):
                    answers[sample] = got
        outcomes: list[SampleOutcome] = []
        to_verify: list[tuple[int, Candidate]] = []  # (position in outcomes, program)
        for sample in range(count):
            answer, finish, error = answers[sample]
            if answer is None:
                outcomes.append(SampleOutcome(sample=sample, llm_error=error, feedback=error or ""))
                continue
            try:
                source = extract_program(answer, finish)
            except ExtractError as exc:
                outcomes.append(SampleOutcome(sample=sample, extract_error=str(exc), feedback=str(exc)))
                continue
            sha = _sha(source)
            known = self.store.verified(state.run_id, sha)
            if known is not None:  # the same program was verified before: its verdict stands
                outcomes.append(known.model_copy(update={"sample": sample}))
                continue
            path = run_dir / f"step{index:03d}-s{sample}.py"
            write_atomic(path, source)
            to_verify.append((len(outcomes), Candidate(name=path.stem, source=source, path=str(path))))
            outcomes.append(SampleOutcome(sample=sample, sha256=sha, path=str(path)))
        if len(to_verify) > 1:
            self.report(state, f"building {len(to_verify)} samples in parallel")
            self.verifier.prebuild([c for _, c in to_verify])
        for position, candidate in to_verify:
            self.report(state, f"verifying {candidate.name}")
            verdict = self.verifier.verify(self.task, candidate)
            stages.add_phases(state.stages, verdict.wall.split(), verdict.wall.second_opinion)
            verdict_path = Path(candidate.path).with_suffix(".verdict.json")  # type: ignore[arg-type]
            write_atomic(verdict_path, verdict.model_dump_json(indent=1))
            outcome = outcome_from(verdict, outcomes[position].sample, candidate.path or "", str(verdict_path))
            outcomes[position] = outcome
            self.store.save_candidate(state.run_id, index, outcome)
            self.report(state, f"{candidate.name}: {_summary(outcome)}")
            if verdict.reference_error:
                raise TaskUnusable(verdict.reference_error)
        for outcome in outcomes:  # failures and reused verdicts are this step's candidates too
            self.store.save_candidate(state.run_id, index, outcome)
        return outcomes

    def _ask(self, state: RunState, index: int, sample: int, messages: list[Message],
             request: CoderRequest | None = None):
        """(answer, finish reason, error) of one Coder call; fatal LLM errors stop the run."""
        hook = self._call_hook(state, index, "coder", sample)
        try:
            if isinstance(self.coder, TypedCoder) and request is not None:
                completion = self.coder.answer(request.model_copy(update={"sample": sample}))  # the prompt is logged
            else:
                completion = self.coder.complete(messages)
        except LLMTimeout as exc:
            hook(messages, None, str(exc))
            return None, None, f"timed out: {exc}"
        except LLMError as exc:
            hook(messages, None, str(exc))
            raise LLMFailure(f"the Coder's LLM failed: {exc}") from exc
        hook(messages, completion, None)
        return completion.text, completion.finish_reason, None

    def _call_hook(self, state: RunState, step: int | None, role: str, sample: int | None = None):
        def record(messages: list[Message], completion: Completion | None, error: str | None) -> None:
            usage = completion.usage if completion else None
            self.store.add_llm_call(
                state.run_id, step, role, sample, completion.model if completion else getattr(
                    getattr(self.coder, "config", None), "model", "?"),
                [m.model_dump() for m in messages], completion.text if completion else None, error,
                usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0,
                usage.cost_usd if usage else 0.0, completion.seconds if completion else 0.0,
                completion.retries if completion else 0)
            state.llm_calls += 1
            if usage:
                state.prompt_tokens += usage.prompt_tokens
                state.completion_tokens += usage.completion_tokens
                state.cost_usd += usage.cost_usd
        return record

    # -- after a step ------------------------------------------------------------------------------

    def _apply(self, state: RunState, chosen: SampleOutcome | None, decision) -> None:
        state.note = ""
        if accepted(chosen):
            assert chosen is not None
            improved = state.subtask_best is not None and (chosen.speedup_eager or 0) >= state.subtask_best
            if state.program is None or improved or decision.action in ("next", "done"):
                state.program, state.program_feedback = chosen.path, chosen.feedback
                state.program_verdict = chosen.verdict_path
            self._consider_best(state, chosen)
        elif chosen is not None:
            state.failures.append(f"step {state.steps_done + 1}: " + (chosen.llm_error or chosen.extract_error
                                                                       or chosen.feedback.splitlines()[0]
                                                                       if chosen.feedback else "failed")[:240])
            state.failures = state.failures[-12:]
            if chosen.path:
                state.fix_program, state.fix_feedback = chosen.path, chosen.feedback
                state.fix_verdict = chosen.verdict_path
            else:  # nothing to fix: ask again, saying what was wrong with the answer
                state.note = f"Your previous answer could not be used: {chosen.extract_error or chosen.llm_error}"
        action = decision.action
        if action == "next":
            state.subtask_index += 1
            state.attempts_on_subtask = state.failures_in_row = state.no_improvement = 0
            state.subtask_best = None
        elif action == "replan":
            state.replans += 1
            self.report(state, f"replanning: {decision.reason}")
            self._make_plan(state, previous=state.plan, why=decision.reason)
            return
        elif action == "done":
            state.status, state.stop_reason = "done", decision.reason
        state.last_action = action if not (action == "fix" and state.fix_program is None) else state.last_action

    def _consider_best(self, state: RunState, o: SampleOutcome) -> None:
        best = state.best
        key = (o.hacking == "none", o.speedup_eager or 0.0)
        if best is None or key > (best.hacking == "none", best.speedup_eager):
            state.best = Best(step=state.steps_done, subtask=state.subtask_index + 1, sha256=o.sha256 or "",
                              path=o.path or "", speedup_eager=o.speedup_eager or 0.0, speedup_best=o.speedup_best,
                              milliseconds=o.milliseconds or 0.0, hacking=o.hacking or "none")

    def _over_budget(self, state: RunState, started: float) -> str | None:
        b = self.config.budget
        if state.steps_done >= b.max_steps:
            return f"{b.max_steps} steps"
        if b.max_llm_calls is not None and state.llm_calls + self.config.samples > b.max_llm_calls:
            return f"{b.max_llm_calls} LLM calls"
        if b.max_tokens is not None and state.prompt_tokens + state.completion_tokens >= b.max_tokens:
            return f"{b.max_tokens} tokens"
        if b.max_cost_usd is not None and state.cost_usd >= b.max_cost_usd:
            return f"${b.max_cost_usd:g}"
        if b.max_wall_s is not None and time.time() - started >= b.max_wall_s:
            return f"{b.max_wall_s:g} s of wall time"
        return None

    def _write_best(self, state: RunState) -> None:
        if state.best is None:
            return
        run_dir = self.store.run_dir(state.run_id)
        best_path = run_dir / "best.py"
        if Path(state.best.path).resolve() != best_path.resolve():
            copy_atomic(state.best.path, best_path)
        summary = summarize(state)
        write_atomic(run_dir / "summary.json", json.dumps(summary, indent=1))


def summarize(state: RunState) -> dict:
    """The run's result for people: the best program and how it compares with every baseline."""
    out: dict = {"run": state.run_id, "task": state.task, "status": state.status, "stop_reason": state.stop_reason,
                 "steps": state.steps_done, "replans": state.replans, "llm_calls": state.llm_calls,
                 "tokens": state.prompt_tokens + state.completion_tokens, "cost_usd": round(state.cost_usd, 4),
                 "seconds": round(state.seconds, 1), "best": None}
    if state.best is None:
        return out
    best = state.best.model_dump()
    verdict_path = Path(state.best.path).with_suffix(".verdict.json")
    if verdict_path.exists():
        v = Verdict.model_validate_json(verdict_path.read_text())
        best.update(speedup=v.speedup, precision=v.precision.summary, arithmetic=v.precision.arithmetic,
                    hacking=v.hacking.level,
                    operator_coverage=v.hacking.operator_coverage, tolerance=v.tolerance.name,
                    device=v.device.name, milliseconds=v.timing.candidate.median_ms if v.timing else None)
    out["best"] = best
    return out


def _summary(o: SampleOutcome) -> str:
    if o.passed:
        return f"passed, {o.speedup_eager or 0:.2f}x vs eager, hacking {o.hacking}"
    first = o.feedback.splitlines()[0][:120] if o.feedback else ""
    return f"failed ({'incorrect' if o.compiled else 'build/import'}; hacking {o.hacking}): {first}"
