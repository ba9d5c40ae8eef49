"""What a model call costs: USD per million input and output tokens, per model name.

A name is looked up exactly, then by the longest table key it starts with (so
``gpt-4o-2024-08-06`` is priced as ``gpt-4o``); case is ignored. Unknown models (a local vLLM
server, a local Hugging Face model) cost 0.0.

A price file is JSON or TOML (TOML needs Python 3.11+)::

    {"models": {"gpt-4o": {"input": 2.5, "output": 10.0}}}

    [models."gpt-4o"]
    input = 2.5
    output = 10.0

The ``models`` level may be left out. A file replaces the default table as a whole. Point
``STITCHCUDA_PRICES`` at a file to make it the table in force (:meth:`PriceTable.from_env`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from stitchcuda.llm.base import LLMError

PRICES_ENV = "STITCHCUDA_PRICES"

# Defaults (USD per 1M tokens, standard tier, no caching or batch discounts), taken from the
# providers' public price pages in 2025. Prices change: check them, and put your own in a file.
DEFAULT_SOURCE = "built-in defaults (2025 list prices; check your provider's price page)"
_DEFAULTS: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "o3": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-haiku-4-5": (1.00, 5.00),
    "claude-opus-4": (15.00, 75.00),
    "claude-opus-4-5": (5.00, 25.00),
}


class Price(BaseModel):
    input: float = Field(ge=0, description="USD per 1M prompt tokens")
    output: float = Field(ge=0, description="USD per 1M completion tokens")


class PriceTable(BaseModel):
    models: dict[str, Price] = Field(default_factory=dict)
    source: str = Field("", description="where these prices came from, for reports")

    @model_validator(mode="before")
    @classmethod
    def _accept_flat(cls, data: Any) -> Any:
        """Allow a file that maps names to prices directly, without the ``models`` level."""
        if isinstance(data, dict) and "models" not in data and data and all(
                isinstance(v, dict) for v in data.values()):
            return {"models": data}
        return data

    @classmethod
    def default(cls) -> PriceTable:
        return cls(models={name: Price(input=i, output=o) for name, (i, o) in _DEFAULTS.items()},
                   source=DEFAULT_SOURCE)

    @classmethod
    def load(cls, path: str | Path) -> PriceTable:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise LLMError(f"cannot read the price file {path}: {e}") from e
        try:
            if path.suffix.lower() == ".toml":
                import tomllib

                data = tomllib.loads(text)
            else:
                data = json.loads(text)
            table = cls.model_validate(data)
        except (ValueError, ValidationError) as e:  # json, toml and pydantic errors are ValueErrors
            raise LLMError(f"{path} is not a valid price file ({e}); expected "
                           '{"models": {"<model>": {"input": <USD/1M>, "output": <USD/1M>}}}') from e
        if not table.source:
            table.source = str(path)
        return table

    @classmethod
    def from_env(cls) -> PriceTable:
        """The file named by ``$STITCHCUDA_PRICES`` when set, else the defaults."""
        path = os.environ.get(PRICES_ENV)
        if not path:
            return cls.default()
        if not Path(path).is_file():
            raise LLMError(f"${PRICES_ENV} points at {path}, which is not a file")
        return cls.load(path)

    def price(self, model: str) -> Price | None:
        name = model.lower()
        table = {k.lower(): v for k, v in self.models.items()}
        if name in table:
            return table[name]
        prefixes = [k for k in table if name.startswith(k)]
        return table[max(prefixes, key=len)] if prefixes else None

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        p = self.price(model)
        if p is None:
            return 0.0
        return (prompt_tokens * p.input + completion_tokens * p.output) / 1_000_000
