"""A GRPO smoke run on the CPU: a tiny randomly initialised Phi and a tokenizer trained here
(nothing from a hub), a few steps of `stitchcuda train`, rewards through the real reward
functions (extraction, verification on the CPU, rule reward, rubric over the scripted server),
and the effect GRPO exists for: the LoRA adapter's weights move."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stitchcuda.cli import app
from stitchcuda.rl.train import step_metrics
from stitchcuda.store import RunStore, TrainLog
from tests.conftest import share_builds
from tests.llm_server import ScriptedOpenAIServer
from tests.test_optimize_loop import plan

pytest.importorskip("trl")
pytest.importorskip("peft")

ROOT = Path(__file__).parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


HONEST = FIXTURES / "agents" / "tiny_mlp_full_cpp.py"  # passes tiny_mlp with its own C++ (a g++ build)


def tiny_model(folder: Path) -> str:
    """A 2-layer Phi with a word-level tokenizer over a few programs' words, plus one token that is
    a whole fenced honest program; returns that program's text.

    Random weights alone write no program, so every completion would score 0, every group's
    advantages would be 0 and GRPO would have nothing to learn from. Phi's output layer has a
    bias: it leaves two tokens in play, about even, the program and the end of the answer. A group
    of one-token completions then mixes rewarded programs with empty answers."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PhiConfig, PhiForCausalLM, PreTrainedTokenizerFast

    corpus = [(FIXTURES / "cpu" / name).read_text() for name in ("tiny_mlp.py", "cpp_extension.py")]
    corpus.append("```python\nclass ModelNew(nn.Module):\n```")
    raw = Tokenizer(models.WordLevel(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(corpus, trainers.WordLevelTrainer(
        special_tokens=["<unk>", "<pad>", "<|end|>", "<|user|>", "<|system|>", "<|assistant|>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="<|end|>")
    program = "```python\n" + HONEST.read_text() + "```"
    tokenizer.add_tokens([AddedToken(program, normalized=False, special=False)])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    import torch

    torch.manual_seed(0)
    config = PhiConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                       bos_token_id=tokenizer.eos_token_id)
    model = PhiForCausalLM(config)
    in_play = [tokenizer.convert_tokens_to_ids(program), tokenizer.eos_token_id]
    with torch.no_grad():  # the weights stay random (and small), so the logits still depend on the LoRA
        model.lm_head.bias.fill_(-30.0)
        model.lm_head.bias[in_play] = 0.0
    model.save_pretrained(folder)
    assert tokenizer.decode(in_play[:1]) == program
    return program


@pytest.fixture
def lora_at_start(monkeypatch) -> dict:
    """The LoRA weights as the trainer holds them when training starts, named as the saved adapter
    names them (without PEFT's adapter name): filled in by a GRPOTrainer that `train` builds."""
    import trl

    snapshot: dict = {}

    class Snapshotting(trl.GRPOTrainer):
        def train(self, *args, **kwargs):
            if not snapshot:  # the first run's start, not a resumed run's
                snapshot.update({name.replace(".default", ""): p.detach().clone()
                                 for name, p in self.model.named_parameters() if "lora_" in name})
            return super().train(*args, **kwargs)

    monkeypatch.setattr(trl, "GRPOTrainer", Snapshotting)
    return snapshot


def test_grpo_smoke_run_with_verified_rewards(tmp_path, cache, session_builds, lora_at_start):
    share_builds(cache, session_builds)
    import torch
    from safetensors.torch import load_file

    from tests.test_reward import judgement

    model_dir = tmp_path / "tiny"
    program = tiny_model(model_dir)
    data = tmp_path / "data"
    built = CliRunner().invoke(app, ["dataset", "build", "--tasks", str(FIXTURES / "cpu" / "tiny_mlp.py"),
                                     "--eval-fraction", "0", "-o", str(data), "--json"])
    assert built.exit_code == 0, built.output
    with ScriptedOpenAIServer([judgement(skill_compliance=5)]) as server:
        config = {
            "model": str(model_dir), "dataset": str(data), "output_dir": str(tmp_path / "out"),
            "workspace": str(tmp_path / "ws"), "report_to": ["tensorboard"],
            # one token per completion: the program or the end; 8 of them make a mixed group all but surely
            "grpo": {"num_generations": 8, "max_completion_length": 1, "per_device_train_batch_size": 8,
                     "max_steps": 2, "save_steps": 1, "logging_steps": 1, "bf16": False},
            "generation": {"backend": "transformers"},
            "verify": {"preset": "tiny-debug", "gpus": ["cpu"], "runs_per_gpu": 1},
            "judge": server.config().model_dump(),
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        }
        (tmp_path / "train.json").write_text(json.dumps(config))
        result = CliRunner().invoke(app, ["train", str(tmp_path / "train.json"), "--json"])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert len(server.requests) == 1  # the one program is judged once; empty answers spare the judge
    assert summary["status"] == "done" and summary["steps"] == 2 and summary["generation"] == "transformers"
    assert summary["verifications"] == 1  # every sample of the program shares one verification
    assert (Path(summary["adapter"]) / "adapter_config.json").exists()
    assert (tmp_path / "out" / "checkpoint-2").is_dir()
    metrics = [m for _, m in step_metrics(tmp_path / "ws")]
    logged = {k for m in metrics for k in m}
    for part in ("reward", "rule", "rubric_r", "correct", "total_hack", "speedup", "judge_neutral"):
        assert any(part in k for k in logged), (part, sorted(logged))
    # every step keeps its rewards, the last too (the trainer's closing summary shares its step)
    assert len(metrics) == 2 and all("reward" in m for m in metrics) and "train_runtime" in metrics[-1]
    assert any(m["reward_std"] > 0 for m in metrics)  # a group mixed the program with empty answers
    assert max(m["rewards/correct/mean"] for m in metrics) > 0
    assert TrainLog(tmp_path / "ws").status(summary["run"]) == "done"
    assert list((tmp_path / "out").rglob("events.out.tfevents.*"))  # TensorBoard got the same metrics

    # the effect of training: the adapter saved is not the one the trainer started from
    trained = load_file(Path(summary["adapter"]) / "adapter_model.safetensors")
    assert lora_at_start and set(trained) == set(lora_at_start), (sorted(trained), sorted(lora_at_start))
    moved = [name for name, w in trained.items() if not torch.equal(w, lora_at_start[name])]
    assert moved, "two GRPO steps on mixed rewards left every LoRA weight where it started"
    assert any(".lora_B." in name for name in moved)  # B starts at zero: the adapter now changes the model

    # the adapter plugs into optimize as the Coder (a local HF model + LoRA); the Planner is scripted
    with ScriptedOpenAIServer([plan(target=0.01)]) as planner:
        run = CliRunner().invoke(app, [
            "optimize", str(FIXTURES / "cpu" / "tiny_mlp.py"), "--model", "scripted", "--base-url",
            planner.base_url, "--coder-provider", "hf", "--coder-model", str(model_dir), "--adapter",
            summary["adapter"], "--device", "cpu", "--preset", "tiny-debug", "--max-steps", "1",
            "--workspace", str(tmp_path / "ws-optimize"), "-o", str(tmp_path / "taught.py"), "--json"])
    calls = RunStore(tmp_path / "ws-optimize").llm_calls(RunStore(tmp_path / "ws-optimize").resolve("last"))
    coder = [c for c in calls if c["role"] == "coder"]
    assert coder and coder[0]["model"] == f"{model_dir}+{summary['adapter']}" and coder[0]["answer"] is not None
    # a clean run either way: the program the Coder wrote passes, an empty answer leaves no best
    assert run.exit_code == (0 if program in coder[0]["answer"] else 1), run.output

    # a resumed run starts from the last checkpoint (without the judge, whose server is gone)
    config["grpo"]["max_steps"] = 3
    del config["judge"]
    (tmp_path / "train.json").write_text(json.dumps(config))
    again = CliRunner().invoke(app, ["train", str(tmp_path / "train.json"), "--resume", "--json"])
    assert again.exit_code == 0, again.output
    resumed = json.loads(again.stdout)
    assert resumed["resumed_from"].endswith("checkpoint-2") and resumed["steps"] == 3


def test_reward_functions_verify_extracted_programs(tmp_path, cache, session_builds):
    """The path a good completion takes: extracted, verified (a real g++ build), rule-rewarded."""
    share_builds(cache, session_builds)
    from stitchcuda.reward import RewardConfig
    from stitchcuda.rl.config import VerifySection
    from stitchcuda.rl.rewards import VerificationPool, VerifiedRewards

    reference = (FIXTURES / "cpu" / "tiny_mlp.py").read_text()
    honest = (FIXTURES / "agents" / "tiny_mlp_full_cpp.py").read_text()
    pure = (FIXTURES / "cpu" / "pure_torch.py").read_text()
    pool = VerificationPool(VerifySection(preset="tiny-debug", gpus=["cpu"], runs_per_gpu=2), tmp_path)
    rewards = VerifiedRewards(pool, None, RewardConfig())
    functions, weights = rewards.functions()
    completions = [[{"role": "assistant", "content": f"```python\n{honest}```"}],
                   [{"role": "assistant", "content": f"```python\n{pure}```"}],
                   [{"role": "assistant", "content": "no code at all"}],
                   [{"role": "assistant", "content": f"```python\n{honest}```"}]]  # the same program again
    kwargs = dict(prompts=[[]] * 4, completions=completions, task=["tiny_mlp"] * 4, reference=[reference] * 4,
                  skill=[1] * 4, feedback=[""] * 4)
    values = functions[0](**kwargs)
    assert values[0] > 0.3 and values[1] == 0.0 and values[2] == 0.0 and values[3] == values[0]
    assert rewards.verifications == 2  # each distinct program verified once, and only once across functions
    gates = [b.rule.gate for b in rewards.score(completions, ["tiny_mlp"] * 4, [reference] * 4)]
    assert gates[:3] == ["passed", "total hack", gates[2]] and gates[2].startswith("no program")
    assert functions[4](**kwargs) == [0.0, 1.0, 0.0, 0.0] and weights == [1.0] + [0.0] * 6
    assert rewards.verifications == 2


def test_reward_verifications_on_ray_with_logical_gpus(tmp_path, cache):
    ray = pytest.importorskip("ray")
    from stitchcuda.reward import RewardConfig
    from stitchcuda.rl.config import VerifySection
    from stitchcuda.rl.rewards import VerificationPool, VerifiedRewards

    reference = (FIXTURES / "cpu" / "tiny_mlp.py").read_text()
    pure = (FIXTURES / "cpu" / "pure_torch.py").read_text()
    wrong = (FIXTURES / "cpu" / "wrong.py").read_text()
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pool = VerificationPool(VerifySection(preset="tiny-debug", gpus=["cpu"], ray="local", runs_per_gpu=2),
                                tmp_path)
        rewards = VerifiedRewards(pool, None, RewardConfig())
        found = rewards.score([f"```python\n{pure}```", f"```python\n{wrong}```"], ["tiny_mlp"] * 2,
                              [reference] * 2)
    finally:
        ray.shutdown()
    assert [b.rule.gate for b in found] == ["total hack", "total hack"] and rewards.verifications == 2
    assert all(b.reward == 0.0 for b in found)


def test_the_gpu_runs_taught_model_writes_through_its_tokenizer_and_template(tmp_path):
    """benchmarks/grpo_gpu.py's stand-in for a small coder (no hub on the GPU machine): its
    tokenizer must give back every byte of the programs it is taught (several per task), and its prompts must be
    rendered with the chat template GRPO uses (one teaching step here; the GPU run takes 1,000)."""
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stitchcuda.rl.dataset import build_dataset

    spec = importlib.util.spec_from_file_location("grpo_gpu", ROOT / "benchmarks" / "grpo_gpu.py")
    grpo_gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grpo_gpu)
    build_dataset(tmp_path, [], tmp_path / "data", list(grpo_gpu.TAUGHT), eval_fraction=0.0)
    folder = grpo_gpu.taught_tiny(tmp_path / "taught", tmp_path / "data", steps=1)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for path in (p for paths in grpo_gpu.TAUGHT.values() for p in paths):
        text = "```python\n" + (ROOT / path).read_text() + "```"
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                           tokenize=False)
    assert prompt == "<|user|>x<|end|><|assistant|>"
    assert AutoModelForCausalLM.from_pretrained(folder).config.eos_token_id == tokenizer.eos_token_id
