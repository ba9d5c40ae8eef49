"""``stitchcuda train CONFIG``: GRPO on the Coder's two skills with TRL's GRPOTrainer and a
PEFT LoRA adapter, rewarded by real verifications (and the rubric, when a judge is configured).

Generation runs through vLLM (server or colocated) where it is installed and asked for, plain
transformers otherwise. Checkpoints go to ``output_dir`` every ``save_steps`` and a run resumes
from the last one; the adapter is saved to ``output_dir/adapter``, ready for
``stitchcuda optimize --coder-provider hf --coder-model BASE --adapter DIR``. Per-step metrics
(reward parts, correctness and hacking rates, speedups, judge fallbacks) go to TensorBoard and
to the run store's ``train_metrics`` table.
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from stitchcuda.rl.config import TrainConfig


class TrainError(ValueError):
    """A config that cannot train; the message says what to change."""


TRAIN_SCHEMA = """
CREATE TABLE IF NOT EXISTS train_runs (id TEXT PRIMARY KEY, config TEXT NOT NULL, created REAL NOT NULL,
                                       updated REAL NOT NULL, status TEXT NOT NULL, summary TEXT);
CREATE TABLE IF NOT EXISTS train_metrics (run_id TEXT NOT NULL, step INTEGER NOT NULL, metrics TEXT NOT NULL,
                                          created REAL NOT NULL, PRIMARY KEY (run_id, step));
"""


def generation_backend(config: TrainConfig) -> tuple[bool, str | None]:
    """(use vLLM, its mode) for the config, refusing a vLLM backend that is not installed."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    backend = config.generation.backend
    if backend == "transformers" or (backend == "auto" and not has_vllm):
        return False, None
    if not has_vllm:
        raise TrainError(f"generation backend {backend} needs vLLM: pip install vllm (or backend = 'transformers')")
    if backend == "vllm-server":
        if not config.generation.vllm_server_base_url:
            raise TrainError("vllm-server needs generation.vllm_server_base_url (a `trl vllm-serve` server)")
        return True, "server"
    return True, "colocate"


def load_prompts(config: TrainConfig) -> Any:
    """The training split, only the configured skills, in the columns the reward functions read."""
    import datasets

    path = Path(config.dataset) / "train.parquet"
    if not path.exists():
        raise TrainError(f"{path} does not exist: build it with `stitchcuda dataset build ... -o {config.dataset}`")
    data = datasets.load_dataset("parquet", data_files={"train": str(path)}, split="train")
    data = data.filter(lambda row: row["skill"] in config.skills)
    if len(data) == 0:
        raise TrainError(f"no training sample of skills {config.skills} in {path}")
    keep = ["prompt", "task", "reference", "skill", "feedback"]
    return data.remove_columns([c for c in data.column_names if c not in keep])


def _store(config: TrainConfig) -> sqlite3.Connection:
    root = Path(config.workspace)
    root.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(root / "runs.sqlite", isolation_level=None, check_same_thread=False, timeout=60)
    db.executescript(TRAIN_SCHEMA)
    return db


def _metrics_callback(db: sqlite3.Connection, run_id: str) -> Any:
    from transformers import TrainerCallback

    class MetricsToStore(TrainerCallback):
        """Every logged step's metrics into the run store, beside TensorBoard's copy."""

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if not logs:
                return
            # the trainer's closing summary is logged at the last step too: merged, so that it
            # does not replace that step's rewards
            row = db.execute("SELECT metrics FROM train_metrics WHERE run_id = ? AND step = ?",
                             (run_id, state.global_step)).fetchone()
            merged = {**json.loads(row[0]), **logs} if row else logs
            db.execute("INSERT OR REPLACE INTO train_metrics VALUES (?, ?, ?, ?)",
                       (run_id, state.global_step, json.dumps(merged, default=float), time.time()))

    return MetricsToStore()


def step_metrics(workspace: Path, run_id: str | None = None) -> list[tuple[int, dict[str, Any]]]:
    """The logged metrics of a training run (the latest when ``run_id`` is None), step by step."""
    db = sqlite3.connect(Path(workspace) / "runs.sqlite")
    try:
        if run_id is None:
            row = db.execute("SELECT id FROM train_runs ORDER BY created DESC LIMIT 1").fetchone()
            if row is None:
                return []
            run_id = row[0]
        rows = db.execute("SELECT step, metrics FROM train_metrics WHERE run_id = ? ORDER BY step", (run_id,))
        return [(step, json.loads(metrics)) for step, metrics in rows]
    finally:
        db.close()


def _last_checkpoint(output_dir: Path) -> str | None:
    found = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return str(found[-1]) if found else None


def train(config: TrainConfig, resume: bool = False) -> dict[str, Any]:
    try:
        import torch
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        raise TrainError(f"training needs the train extra ({exc.name} is missing): "
                         "pip install 'stitchcuda[train]'") from None
    from stitchcuda.llm import make_client
    from stitchcuda.reward import RubricJudge
    from stitchcuda.rl.rewards import VerificationPool, VerifiedRewards

    use_vllm, vllm_mode = generation_backend(config)
    prompts = load_prompts(config)
    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or config.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype = torch.bfloat16 if cuda and config.grpo.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype)
    judge = RubricJudge(make_client(config.judge), retries=config.reward.judge_retries) if config.judge else None
    output_dir = Path(config.output_dir)
    pool = VerificationPool(config.verify, Path(config.workspace))
    rewards = VerifiedRewards(pool, judge, config.reward)
    functions, weights = rewards.functions()
    g = config.grpo
    args = GRPOConfig(
        output_dir=str(output_dir), num_generations=g.num_generations, max_completion_length=g.max_completion_length,
        temperature=g.temperature, learning_rate=g.learning_rate, beta=g.beta,
        per_device_train_batch_size=g.per_device_train_batch_size,
        gradient_accumulation_steps=g.gradient_accumulation_steps, max_steps=g.max_steps,
        logging_steps=g.logging_steps, save_steps=g.save_steps, seed=g.seed, bf16=cuda and g.bf16,
        use_cpu=not cuda, report_to=config.report_to, reward_weights=weights, use_vllm=use_vllm,
        **({"vllm_mode": vllm_mode} if use_vllm else {}),
        **({"vllm_server_base_url": config.generation.vllm_server_base_url} if vllm_mode == "server" else {}),
        **({"vllm_gpu_memory_utilization": config.generation.vllm_gpu_memory_utilization}
           if vllm_mode == "colocate" else {}))
    lora = LoraConfig(r=config.lora.r, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
                      target_modules=config.lora.target_modules, task_type="CAUSAL_LM")
    db = _store(config)
    run_id = f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    db.execute("INSERT INTO train_runs VALUES (?, ?, ?, ?, 'running', NULL)",
               (run_id, config.model_dump_json(), time.time(), time.time()))
    trainer = GRPOTrainer(model=model, reward_funcs=functions, args=args, train_dataset=prompts,
                          processing_class=tokenizer, peft_config=lora, callbacks=[_metrics_callback(db, run_id)])
    checkpoint = _last_checkpoint(output_dir) if resume else None
    started = time.time()
    status = "failed"
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
        adapter = output_dir / "adapter"
        trainer.save_model(str(adapter))
        tokenizer.save_pretrained(str(adapter))
        status = "done"
    finally:
        devices = max(1, len({str(s.gate.path) for s in pool.slots}))
        minutes = rewards.verify_seconds / 60
        summary = {
            "run": run_id, "status": status, "steps": trainer.state.global_step, "resumed_from": checkpoint,
            "adapter": str(output_dir / "adapter") if status == "done" else None, "generation":
            f"vllm ({vllm_mode})" if use_vllm else "transformers", "seconds": round(time.time() - started, 1),
            "verifications": rewards.verifications,
            "verified_per_minute_per_gpu": round(rewards.verifications / minutes / devices, 2) if minutes else None,
            "last_metrics": (trainer.state.log_history or [{}])[-1]}
        db.execute("UPDATE train_runs SET status = ?, summary = ?, updated = ? WHERE id = ?",
                   (status, json.dumps(summary, default=str), time.time(), run_id))
    return summary
