"""The LLM layer against a real HTTP server on 127.0.0.1, driven through the real SDKs."""

from __future__ import annotations

import json
import socket
import sys
import time
import types
from email.utils import formatdate

import pytest

from stitchcuda.llm import (
    AnthropicClient,
    LLMAuthError,
    LLMBadRequest,
    LLMClient,
    LLMConfig,
    LLMError,
    LLMModelNotFound,
    LLMServerError,
    LLMTimeout,
    LLMUnreachable,
    LocalHFClient,
    Message,
    OpenAIChatClient,
    Price,
    PriceTable,
    local_hf,
    make_client,
)
from stitchcuda.llm._http import parse_retry_after
from tests.llm_server import Delay, HTTPError, Reply, ScriptedOpenAIServer

CHAT = [Message(role="system", content="You write CUDA."),
        Message(role="user", content="Fuse these two ops please"),
        Message(role="assistant", content="Which ops?"),
        Message(role="user", content="relu and add")]
PRICES = PriceTable(models={"scripted-model": Price(input=1.0, output=2.0)})


@pytest.fixture(autouse=True)
def _no_real_keys(monkeypatch):
    """Never send a developer's real key to the test server; never read their price file."""
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL",
                "STITCHCUDA_PRICES"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def server():
    with ScriptedOpenAIServer() as s:
        yield s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- OpenAI-compatible backend ---------------------------------------------------------------

def test_answer_with_usage_cost_and_the_messages_sent(server):
    server.script([Reply("__global__ void k() {}", prompt_tokens=1200, completion_tokens=300)])
    client = OpenAIChatClient(server.config(), PRICES)
    assert isinstance(client, LLMClient)

    out = client.complete(CHAT, max_tokens=77, temperature=0.0)

    assert out.text == "__global__ void k() {}"
    assert out.model == "scripted-model" and out.finish_reason == "stop" and out.retries == 0
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (1200, 300)
    assert out.usage.cost_usd == pytest.approx((1200 * 1.0 + 300 * 2.0) / 1e6)
    assert out.seconds > 0
    req = server.requests[0]
    assert req["messages"] == [m.model_dump() for m in CHAT]
    assert (req["model"], req["max_tokens"], req["temperature"]) == ("scripted-model", 77, 0.0)
    assert server.log[0].headers["authorization"] == "Bearer EMPTY"  # vLLM's placeholder on localhost


def test_config_defaults_for_tokens_and_temperature_and_missing_usage(server):
    server.script([Reply("ok", usage=False, finish_reason="length")])
    out = OpenAIChatClient(server.config(max_tokens=123, temperature=0.3), PRICES).complete(CHAT[1:2])
    assert (server.requests[0]["max_tokens"], server.requests[0]["temperature"]) == (123, 0.3)
    assert out.usage.total_tokens == 0 and out.usage.cost_usd == 0.0
    assert out.finish_reason == "length"


def test_429_is_retried_and_retry_after_is_honoured_but_capped(server):
    server.script([HTTPError(429, "slow down", headers={"Retry-After": "30"}), "done"])
    client = OpenAIChatClient(server.config(retry_backoff_s=0.001, retry_max_wait_s=0.3))
    t0 = time.monotonic()
    out = client.complete(CHAT)
    waited = time.monotonic() - t0
    assert out.text == "done" and out.retries == 1 and len(server.requests) == 2
    assert 0.3 <= waited < 3  # the header's 30 s, capped at retry_max_wait_s (backoff alone: ~1 ms)


def test_500_twice_then_success(server):
    server.script([HTTPError(500, "boom"), HTTPError(503, "busy"), "third time lucky"])
    out = OpenAIChatClient(server.config(max_retries=3)).complete(CHAT)
    assert out.text == "third time lucky" and out.retries == 2 and len(server.requests) == 3


def test_5xx_after_every_retry_is_a_server_error(server):
    server.script([HTTPError(502, "bad gateway")] * 3)
    with pytest.raises(LLMServerError, match="502.*3 attempts.*bad gateway"):
        OpenAIChatClient(server.config(max_retries=2)).complete(CHAT)
    assert len(server.requests) == 3


def test_401_is_an_auth_error_naming_the_variable_and_not_retried(server, monkeypatch):
    monkeypatch.setenv("MY_TEST_KEY", "sk-test-123")
    server.script([HTTPError(401, "Incorrect API key provided")])
    with pytest.raises(LLMAuthError, match=r"refused the key in \$MY_TEST_KEY.*Incorrect API key"):
        OpenAIChatClient(server.config(api_key_env="MY_TEST_KEY")).complete(CHAT)
    assert len(server.requests) == 1
    assert server.log[0].headers["authorization"] == "Bearer sk-test-123"


def test_401_without_a_key_says_which_variable_to_set(server):
    server.script([HTTPError(401, "missing key")])
    with pytest.raises(LLMAuthError, match=r"wants an API key.*set \$OPENAI_API_KEY"):
        OpenAIChatClient(server.config()).complete(CHAT)


def test_hosted_api_without_a_key_fails_at_construction(monkeypatch):
    cfg = LLMConfig(model="gpt-4o", base_url="https://api.example.com/v1")
    with pytest.raises(LLMAuthError, match=r"set \$OPENAI_API_KEY"):
        OpenAIChatClient(cfg)
    with pytest.raises(LLMAuthError, match=r"set \$ANTHROPIC_API_KEY"):
        make_client(LLMConfig(provider="anthropic", model="claude-sonnet-4-5"))


@pytest.mark.parametrize("status, message", [(404, "The model `nope` does not exist."),
                                             (400, "model 'nope' does not exist")])
def test_unknown_model_is_model_not_found(server, status, message):
    server.script([HTTPError(status, message)])
    with pytest.raises(LLMModelNotFound) as info:
        OpenAIChatClient(server.config(model="nope")).complete(CHAT)
    text = str(info.value)
    assert "'nope'" in text and server.base_url in text and f"curl {server.base_url}/models" in text
    assert len(server.requests) == 1


def test_400_is_a_bad_request_with_the_servers_message(server):
    server.script([HTTPError(400, "This model's maximum context length is 4096 tokens")])
    with pytest.raises(LLMBadRequest, match="maximum context length is 4096"):
        OpenAIChatClient(server.config()).complete(CHAT)
    assert len(server.requests) == 1


def test_slow_server_times_out_after_retries(server):
    server.script([Delay(2.0), Delay(2.0)])
    t0 = time.monotonic()
    with pytest.raises(LLMTimeout, match=r"within 0.3 s \(2 attempts\)"):
        OpenAIChatClient(server.config(timeout_s=0.3, max_retries=1)).complete(CHAT)
    assert time.monotonic() - t0 < 3
    assert len(server.requests) == 2


def test_unreachable_port_names_the_url():
    url = f"http://127.0.0.1:{_free_port()}/v1"
    cfg = LLMConfig(model="m", base_url=url, max_retries=1, retry_backoff_s=0.01, timeout_s=2)
    with pytest.raises(LLMUnreachable, match=f"{url}.*2 attempts"):
        OpenAIChatClient(cfg).complete(CHAT)


def test_switches_to_max_completion_tokens_when_the_server_asks(server):
    def reasoning_api(req):
        if "max_tokens" in req:
            return HTTPError(400, "Unsupported parameter: 'max_tokens' is not supported with this model. "
                                  "Use 'max_completion_tokens' instead.")
        return f"got {req['max_completion_tokens']}"

    server.responder = reasoning_api
    client = OpenAIChatClient(server.config())
    assert client.complete(CHAT, max_tokens=50).text == "got 50"
    assert client.complete(CHAT, max_tokens=60).text == "got 60"
    assert [("max_tokens" in r, "max_completion_tokens" in r) for r in server.requests] == [
        (True, False), (False, True), (False, True)]


def test_responder_answers_dynamically_and_running_out_of_script_is_clear(server):
    server.script(["scripted"])
    client = OpenAIChatClient(server.config())
    assert client.complete(CHAT).text == "scripted"
    with pytest.raises(LLMError, match="script ran out"):
        client.complete(CHAT)
    server.responder = lambda req: Reply(req["messages"][-1]["content"].upper())
    assert client.complete(CHAT).text == "RELU AND ADD"
    assert server.pending == 0 and server.messages()[-1]["content"] == "relu and add"


# -- Anthropic backend -----------------------------------------------------------------------

def test_anthropic_answer_system_parameter_and_usage(server):
    server.script([Reply("use a fused kernel", prompt_tokens=10, completion_tokens=4, finish_reason="length")])
    prices = PriceTable(models={"claude-test": Price(input=3.0, output=15.0)})
    client = make_client(server.config(provider="anthropic", model="claude-test"), prices)
    assert isinstance(client, AnthropicClient)

    out = client.complete(CHAT + [Message(role="user", content="now")], max_tokens=64, temperature=0.2)

    assert out.text == "use a fused kernel" and out.finish_reason == "length" and out.retries == 0
    assert out.usage.cost_usd == pytest.approx((10 * 3.0 + 4 * 15.0) / 1e6)
    (rec,) = server.log
    assert rec.path == "/v1/messages"
    # older SDKs send the key as x-api-key, newer ones as a bearer token
    assert rec.headers.get("x-api-key", rec.headers.get("authorization", "").removeprefix("Bearer ")) == "EMPTY"
    assert rec.json["system"] == "You write CUDA."
    assert rec.json["messages"] == [{"role": "user", "content": "Fuse these two ops please"},
                                    {"role": "assistant", "content": "Which ops?"},
                                    {"role": "user", "content": "relu and add\n\nnow"}]
    assert (rec.json["max_tokens"], rec.json["temperature"]) == (64, 0.2)


def test_anthropic_retries_overload_and_maps_errors(server):
    server.script([HTTPError(529, "Overloaded"), "fine", HTTPError(401, "invalid x-api-key"),
                   HTTPError(404, "model: claude-nope")])
    client = AnthropicClient(server.config(provider="anthropic", base_url=server.url + "/v1"))
    out = client.complete(CHAT)
    assert out.text == "fine" and out.retries == 1 and out.finish_reason == "stop"
    with pytest.raises(LLMAuthError, match=r"ANTHROPIC_API_KEY"):
        client.complete(CHAT)
    with pytest.raises(LLMModelNotFound, match="scripted-model"):
        client.complete(CHAT)


def test_anthropic_missing_sdk_names_the_extra(monkeypatch, server):
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(LLMError, match=r"stitchcuda\[anthropic\]"):
        AnthropicClient(server.config(provider="anthropic"))


# -- prices ----------------------------------------------------------------------------------

def test_price_table_defaults_exact_prefix_and_unknown():
    table = PriceTable.default()
    assert "check" in table.source
    assert table.price("gpt-4o-mini") == table.models["gpt-4o-mini"]  # exact, not the gpt-4o prefix
    assert table.price("gpt-4o-2024-08-06") == table.models["gpt-4o"]  # longest prefix
    assert table.price("GPT-4O-MINI-2024-07-18") == table.models["gpt-4o-mini"]
    assert table.cost("Qwen/Qwen2.5-Coder-7B-Instruct", 10_000, 10_000) == 0.0
    assert PriceTable().cost("gpt-4o", 1, 1) == 0.0


def test_price_table_loads_json_toml_and_env(tmp_path, monkeypatch):
    js = tmp_path / "prices.json"
    js.write_text(json.dumps({"models": {"my-model": {"input": 1.5, "output": 6}}}))
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"my-model": {"input": 2, "output": 4}}))
    table = PriceTable.load(js)
    assert table.cost("my-model-v2", 1_000_000, 500_000) == pytest.approx(1.5 + 3.0)
    assert table.source == str(js) and "gpt-4o" not in table.models  # a file replaces the defaults
    assert PriceTable.load(flat).price("my-model") == Price(input=2, output=4)
    toml = tmp_path / "prices.toml"
    toml.write_text('[models."my-model"]\ninput = 0.5\noutput = 1.0\n')
    assert PriceTable.load(toml).cost("my-model", 2_000_000, 0) == pytest.approx(1.0)

    monkeypatch.setenv("STITCHCUDA_PRICES", str(js))
    assert PriceTable.from_env().price("my-model") == Price(input=1.5, output=6)
    monkeypatch.setenv("STITCHCUDA_PRICES", str(tmp_path / "missing.json"))
    with pytest.raises(LLMError, match="STITCHCUDA_PRICES"):
        PriceTable.from_env()
    bad = tmp_path / "bad.json"
    bad.write_text('{"models": {"m": {"input": "free"}}}')
    with pytest.raises(LLMError, match="not a valid price file"):
        PriceTable.load(bad)


def test_client_uses_the_price_file_from_env(server, tmp_path, monkeypatch):
    prices = tmp_path / "p.json"
    prices.write_text(json.dumps({"scripted-model": {"input": 10, "output": 0}}))
    monkeypatch.setenv("STITCHCUDA_PRICES", str(prices))
    server.script([Reply("x", prompt_tokens=100_000, completion_tokens=1)])
    assert OpenAIChatClient(server.config()).complete(CHAT).usage.cost_usd == pytest.approx(1.0)


def test_parse_retry_after_forms():
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert 50 < parse_retry_after({"retry-after": formatdate(time.time() + 60, usegmt=True)}) <= 60
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


# -- local Hugging Face backend (fake transformers and peft: only the wiring is tested) --------

def _fake_hf(monkeypatch):
    import torch

    loads: list[str] = []

    class Enc(dict):
        def to(self, device):
            return self

    class Tokenizer:
        chat_template = "{{ messages }}"
        eos_token_id = 2
        pad_token_id = None

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return " ".join(f"<{m['role']}> {m['content']}" for m in messages) + " <assistant>"

        def __call__(self, text, return_tensors, add_special_tokens):
            ids = torch.full((1, len(text.split())), 5)
            return Enc(input_ids=ids, attention_mask=torch.ones_like(ids))

        def decode(self, ids, skip_special_tokens):
            return " ".join(f"t{i}" for i in ids if not (skip_special_tokens and i == self.eos_token_id))

    class Model:
        device = "cpu"

        def __init__(self, name):
            self.name, self.calls = name, []

        def eval(self):
            return self

        def generate(self, input_ids, attention_mask, **kwargs):
            self.calls.append(kwargs)
            new = torch.tensor([[7, 8, 2]])[:, : kwargs["max_new_tokens"]]
            return torch.cat([input_ids, new], dim=1)

    class Peft(Model):
        @classmethod
        def from_pretrained(cls, base, adapter):
            loads.append(f"adapter:{adapter}")
            wrapped = cls(f"{base.name}+{adapter}")
            wrapped.base = base
            return wrapped

    def load_model(name, **kwargs):
        loads.append(f"model:{name}:{sorted(kwargs)}")
        return Model(name)

    transformers = types.ModuleType("transformers")
    transformers.__version__ = "4.57.0"
    transformers.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda name: Tokenizer())
    transformers.AutoModelForCausalLM = types.SimpleNamespace(from_pretrained=load_model)
    peft = types.ModuleType("peft")
    peft.PeftModel = Peft
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    monkeypatch.setitem(sys.modules, "peft", peft)
    monkeypatch.setattr(local_hf, "_CACHE", {})
    return loads


def test_local_hf_loads_the_adapter_once_and_generates(monkeypatch):
    loads = _fake_hf(monkeypatch)
    cfg = LLMConfig(provider="hf", model="tiny/base", adapter="runs/lora", temperature=0.0, max_tokens=16)
    client = make_client(cfg)
    again = LocalHFClient(cfg)
    assert isinstance(client, LocalHFClient)
    assert loads == ["model:tiny/base:['device_map', 'dtype']", "adapter:runs/lora"]  # cached per pair

    out = client.complete(CHAT[:2])
    model = again._loaded.model
    assert model.name == "tiny/base+runs/lora" and model.base.name == "tiny/base"
    assert model.calls[-1] == {"max_new_tokens": 16, "pad_token_id": 2, "do_sample": False}
    assert out.text == "t7 t8" and out.finish_reason == "stop" and out.usage.cost_usd == 0.0
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (11, 3)  # words of the template

    out = again.complete(CHAT[:2], max_tokens=2, temperature=0.8)
    assert model.calls[-1] == {"max_new_tokens": 2, "pad_token_id": 2, "do_sample": True, "temperature": 0.8}
    assert out.finish_reason == "length" and out.usage.completion_tokens == 2


def test_local_hf_without_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setattr(local_hf, "_CACHE", {})
    with pytest.raises(LLMError, match=r"stitchcuda\[local\]"):
        LocalHFClient(LLMConfig(provider="hf", model="tiny/base"))
