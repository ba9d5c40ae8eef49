"""Any OpenAI-compatible chat-completions server: OpenAI itself, vLLM, SGLang, a proxy.

``base_url`` picks the server (default ``$OPENAI_BASE_URL``, else api.openai.com). The key is
read from ``$OPENAI_API_KEY`` (or ``config.api_key_env``); a server on this machine without a
key gets the placeholder ``EMPTY``, as vLLM expects. Nothing falls back to another provider.
"""

from __future__ import annotations

import os
import time

from stitchcuda.llm._http import Endpoint, resolve_key, with_retries
from stitchcuda.llm.base import Completion, LLMBadRequest, LLMConfig, LLMError, Message, Usage
from stitchcuda.llm.pricing import PriceTable

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIChatClient:
    def __init__(self, config: LLMConfig, prices: PriceTable | None = None):
        import openai

        self.config = config
        self.prices = prices if prices is not None else PriceTable.from_env()
        url = (config.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        key_env = config.api_key_env or "OPENAI_API_KEY"
        key, placeholder = resolve_key(key_env, url, "the OpenAI-compatible backend")
        self._sdk = openai
        self._client = openai.OpenAI(api_key=key, base_url=url, timeout=config.timeout_s, max_retries=0)
        self._endpoint = Endpoint(provider="OpenAI-compatible", model=config.model, url=url, key_env=key_env,
                                  placeholder_key=placeholder, list_models=f"curl {url}/models")
        # OpenAI's reasoning models refuse `max_tokens`; switched on the first such refusal.
        self._token_param = "max_tokens"

    def complete(self, messages: list[Message], *, max_tokens: int | None = None,
                 temperature: float | None = None) -> Completion:
        if not messages:
            raise LLMBadRequest("no messages to send")
        start = time.monotonic()
        kwargs = dict(model=self.config.model,
                      messages=[{"role": m.role, "content": m.content} for m in messages],
                      temperature=self.config.temperature if temperature is None else temperature)
        limit = self.config.max_tokens if max_tokens is None else max_tokens

        def create():
            if self._token_param == "max_tokens":
                return self._client.chat.completions.create(**kwargs, max_tokens=limit)
            # in the body, as SDKs before 1.45 do not know the argument
            return self._client.chat.completions.create(**kwargs, extra_body={self._token_param: limit})

        def send():
            try:
                return create()
            except self._sdk.BadRequestError as e:
                if self._token_param == "max_tokens" and "max_completion_tokens" in str(e):
                    self._token_param = "max_completion_tokens"
                    return create()
                raise

        resp, retries = with_retries(send, sdk=self._sdk, config=self.config, endpoint=self._endpoint)
        if not resp.choices:
            raise LLMError(f"{self._endpoint.url} returned no choices for {self.config.model}")
        choice = resp.choices[0]
        usage = resp.usage
        prompt = (getattr(usage, "prompt_tokens", 0) or 0) if usage else 0
        completion = (getattr(usage, "completion_tokens", 0) or 0) if usage else 0
        return Completion(
            text=choice.message.content or "",
            model=resp.model or self.config.model,
            usage=Usage(prompt_tokens=prompt, completion_tokens=completion,
                        cost_usd=self.prices.cost(self.config.model, prompt, completion)),
            seconds=time.monotonic() - start,
            retries=retries,
            finish_reason=choice.finish_reason,
        )
