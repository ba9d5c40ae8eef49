"""A short GRPO run on one GPU whose rewards come from real verifications.

The model is $STITCHCUDA_GRPO_MODEL (a local folder or a cached Hugging Face id) when set, else
the smallest causal LM in the local Hugging Face cache; with neither, a tiny random model is
built here (its completions hold no program, so its rewards are real but zero: it proves the
wiring, not learning). Prints the run's summary: steps, reward parts, verified candidates per
minute per GPU.

    python benchmarks/grpo_gpu.py [--steps 4] [--tasks mlp norm_softmax_gate]

The GPU image has transformers and peft but not trl or datasets: carry their wheels
(`../shared/gpu/wheels-for-gpu.sh 'trl>=0.20' 'datasets>=2.20'` into .whl/).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from stitchcuda.rl.config import TrainConfig
from stitchcuda.rl.dataset import build_dataset
from stitchcuda.rl.train import train


def local_model() -> str | None:
    if os.environ.get("STITCHCUDA_GRPO_MODEL"):
        return os.environ["STITCHCUDA_GRPO_MODEL"]
    hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    found = []
    for repo in hub.glob("models--*"):
        weights = list(repo.rglob("*.safetensors"))
        if weights and list(repo.rglob("config.json")) and list(repo.rglob("tokenizer*")):
            found.append((sum(w.stat().st_size for w in weights), repo.name[len("models--"):].replace("--", "/")))
    return min(found)[1] if found else None


def tiny_random(folder: Path) -> str:
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from tests.test_grpo_smoke import tiny_model

    tiny_model(folder)
    return str(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tasks", nargs="+", default=["mlp", "norm_softmax_gate"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stitchcuda-grpo-") as tmp:
        root = Path(tmp)
        model = local_model() or tiny_random(root / "tiny")
        print(f"model: {model}")
        build_dataset(root, [], root / "data", args.tasks, eval_fraction=0.0)
        config = TrainConfig(model=model, dataset=str(root / "data"), output_dir=str(root / "out"),
                             workspace=str(root / "ws"), report_to=["none"],
                             grpo={"num_generations": 4, "max_completion_length": 2048, "per_device_train_batch_size": 4,
                                   "max_steps": args.steps, "save_steps": args.steps, "logging_steps": 1},
                             verify={"preset": "quick", "gpus": ["cuda:0"], "runs_per_gpu": 2})
        summary = train(config)
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
