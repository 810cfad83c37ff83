"""Byte counts from real tensors: what autograd saves for backward, outputs, parameters.

Saved tensors are observed with ``torch.autograd.graph.saved_tensors_hooks`` during the forward pass;
each is attributed to its underlying storage and every storage is counted once (views such as
``q, k, v = qkv.split(...)`` share one). Storages of the module's parameters and buffers (weights
saved by ``linear``, the causal mask) are model state, not activations, and are not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def state_storages(module: nn.Module) -> set[tuple[str, int]]:
    """Storage keys of ``module``'s parameters and buffers."""
    tensors = [*module.parameters(), *module.buffers()]
    return {_storage_key(t) for t in tensors}


def saved_bytes(module: nn.Module, fn: Callable[[], Any]) -> int:
    """Bytes of the distinct non-state storages autograd saves while ``fn()`` runs ``module`` forward."""
    exclude = state_storages(module)
    seen: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in exclude and key[1] != 0:
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def param_counts(module: nn.Module) -> tuple[int, int]:
    """``(parameters, bytes)`` of ``module``, each shared parameter once."""
    params = list(module.parameters())
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)
