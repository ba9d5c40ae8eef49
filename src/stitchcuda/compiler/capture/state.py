"""A module's plain tensor attributes (state its forward may reassign, ``self.hidden = ...``) as
buffers for the capture, so that torch.export records the forward's write-back as a buffer mutation."""

from __future__ import annotations

from typing import Any


def state_as_buffers(model: Any) -> list[str]:
    """Turn every plain tensor attribute of the model's modules (``self.hidden = torch.randn(...)``)
    into a non-persistent buffer, so that torch.export sees the forward reassigning it as a buffer
    mutation; the dotted names, which the program turns into buffers the same way."""
    import torch

    names = []
    for path, module in model.named_modules():
        keys = []
        for key, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                delattr(module, key)
                module.register_buffer(key, value, persistent=False)
                names.append(f"{path}.{key}" if path else key)
                keys.append(key)
        if keys and path:
            _reassigned_in_place(module, frozenset(keys))
    return names


def _reassigned_in_place(module: Any, keys: frozenset[str]) -> None:
    """torch.export records a buffer reassigned in the root module's forward as a mutation, but
    not one reassigned inside a submodule (a stateful cell wrapped by the task's Model). For this
    capture's instance, reassigning one of ``keys`` with a tensor of the buffer's shape and dtype
    copies into the buffer in place instead, which export records at any depth; any other
    reassignment stays one (and the check after the capture refuses it by name)."""
    import torch

    cls = type(module)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        current = self._buffers.get(name) if name in keys else None
        if current is not None and isinstance(value, torch.Tensor) and value.shape == current.shape \
                and value.dtype == current.dtype and value.device == current.device:
            current.copy_(value)
        else:
            cls.__setattr__(self, name, value)

    module.__class__ = type(cls.__name__, (cls,), {"__setattr__": __setattr__, "__module__": cls.__module__})
