"""Measured compute per tensor-parallel size (issue 11 item 3): ``pipeplan profile ... --tensor 1,2,4,8``.

For each ``t``, a transformer block's rank-0 shard (:class:`executor.tensor_parallel.TensorParallelBlock`:
Megatron-LM 3.2's split, attention by heads, QKV and MLP-up column-parallel, output projection and
MLP-down row-parallel, norms replicated) is timed on this one device exactly as a whole layer is
(:func:`profiler.layers.profile_layer`), with its collectives replaced by the identity
(:func:`without_collectives`): the times are the shard's compute at its ``1/t`` GEMM shapes, without the
communication, which the cost model adds from the cluster's links. They go into
``LayerProfile.tensor_times[t]`` (:class:`planner.profile.ShardTimes`, ``source="measured"``).

The embedding and the LM head are replicated by our executor (not vocabulary-parallel), so their shard at
any ``t`` is the whole layer: their ``tensor_times[t]`` repeat the layer's own times (the profile's notes
say so). ``t = 1`` repeats every layer's own times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch

from executor.models import ModelConfig
from planner.profile import ShardTimes
from profiler.layers import LayerMeasurement, profile_layer


@contextmanager
def without_collectives() -> Iterator[None]:
    """Within: the tensor-parallel layers' all-reduces do nothing (one device, no process group)."""
    import executor.tensor_parallel as tp

    real = tp.dist
    tp.dist = SimpleNamespace(all_reduce=lambda *args, **kwargs: None)  # type: ignore[assignment]
    try:
        yield
    finally:
        tp.dist = real


def check_tensor_sizes(config: ModelConfig, tensor: list[int]) -> None:
    """Raise ``ValueError`` naming ``--tensor`` unless every t splits the heads and the MLP evenly."""
    for t in tensor:
        if t < 1 or config.heads % t or config.ffn_hidden % t:
            raise ValueError(f"--tensor: t={t} must divide the heads ({config.heads}) and the MLP width "
                             f"({config.ffn_hidden}) of {config.name}")


def shard_times(m: LayerMeasurement, source: str = "measured") -> ShardTimes:
    return ShardTimes(fwd_time={b: x.median for b, x in m.fwd.items()},
                      bwd_time={b: x.median for b, x in m.bwd.items()},
                      recompute_time={b: x.median for b, x in m.recompute.items()} or None,
                      stashed_bytes_per_sample=m.stashed_bytes_per_sample,
                      held_grad_bytes_per_sample=m.held_grad_bytes_per_sample or None,
                      source=source)  # type: ignore[arg-type]


def measure_shards(layer: torch.nn.Module, inputs_for: Callable[[int], Any], sizes: list[int], tensor: list[int],
                   device: torch.device, dtype: torch.dtype, whole: LayerMeasurement,
                   **timing: Any) -> dict[int, ShardTimes]:
    """``t -> ShardTimes`` of a transformer block ``layer`` (its whole measurement ``whole`` is ``t = 1``)."""
    from executor.tensor_parallel import TensorParallelBlock

    out = {1: shard_times(whole)} if 1 in tensor else {}
    for t in sorted(set(tensor) - {1}):
        with without_collectives():
            shard = TensorParallelBlock.from_block(layer, 0, t, None).to(device, dtype)
            shard.train()
            out[t] = shard_times(profile_layer(shard, inputs_for, sizes, device, **timing))
        del shard
    return out


def replicated(whole: LayerMeasurement, tensor: list[int]) -> dict[int, ShardTimes]:
    """A replicated layer (embedding, LM head): the same times at every t."""
    return {t: shard_times(whole) for t in sorted(set(tensor))}
