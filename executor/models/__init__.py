"""Model zoo: GPT, BERT and Llama-family decoders as ordered lists of layers, cut into pipeline stages with
:class:`Stage`.

``build_layers(config, seed)`` returns ``[embedding, block_0, ..., block_{L-1}, head_with_loss]``, the
same layers (and names, :func:`layer_names`) as the model profile. Every layer is initialised from its
own seed derived from ``(seed, index)``, so a process that builds only its slice
(``build_layers(config, seed, start, stop)``) gets exactly the weights of the full model.

Tied embeddings: when the embedding and the head are built together they share one ``Parameter``;
built apart (different stages) each holds an identical copy, and the executor must all-reduce (sum)
their gradients between the first and last stage after every backward pass (Megatron-LM does the same).
:func:`tied_parameters` names them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from executor.models.config import PRESETS, ModelConfig, get_config
from planner.model import ModelSpec

if TYPE_CHECKING:
    from torch import nn

    from executor.models.stage import Stage, takes_targets

__all__ = [
    "PRESETS",
    "ModelConfig",
    "Stage",
    "build_layers",
    "get_config",
    "layer_kinds",
    "layer_names",
    "layer_seed",
    "takes_targets",
    "tied_parameters",
]


def __getattr__(name: str) -> Any:
    """``Stage`` and ``takes_targets`` (:mod:`executor.models.stage`), imported with torch on first use: the
    processes that only read a model's configuration -- ``pipeplan run`` validating a plan before it launches
    the ranks that build the layers -- do not import torch (~3 s of CPU on the 2-core machine, per process)."""
    if name in ("Stage", "takes_targets"):
        from executor.models import stage

        return getattr(stage, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def layer_seed(seed: int, index: int) -> int:
    """The seed layer ``index`` is initialised from."""
    return seed * 1_000_003 + index


def layer_names(config: ModelConfig) -> list[str]:
    """``["embedding", "block.0", ..., "block.{L-1}", "head"]``."""
    return ["embedding", *(f"block.{i}" for i in range(config.layers)), "head"]


def layer_kinds(config: ModelConfig) -> list[str]:
    """Profile kinds: ``embedding``, ``transformer`` per block, ``lm_head`` (head + loss)."""
    return ["embedding", *(["transformer"] * config.layers), "lm_head"]


def build_layers(
    config: ModelSpec | str, seed: int = 0, start: int = 0, stop: int | None = None
) -> list[nn.Module]:
    """Layers ``start:stop`` of the model, deterministically initialised from ``seed`` (fp32, CPU)."""
    config = get_config(config)
    n = config.num_profile_layers
    stop = n if stop is None else stop
    if not 0 <= start < stop <= n:
        raise ValueError(f"need 0 <= start < stop <= {n}, got start={start} stop={stop}")
    import torch

    from executor.models import bert, gpt, llama

    family = {"gpt": gpt, "bert": bert, "llama": llama}[config.family]
    token_seed = layer_seed(seed, 0)
    layers: list[nn.Module] = []
    for index in range(start, stop):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(layer_seed(seed, index))
            layers.append(family.make_layer(config, index, token_seed))
    if config.tied_embeddings and start == 0 and stop == n:
        layers[-1].weight = layers[0].tok.weight  # one Parameter when on the same process
    return layers


def tied_parameters(config: ModelSpec | str) -> list[list[tuple[int, str]]]:
    """Groups of ``(layer index, parameter name)`` holding the same weight; their gradients are summed."""
    config = get_config(config)
    if not config.tied_embeddings:
        return []
    return [[(0, "tok.weight"), (config.num_profile_layers - 1, "weight")]]
