"""The reward functions GRPOTrainer calls, backed by real verifications.

``VerifiedRewards.functions()`` gives TRL one reward that trains (the combined reward, weight 1)
and, with weight 0 so they are only logged, its parts: rule reward, rubric r, correctness,
total hacks, speedup and neutral judgements. All of them read one cache filled by the first:
each completion is extracted, verified once (concurrently, through a pool of gated verifiers:
a build on CPU cores, then the GPU under its lock) and scored with the rubric.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stitchcuda.agents.extract import ExtractError, extract_program
from stitchcuda.reward import RewardConfig, RubricJudge
from stitchcuda.reward.combine import RewardBreakdown, combined_reward
from stitchcuda.reward.rule import RuleReward
from stitchcuda.reward.score import score_candidate
from stitchcuda.rl.config import VerifySection
from stitchcuda.task.record import Candidate, Task
from stitchcuda.verify.config import PRESETS
from stitchcuda.verify.pool import VerifierPool


def completion_text(completion: Any) -> str:
    """TRL passes a string (plain prompts) or a list of messages (conversational prompts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


class VerificationPool(VerifierPool):
    """The Verifier pool a training config's ``[verify]`` section asks for (its preset and
    tolerance, its GPUs or every visible one, ``runs_per_gpu``, Ray or not)."""

    def __init__(self, section: VerifySection, workspace: Path):
        config = PRESETS[section.preset].model_copy(update={"tolerance": section.tolerance})
        super().__init__(config, workspace, devices=section.gpus or None, runs_per_gpu=section.runs_per_gpu,
                         ray=section.ray)


class VerifiedRewards:
    def __init__(self, pool: VerifierPool, judge: RubricJudge | None, config: RewardConfig):
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
