"""Model-profile schema: the planner's input, written by :mod:`profiler` (pydantic v2, no torch).

A profile lists the model's layers in execution order. Per layer it holds what PipeDream's profiler
records (PipeDream section 3.1: compute time ``T_l``, output activation size ``a_l``, parameter size
``w_l``), split into forward and backward, measured for several micro-batch sizes ``b``, plus the memory
that autograd stashes for the backward pass and the layer input that must be kept when the layer's
activations are recomputed (Megatron-LM section 3.5 / the PTD-P notes, "Activation Recomputation").

Full activation recomputation checkpoints **each transformer layer** (Megatron-LM ``--recompute-method uniform
--recompute-num-layers 1``, ``ParallelTransformer._checkpointed_forward``; torchtitan's ``full`` activation
checkpointing): a checkpointed layer keeps only its input until its backward, which re-runs its forward first.
The embedding and the LM head with its loss are not checkpointed: they keep their stash and their backward is
the plain one. :func:`checkpointed` says which kinds are; the executor (:class:`executor.interpreter.
StageModule`), the profiler, the operator model and the memory model (:func:`planner.cost.stage_infos`) all
ask it.

Times are seconds, sizes bytes; ``*_per_sample`` sizes are per sequence of the micro-batch.

Compute per tensor-parallel size (optional, schema version 1 still): ``LayerProfile.tensor_times[t]`` is a
:class:`ShardTimes`, the times of the layer's ``1/t`` shard on one device (Megatron-LM 3.2's column/row
split: the GEMMs at their sharded shapes, the element-wise work each rank does), *without* the
tensor-parallel communication, which the cost model adds from the cluster's links. It is written by the
operator model (:mod:`planner.analytic`) or measured (``pipeplan profile --tensor 1,2,4,8``). A profile
without it stays valid: the cost model then divides the t = 1 times by ``t`` and the request's
``tensor_efficiency`` (and says so in each candidate).

:meth:`LayerProfile.time` interpolates the measured times between micro-batch sizes (see its
docstring). :meth:`ModelProfile.content_hash` is the sha256 of the canonical JSON: the API versions
profiles by it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.dtypes import dtype_error
from planner.jsondoc import integer, refuse_duplicate_keys
from planner.limits import MAX_COUNT, MAX_LAYERS, MAX_SECONDS, MAX_SIZE, MAX_SIZES, SHAPE_LIMITS
from planner.model import ModelSpec

TimeKind = Literal["fwd", "bwd", "recompute"]
#: a count of bytes or parameters: a JSON integer, 0..MAX_COUNT (strict: ``true`` or ``"49984"`` is no count;
#: JSON's booleans and strings are not taken as numbers, as a cluster's counts are not)
Count = Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)]

#: layer kinds full recomputation does not checkpoint (module docstring): the embedding and the LM head
NOT_CHECKPOINTED = frozenset({"embedding", "lm_head"})


def checkpointed(kind: str) -> bool:
    """Whether full activation recomputation checkpoints a layer of ``kind`` (module docstring): every kind but
    the embedding and the LM head (a transformer block, or a user's generic ``layer``)."""
    return kind not in NOT_CHECKPOINTED


def stage_splits_backward(kinds: Iterable[str], recompute: bool) -> bool:
    """Whether zero-bubble's I/W split is made on a stage whose layers have ``kinds`` (:mod:`executor.
    split_backward`, which the executor runs and :mod:`planner.cost` times): not under full recomputation when
    one of its layers is checkpointed (:func:`checkpointed`), since such a layer recomputes its forward in every
    backward call; there W is one whole backward for the weights."""
    return not (recompute and any(checkpointed(k) for k in kinds))


def _check_times(field: str, times: dict[int, float] | None, *, allow_empty: bool = False) -> None:
    """Raise ``ValueError`` naming ``field`` if a size is not an int in 1..``MAX_SIZE`` or a time is not finite
    and in 0..``MAX_SECONDS`` (:mod:`planner.limits`), or if there are more than ``MAX_SIZES`` sizes."""
    if times is None:
        return
    if not times and not allow_empty:
        raise ValueError(f"{field}: needs at least one micro-batch size")
    if len(times) > MAX_SIZES:
        raise ValueError(f"{field}: at most {MAX_SIZES} micro-batch sizes, got {len(times)}")
    for b, t in times.items():
        if b < 1:
            raise ValueError(f"{field}: micro-batch size {b} must be >= 1")
        if b > MAX_SIZE:
            raise ValueError(f"{field}: micro-batch size {b} must be at most {MAX_SIZE}")
        if not math.isfinite(t):
            raise ValueError(f"{field}[{b}]: time {t} must be finite (no NaN or inf)")
        if t < 0:
            raise ValueError(f"{field}[{b}]: time {t} must be >= 0")
        if t > MAX_SECONDS:
            raise ValueError(f"{field}[{b}]: time {t} s must be at most {MAX_SECONDS:g} s")


#: a JSON object key read as a whole number (a micro-batch size, a tensor-parallel size) as written plainly
_PLAIN_INT = re.compile(r"-?(0|[1-9][0-9]*)")


def _plain_int_keys(value: Any) -> Any:
    """A ``dict[int, ...]`` field's keys as JSON gives them (strings) must be whole numbers written plainly:
    pydantic reads ``"01"``, ``" 1"`` and ``"1"`` as the same 1, so an object holding two of them kept one
    value and dropped the other without a word (the API's and loaders' duplicate-key rule compares the
    strings)."""
    if isinstance(value, dict):
        for k in value:
            if isinstance(k, str) and not _PLAIN_INT.fullmatch(k):
                raise ValueError(f"key {k[:20]!r} is not a whole number written plainly (as '1', not '01', ' 1' "
                                 "or '1.0')")
    return value


class ShardTimes(BaseModel):
    """One layer's tensor-parallel shard at one ``t``: micro-batch size -> seconds, compute only.

    ``fwd_time``/``bwd_time``/``recompute_time`` as in :class:`LayerProfile` (recompute = forward re-run
    plus backward). ``bwd_input_time``/``bwd_weight_time`` (optional, both or neither): the backward split
    into the input-gradient and weight-gradient parts (zero-bubble pipelines, Qi et al. 2023: B = I + W);
    when absent the cost model halves ``bwd_time``. ``stashed_bytes_per_sample`` (optional): the shard's
    stashed activations (Korthikanti et al. 2022, eq. 2 for GPT shapes); ``transient_bytes_per_sample``
    (optional): as :class:`LayerProfile`'s, of the shard; ``sequence_parallel``: whether the
    times and memory assume Megatron's sequence parallelism (norms and dropouts split along the sequence).
    ``source``: "measured" or "operators" (the operator model).
    """

    model_config = ConfigDict(extra="forbid")

    fwd_time: dict[int, float]
    bwd_time: dict[int, float]
    recompute_time: dict[int, float] | None = None
    bwd_input_time: dict[int, float] | None = None
    bwd_weight_time: dict[int, float] | None = None
    stashed_bytes_per_sample: Count | None = None
    # (absent when unknown, so profiles made before it read and hash as they did)
    transient_bytes_per_sample: Count | None = Field(default=None, exclude_if=lambda v: v is None)
    #: bytes per sample of the output gradients a split backward's I keeps for its W (the weight GEMMs'
    #: ``dY``; :attr:`planner.operators.PassTimes.held_grad_bytes`); absent when unknown (counted as 0)
    held_grad_bytes_per_sample: Count | None = Field(default=None, exclude_if=lambda v: v is None)
    sequence_parallel: bool = False
    source: Literal["measured", "operators"] = "measured"
    #: (operator-model shards on a device with a power limit) per micro-batch size, the share of the times that
    #: runs on the matrix engines at the device's held rate (GEMM and fused attention kernels): what a higher
    #: clock than ``sustained_rate`` shortens (:mod:`planner.power`); absent otherwise
    matrix_share: dict[int, float] | None = Field(default=None, exclude_if=lambda v: v is None)

    @field_validator("fwd_time", "bwd_time", "recompute_time", "bwd_input_time", "bwd_weight_time", "matrix_share",
                     mode="before")
    @classmethod
    def _plain_keys(cls, v: Any) -> Any:
        return _plain_int_keys(v)

    @model_validator(mode="after")
    def _validate(self) -> ShardTimes:
        for name in ("fwd_time", "bwd_time", "recompute_time", "bwd_input_time", "bwd_weight_time"):
            _check_times(name, getattr(self, name))
        for b, share in (self.matrix_share or {}).items():
            if b < 1 or not 0.0 <= share <= 1.0:
                raise ValueError(f"matrix_share[{b}]: a share in [0, 1] at a micro-batch size >= 1, got {share}")
        if set(self.fwd_time) != set(self.bwd_time):
            raise ValueError(f"fwd_time and bwd_time must cover the same micro-batch sizes "
                             f"(fwd {sorted(self.fwd_time)}, bwd {sorted(self.bwd_time)})")
        if (self.bwd_input_time is None) != (self.bwd_weight_time is None):
            raise ValueError("bwd_input_time and bwd_weight_time: give both or neither")
        return self

    def time(self, kind: str, b: int | float) -> float:
        """Seconds of ``kind`` ("fwd", "bwd", "recompute", "bwd_input", "bwd_weight") at ``b`` samples,
        interpolated as :meth:`LayerProfile.time`; recompute falls back to fwd + bwd, the split to halves."""
        if kind == "recompute" and self.recompute_time is None:
            return self.time("fwd", b) + self.time("bwd", b)
        if kind in ("bwd_input", "bwd_weight") and self.bwd_input_time is None:
            return self.time("bwd", b) / 2
        table = {"fwd": self.fwd_time, "bwd": self.bwd_time, "recompute": self.recompute_time,
                 "bwd_input": self.bwd_input_time, "bwd_weight": self.bwd_weight_time}.get(kind)
        if table is None:
            raise ValueError(f"kind must be fwd, bwd, recompute, bwd_input or bwd_weight, got {kind!r}")
        return interpolate_time(table, float(b))

    def matrix_share_at(self, b: int | float) -> float:
        """:attr:`matrix_share` at ``b`` samples: piecewise-linear between the sizes, flat outside; 0 without."""
        if not self.matrix_share:
            return 0.0
        xs = sorted(self.matrix_share)
        return float(np.interp(b, xs, [self.matrix_share[x] for x in xs]))


class LayerProfile(BaseModel):
    """One layer of the model (embedding, one transformer block, final norm, LM head with the loss...).

    ``fwd_time``/``bwd_time``: micro-batch size -> median seconds. ``recompute_time`` (optional): the
    backward pass of the layer when its activations are recomputed (activation checkpointing, Chen et al.
    2016; Megatron-LM 3.5): the forward re-run plus the backward, measured as one unit; it replaces
    ``bwd_time`` for a recomputed layer. ``fwd_spread``/``bwd_spread``: interquartile range of the repeats
    divided by their median. ``tied_params``: how many of ``params`` are a copy of another layer's
    parameters (a tied LM head holds a copy of the word embedding, Megatron-style; subtract it when the two
    layers share a stage). ``transient_bytes_per_sample`` (optional): bytes per sample the layer holds beside
    its stash while its forward or backward runs and frees after (the loss's fp32 copies of the logits and
    their gradient: :func:`planner.operators.eager_cross_entropy`), what a device needs on top of its
    stashed activations while the layer runs; None where not known (a profile measured on the CPU, or made
    before the field existed).
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str
    fwd_time: dict[int, float]
    bwd_time: dict[int, float]
    recompute_time: dict[int, float] | None = None
    fwd_spread: dict[int, float] | None = None
    bwd_spread: dict[int, float] | None = None
    output_bytes_per_sample: Count
    stashed_bytes_per_sample: Count
    transient_bytes_per_sample: Count | None = Field(default=None, exclude_if=lambda v: v is None)
    #: as :class:`ShardTimes`' (the t = 1 figure)
    held_grad_bytes_per_sample: Count | None = Field(default=None, exclude_if=lambda v: v is None)
    input_bytes_per_sample: Count
    params: Count
    param_bytes: Count
    tied_params: Count = 0
    tensor_times: dict[int, ShardTimes] | None = Field(
        default=None, max_length=MAX_SIZES, description="t -> the 1/t shard's compute times (module docstring)")
    #: of ``params``, the parameters of the layer's experts (a mixture of experts), which expert parallelism splits
    #: over its ranks (:mod:`planner.expert_parallel`); 0 for a dense layer (and then absent from the record)
    expert_params: Count = Field(default=0, exclude_if=lambda v: v == 0)
    #: of ``params``, those every tensor-parallel rank holds whole rather than ``1/t`` of (latent attention's down-
    #: projections and latent norms: :mod:`planner.mla`); the planner's view at ``t`` counts them whole
    #: (:func:`planner.expert_parallel.expert_view`); 0 (absent from the record) where all are split over ``t``
    replicated_params: Count = Field(default=0, exclude_if=lambda v: v == 0)
    #: expert-parallel size ``e`` (> 1) -> ``t`` -> the shard's times with the layer's experts split over ``e``
    #: ranks (each runs ``E/e`` experts on the tokens routed to them); absent where not known
    expert_times: dict[int, dict[int, ShardTimes]] | None = Field(
        default=None, max_length=MAX_SIZES, exclude_if=lambda v: v is None,
        description="e -> t -> the shard's compute times with the experts split over e ranks")
    #: expert-parallel size ``e`` (>= 1) -> ``t`` (> 1) -> the shard's times with the layer's experts whole on each
    #: rank (expert tensor parallelism 1: :attr:`planner.request.Config.expert_tensor`; the attention split over
    #: ``t``, each rank's ``T/t`` tokens routed to experts over the ``e`` ranks); absent where not known
    unsplit_expert_times: dict[int, dict[int, ShardTimes]] | None = Field(
        default=None, max_length=MAX_SIZES, exclude_if=lambda v: v is None,
        description="e -> t -> the shard's compute times with the experts whole (expert tensor parallelism 1)")

    @field_validator("fwd_time", "bwd_time", "recompute_time", "fwd_spread", "bwd_spread", "tensor_times",
                     mode="before")
    @classmethod
    def _plain_keys(cls, v: Any) -> Any:
        return _plain_int_keys(v)

    @field_validator("expert_times", "unsplit_expert_times", mode="before")
    @classmethod
    def _plain_nested_keys(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for inner in _plain_int_keys(v).values():
                _plain_int_keys(inner)
        return v

    @model_validator(mode="after")
    def _validate(self) -> LayerProfile:
        where = f"layer {self.name!r}"
        _check_times(f"{where}: fwd_time", self.fwd_time)
        _check_times(f"{where}: bwd_time", self.bwd_time)
        _check_times(f"{where}: recompute_time", self.recompute_time)
        _check_times(f"{where}: fwd_spread", self.fwd_spread, allow_empty=True)
        _check_times(f"{where}: bwd_spread", self.bwd_spread, allow_empty=True)
        if set(self.fwd_time) != set(self.bwd_time):
            raise ValueError(
                f"{where}: fwd_time and bwd_time must be measured for the same micro-batch sizes "
                f"(fwd {sorted(self.fwd_time)}, bwd {sorted(self.bwd_time)})"
            )
        if self.recompute_time is not None and not self.recompute_time:
            raise ValueError(f"{where}: recompute_time is empty; leave it None when not measured")
        if self.tied_params > self.params:
            raise ValueError(f"{where}: tied_params {self.tied_params} exceeds params {self.params}")
        for t in self.tensor_times or {}:
            if not 1 <= t <= MAX_SIZE:
                raise ValueError(f"{where}: tensor_times: tensor-parallel size {t} must be between 1 and {MAX_SIZE}")
        if self.expert_params > self.params:
            raise ValueError(f"{where}: expert_params {self.expert_params} exceeds params {self.params}")
        if self.replicated_params + self.expert_params > self.params:
            raise ValueError(f"{where}: replicated_params {self.replicated_params} and expert_params "
                             f"{self.expert_params} exceed params {self.params}")
        for e, shards in (self.expert_times or {}).items():
            if not 2 <= e <= MAX_SIZE:
                raise ValueError(f"{where}: expert_times: expert-parallel size {e} must be between 2 and {MAX_SIZE}")
            if not self.expert_params:
                raise ValueError(f"{where}: expert_times needs expert_params (a layer without experts has no "
                                 "expert-parallel times)")
            if 1 not in shards or len(shards) > MAX_SIZES or any(not 1 <= t <= MAX_SIZE for t in shards):
                raise ValueError(f"{where}: expert_times.{e}: tensor-parallel sizes between 1 and {MAX_SIZE}, at most "
                                 f"{MAX_SIZES} of them, t = 1 among them (got {sorted(shards)[:8]})")
        for e, shards in (self.unsplit_expert_times or {}).items():
            if not 1 <= e <= MAX_SIZE or not self.expert_params:
                raise ValueError(f"{where}: unsplit_expert_times: expert-parallel sizes between 1 and {MAX_SIZE}, "
                                 "of a layer with expert_params")
            if len(shards) > MAX_SIZES or any(not 2 <= t <= MAX_SIZE for t in shards):
                raise ValueError(f"{where}: unsplit_expert_times.{e}: tensor-parallel sizes between 2 and {MAX_SIZE}, "
                                 f"at most {MAX_SIZES} of them (got {sorted(shards)[:8]})")
        one = (self.tensor_times or {}).get(1)
        if one is not None:  # the t = 1 "shard" is the layer: the planner reads it in place of fwd_time/bwd_time
            for name, own, shard in (("fwd_time", self.fwd_time, one.fwd_time), ("bwd_time", self.bwd_time,
                                                                                  one.bwd_time)):
                if set(own) != set(shard) or any(not math.isclose(own[b], shard[b], rel_tol=1e-9) for b in own):
                    raise ValueError(f"{where}: tensor_times.1.{name} must be the layer's own {name} (the t = 1 "
                                     "shard is the whole layer; the planner reads it at t = 1): "
                                     f"{str(own)[:120]} vs {str(shard)[:120]}")
        return self

    def shard_time(self, kind: str, b: int | float, t: int) -> float | None:
        """Seconds of ``kind`` of the layer's ``1/t`` shard at ``b`` samples from ``tensor_times``, or None
        when the profile has no times at this ``t``."""
        st = self.tensor_times.get(t) if self.tensor_times else None
        if st is not None and kind == "recompute" and not checkpointed(self.kind):
            kind = "bwd"  # not checkpointed: its backward under recomputation is the plain one
        return None if st is None else st.time(kind, b)

    @property
    def micro_batch_sizes(self) -> list[int]:
        """The measured micro-batch sizes, ascending."""
        return sorted(self.fwd_time)

    def time(self, kind: TimeKind, b: int | float) -> float:
        """Seconds of a ``kind`` pass ("fwd", "bwd" or "recompute") over a micro-batch of ``b`` samples.

        With measured sizes ``b_1 < ... < b_n`` and times ``t_i``:

        * ``b_1 <= b <= b_n``: piecewise-linear between the measured points (exact at them).
        * ``b > b_n``: linear extrapolation from the last two points, but the per-sample time never drops
          below that of the largest measured size: ``max(t_n + s (b - b_n), t_n b / b_n)`` with ``s`` the
          last segment's slope (one point: ``t_1 b / b_1``). A device that is saturated at ``b_n`` does
          not get cheaper per sample.
        * ``b < b_1``: small micro-batches under-use the device, so time shrinks no faster than
          proportionally: the first segment extended downwards, clamped into
          ``[t_1 b / b_1, t_1]`` (one point: ``t_1``).

        If the measured times do not decrease with ``b``, the result does not either, and it is continuous.
        ``recompute`` falls back to ``fwd + bwd`` (forward re-run plus backward) when not measured; it is the
        plain ``bwd`` for a kind full recomputation does not checkpoint (:func:`checkpointed`).
        """
        if not (b > 0) or not math.isfinite(b):
            raise ValueError(f"micro-batch size must be a finite number > 0, got {b}")
        if kind == "recompute" and not checkpointed(self.kind):
            kind = "bwd"
        if kind == "recompute" and self.recompute_time is None:
            return self.time("fwd", b) + self.time("bwd", b)
        table = {"fwd": self.fwd_time, "bwd": self.bwd_time, "recompute": self.recompute_time}.get(kind)
        if table is None:
            raise ValueError(f"kind must be 'fwd', 'bwd' or 'recompute', got {kind!r}")
        return interpolate_time(table, float(b))


def interpolate_time(table: dict[int, float], b: float) -> float:
    """The interpolation rule of :meth:`LayerProfile.time` on a ``{b: seconds}`` table."""
    xs = sorted(table)
    ys = [table[x] for x in xs]
    if b <= xs[0]:
        if len(xs) == 1:
            extended = ys[0]
        else:
            slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
            extended = ys[0] - slope * (xs[0] - b)
        low = ys[0] * b / xs[0]
        return min(max(extended, low), ys[0])
    if b >= xs[-1]:
        proportional = ys[-1] * b / xs[-1]
        if len(xs) == 1:
            return proportional
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return max(ys[-1] + slope * (b - xs[-1]), proportional)
    for i in range(1, len(xs)):
        if b <= xs[i]:
            frac = (b - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + frac * (ys[i] - ys[i - 1])
    raise AssertionError("unreachable")  # pragma: no cover


class TransformerShape(BaseModel):
    """Shape of a transformer language model (optional; lets the planner use analytical formulas)."""

    # strict: a count is a JSON integer (not 4.0, not true, not "4"), as a cluster's are
    model_config = ConfigDict(extra="forbid", strict=True)

    hidden: int = Field(gt=0, le=SHAPE_LIMITS["hidden"])
    seq: int = Field(gt=0, le=SHAPE_LIMITS["seq"])
    heads: int = Field(gt=0, le=SHAPE_LIMITS["heads"])
    vocab: int = Field(gt=0, le=SHAPE_LIMITS["vocab"])
    layers: int = Field(gt=0, le=SHAPE_LIMITS["layers"])
    ffn_hidden: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["ffn_hidden"])
    #: a mixture of experts' expert count ``E`` and experts per token ``k`` (:mod:`planner.moe`); absent for a
    #: dense model
    experts: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["experts"], exclude_if=lambda v: v is None)
    experts_per_token: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["experts"],
                                          exclude_if=lambda v: v is None)
    #: the width of a mixture of experts' shared expert (:attr:`planner.model.ModelSpec.shared_expert_ffn_hidden`): a
    #: dense MLP beside the routed experts in every layer with experts, with its own tensor-parallel collectives
    #: (:meth:`planner.cost.ConfigCosts._tp_comm`); absent without one
    shared_expert_ffn_hidden: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["ffn_hidden"],
                                                 exclude_if=lambda v: v is None)
    #: latent attention (:attr:`planner.model.ModelSpec.kv_lora_rank`): the width of what its column-parallel
    #: up-projections read -- the query latent (or the hidden size without one), the key/value latent and the shared
    #: rotated key -- which its tensor-parallel input collective moves in place of the hidden size
    #: (:meth:`planner.cost.ConfigCosts._tp_comm`); absent for standard attention
    latent_width: int | None = Field(default=None, gt=0, le=3 * SHAPE_LIMITS["hidden"], exclude_if=lambda v: v is None)
    #: norms per transformer layer over a width tensor parallelism splits (OLMo 2's query and key norms over the whole
    #: projections, :attr:`planner.model.ModelSpec.qk_norm_scope`): each all-reduces its rows' sums of squares over the
    #: tensor-parallel group in the forward and in the backward (:meth:`planner.cost.ConfigCosts._tp_comm`); 0 for none
    split_norms: int = Field(default=0, ge=0, le=2, exclude_if=lambda v: v == 0)
    #: with ``split_norms``: the key/value heads (:attr:`planner.model.ModelSpec.kv_heads`), whose count says whether
    #: ``t`` splits the key projection (``t`` dividing it) or every rank computes it whole (replicated key heads:
    #: :func:`planner.operators._shard`), its norm then without an all-reduce; absent otherwise
    kv_heads: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["kv_heads"], exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _defaults(self) -> TransformerShape:
        if self.ffn_hidden is None:
            self.ffn_hidden = 4 * self.hidden
        if (self.experts is None) != (self.experts_per_token is None):
            raise ValueError("experts and experts_per_token: give both (a mixture of experts) or neither")
        if self.experts is not None and int(self.experts_per_token or 0) > self.experts:
            raise ValueError(f"experts_per_token {self.experts_per_token} exceeds experts {self.experts}")
        if self.shared_expert_ffn_hidden is not None and self.experts is None:
            raise ValueError("shared_expert_ffn_hidden: only with experts (a mixture of experts)")
        return self


def shape_of(spec: ModelSpec) -> TransformerShape:
    """The shape a profile of ``spec`` records (the analytical profile's and the profilers'): one description."""
    projection_norms = spec.qk_norm and spec.qk_norm_scope == "projection"
    return TransformerShape(hidden=spec.hidden, seq=spec.seq, heads=spec.heads, vocab=spec.vocab, layers=spec.layers,
                            ffn_hidden=spec.f, experts=spec.experts, experts_per_token=spec.experts_per_token,
                            shared_expert_ffn_hidden=spec.shared_expert_ffn_hidden, latent_width=spec.latent_width,
                            split_norms=2 if projection_norms else 0, kv_heads=spec.k if projection_norms else None)


class ModelProfile(BaseModel):
    """A whole model: its layers in execution order and where/how they were measured."""

    model_config = ConfigDict(extra="forbid")

    name: str
    layers: list[LayerProfile] = Field(max_length=MAX_LAYERS)
    device: str
    dtype: str
    shape: TransformerShape | None = None
    source: Literal["measured", "analytical"]
    environment: dict[str, str] = Field(default_factory=dict)
    notes: str = ""
    schema_version: int = Field(default=1, strict=True)  # (a JSON integer: not true, not 1.0)

    @model_validator(mode="before")
    @classmethod
    def _not_a_hf_config(cls, data: Any) -> Any:
        """A Hugging Face ``config.json`` given where a profile goes is said to be one (not a list of some 26
        missing and unknown fields), with how to make a profile of it."""
        if isinstance(data, dict) and "layers" not in data and ("model_type" in data or "architectures" in data):
            raise ValueError("this is a Hugging Face config.json, not a model profile: make a profile of it with "
                             "`pipeplan profile-analytic --hf-config FILE --out profile.json`, "
                             "POST /profiles/hf-config or the new-plan page's Make profile")
        return data

    @field_validator("layers")
    @classmethod
    def _layers_non_empty(cls, layers: list[LayerProfile]) -> list[LayerProfile]:
        if not layers:
            raise ValueError("layers: a profile needs at least one layer")
        return layers

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        """A dtype the cost and memory models know the element size of (:mod:`planner.dtypes`; an unknown one
        was costed as 2 bytes)."""
        if (why := dtype_error(v)) is not None:
            raise ValueError(why.removeprefix("dtype: "))
        return v

    @model_validator(mode="after")
    def _shape_agrees(self) -> ModelProfile:
        """The ``shape`` describes these layers: its ``layers`` is the number of transformer layers (where the
        profile names them by ``kind``), which the tensor-parallel costs and an export's layer counts read."""
        blocks = sum(1 for lay in self.layers if lay.kind == "transformer")
        if self.shape is not None and blocks and blocks != self.shape.layers:
            raise ValueError(f"shape.layers: {self.shape.layers}, but the profile has {blocks} layers of kind "
                             "'transformer' (the shape describes these layers)")
        try:  # the environment's model_spec (what exports write out) describes them too
            spec = json.loads(self.environment.get("model_spec", "{}"))
        except (ValueError, RecursionError):
            spec = None
        if isinstance(spec, dict):
            for key, have in (("layers", blocks or None), ("heads", self.shape.heads if self.shape else None),
                              ("hidden", self.shape.hidden if self.shape else None)):
                given = integer(spec.get(key))
                if have is not None and given is not None and given != have:
                    raise ValueError(f"environment.model_spec: {key} {given}, but the profile's is {have} (the "
                                     "model an export writes out must be the one profiled)")
        return self

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"schema_version: only version 1 is known, got {v}")
        return v

    def canonical_json(self) -> str:
        """JSON with sorted keys and no whitespace: the input of :meth:`content_hash`. Fields added after
        version 1 shipped (``tensor_times``) are left out when unset, so older profiles keep their hash."""
        data = self.model_dump(mode="json")
        for layer in data["layers"]:
            if layer.get("tensor_times") is None:
                layer.pop("tensor_times", None)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def tensor_sizes(self) -> list[int]:
        """The ``t`` at which every layer has shard times (empty when any layer lacks them)."""
        sizes: set[int] | None = None
        for layer in self.layers:
            have = set(layer.tensor_times or {})
            sizes = have if sizes is None else sizes & have
        return sorted(sizes or ())

    @property
    def tensor_split_problem(self) -> str | None:
        """Why tensor parallelism (t > 1) is not modelled for this profile, or None where it is: some layer has
        shard times (``tensor_times``: measured with ``pipeplan profile --tensor``, or the operator model's), or
        is a ``transformer`` block, which the cost model splits as Megatron-LM does (:mod:`planner.cost`). A model
        of your own (``pipeplan profile --module``: layers of kind ``layer``) has neither: how its layers would be
        split is unknown, and t > 1 would be the t = 1 times divided by t, a guess (pipeplan's executor runs such
        a model at t = 1 only). A new user's plan of ``examples/custom_model.py`` ranked a t = 4 row first."""
        if any(lay.tensor_times or lay.kind == "transformer" for lay in self.layers):
            return None
        kinds = ", ".join(sorted({lay.kind for lay in self.layers}))
        return (f"tensor: no layer of profile {self.name!r} is one tensor parallelism is known to split (kinds: "
                f"{kinds}; a transformer block, or shard times from `pipeplan profile --tensor`): t = 1 only")

    @property
    def attention_heads(self) -> int | None:
        """The model's attention heads, where the profile says (its ``shape``, else the ``model_spec`` of its
        environment): what bounds its tensor-parallel sizes (:func:`planner.model.tensor_split_error`)."""
        if self.shape is not None:
            return self.shape.heads
        try:
            heads = json.loads(self.environment.get("model_spec", "{}")).get("heads")
        except (ValueError, AttributeError, RecursionError):
            return None
        heads = integer(heads)
        return heads if heads is not None and heads > 0 else None

    def content_hash(self) -> str:
        """sha256 hex digest of :meth:`canonical_json`."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @property
    def total_params(self) -> int:
        """Parameters of the model, tied copies counted once."""
        return sum(layer.params - layer.tied_params for layer in self.layers)


#: what eager kernels (``environment["kernels"] = "eager"``, :mod:`planner.operators` "Kernels") are, in words
EAGER_WORDS = ("eager PyTorch kernels (the element-wise ops as separate kernels, as torchtitan's and Hugging Face's "
               "code runs them)")
#: the operator model's default kernels (an analytical profile without ``environment["kernels"]``), in words
FUSED_WORDS = "fused kernels (Megatron-LM / Transformer Engine: one per norm, activation and residual add)"
#: what torchtitan's selective op checkpointing (``recompute_granularity = "op"``) re-runs, in words
OP_WORDS = "selective op checkpointing (torchtitan: every other GEMM and the element-wise ops re-run)"
#: what a profile's layers may re-run in the backward besides full recomputation (:func:`recompute_granularity`)
RECOMPUTE_GRANULARITIES = ("selective", "op")


def recompute_granularity(value: str | None) -> str:
    """What a profile's layers re-run in the backward when a candidate does not recompute them fully, from an
    environment's (or a candidate document's) ``recompute_granularity``: "selective" (Megatron's attention
    core), "op" (torchtitan's op checkpointing) or "none" (anything else, "full" included: that is a
    candidate's configuration, not the profile's)."""
    return value if value in RECOMPUTE_GRANULARITIES else "none"


#: the flash kernels by their names (planner.device.ATTENTION_IMPLS)
ATTENTION_WORDS = {"flash2": "FlashAttention-2", "flash3": "FlashAttention-3", "cudnn": "cuDNN's fused attention"}


#: pipeplan's executor's training runtime, in the profile environment's words: what an analytical profile means
#: where it names none of these (:func:`planner.analytic.runtime_environment` records only what differs; the
#: choices: :data:`planner.analytic.P2P_RUNTIMES`, :data:`planner.analytic.DP_ALLREDUCE_RUNTIMES`, and
#: Megatron-LM's scatter/gather of the pipeline sends "on")
EXECUTOR_RUNTIME: dict[str, str] = {"p2p": "overlapped", "dp_allreduce": "after-backward", "p2p_scatter_gather": "off"}


def other_runtime(env: Mapping[str, str]) -> dict[str, str]:
    """The entries of the profile environment ``env`` that describe a training runtime other than pipeplan's
    executor (:data:`EXECUTOR_RUNTIME`)."""
    return {k: v for k, v in env.items() if k in EXECUTOR_RUNTIME and v != EXECUTOR_RUNTIME[k]}


def runtime_words(env: Mapping[str, str], *, runtime_defaults: bool = False, tensor: int | None = None,
                  recompute: bool = False, sharded_weights: bool = False) -> list[str]:
    """What times made under the profile environment ``env`` assume of the kernels and the training runtime,
    in words (the keys :mod:`planner.analytic` writes; a key ``env`` lacks is not named).
    ``runtime_defaults``: an analytical profile, which records the pipeline sends, the data-parallel
    all-reduce and the kernels only where they differ from the defaults (overlapped, after the backward, fused).
    ``tensor``/``recompute``: of one configuration -- sequence parallelism only where t > 1, the selective
    re-run of the attention core only where the layers are not recomputed fully. ``sharded_weights``: a plan
    with sharded weights (:mod:`planner.fsdp`) has no data-parallel all-reduce to name."""
    words = []
    if env.get("attention") == "flash":
        impl = env.get("attention_impl") or "flash2"
        words.append(ATTENTION_WORDS.get(impl, impl))
    elif env.get("attention") == "unfused":
        words.append("the unfused attention core (scores, softmax, dropout and the product apart)")
    if env.get("dropout") in ("true", "false"):
        words.append("dropout" if env["dropout"] == "true" else "no dropout")
    if env.get("sequence_parallel") == "true" and (tensor is None or tensor > 1):
        words.append("sequence parallelism")
    if env.get("recompute_granularity") == "selective" and not recompute:
        words.append("selective recomputation of the attention core")
    if env.get("recompute_granularity") == "op" and not recompute:
        words.append(OP_WORDS)
    kernels = env.get("kernels", "fused" if runtime_defaults else None)
    if kernels is not None:
        words.append(EAGER_WORDS if kernels == "eager" else FUSED_WORDS)
    if env.get("expert_gemm") in ("grouped", "sequential"):
        words.append("the experts' GEMMs " + ("as one grouped GEMM" if env["expert_gemm"] == "grouped"
                                               else "launched one expert at a time")
                     + " (balanced routing)")
    p2p = env.get("p2p", EXECUTOR_RUNTIME["p2p"] if runtime_defaults else None)
    if p2p is not None:
        words.append(f"{'blocking' if p2p == 'blocking' else 'overlapped'} pipeline sends")
    if env.get("p2p_scatter_gather") == "on":
        words.append("Megatron-LM's scatter/gather of the pipeline sends (1/t of the tensor per rank, then "
                     "gathered)")
    dp = env.get("dp_allreduce", EXECUTOR_RUNTIME["dp_allreduce"] if runtime_defaults else None)
    if dp is not None and not sharded_weights:
        words.append("the data-parallel all-reduce " + ("overlapped with the backward" if dp == "overlapped"
                                                        else "after the backward"))
    return words


_LEAF_OBJECT = re.compile(r"\{\n\s*([^{}\[\]]*?)\n\s*\}")


def save_profile(profile: ModelProfile, path: str | Path) -> None:
    """Write ``profile`` as indented JSON, each innermost object (a ``{b: seconds}`` table) on one line."""
    text = _LEAF_OBJECT.sub(lambda m: "{" + " ".join(m.group(1).split()) + "}", profile.model_dump_json(indent=2))
    Path(path).write_text(text + "\n")


def load_profile(path: str | Path) -> ModelProfile:
    """Read and validate a profile written by :func:`save_profile` (or by hand)."""
    text = Path(path).read_text()
    refuse_duplicate_keys(text)
    return ModelProfile.model_validate_json(text)
