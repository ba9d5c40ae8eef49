"""Anthropic's Messages API through the ``anthropic`` SDK (the optional extra ``anthropic``).

System messages go to the ``system`` parameter; consecutive turns of one role are joined, as
the API wants user and assistant turns to alternate. ``base_url`` is the server root (a
trailing ``/v1`` is dropped, since the SDK adds it). Stop reasons are reported in the OpenAI
vocabulary (``stop``, ``length``) so that agents can check truncation one way for every backend.
"""

from __future__ import annotations

import inspect
import os
import time

from stitchcuda.llm._http import Endpoint, resolve_key, with_retries
from stitchcuda.llm.base import Completion, LLMBadRequest, LLMConfig, LLMError, Message, Usage
from stitchcuda.llm.pricing import PriceTable

DEFAULT_BASE_URL = "https://api.anthropic.com"
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}


def split_system(messages: list[Message]) -> tuple[str | None, list[dict[str, str]]]:
    """The joined system prompt, and the other turns with neighbours of one role merged."""
    system = [m.content for m in messages if m.role == "system"]
    turns: list[dict[str, str]] = []
    for m in messages:
        if m.role == "system":
            continue
        if turns and turns[-1]["role"] == m.role:
            turns[-1]["content"] += "\n\n" + m.content
        else:
            turns.append({"role": m.role, "content": m.content})
    return ("\n\n".join(system) if system else None), turns


class AnthropicClient:
    def __init__(self, config: LLMConfig, prices: PriceTable | None = None):
        try:
            import anthropic
        except ImportError as e:
            raise LLMError("the anthropic provider needs the anthropic SDK: "
                           "pip install 'stitchcuda[anthropic]'") from e
        self.config = config
        self.prices = prices if prices is not None else PriceTable.from_env()
        url = (config.base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        url = url.removesuffix("/v1")
        key_env = config.api_key_env or "ANTHROPIC_API_KEY"
        key, placeholder = resolve_key(key_env, url, "the Anthropic backend")
        self._sdk = anthropic
        self._client = anthropic.Anthropic(api_key=key, base_url=url, timeout=config.timeout_s, max_retries=0)
        self._endpoint = Endpoint(
            provider="Anthropic", model=config.model, url=url, key_env=key_env, placeholder_key=placeholder,
            list_models=f'curl {url}/v1/models -H "x-api-key: ${key_env}" -H "anthropic-version: 2023-06-01"')
        # Recent SDKs dropped `temperature` from the signature; the API still takes it in the body.
        self._temperature_kwarg = "temperature" in inspect.signature(self._client.messages.create).parameters

    def complete(self, messages: list[Message], *, max_tokens: int | None = None,
                 temperature: float | None = None) -> Completion:
        system, turns = split_system(messages)
        if not turns:
            raise LLMBadRequest("no user or assistant messages to send (the Messages API needs at least one)")
        start = time.monotonic()
        t = self.config.temperature if temperature is None else temperature
        kwargs: dict = dict(model=self.config.model, messages=turns,
                            max_tokens=self.config.max_tokens if max_tokens is None else max_tokens)
        if system is not None:
            kwargs["system"] = system
        if self._temperature_kwarg:
            kwargs["temperature"] = t
        else:
            kwargs["extra_body"] = {"temperature": t}

        resp, retries = with_retries(lambda: self._client.messages.create(**kwargs), sdk=self._sdk,
                                     config=self.config, endpoint=self._endpoint)
        text = "".join(getattr(block, "text", "") for block in resp.content if block.type == "text")
        usage = resp.usage
        prompt = (getattr(usage, "input_tokens", 0) or 0) if usage else 0
        completion = (getattr(usage, "output_tokens", 0) or 0) if usage else 0
        return Completion(
            text=text,
            model=resp.model or self.config.model,
            usage=Usage(prompt_tokens=prompt, completion_tokens=completion,
                        cost_usd=self.prices.cost(self.config.model, prompt, completion)),
            seconds=time.monotonic() - start,
            retries=retries,
            finish_reason=_FINISH.get(resp.stop_reason, resp.stop_reason) if resp.stop_reason else None,
        )
