"""A short GRPO run on one GPU whose rewards come from real verifications.

The model is $STITCHCUDA_GRPO_MODEL (a local folder or a cached Hugging Face id) when set, else
the smallest causal LM in the local Hugging Face cache; with neither, a tiny model is taught here
to write known programs for the tasks, honest, hacked and wrong (see ``taught_tiny``), so that its
completions are real programs whose rewards differ. Prints each step's rewards from the run store
and the run's summary (steps, verified candidates per minute per GPU).

    python benchmarks/grpo_gpu.py [--steps 4] [--teach-steps 1000] [--temperature 0.6]

The GPU image has transformers and peft but not trl or datasets: carry their wheels
(`../shared/gpu/wheels-for-gpu.sh 'trl>=0.20' 'datasets>=2.20'` into .whl/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from stitchcuda.rl.config import TrainConfig
from stitchcuda.rl.dataset import build_dataset
from stitchcuda.rl.train import step_metrics, train

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


# the programs the taught model learns to write, per task, in equal shares: an honest one beside
# a partial hack, an incorrect one and a total hack from our corpus, so that a group of samples
# for one prompt holds different programs whose real rewards differ (a model taught one answer
# writes it every time: equal rewards, zero advantages, no gradient)
TAUGHT = {
    "mlp": ["tests/fixtures/candidates/mlp_honest.py", "tests/hacks/aten_in_cpp_partial_mlp.py",
            "tests/fixtures/candidates/mlp_wrong.py", "tests/hacks/pure_pytorch_mlp.py"],
    "norm_softmax_gate": ["tests/fixtures/candidates/norm_softmax_gate_honest.py",
                          "tests/hacks/pure_pytorch_nsg_aliases.py"],
}


def taught_tiny(folder: Path, data: Path, steps: int = 1000) -> str:
    """A 4-layer Llama (about 4M parameters) with a byte-level BPE tokenizer, taught here by
    supervised steps to answer each training prompt with one of its task's TAUGHT programs.
    The GPU machine reaches no model hub and a carried model must fit in 64 MiB, so no real
    pretrained coder can run there; this one writes real programs (honest, hacked, wrong, and
    now and then a mix of two that breaks), so GRPO's rewards come from real builds and timings
    and differ within a group, which is what the run must show."""
    import pyarrow.parquet as pq
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from tests.test_grpo_smoke import CHAT_TEMPLATE

    rows = [r for r in pq.read_table(data / "train.parquet").to_pylist() if r["task"] in TAUGHT]
    answers = {t: ["```python\n" + (ROOT / f).read_text() + "```" for f in files] for t, files in TAUGHT.items()}
    specials = ["<pad>", "<|end|>", "<|user|>", "<|system|>", "<|assistant|>"]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    corpus = [m["content"] for r in rows for m in r["prompt"]] + [a for texts in answers.values() for a in texts]
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
    sequences = []
    for r in rows:
        prompt = tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
        head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        for answer in answers[r["task"]]:
            tail = tokenizer(answer + "<|end|>", add_special_tokens=False)["input_ids"]
            sequences.append((head, tail))
    # one padded batch: every answer of every prompt in each step
    width = max(len(h) + len(t) for h, t in sequences)
    ids = torch.full((len(sequences), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)  # learn the answers, not the prompts or the padding
    mask = torch.zeros_like(ids)
    for row, (head, tail) in enumerate(sequences):
        n = len(head) + len(tail)
        ids[row, :n] = torch.tensor(head + tail)
        labels[row, len(head):n] = torch.tensor(tail)
        mask[row, :n] = 1
    ids, labels, mask = ids.to(device), labels.to(device), mask.to(device)
    print(f"taught model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{len(sequences)} answers of {min(len(t) for _, t in sequences)}-{max(len(t) for _, t in sequences)} tokens")
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    # decayed to zero, so that the last steps drive the loss down to where a 3,000-token answer
    # is usually sampled without a slip
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    model.train()
    for step in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
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
        for step, m in step_metrics(root / "ws", summary["run"]):
            print(f"step {step}: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(m.items())
                                               if isinstance(v, (int, float)) and ("reward" in k or "correct" in k
                                                                                   or "speedup" in k or "hack" in k)))
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
