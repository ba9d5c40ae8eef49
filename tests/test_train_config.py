"""The training config: [grpo] is TRL's GRPOConfig itself, so every key we ship must be one of its
fields, and a key that is not is refused with a message (no traceback) before any model loads."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stitchcuda.cli import app
from stitchcuda.rl.config import GRPO_DEFAULTS, OWN_GRPO_KEYS, TrainConfig

trl = pytest.importorskip("trl")

SHIPPED = sorted((Path(__file__).parents[1] / "configs" / "train").glob("*.toml"))


def grpo_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(trl.GRPOConfig) if f.init}


def test_every_grpo_key_we_ship_is_a_field_of_trls_config():
    assert SHIPPED, "configs/train/*.toml went missing"
    shipped = {key for path in SHIPPED for key in tomllib.loads(path.read_text()).get("grpo", {})}
    assert shipped and set(GRPO_DEFAULTS) <= grpo_fields() and shipped <= grpo_fields(), \
        sorted((set(GRPO_DEFAULTS) | shipped) - grpo_fields())
    assert set(OWN_GRPO_KEYS) <= grpo_fields()  # the fields stitchcuda sets must reach TRL too
    assert not (shipped | set(GRPO_DEFAULTS)) & set(OWN_GRPO_KEYS)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_configs_build_trls_config(path, tmp_path):
    from stitchcuda.rl.train import grpo_arguments

    config = TrainConfig.load(path).model_copy(update={"output_dir": str(tmp_path / "out")})
    args = grpo_arguments(config, cuda=False, reward_weights=[1.0, 0.0], use_vllm=False, vllm_mode=None)
    assert isinstance(args, trl.GRPOConfig)
    section = tomllib.loads(path.read_text())["grpo"]
    for key, value in {**GRPO_DEFAULTS, **section}.items():
        if key != "bf16":
            assert getattr(args, key) == value, key
    assert args.bf16 is False and args.use_cpu and args.output_dir == str(tmp_path / "out")  # no CUDA here
    assert args.reward_weights == [1.0, 0.0]


def test_any_field_of_trls_config_passes_through(tmp_path):
    from stitchcuda.rl.train import grpo_arguments

    config = TrainConfig(model="m", dataset="d", output_dir=str(tmp_path),
                         grpo={"loss_type": "grpo", "scale_rewards": "batch", "num_generations": 2})
    assert config.grpo["max_steps"] == GRPO_DEFAULTS["max_steps"]  # the defaults stay under the section
    args = grpo_arguments(config, cuda=False, reward_weights=[1.0], use_vllm=False, vllm_mode=None)
    assert (args.loss_type, args.scale_rewards, args.num_generations) == ("grpo", "batch", 2)


def test_unknown_and_owned_keys_are_refused_by_name():
    from stitchcuda.rl.train import TrainError, check_grpo_section

    with pytest.raises(TrainError, match=r"\[grpo\] num_generation is not a field .*did you mean num_generations"):
        check_grpo_section({"num_generation": 4})
    with pytest.raises(TrainError, match=r"\[grpo\] output_dir is set by stitchcuda: set it in the top-level"):
        check_grpo_section({"output_dir": "x"})
    check_grpo_section(GRPO_DEFAULTS)


def test_trls_own_checks_become_train_errors(tmp_path):
    from stitchcuda.rl.train import TrainError, grpo_arguments

    config = TrainConfig(model="m", dataset="d", output_dir=str(tmp_path),
                         grpo={"num_generations": 3, "per_device_train_batch_size": 4})
    with pytest.raises(TrainError, match="trl.GRPOConfig refused the \\[grpo\\] section"):
        grpo_arguments(config, cuda=False, reward_weights=[1.0], use_vllm=False, vllm_mode=None)


def test_cli_names_a_misspelt_key_without_a_traceback(tmp_path):
    # the dataset does not exist: the key must be refused first, before anything is loaded
    (tmp_path / "train.json").write_text(json.dumps({"model": "m", "dataset": str(tmp_path / "none"),
                                                     "grpo": {"learning_rat": 1e-5}}))
    result = CliRunner().invoke(app, ["train", str(tmp_path / "train.json")])
    assert result.exit_code == 2, result.output
    assert "learning_rat is not a field of trl.GRPOConfig" in result.output and "learning_rate" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)  # a clean exit
