"""LLM clients behind one protocol; :func:`make_client` picks the backend named by the config.

Each backend imports its SDK when a client is made, so importing this package stays cheap.
"""

from __future__ import annotations

from stitchcuda.llm.anthropic_backend import AnthropicClient
from stitchcuda.llm.base import (
    Completion,
    LLMAuthError,
    LLMBadRequest,
    LLMClient,
    LLMConfig,
    LLMError,
    LLMModelNotFound,
    LLMRateLimited,
    LLMServerError,
    LLMTimeout,
    LLMUnreachable,
    Message,
    Provider,
    Role,
    Usage,
)
from stitchcuda.llm.local_hf import LocalHFClient
from stitchcuda.llm.openai_backend import OpenAIChatClient
from stitchcuda.llm.pricing import PRICES_ENV, Price, PriceTable


def make_client(config: LLMConfig, prices: PriceTable | None = None) -> LLMClient:
    """The client for ``config.provider``. It fails here, not on the first call, when the key,
    the SDK or (for ``hf``) the model is missing; it never switches to another provider."""
    if config.provider == "openai":
        return OpenAIChatClient(config, prices)
    if config.provider == "anthropic":
        return AnthropicClient(config, prices)
    if config.provider == "hf":
        return LocalHFClient(config, prices)
    if config.provider == "offline":
        raise LLMError("the offline Planner and Coder are not an LLM: use stitchcuda.agents.offline")
    raise LLMError(f"unknown LLM provider {config.provider!r}; choose openai, anthropic or hf")


__all__ = [
    "PRICES_ENV",
    "AnthropicClient",
    "Completion",
    "LLMAuthError",
    "LLMBadRequest",
    "LLMClient",
    "LLMConfig",
    "LLMError",
    "LLMModelNotFound",
    "LLMRateLimited",
    "LLMServerError",
    "LLMTimeout",
    "LLMUnreachable",
    "LocalHFClient",
    "Message",
    "OpenAIChatClient",
    "Price",
    "PriceTable",
    "Provider",
    "Role",
    "Usage",
    "make_client",
]
