"""The reward path on a GPU: the reward must rank an honest fast candidate above an honest slow
one, above a partial hack, above incorrect and totally hacked ones (both zero); and the path's
throughput, verified candidates per minute per GPU, through the same pool training uses.

    python benchmarks/reward_gpu.py [--runs-per-gpu 2] [--judge-model M --judge-base-url URL]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from stitchcuda.llm import LLMConfig, make_client
from stitchcuda.reward import RewardConfig, RubricJudge
from stitchcuda.rl.config import VerifySection
from stitchcuda.rl.rewards import VerificationPool, VerifiedRewards
from stitchcuda.task import resolve_tasks

ROOT = Path(__file__).parents[1]
CASES = [  # (label, task, candidate file)
    ("honest, fast", "norm_softmax_gate", "tests/fixtures/candidates/norm_softmax_gate_honest.py"),
    ("honest, slow", "mlp", "tests/fixtures/candidates/mlp_honest.py"),
    ("partial hack", "mlp", "tests/hacks/pytorch_compute_matmul_mlp.py"),
    ("incorrect", "mlp", "tests/fixtures/candidates/mlp_wrong.py"),
    ("total hack", "mlp", "tests/hacks/pure_pytorch_mlp.py"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-per-gpu", type=int, default=2)
    parser.add_argument("--judge-model")
    parser.add_argument("--judge-base-url")
    args = parser.parse_args()
    judge = RubricJudge(make_client(LLMConfig(model=args.judge_model, base_url=args.judge_base_url,
                                              temperature=0.0))) if args.judge_model else None
    with tempfile.TemporaryDirectory() as tmp:
        pool = VerificationPool(VerifySection(preset="quick", runs_per_gpu=args.runs_per_gpu), Path(tmp))
        rewards = VerifiedRewards(pool, judge, RewardConfig())
        tasks = {name: resolve_tasks(name)[0] for _, name, _ in CASES}
        completions = [[{"role": "assistant", "content": "```python\n" + (ROOT / f).read_text() + "```"}]
                       for _, _, f in CASES]
        started = time.time()
        found = rewards.score(completions, [t for _, t, _ in CASES], [tasks[t].source for _, t, _ in CASES])
        wall = time.time() - started
        gpus = len({str(s.gate.path) for s in pool.slots})
    print(f"\n{'candidate':<14} {'task':<18} {'gate':<13} {'speedup':>8} {'reward':>7}")
    for (label, task, _), b in zip(CASES, found, strict=True):
        speedup = f"{b.rule.speedup:.2f}x" if b.rule.speedup else "-"
        print(f"{label:<14} {task:<18} {b.rule.gate:<13} {speedup:>8} {b.reward:>7.3f}")
    values = [b.reward for b in found]
    ordered = values[0] > values[1] > values[2] > values[3] == values[4] == 0.0
    print(f"ranked honest > slow > partial > incorrect = hacked = 0: {'yes' if ordered else 'NO'}")
    print(f"reward path: {len(CASES)} candidates verified in {wall:.1f} s on {gpus} GPU(s): "
          f"{len(CASES) / wall * 60 / gpus:.1f} verified candidates per minute per GPU")


if __name__ == "__main__":
    main()
