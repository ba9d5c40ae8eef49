"""What ``stitchcuda train CONFIG`` reads (TOML or JSON): model, data, LoRA, GRPO, generation,
verification and reward, each a typed section with the defaults of a small single-GPU run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from stitchcuda.llm.base import LLMConfig
from stitchcuda.reward.config import RewardConfig


class LoraSection(BaseModel):
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] | str = Field("all-linear", description="module names, or all-linear")


class GRPOSection(BaseModel):
    num_generations: int = Field(4, ge=2, description="completions per prompt: the group GRPO normalises over")
    max_completion_length: int = 4096
    temperature: float = 1.0
    learning_rate: float = 1e-5
    beta: float = Field(0.0, ge=0, description="KL coefficient (0: no reference model kept)")
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    max_steps: int = 200
    logging_steps: int = 1
    save_steps: int = 25
    seed: int = 0
    bf16: bool = Field(True, description="bf16 weights and compute (off on CPU)")


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
    grpo: GRPOSection = GRPOSection()
    generation: GenerationSection = GenerationSection()
    verify: VerifySection = VerifySection()
    reward: RewardConfig = RewardConfig()
    judge: LLMConfig | None = Field(None, description="the rubric judge; none: rule reward alone (r = 0.5)")

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        """Read a TOML or JSON config; paths written ./x or ../x are relative to the config's folder."""
        path = Path(path)
        text = path.read_text()
        if path.suffix == ".toml":
            import tomllib  # Python 3.11+

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
        config = cls.model_validate(data)
        for field in ("model", "tokenizer", "dataset", "output_dir"):
            value = getattr(config, field)
            if isinstance(value, str) and value.startswith(("./", "../")):
                setattr(config, field, str((path.parent / value).resolve()))
        return config
