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

import difflib
import importlib.util
import time
from pathlib import Path
from typing import Any

from stitchcuda.llm import make_client
from stitchcuda.reward import RubricJudge
from stitchcuda.rl.config import OWN_GRPO_KEYS, TrainConfig
from stitchcuda.rl.rewards import VerificationPool, VerifiedRewards
from stitchcuda.store import TrainLog
from stitchcuda.torchvision_compat import make_torchvision_importable


class TrainError(ValueError):
    """A config that cannot train; the message says what to change."""


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


def _metrics_callback(log: TrainLog, run_id: str) -> Any:
    make_torchvision_importable()  # transformers imports torchvision where it is installed
    from transformers import TrainerCallback

    class MetricsToStore(TrainerCallback):
        """Every logged step's metrics into the run store, beside TensorBoard's copy."""

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if logs:
                log.log(run_id, state.global_step, logs)

    return MetricsToStore()


def step_metrics(workspace: Path, run_id: str | None = None) -> list[tuple[int, dict[str, Any]]]:
    """The logged metrics of a training run (the latest when ``run_id`` is None), step by step."""
    log = TrainLog(workspace)
    try:
        return log.metrics(run_id)
    finally:
        log.close()


def check_grpo_section(section: dict[str, Any]) -> None:
    """Refuse [grpo] keys that are not fields of TRL's GRPOConfig, or that stitchcuda sets itself,
    before a model is loaded; the message names every such key and what to write instead."""
    import dataclasses

    make_torchvision_importable()  # transformers imports torchvision where it is installed
    import trl

    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig) if f.init}
    problems = []
    for key in sorted(section):
        if key in OWN_GRPO_KEYS:
            problems.append(f"[grpo] {key} is set by stitchcuda: set it in {OWN_GRPO_KEYS[key]}")
        elif key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            problems.append(f"[grpo] {key} is not a field of trl.GRPOConfig (trl {trl.__version__})"
                            + (f": did you mean {close[0]}?" if close else ""))
    if problems:
        raise TrainError("; ".join(problems))


def grpo_arguments(config: TrainConfig, cuda: bool, reward_weights: list[float], use_vllm: bool,
                   vllm_mode: str | None) -> Any:
    """TRL's GRPOConfig: the [grpo] section as it is, plus the fields stitchcuda sets itself."""
    from trl import GRPOConfig

    check_grpo_section(config.grpo)
    ours: dict[str, Any] = {
        "output_dir": str(config.output_dir), "use_cpu": not cuda, "report_to": config.report_to,
        "reward_weights": reward_weights, "use_vllm": use_vllm,
        "bf16": cuda and bool(config.grpo.get("bf16")),  # bf16 on a CPU is slow where it runs at all
    }
    if vllm_mode == "server":
        ours |= {"vllm_mode": "server", "vllm_server_base_url": config.generation.vllm_server_base_url}
    elif vllm_mode == "colocate":
        ours |= {"vllm_mode": "colocate",
                 "vllm_gpu_memory_utilization": config.generation.vllm_gpu_memory_utilization}
    try:
        return GRPOConfig(**{**config.grpo, **ours})
    except (TypeError, ValueError) as exc:  # TRL's own cross-field checks (batch vs generations, ...)
        raise TrainError(f"trl.GRPOConfig refused the [grpo] section: {exc}") from None


def _last_checkpoint(output_dir: Path) -> str | None:
    found = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return str(found[-1]) if found else None


def train(config: TrainConfig, resume: bool = False) -> dict[str, Any]:
    try:
        import torch
        make_torchvision_importable()  # transformers imports torchvision where it is installed
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOTrainer
    except ImportError as exc:
        raise TrainError(f"training needs the train extra ({exc.name} is missing): "
                         "pip install 'stitchcuda[train]'") from None

    check_grpo_section(config.grpo)  # a misspelt key fails here, not after the model has loaded
    use_vllm, vllm_mode = generation_backend(config)
    prompts = load_prompts(config)
    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or config.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype = torch.bfloat16 if cuda and config.grpo.get("bf16") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype)
    judge = RubricJudge(make_client(config.judge), retries=config.reward.judge_retries) if config.judge else None
    output_dir = Path(config.output_dir)
    pool = VerificationPool(config.verify, Path(config.workspace))
    rewards = VerifiedRewards(pool, judge, config.reward)
    functions, weights = rewards.functions()
    args = grpo_arguments(config, cuda, weights, use_vllm, vllm_mode)
    lora = LoraConfig(r=config.lora.r, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
                      target_modules=config.lora.target_modules, task_type="CAUSAL_LM")
    log = TrainLog(config.workspace)
    run_id = log.start(config.model_dump_json())
    trainer = GRPOTrainer(model=model, reward_funcs=functions, args=args, train_dataset=prompts,
                          processing_class=tokenizer, peft_config=lora, callbacks=[_metrics_callback(log, run_id)])
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
        log.finish(run_id, status, summary)
        log.close()
    return summary
