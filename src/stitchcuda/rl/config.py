"""What ``stitchcuda train CONFIG`` reads (TOML or JSON): model, data, LoRA, GRPO, generation,
verification and reward, with the defaults of a small single-GPU run. Each section is a typed
record; [grpo] is TRL's own ``GRPOConfig``, built from the section's keys by ``rl.train``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from stitchcuda.llm.base import LLMConfig
from stitchcuda.reward.config import RewardConfig


class LoraSection(BaseModel):
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] | str = Field("all-linear", description="module names, or all-linear")


# The [grpo] section is passed to ``trl.GRPOConfig(**section)`` as it is, over these defaults (a
# small single-GPU run; TRL's own defaults suit a different scale: 8 generations of 512 tokens, 10x
# the logging interval). Any GRPOConfig field may be set there, with TRL's meaning and checks.
GRPO_DEFAULTS: dict[str, Any] = {
    "num_generations": 4, "max_completion_length": 4096, "temperature": 1.0, "learning_rate": 1e-5,
    "beta": 0.0, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "max_steps": 200,
    "logging_steps": 1, "save_steps": 25, "seed": 0,
    "bf16": True,  # asked for; ``train`` turns it off on a machine without CUDA
}

# GRPOConfig fields stitchcuda sets itself, from another section or from the machine: a [grpo]
# value would be overwritten, so it is refused with where to set it instead
OWN_GRPO_KEYS: dict[str, str] = {
    "output_dir": "the top-level output_dir",
    "report_to": "the top-level report_to",
    "reward_weights": "nowhere: the combined reward trains (weight 1), its parts are only logged",
    "use_cpu": "nowhere: the CPU is used when no CUDA device is visible",
    "use_vllm": "[generation] backend",
    "vllm_mode": "[generation] backend",
    "vllm_server_base_url": "[generation] vllm_server_base_url",
    "vllm_gpu_memory_utilization": "[generation] vllm_gpu_memory_utilization",
}


class GenerationSection(BaseModel):
    backend: Literal["auto", "vllm-server", "vllm-colocate", "transformers"] = Field(
        "auto", description="auto: vLLM colocated when vllm is installed, plain transformers otherwise")
    vllm_server_base_url: str | None = Field(None, description="a `trl vllm-serve` server, for vllm-server")
    vllm_gpu_memory_utilization: float = 0.3


class VerifySection(BaseModel):
    preset: str = "quick"
    tolerance: Literal["strict", "paper"] = "strict"
    gpus: list[str] | None = Field(None, description="devices for verification (default: every visible GPU); "
                                                     "cpu for C++-only smoke runs")
    runs_per_gpu: int = Field(2, ge=1, description="verifications sharing a GPU, so builds overlap timing")
    ray: str | None = Field(None, description="a Ray address: verify on the cluster instead")


class TrainConfig(BaseModel):
    model: str = Field(description="base model: a Hugging Face id or a local folder")
    tokenizer: str | None = Field(None, description="default: the model's")
    dataset: str = Field(description="a folder written by `stitchcuda dataset build` (train.parquet)")
    skills: list[int] = Field([1, 2], description="which skills' samples to train on")
    output_dir: str = "runs/train"
    workspace: str = Field(".stitchcuda", description="the run store the per-step metrics go to")
    report_to: list[str] = Field(["tensorboard"], description="transformers' loggers (tensorboard, none, ...)")
    lora: LoraSection = LoraSection()
    grpo: dict[str, Any] = Field(default_factory=lambda: dict(GRPO_DEFAULTS),
                                 description="trl.GRPOConfig fields, over GRPO_DEFAULTS")
    generation: GenerationSection = GenerationSection()
    verify: VerifySection = VerifySection()
    reward: RewardConfig = RewardConfig()
    judge: LLMConfig | None = Field(None, description="the rubric judge; none: rule reward alone (r = 0.5)")

    @field_validator("grpo")
    @classmethod
    def _over_defaults(cls, section: dict[str, Any]) -> dict[str, Any]:
        return {**GRPO_DEFAULTS, **section}

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        """Read a TOML or JSON config; paths written ./x or ../x are relative to the config's folder."""
        path = Path(path)
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        config = cls.model_validate(data)
        for field in ("model", "tokenizer", "dataset", "output_dir"):
            value = getattr(config, field)
            if isinstance(value, str) and value.startswith(("./", "../")):
                setattr(config, field, str((path.parent / value).resolve()))
        return config
