"""What the two hosted-API backends share: finding the key, retrying, naming a failure.

The ``openai`` and ``anthropic`` SDKs raise exceptions of the same shape: ``APITimeoutError``
(a kind of ``APIConnectionError``), ``APIConnectionError``, and ``APIStatusError`` (with
``RateLimitError`` and ``InternalServerError`` among its subclasses) carrying ``status_code``,
``response`` and ``body``. One classifier therefore serves both, given the SDK module. The
SDKs' own retries are switched off (``max_retries=0``) so that ``Completion.retries`` counts
every failed attempt.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from types import ModuleType
from typing import Literal, TypeVar
from urllib.parse import urlsplit

from stitchcuda.llm.base import (
    LLMAuthError,
    LLMBadRequest,
    LLMConfig,
    LLMError,
    LLMModelNotFound,
    LLMRateLimited,
    LLMServerError,
    LLMTimeout,
    LLMUnreachable,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})
PLACEHOLDER_KEY = "EMPTY"  # what vLLM and most local servers accept when started without --api-key
_MODEL_MISSING = re.compile(r"model\b.*\b(does not exist|not found|not exist|unknown)", re.IGNORECASE | re.DOTALL)

Kind = Literal["timeout", "connection", "rate_limit", "server", "status", "other"]


def is_local(url: str) -> bool:
    return urlsplit(url).hostname in LOCAL_HOSTS


def resolve_key(key_env: str, url: str, provider: str) -> tuple[str, bool]:
    """The API key and whether it is a placeholder; a hosted API without a key is an error."""
    key = os.environ.get(key_env, "").strip()
    if key:
        return key, False
    if is_local(url):
        return PLACEHOLDER_KEY, True
    raise LLMAuthError(f"no API key for {provider} at {url}: set ${key_env} "
                       "(or set api_key_env in the LLM config to the variable that holds it)")


@dataclass(frozen=True)
class Failure:
    """One failed attempt, sorted into what the retry loop and the error mapping need."""

    kind: Kind
    message: str
    status: int | None = None
    retry_after: float | None = None

    @property
    def retryable(self) -> bool:
        return self.kind in ("timeout", "connection", "rate_limit", "server")


def server_message(exc: Exception) -> str:
    """The server's own words from an error response, else the SDK's message."""
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            for key in ("message", "detail"):
                if inner.get(key):
                    return str(inner[key])
        elif isinstance(inner, str) and inner:
            return inner
        if body.get("detail"):
            return str(body["detail"])
    elif isinstance(body, str) and body.strip():
        return body.strip()[:2000]
    return str(getattr(exc, "message", None) or exc)


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError, OverflowError):
        return None


def classify(exc: Exception, sdk: ModuleType) -> Failure:
    if isinstance(exc, sdk.APITimeoutError):
        return Failure("timeout", str(exc))
    if isinstance(exc, sdk.APIConnectionError):
        return Failure("connection", str(exc.__cause__ or exc))
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        message = server_message(exc)
        if isinstance(exc, sdk.RateLimitError) or status == 429:
            kind: Kind = "rate_limit"
        elif isinstance(exc, sdk.InternalServerError) or status >= 500 or status == 408:
            kind = "server"
        else:
            return Failure("status", message, status)
        return Failure(kind, message, status, parse_retry_after(exc.response.headers))
    return Failure("other", str(exc))


def backoff(retry: int, config: LLMConfig, retry_after: float | None) -> float:
    """Seconds before retry number ``retry`` (0-based): the server's Retry-After when given,
    else exponential with jitter; capped at ``config.retry_max_wait_s`` either way."""
    cap = max(config.retry_max_wait_s, 0.0)
    if retry_after is not None:
        return min(retry_after, cap)
    return min(config.retry_backoff_s * 2**retry, cap) * random.uniform(0.5, 1.0)


@dataclass(frozen=True)
class Endpoint:
    """Who we were talking to, so that an error can say where and what to do."""

    provider: str
    model: str
    url: str
    key_env: str
    placeholder_key: bool
    list_models: str  # a command that lists the served models

    def error(self, f: Failure, config: LLMConfig, attempts: int) -> LLMError:
        tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
        s = f.status
        if f.kind == "timeout":
            return LLMTimeout(f"{self.model} at {self.url} gave no answer within {config.timeout_s:g} s "
                              f"({tries}); raise timeout_s or check the server's load")
        if f.kind == "connection":
            return LLMUnreachable(f"cannot reach {self.provider} server at {self.url} ({f.message}; {tries}); "
                                  "is the server running, and is base_url right?")
        if f.kind == "rate_limit":
            return LLMRateLimited(f"{self.url} still rate-limits {self.model} (HTTP 429, {tries}): {f.message}; "
                                  "lower the concurrency, wait, or raise max_retries")
        if f.kind == "server":
            return LLMServerError(f"{self.url} answered HTTP {s} for {self.model} ({tries}): {f.message}")
        if f.kind == "other":
            return LLMError(f"{self.provider} call to {self.url} failed: {f.message}")
        if s in (401, 403):
            if self.placeholder_key:
                return LLMAuthError(f"the server at {self.url} wants an API key (HTTP {s}: {f.message}); "
                                    f"set ${self.key_env}")
            return LLMAuthError(f"the server at {self.url} refused the key in ${self.key_env} "
                                f"(HTTP {s}: {f.message}); check the key, or point api_key_env at the right one")
        if s == 404 or _MODEL_MISSING.search(f.message):
            return LLMModelNotFound(f"model {self.model!r} not found at {self.url} (HTTP {s}: {f.message}); "
                                    f"list the served models with `{self.list_models}`, and check base_url")
        if s in (400, 413, 422):
            return LLMBadRequest(f"{self.url} rejected the request for {self.model} (HTTP {s}): {f.message}")
        return LLMError(f"{self.url} answered HTTP {s} for {self.model}: {f.message}")


def with_retries(send: Callable[[], T], *, sdk: ModuleType, config: LLMConfig,
                 endpoint: Endpoint) -> tuple[T, int]:
    """``send()`` until it answers; returns the answer and the number of failed attempts."""
    retries = 0
    while True:
        try:
            return send(), retries
        except sdk.APIError as exc:
            failure = classify(exc, sdk)
            if not failure.retryable or retries >= config.max_retries:
                raise endpoint.error(failure, config, retries + 1) from exc
            wait = backoff(retries, config, failure.retry_after)
            log.warning("%s %s: %s%s; retry %d/%d in %.2f s", endpoint.provider, endpoint.model, failure.kind,
                        f" (HTTP {failure.status})" if failure.status else "", retries + 1,
                        config.max_retries, wait)
            time.sleep(wait)
            retries += 1
