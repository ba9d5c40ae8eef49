"""A short GRPO run on one GPU whose rewards come from real verifications.

The model is $STITCHCUDA_GRPO_MODEL (a local folder or a cached Hugging Face id) when set, else
the smallest causal LM in the local Hugging Face cache; with neither, a tiny model is taught here
to write known honest programs for the tasks (see ``taught_tiny``), so that its completions are
real programs. Prints the run's summary: steps, reward parts, verified candidates per minute per
GPU, and each step's rewards from the run store.

    python benchmarks/grpo_gpu.py [--steps 4] [--teach-steps 1000] [--temperature 0.6]

The GPU image has transformers and peft but not trl or datasets: carry their wheels
(`../shared/gpu/wheels-for-gpu.sh 'trl>=0.20' 'datasets>=2.20'` into .whl/).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
from pathlib import Path

from stitchcuda.rl.config import TrainConfig
from stitchcuda.rl.dataset import build_dataset
from stitchcuda.rl.train import train

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))  # the smoke test's chat template


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


# known honest programs the taught model learns to write, per task
TAUGHT = {"mlp": "tests/fixtures/candidates/mlp_honest.py",
          "norm_softmax_gate": "tests/fixtures/candidates/norm_softmax_gate_honest.py"}


def taught_tiny(folder: Path, data: Path, steps: int = 1000) -> str:
    """A 4-layer Llama (about 4M parameters) with a byte-level BPE tokenizer, taught here by
    supervised steps to answer each training prompt with a known honest program for its task.
    The GPU machine reaches no model hub and a carried model must fit in 64 MiB, so no real
    pretrained coder can run there; this one writes real programs (sampled, they sometimes
    break), so GRPO's rewards come from real builds and timings and differ within a
    group, which is what the run must show."""
    import pyarrow.parquet as pq
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from tests.test_grpo_smoke import CHAT_TEMPLATE

    rows = [r for r in pq.read_table(data / "train.parquet").to_pylist() if r["task"] in TAUGHT]
    answers = {t: "```python\n" + (ROOT / f).read_text() + "```" for t, f in TAUGHT.items()}
    specials = ["<pad>", "<|end|>", "<|user|>", "<|system|>", "<|assistant|>"]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    corpus = [m["content"] for r in rows for m in r["prompt"]] + list(answers.values())
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=2048, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<|end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16384,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)).to(device)
    examples = []
    for r in rows:
        prompt = tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
        head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        tail = tokenizer(answers[r["task"]] + "<|end|>", add_special_tokens=False)["input_ids"]
        ids = torch.tensor([head + tail], device=device)
        labels = ids.clone()
        labels[0, :len(head)] = -100  # learn the answer, not the prompt
        examples.append((ids, labels))
    print(f"taught model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, answers of "
          + ", ".join(f"{e[0].shape[1] - int((e[1] == -100).sum())} tokens" for e in examples))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    # decayed to zero, so that the last steps drive the loss down to where a 3,000-token answer
    # is usually sampled without a slip
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    model.train()
    for step in range(steps):
        loss = sum(model(input_ids=ids, labels=labels).loss for ids, labels in examples) / len(examples)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  teaching step {step}: loss {loss.item():.4f}")
    model.cpu().save_pretrained(folder)
    return str(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tasks", nargs="+", default=list(TAUGHT))
    parser.add_argument("--teach-steps", type=int, default=1000, help="supervised steps of the taught model")
    parser.add_argument("--temperature", type=float, default=0.6,
                        help="sampling temperature: one slip in 3,000 tokens usually breaks the program")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stitchcuda-grpo-") as tmp:
        root = Path(tmp)
        build_dataset(root, [], root / "data", args.tasks, eval_fraction=0.0)
        real = local_model()
        model = real or taught_tiny(root / "taught", root / "data", args.teach_steps)
        print(f"model: {model}")
        config = TrainConfig(model=model, dataset=str(root / "data"), output_dir=str(root / "out"),
                             workspace=str(root / "ws"), report_to=["none"],
                             grpo={"num_generations": 4, "max_completion_length": 4096,
                                   "temperature": args.temperature, "per_device_train_batch_size": 4,
                                   "max_steps": args.steps, "save_steps": args.steps, "logging_steps": 1,
                                   "bf16": real is not None},  # the taught model samples its programs in fp32
                             verify={"preset": "quick", "gpus": ["cuda:0"], "runs_per_gpu": 2})
        summary = train(config)
        db = sqlite3.connect(root / "ws" / "runs.sqlite")
        for step, metrics in db.execute("SELECT step, metrics FROM train_metrics ORDER BY step"):
            m = json.loads(metrics)
            print(f"step {step}: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(m.items())
                                               if isinstance(v, (int, float)) and ("reward" in k or "correct" in k
                                                                                   or "speedup" in k or "hack" in k)))
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
