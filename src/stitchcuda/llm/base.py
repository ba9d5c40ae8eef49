"""The one small protocol every LLM backend speaks: messages in, text and usage out.

Agents depend on :class:`LLMClient` only; backends (OpenAI-compatible servers, Anthropic, a
local Hugging Face model with a LoRA adapter) live behind it. Failures that retrying cannot
fix are raised as :class:`LLMError` subclasses whose message says what to do.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

Role = Literal["system", "user", "assistant"]
# "offline" names StitchCUDA's own LLM-free Planner and Coder (stitchcuda.compiler), which stand
# where a model would; make_client does not build them.
Provider = Literal["openai", "anthropic", "hf", "offline"]


class Message(BaseModel):
    role: Role
    content: str


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = Field(0.0, description="from the price table in force; 0 when the model has no price")

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                     completion_tokens=self.completion_tokens + other.completion_tokens,
                     cost_usd=self.cost_usd + other.cost_usd)


class Completion(BaseModel):
    text: str
    model: str
    usage: Usage = Usage()
    seconds: float = 0.0
    retries: int = Field(0, description="attempts that failed (timeout, 429, 5xx) before this answer")
    finish_reason: str | None = None


class LLMConfig(BaseModel):
    """How to reach one model; each agent role may have its own."""

    provider: Provider = "openai"
    model: str
    base_url: str | None = Field(None, description="OpenAI-compatible server, e.g. http://localhost:8000/v1 (vLLM)")
    api_key_env: str | None = Field(None, description="environment variable holding the key; "
                                                      "default OPENAI_API_KEY / ANTHROPIC_API_KEY")
    adapter: str | None = Field(None, description="hf provider: a PEFT LoRA adapter folder")
    temperature: float = 0.7
    max_tokens: int = 8192
    timeout_s: float = 600.0
    max_retries: int = 3
    retry_backoff_s: float = Field(1.0, description="the first retry waits about this long (with jitter); "
                                                    "each further retry doubles it")
    retry_max_wait_s: float = Field(60.0, description="cap on one wait between attempts, "
                                                      "a server's Retry-After included")


class LLMError(RuntimeError):
    """A failure retrying will not fix; the message says what to do."""


class LLMAuthError(LLMError):
    pass


class LLMModelNotFound(LLMError):
    pass


class LLMUnreachable(LLMError):
    pass


class LLMTimeout(LLMError):
    pass


class LLMBadRequest(LLMError):
    pass


class LLMRateLimited(LLMError):
    """Still answered 429 after every retry."""


class LLMServerError(LLMError):
    """Still answered 5xx after every retry."""


@runtime_checkable
class LLMClient(Protocol):
    config: LLMConfig

    def complete(self, messages: list[Message], *, max_tokens: int | None = None,
                 temperature: float | None = None) -> Completion: ...
