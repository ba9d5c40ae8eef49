"""The reward functions GRPOTrainer calls, backed by real verifications.

``VerifiedRewards.functions()`` gives TRL one reward that trains (the combined reward, weight 1)
and, with weight 0 so they are only logged, its parts: rule reward, rubric r, correctness,
total hacks, speedup and neutral judgements. All of them read one cache filled by the first:
each completion is extracted, verified once (concurrently, through a pool of gated verifiers:
a build on CPU cores, then the GPU under its lock) and scored with the rubric.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stitchcuda.reward import RewardConfig, RubricJudge
from stitchcuda.reward.combine import RewardBreakdown, combined_reward
from stitchcuda.reward.rule import RuleReward
from stitchcuda.reward.score import score_candidate
from stitchcuda.rl.config import VerifySection
from stitchcuda.task.record import Candidate, Task


def completion_text(completion: Any) -> str:
    """TRL passes a string (plain prompts) or a list of messages (conversational prompts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


class VerificationPool:
    """Verifies candidates concurrently: ``runs_per_gpu`` at a time per device, one on the GPU;
    or, with ``ray`` set, as Ray tasks with a share of one GPU each (``max_retries=0``)."""

    def __init__(self, section: VerifySection, workspace: Path):
        from stitchcuda.bench.runner import GatedVerifier, GpuGate, default_gpus
        from stitchcuda.verify import Verifier
        from stitchcuda.verify.config import PRESETS

        devices = section.gpus or default_gpus() or ["cpu"]
        base = PRESETS[section.preset].model_copy(update={"tolerance": section.tolerance})
        self.section, self.workspace = section, workspace
        self.ray_device = "cpu" if devices == ["cpu"] else "cuda:0"  # a Ray task sees its own GPU as 0
        self.base = base
        self.slots: list[Any] = []
        for device in devices:
            verifier = Verifier(base.model_copy(update={"device": device}))
            gate = GpuGate(device, workspace / "gpu-locks")
            self.slots += [GatedVerifier(verifier, gate, build_first=section.runs_per_gpu > 1)
                           for _ in range(section.runs_per_gpu)]
        self._next = 0
        self._lock = threading.Lock()
        self.executor = ThreadPoolExecutor(max_workers=len(self.slots))

    def verify_all(self, pairs: list[tuple[Task, Candidate]]) -> list[Any]:
        if self.section.ray:
            return self._on_ray(pairs)

        def one(i: int) -> Any:
            with self._lock:
                slot = self.slots[self._next % len(self.slots)]
                self._next += 1
            return slot.verify(*pairs[i])

        return list(self.executor.map(one, range(len(pairs))))


    def _on_ray(self, pairs: list[tuple[Task, Candidate]]) -> list[Any]:
        import ray

        from stitchcuda.verify.verdict import Verdict

        if not ray.is_initialized():
            ray.init(address=None if self.section.ray == "local" else self.section.ray, log_to_driver=False)
        remote = ray.remote(num_gpus=1.0 / self.section.runs_per_gpu, num_cpus=1, max_retries=0)(_ray_verify)
        config = self.base.model_copy(update={"device": self.ray_device}).model_dump_json()
        refs = [remote.remote(t.model_dump_json(), c.model_dump_json(), config, str(self.workspace)) for t, c in pairs]
        out = []
        for (task, cand), ref in zip(pairs, refs, strict=True):
            try:
                out.append(Verdict.model_validate_json(ray.get(ref)))
            except Exception as exc:  # the worker process died: a verdict that says so, worth nothing
                from stitchcuda.verify.judge import judge

                out.append(judge(task, cand, self.base, None, static_error=f"the Ray worker died: {exc}"))
        return out


def _ray_verify(task_json: str, candidate_json: str, config_json: str, workspace: str) -> str:
    from stitchcuda.bench.runner import GatedVerifier, GpuGate
    from stitchcuda.verify import Verifier
    from stitchcuda.verify.config import VerifyConfig

    config = VerifyConfig.model_validate_json(config_json)
    verifier = GatedVerifier(Verifier(config), GpuGate(config.device, Path(workspace) / "gpu-locks"))
    return verifier.verify(Task.model_validate_json(task_json), Candidate.model_validate_json(candidate_json)) \
        .model_dump_json()


class VerifiedRewards:
    def __init__(self, pool: VerificationPool, judge: RubricJudge | None, config: RewardConfig):
        self.pool, self.judge, self.config = pool, judge, config
        self.cache: dict[str, RewardBreakdown] = {}
        self.verifications = 0
        self.verify_seconds = 0.0

    @staticmethod
    def _key(reference: str, text: str) -> str:
        return hashlib.sha256((reference + "\0" + text).encode()).hexdigest()

    def score(self, completions: list[Any], task: list[str], reference: list[str], skill: list[int] | None = None,
              feedback: list[str] | None = None) -> list[RewardBreakdown]:
        """Every completion's breakdown: extracted, verified (the ones not seen yet), scored."""
        from stitchcuda.agents.extract import ExtractError, extract_program

        texts = [completion_text(c) for c in completions]
        keys = [self._key(r, t) for r, t in zip(reference, texts, strict=True)]
        todo: dict[str, tuple[int, str]] = {}
        for i, (k, t) in enumerate(zip(keys, texts, strict=True)):
            if k in self.cache or k in todo:
                continue
            try:
                todo[k] = (i, extract_program(t))
            except ExtractError as exc:
                self.cache[k] = combined_reward(RuleReward(value=0.0, gate=f"no program: {exc}"), None, self.config)
        if todo:
            tasks = {i: Task(name=task[i], source=reference[i]) for i, _ in todo.values()}
            pairs = [(tasks[i], Candidate(name=f"grpo_{k[:12]}", source=src)) for k, (i, src) in todo.items()]
            started = time.time()
            verdicts = self.pool.verify_all(pairs)
            self.verify_seconds += time.time() - started
            self.verifications += len(pairs)
            for (k, (i, src)), verdict in zip(todo.items(), verdicts, strict=True):
                self.cache[k] = score_candidate(
                    tasks[i], src, verdict, judge=self.judge, config=self.config,
                    skill="feedback" if skill and skill[i] == 2 else "scratch",
                    feedback=feedback[i] if feedback else "")
        return [self.cache[k] for k in keys]

    def functions(self) -> tuple[list[Callable[..., list[float]]], list[float]]:
        """(the reward functions, their weights): the combined reward trains, the parts are logged."""
        def make(name: str, part: Callable[[RewardBreakdown], float]) -> Callable[..., list[float]]:
            def reward_fn(prompts: list[Any], completions: list[Any], task: list[str], reference: list[str],
                          skill: list[int] | None = None, feedback: list[str] | None = None,
                          **_: Any) -> list[float]:
                return [part(b) for b in self.score(completions, task, reference, skill, feedback)]

            reward_fn.__name__ = name
            return reward_fn

        parts: list[tuple[str, Callable[[RewardBreakdown], float]]] = [
            ("reward", lambda b: b.reward),
            ("rule", lambda b: b.rule.value),
            ("rubric_r", lambda b: b.rubric.normalized if b.rubric else 0.5),
            ("correct", lambda b: float(b.rule.gate in ("passed", "partial hack"))),
            ("total_hack", lambda b: float(b.rule.gate == "total hack")),
            ("speedup", lambda b: b.rule.speedup or 0.0),
            ("judge_neutral", lambda b: float(bool(b.rubric and b.rubric.neutral))),
        ]
        return [make(n, f) for n, f in parts], [1.0] + [0.0] * (len(parts) - 1)
