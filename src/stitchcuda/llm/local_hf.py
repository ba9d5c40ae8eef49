"""A local Hugging Face causal LM, optionally with a PEFT LoRA adapter (the extra ``local``).

``config.model`` is a hub id or a folder; ``config.adapter`` a LoRA adapter folder trained on
top of it. The prompt is the tokenizer's chat template; ``temperature`` 0 means greedy
decoding. A loaded (model, adapter) pair is kept for the life of the process, and generation
on one pair runs one call at a time. Local calls cost nothing and are never retried.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from stitchcuda.llm.base import Completion, LLMBadRequest, LLMConfig, LLMError, Message, Usage
from stitchcuda.llm.pricing import PriceTable

_INSTALL = "pip install 'stitchcuda[local]'"


@dataclass
class _Loaded:
    model: Any
    tokenizer: Any
    lock: threading.Lock = field(default_factory=threading.Lock)


_CACHE: dict[tuple[str, str | None], _Loaded] = {}
_CACHE_LOCK = threading.Lock()


def _version(module: Any) -> tuple[int, int]:
    parts = str(getattr(module, "__version__", "0.0")).split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


def _load(model_name: str, adapter: str | None) -> _Loaded:
    try:
        from stitchcuda.torchvision_compat import make_torchvision_importable

        make_torchvision_importable()  # transformers imports torchvision where it is installed
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise LLMError(f"the hf provider needs transformers: {_INSTALL}") from e
    # transformers 4.56 renamed `torch_dtype` to `dtype`; "auto" keeps the checkpoint's dtype.
    dtype_kw = "dtype" if _version(transformers) >= (4, 56) else "torch_dtype"
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name)
        if not getattr(tokenizer, "chat_template", None):
            raise LLMError(f"{model_name!r} has no chat template; use an instruction-tuned (chat) model")
        model = AutoModelForCausalLM.from_pretrained(model_name, device_map="auto", **{dtype_kw: "auto"})
    except OSError as e:
        raise LLMError(f"cannot load the model {model_name!r}: {e}") from e
    if adapter:
        try:
            from peft import PeftModel
        except ImportError as e:
            raise LLMError(f"a LoRA adapter needs peft: {_INSTALL}") from e
        try:
            model = PeftModel.from_pretrained(model, adapter)
        except (OSError, ValueError) as e:
            raise LLMError(f"cannot load the LoRA adapter {adapter!r} onto {model_name!r}: {e}") from e
    model.eval()
    return _Loaded(model=model, tokenizer=tokenizer)


def load_cached(model_name: str, adapter: str | None) -> _Loaded:
    key = (model_name, adapter)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = _load(model_name, adapter)
        return _CACHE[key]


class LocalHFClient:
    def __init__(self, config: LLMConfig, prices: PriceTable | None = None):
        self.config = config
        self.prices = prices if prices is not None else PriceTable()
        self._loaded = load_cached(config.model, config.adapter)

    def complete(self, messages: list[Message], *, max_tokens: int | None = None,
                 temperature: float | None = None) -> Completion:
        import torch

        if not messages:
            raise LLMBadRequest("no messages to send")
        start = time.monotonic()
        tok, model = self._loaded.tokenizer, self._loaded.model
        t = self.config.temperature if temperature is None else temperature
        limit = self.config.max_tokens if max_tokens is None else max_tokens
        # Render the template to text, then tokenize without adding a second BOS.
        prompt = tok.apply_chat_template([{"role": m.role, "content": m.content} for m in messages],
                                         tokenize=False, add_generation_prompt=True)
        enc = tok(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
        sampling: dict[str, Any] = {"do_sample": True, "temperature": t} if t > 0 else {"do_sample": False}
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        with self._loaded.lock, torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=limit, pad_token_id=pad, **sampling)
        n_prompt = int(enc["input_ids"].shape[1])
        ids = [int(i) for i in out[0][n_prompt:]]  # one sequence, so no padding; the end token counts
        n_completion = len(ids)
        eos = tok.eos_token_id
        ended = bool(ids) and ids[-1] in (set(eos) if isinstance(eos, (list, tuple)) else {eos})
        return Completion(
            text=tok.decode(ids, skip_special_tokens=True),
            model=self.config.model + (f"+{self.config.adapter}" if self.config.adapter else ""),
            usage=Usage(prompt_tokens=n_prompt, completion_tokens=n_completion,
                        cost_usd=self.prices.cost(self.config.model, n_prompt, n_completion)),
            seconds=time.monotonic() - start,
            retries=0,
            finish_reason="stop" if ended or n_completion < limit else "length",
        )
