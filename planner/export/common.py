"""What every framework export shares: its input (:class:`ExportInput`: the candidate's
:class:`~planner.runspec.RunSpec` and what is known of the model), its output (:class:`Export`: files and
notes), what a parser reads back (:class:`Parsed`), and the refusal of a schedule a framework lacks
(:class:`UnsupportedSchedule`, naming the closest configuration it has). Pure Python; no framework is
imported (the tests load the outputs with the frameworks' own parsers where they can be installed).

Symbols: ``t`` tensor-parallel size, ``D`` pipeline devices, ``W`` data-parallel width, ``b`` micro-batch
size, ``N`` micro-batches per pipeline group and iteration (global batch ``W N b``), ``v`` model chunks per
device (Megatron-LM's virtual pipeline size, our interleaved ``chunks``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from planner.model import PRESETS, ModelSpec, tensor_split_error
from planner.placement import pipeline_outermost_order
from planner.profile import EXECUTOR_RUNTIME, ModelProfile, recompute_granularity, runtime_words
from planner.request import ALL_SCHEDULES, Config
from planner.runspec import RunSpec
from planner.schedules import SCHEDULE_PARAMETERS

#: profile layer kinds (``executor.models.layer_kinds``, ``planner.analytic``, ``profiler.hf_model``)
EMBEDDING, TRANSFORMER, HEAD = "embedding", "transformer", "lm_head"


@dataclass(frozen=True)
class ExportInput:
    """One candidate to export. ``model``: the model's shape when known (a preset, or the profile's
    shape); ``layer_kinds``: the kind of every profile layer (what the partition's ``[start, end)``
    ranges index); ``dtype``: the profile's; ``sequence_parallel``: whether the profile's tensor-parallel
    times assume Megatron's sequence parallelism (None: not known, no profile); ``recompute_granularity``:
    ``"selective"`` when the profile re-runs the attention core in the backward (its environment's
    ``recompute_granularity``: the unfused core, or the flash kernel's forward, as Megatron-Core checkpoints
    it), ``"op"`` when it re-runs what torchtitan's selective op checkpointing does
    (:func:`planner.operators.checkpoint_ops`);
    ``kernels``: ``"eager"`` when the profile times eager PyTorch's separate norm, rotary, activation and
    residual kernels (torchtitan and Hugging Face code without ``torch.compile``), ``"fused"`` for Megatron-LM's
    / Transformer Engine's, None where unknown (no profile, a candidate document that does not say: use
    :meth:`document_fields`); ``gpus_per_node``: the
    cluster's, for launch lines;
    ``shard_optimizer``: the plan's request split the optimizer state over the W replicas (its memory counts
    ``4 + 12/W`` bytes per parameter: ZeRO-1, Megatron-LM's ``--use-distributed-optimizer``; the candidate
    document's ``shard_optimizer``); ``shard_parameters``: the weights and gradients too (ZeRO-3, FSDP as
    torchtitan runs it: :mod:`planner.fsdp`; the candidate document's ``shard_parameters``);
    ``dropout``, ``attention``, ``attention_impl``, ``p2p``, ``dp_allreduce``: the kernels and the runtime the
    profile's times assume (its environment; None where the profile does not say), written in headers
    (:func:`runtime_line`) and, where the framework has the option, set;
    ``predicted``: the candidate's predicted iteration time (seconds), written in headers;
    ``does_not_fit``: why the planner predicts the exported configuration does not fit in memory (a closest
    configuration exported in a refused candidate's stead: ``export --closest``), written in headers; None when it
    fits or is not known;
    ``plan_path``/``candidate``: where the candidate came from (formats that re-run the plan, e.g. a
    batch script, name them)."""

    spec: RunSpec
    model: ModelSpec | None = None
    layer_kinds: tuple[str, ...] | None = None
    dtype: str = "bf16"
    sequence_parallel: bool | None = None
    recompute_granularity: str = "none"
    kernels: str | None = None
    gpus_per_node: int | None = None
    shard_optimizer: bool = False
    shard_parameters: bool = False
    dropout: bool | None = None
    attention: str | None = None
    attention_impl: str | None = None
    p2p: str | None = None
    dp_allreduce: str | None = None
    #: a mixture of experts' expert GEMMs the profile times (its environment's ``expert_gemm``: grouped or
    #: sequential, :mod:`planner.moe`); None for a dense model or a profile that does not say
    expert_gemm: str | None = None
    predicted: float | None = None
    does_not_fit: str | None = None
    plan_path: str | None = None
    candidate: int = 0

    @property
    def config(self) -> Config:
        return self.spec.config

    @property
    def world_size(self) -> int:
        c = self.config
        return c.tensor * c.pipeline * c.data

    def kinds(self) -> tuple[str, ...] | None:
        """The profile layers' kinds: given, or -- with a partition and a known model -- the standard
        layout ``embedding, transformer x L, lm_head`` when the partition covers ``L + 2`` layers."""
        if self.layer_kinds is not None:
            return self.layer_kinds
        total = self.spec.partition[-1][1] if self.spec.partition else None
        if self.model is not None and total == self.model.layers + 2:
            return (EMBEDDING, *[TRANSFORMER] * self.model.layers, HEAD)
        return None

    def transformer_layers(self) -> int | None:
        """L, the transformer layers of the model."""
        if self.model is not None:
            return self.model.layers
        kinds = self.kinds()
        return None if kinds is None else sum(k == TRANSFORMER for k in kinds)

    def stage_layers(self) -> list[list[int]] | None:
        """Per schedule stage (model order), the indices of the profile layers it holds; None without a
        partition."""
        if not self.spec.partition:
            return None
        return [list(range(a, b)) for a, b in self.spec.partition]

    def transformer_counts(self) -> list[int] | None:
        """Transformer layers per schedule stage, from the partition and the kinds (None when unknown)."""
        kinds, stages = self.kinds(), self.stage_layers()
        if kinds is None or stages is None:
            return None
        return [sum(kinds[i] == TRANSFORMER for i in st) for st in stages]

    @property
    def fsdp(self) -> bool:
        """The plan shards the weights over more than one replica (``shard_parameters`` with W > 1)."""
        return self.shard_parameters and self.config.data > 1

    @staticmethod
    def document_fields(doc: dict) -> dict[str, object]:
        """What a candidate document (``Candidate.to_dict()``) says of the profile it was planned on, for an
        export made without that profile: ``recompute_granularity`` (selective or op; a candidate that recomputes
        fully says "full", which is its configuration's), ``kernels`` and ``sequence_parallel``."""
        out: dict[str, object] = {}
        if isinstance(doc.get("sequence_parallel"), bool):
            out["sequence_parallel"] = doc["sequence_parallel"]
        if recompute_granularity(doc.get("recompute_granularity")) != "none":
            out["recompute_granularity"] = doc["recompute_granularity"]
        if doc.get("kernels") in ("fused", "eager"):
            out["kernels"] = doc["kernels"]
        return out

    @classmethod
    def from_profile(cls, spec: RunSpec, profile: ModelProfile | None, model: ModelSpec | None = None,
                     **kw: object) -> ExportInput:
        """The input for ``spec`` planned on ``profile``: its layer kinds, dtype, sequence parallelism at
        the candidate's ``t``, and its model (``model`` when given, else the preset the profile names,
        else one built from the profile's shape)."""
        if profile is None:
            return cls(spec=spec, model=model, **kw)  # type: ignore[arg-type]
        t = spec.config.tensor
        env = profile.environment
        # the cost model's switch (planner.cost), or shard times measured with it
        sp = env.get("sequence_parallel") == "true" or any(
            bool(layer.tensor_times and t in layer.tensor_times and layer.tensor_times[t].sequence_parallel)
            for layer in profile.layers)
        analytic = profile.source == "analytical"  # the runtime entries are the operator model's (planner.analytic)
        return cls(spec=spec, model=model or model_of(profile), layer_kinds=tuple(la.kind for la in profile.layers),
                   dtype=profile.dtype, sequence_parallel=sp,
                   recompute_granularity=recompute_granularity(env.get("recompute_granularity")),
                   kernels="eager" if env.get("kernels") == "eager" else ("fused" if analytic else None),
                   dropout={"true": True, "false": False}.get(env.get("dropout", "")),
                   attention=env.get("attention"), attention_impl=env.get("attention_impl"),
                   p2p=env.get("p2p", EXECUTOR_RUNTIME["p2p"]) if analytic else env.get("p2p"),
                   dp_allreduce=(env.get("dp_allreduce", EXECUTOR_RUNTIME["dp_allreduce"]) if analytic
                                 else env.get("dp_allreduce")),
                   expert_gemm=env.get("expert_gemm"),
                   **kw)  # type: ignore[arg-type]


def model_of(profile: ModelProfile) -> ModelSpec | None:
    """The model a profile was made of: the one its environment spells out (``model_spec``: analytical
    profiles, and measured ones of a Hugging Face config), else the preset it names when the shape agrees (or,
    without a shape, its count of transformer layers does), else a GPT-shaped :class:`ModelSpec` from its
    ``shape`` (None without one). An :class:`ExportError` naming the shape's field where no model has that shape
    (a hidden size the heads do not divide: the profile's upload takes it, for a model whose head width is not
    hidden / heads, which only ``model_spec`` can say)."""
    if "model_spec" in profile.environment:
        try:
            return ModelSpec.model_validate_json(profile.environment["model_spec"])
        except ValueError:
            pass  # (an environment edited by hand: fall back to what the shape says)
    name = profile.environment.get("model") or profile.name
    preset = PRESETS.get(name)
    shape = profile.shape
    blocks = sum(1 for lay in profile.layers if lay.kind == "transformer")
    if preset is not None and ((preset.layers, preset.hidden) == (shape.layers, shape.hidden) if shape is not None
                               else blocks in (0, preset.layers)):
        return preset
    if shape is None:
        return None
    try:
        return ModelSpec(name=profile.name, layers=shape.layers, hidden=shape.hidden, heads=shape.heads,
                         ffn_hidden=shape.ffn_hidden, seq=shape.seq, vocab=shape.vocab,
                         architecture="encoder" if profile.environment.get("family") == "bert" else "decoder")
    except ValidationError as e:
        why = "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())
        raise ExportError(f"shape: profile {profile.name!r} describes no model an export can write out ({why}); "
                          "give its environment's model_spec (what `pipeplan profile-analytic` and "
                          "`pipeplan profile --hf-config` write) to export it") from None


@dataclass(frozen=True)
class ExportFile:
    """One file of an export: its name, its text and its media type."""

    name: str
    content: str
    media_type: str = "text/plain"


@dataclass(frozen=True)
class Export:
    """What an exporter returns: ``files`` (the first is the main one, printed by the CLI) and ``notes``
    (where the framework's run differs from the prediction, in words)."""

    format: str
    files: tuple[ExportFile, ...]
    notes: tuple[str, ...] = ()

    @property
    def main(self) -> ExportFile:
        return self.files[0]

    def file(self, name: str) -> ExportFile:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(f"no file {name!r} in the {self.format} export ({', '.join(f.name for f in self.files)})")


@dataclass(frozen=True)
class Parsed:
    """What a parser reads back from an export: the configuration, N, and -- where the format carries
    it -- transformer layers per stage (``layer_counts``) or profile layers per stage (``partition``); of a mixture
    of experts the format writes out (Megatron-LM's arguments), its shared expert's width and gate and its dense
    layers (:class:`planner.model.ModelSpec`'s ``shared_expert_ffn_hidden``, ``shared_expert_gate``,
    ``dense_layers``; None, False and () where it has none or the format does not say), its routing
    (``normalize_topk``, ``router_score``, ``router_groups``, ``router_group_topk``, ``router_bias``,
    ``routed_scaling``: ModelSpec's defaults where the format does not say), multi-head latent attention
    (``kv_lora_rank``, ``q_lora_rank``, ``qk_rope_head_dim``, ``v_head_dim`` and ``head_dim``, the query/key width
    per head; None without it), and gpt-oss's attention and MLP where the format writes them (ModelSpec's
    ``attention_sinks``, ``sliding_window``, ``global_every``, ``glu_linear_offset``, ``glu_clamp``; ``activation``:
    the gated MLP's activation, silu or quick_gelu, None where the MLP is not gated or the format does not say;
    ``bias`` and ``qkv_bias``: the linear layers' biases, None where the format does not say), and each head's
    attention where the format writes it (``rotary_dim``: the rotated dimensions of each head's query and key, None
    where all are or the format does not say; ``qk_norm``: norms over each head's query and key, None where the format
    does not say), and Llama 4's where the format writes them (ModelSpec's ``nope_layers``, ``rope_interleaved``,
    ``qk_l2_norm``, ``router_weights_on_input``: (), False, False, False where the format does not say), and the
    norms' epsilon where the format writes one (``norm_eps``; None where it leaves its default)."""

    config: Config
    microbatches: int
    layer_counts: list[int] | None = None
    partition: list[tuple[int, int]] | None = None
    shared_expert_ffn_hidden: int | None = None
    shared_expert_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    normalize_topk: bool = True
    router_score: str = "softmax"
    router_groups: int | None = None
    router_group_topk: int | None = None
    router_bias: bool = False
    routed_scaling: float = 1.0
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    head_dim: int | None = None
    attention_sinks: bool = False
    sliding_window: int | None = None
    global_every: int | None = None
    activation: str | None = None
    glu_linear_offset: float = 0.0
    glu_clamp: float | None = None
    bias: bool | None = None
    qkv_bias: bool | None = None
    rotary_dim: int | None = None
    qk_norm: bool | None = None
    nope_layers: tuple[int, ...] = ()
    rope_interleaved: bool = False
    qk_l2_norm: bool = False
    router_weights_on_input: bool = False
    norm_eps: float | None = None


class ExportError(ValueError):
    """The candidate cannot be exported in this format (the message says why)."""


def check_heads(inp: ExportInput, framework: str) -> None:
    """An :class:`ExportError` when the framework cannot split the model's heads over the candidate's ``t``:
    Megatron-LM and torchtitan give each rank whole query heads and whole key/value groups
    (:func:`planner.model.tensor_split_error`); pipeplan's executor replicates key/value heads fewer than ``t``,
    so a plan may hold such a ``t``."""
    if inp.model is not None and (why := tensor_split_error(inp.model.heads, inp.config.tensor,
                                                            inp.model.k)) is not None:
        raise ExportError(f"{framework}: {why.removeprefix('tensor: ')}; pipeplan's executor runs it (the key/value "
                          "heads replicated), or export a candidate with a smaller t")


#: why a framework with synchronous updates only refuses the asynchronous schedules (every framework we export to)
SYNCHRONOUS_ONLY = {
    "pipedream": "its updates are synchronous; PipeDream stashes weight versions (asynchronous)",
    "pipedream-2bw": "its updates are synchronous; PipeDream-2BW double-buffers weights (asynchronous)",
    "pipedream-rr": "its updates are synchronous; PipeDream-RR stashes weight versions (asynchronous) on stages "
                    "replicated unevenly",
}


def layer_ranges(layers: tuple[int, ...] | list[int]) -> str:
    """``0-2, 5, 7-8``: layer numbers in runs."""
    runs: list[list[int]] = []
    for i in sorted(layers):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def routing_words(model: ModelSpec) -> list[str]:
    """DeepSeek's and Llama 4's routing variants of ``model``'s mixture of experts in words, each naming its fields
    (:class:`planner.model.ModelSpec`'s ``router_score``, ``router_groups`` / ``router_group_topk``, ``router_bias``,
    ``routed_scaling``, ``router_weights_on_input``); [] for the default softmax routing."""
    words = []
    if model.router_score == "sigmoid":
        words.append("sigmoid scores (router_score)")
    if model.router_groups is not None:
        words.append(f"the top {model.experts_per_token} within each token's best {model.router_group_topk} of "
                     f"{model.router_groups} expert groups (router_groups, router_group_topk)")
    if model.router_bias:
        words.append("a per-expert bias on the scores for the choice only (router_bias)")
    if model.routed_scaling != 1.0:
        words.append(f"the chosen weights times {model.routed_scaling:g} (routed_scaling)")
    if model.router_weights_on_input:
        words.append("each expert's input, not its output, multiplied by its routing weight (router_weights_on_input)")
    return words


def latent_words(model: ModelSpec) -> str:
    """``model``'s multi-head latent attention in words naming its fields (``kv_lora_rank`` given)."""
    q = "" if model.q_lora_rank is None else f", q_lora_rank {model.q_lora_rank}"
    return (f"multi-head latent attention (kv_lora_rank {model.kv_lora_rank}{q}, qk_rope_head_dim "
            f"{model.qk_rope_head_dim} of head_dim {model.d}, v_head_dim {model.v_d})")


def gpt_oss_words(model: ModelSpec) -> dict[str, str]:
    """What ``model`` has of gpt-oss's attention and MLP (and what else a framework's settings may leave out), in
    words, by the :class:`planner.model.ModelSpec` field that says it: ``attention_sinks``, ``glu_linear_offset``,
    ``glu_clamp``, ``bias`` (or ``qkv_bias``), ``rope_local_theta``; {} for a model with none of them."""
    words: dict[str, str] = {}
    if model.attention_sinks:
        words["attention_sinks"] = "a learned sink logit per head in every attention softmax (attention_sinks)"
    if model.gated_mlp and model.glu_linear_offset != 0.0:
        words["glu_linear_offset"] = (f"the up projection plus {model.glu_linear_offset:g} before the gate's product "
                                      "(glu_linear_offset)")
    if model.gated_mlp and model.glu_clamp is not None:
        words["glu_clamp"] = (f"the gate clamped to at most {model.glu_clamp:g} and the up projection to "
                              f"[-{model.glu_clamp:g}, {model.glu_clamp:g}] (glu_clamp)")
    if model.bias:
        words["bias"] = ("biases on every linear layer" + (", the experts' and the router's included" if model.moe
                                                           else "") + " (bias)")
    elif model.qkv_bias:
        words["qkv_bias"] = "biases on the query, key and value projections (qkv_bias)"
    if model.rope_local_theta is not None:
        words["rope_local_theta"] = (f"a rotary base of {model.rope_local_theta:g} on the windowed layers "
                                     "(rope_local_theta)")
    return words


def chunk_limits(model: ModelSpec) -> bool:
    """Whether ``model``'s ``attention_chunk`` limits what a query sees at its sequence: shorter than it (on the layers
    with rotary positions, :meth:`planner.model.ModelSpec.layer_chunk`); at the sequence or longer every chunked layer
    attends causally to the whole sequence, as without chunks."""
    return any(model.layer_chunk(i) is not None for i in range(model.layers))


def temperature_from(model: ModelSpec) -> int | None:
    """The first position of ``model``'s sequence whose query ``query_temperature`` scales (by ``1 + scale ln(1 +
    floor((m + 1) / floor))``, which is 1 while ``m + 1 < floor``: position ``floor - 1``), None where it scales none:
    no temperature, a scale of 0, or a sequence of at most ``floor - 1`` positions (Llama 4's 8192 beside a sequence
    of 4096)."""
    if model.query_temperature is None:
        return None
    floor, scale = model.query_temperature
    return floor - 1 if scale > 0 and floor <= model.seq else None


def llama4_words(model: ModelSpec) -> dict[str, str]:
    """What ``model`` has of Llama 4's attention that changes what it computes at its sequence, in words, by the
    :class:`planner.model.ModelSpec` field that says it: ``nope_layers``, ``qk_l2_norm``, ``attention_chunk`` (where it
    limits the attention: :func:`chunk_limits`) and ``query_temperature`` (where it scales a query:
    :func:`temperature_from`); {} for a model with none. (``rope_interleaved`` is not among them: torchtitan's rotary
    turns adjacent pairs, Megatron-LM's ``--rotary-interleaved`` is written; ``router_weights_on_input`` is a routing
    variant, :func:`routing_words`.)"""
    words: dict[str, str] = {}
    if model.nope_layers:
        words["nope_layers"] = f"no rotary positions on layers {layer_ranges(model.nope_layers)} (nope_layers)"
    if model.qk_l2_norm:
        where = " on the layers with rotary positions" if model.nope_layers else ""
        words["qk_l2_norm"] = (f"each head's query and key divided by its root mean square, no weight{where} "
                               "(qk_l2_norm)")
    if model.attention_chunk is not None and chunk_limits(model):
        where = " on the layers with rotary positions" if model.nope_layers else ""
        words["attention_chunk"] = (f"attention within chunks of {model.attention_chunk} positions{where} "
                                    "(attention_chunk)")
    if (start := temperature_from(model)) is not None:
        floor, scale = model.query_temperature  # type: ignore[misc]
        words["query_temperature"] = (f"the queries of the layers without rotary positions multiplied by 1 + {scale:g} "
                                      f"ln(1 + floor((m + 1) / {floor})) from position {start} on (query_temperature)")
    return words


def llama4_inert_notes(model: ModelSpec) -> list[str]:
    """Where ``model``'s ``attention_chunk`` or ``query_temperature`` is given but changes nothing at its sequence
    (:func:`chunk_limits`, :func:`temperature_from`), a note saying so: the export writes nothing for it, which is the
    model at this sequence and not at a longer one."""
    notes = []
    if model.attention_chunk is not None and not chunk_limits(model):
        notes.append(f"attention_chunk {model.attention_chunk} is not shorter than the sequence ({model.seq}): every "
                     "chunked layer attends causally to the whole sequence, as written here; a sequence longer than "
                     "the chunk would need chunked attention, which this export does not write")
    if model.query_temperature is not None and temperature_from(model) is None:
        floor, scale = model.query_temperature
        notes.append(f"query_temperature ({floor}, {scale:g}) scales no query of the {model.seq}-token sequence "
                     + ("(a scale of 0)" if scale == 0 else f"(it first does at position {floor - 1})")
                     + ": nothing is written for it; a longer sequence would need it")
    return notes


def model_gaps_note(model: ModelSpec | None, framework: str, writes: str, experts: bool = False,
                    latent: bool = False, window: bool = False, sinks: bool = False, glu: bool = False,
                    biases: bool = False, rotary: bool = False, llama4: bool = False) -> str | None:
    """A note naming what of ``model`` the framework's model arguments (``writes``: what the export writes, e.g.
    "Llama-shaped arguments") do not set: Gemma's embedding scale, Gemma 2's norms on each branch's output and its
    soft-caps (:class:`planner.model.ModelSpec`), OLMo 2's norms on each branch's output instead of its input
    (``post_norm``) and OLMo 2's and OLMoE's query and key norms over the whole projections (``qk_norm_scope``
    projection), GELU's tanh form under a gated MLP, a mixture of experts where the
    arguments do not write one (``experts``: they do; with its shared expert, its dense layers and its routing
    variants, named by their fields: :func:`routing_words`), multi-head latent attention where they do not write it
    (``latent``: they do; :func:`latent_words`), a sliding window where they do not write it (``window``: they do),
    gpt-oss's attention sinks (``sinks``: written), its quick_gelu gate with the up projection's offset and the clamp
    (``glu``: written), the linear layers' biases (``biases``: written), rotary positions on part of each head
    (``rotary_dim``; ``rotary``: written), the local layers' own rotary base, which neither writes
    (:func:`gpt_oss_words` names each by its field), and Llama 4's attention (:func:`llama4_words`; ``llama4``: the
    caller writes each, or refuses the model); None when nothing is missing. The plan's times are the model's
    own: the framework's model has to be the user's."""
    if model is None:
        return None
    gaps = []
    if model.mla and not latent:
        gaps.append(latent_words(model))
    if model.moe and not experts:
        where = (f"in each MLP but those of layers {layer_ranges(model.dense_layers)} (dense_layers: the dense MLP, "
                 f"{model.f} wide)" if model.dense_layers else "in each MLP")
        shared = ("" if model.shared_expert_ffn_hidden is None else
                  f", beside them a{' gated' if model.shared_expert_gate else ''} shared expert "
                  f"{model.shared_expert_ffn_hidden} wide (shared_expert_ffn_hidden"
                  f"{', shared_expert_gate' if model.shared_expert_gate else ''})")
        routing = routing_words(model)
        routed = f", routed with {', '.join(routing)}" if routing else ""
        gaps.append(f"a mixture of {model.experts} experts ({model.experts_per_token} per token) {where}{shared}"
                    f"{routed}")
    if model.embedding_scale:
        gaps.append("embeddings times sqrt(hidden)")
    if model.sandwich_norm:
        gaps.append("a norm on the attention's and the MLP's outputs")
    if model.post_norm:
        gaps.append("norms on the attention's and the MLP's outputs before each residual add and none on their "
                    "inputs (post_norm)")
    if model.qk_norm and model.qk_norm_scope == "projection":
        gaps.append(f"one RMSNorm over the whole query projection ({model.q_dim} wide) and one over the whole key "
                    f"projection ({model.kv_dim} wide), not over each head's {model.d} (qk_norm_scope projection)")
    if model.attention_softcap is not None:
        gaps.append(f"scores soft-capped at {model.attention_softcap:g}")
    if model.logit_softcap is not None:
        gaps.append(f"logits soft-capped at {model.logit_softcap:g}")
    if model.gated_mlp and model.activation not in ("silu", *(("quick_gelu",) if glu else ())):
        gaps.append(f"a gated MLP with {model.activation} (GeGLU)")
    if model.sliding_window is not None and not window:
        where = "every layer" if model.global_every is None else f"all but every {model.global_every}th layer"
        fields = "sliding_window" if model.global_every is None else "sliding_window, global_every"
        gaps.append(f"attention within a window of {model.sliding_window} tokens on {where} ({fields})")
    if model.rotary_dim is not None and model.rotary_dim < model.d and not rotary:  # (ModelSpec: rotary, no latent)
        gaps.append(f"rotary positions on the first {model.rot_d} of each head's {model.d} query and key dimensions, "
                    f"the other {model.d - model.rot_d} unrotated (rotary_dim)")
    words = gpt_oss_words(model)
    gaps += [w for key, w in words.items() if not {"attention_sinks": sinks, "glu_linear_offset": glu,
                                                   "glu_clamp": glu, "bias": biases, "qkv_bias": biases}.get(key)]
    if not llama4:
        gaps += list(llama4_words(model).values())
    if not gaps:
        return None
    return (f"{framework}: the model has {', '.join(gaps)}, which the {writes} written here do not set: run it "
            "with that framework's own implementation of the model (the plan's times are for this one)")


class UnsupportedSchedule(ExportError):
    """``framework`` has no such schedule. ``closest`` is the configuration it has that is nearest (same
    t, D, W, b, N and recomputation; the schedule it has that is most alike), ``reason`` why it lacks it;
    ``others``: the framework's other configurations of the same t, D, W, b, N and recomputation, less alike, in
    order (what :func:`planner.export.switch.best_closest` picks among once their costs can be predicted)."""

    def __init__(self, framework: str, spec: RunSpec, closest: RunSpec, reason: str,
                 others: tuple[RunSpec, ...] = ()) -> None:
        self.framework, self.spec, self.closest, self.reason = framework, spec, closest, reason
        self.others = others
        super().__init__(self.describe())

    @property
    def choices(self) -> tuple[RunSpec, ...]:
        """Every configuration the framework has that could stand in: ``closest``, then ``others``."""
        return (self.closest, *self.others)

    def with_closest(self, closest: RunSpec) -> UnsupportedSchedule:
        """The same refusal naming ``closest`` (one of :attr:`choices`) as the closest; the rest as ``others``."""
        others = tuple(s for s in self.choices if s != closest)
        return UnsupportedSchedule(self.framework, self.spec, closest, self.reason, others)

    def describe(self, cost: str = "") -> str:
        c = self.spec.config
        return (f"{self.framework} cannot run schedule {c.schedule!r} ({c.label()}): {self.reason}. The closest "
                f"it has is {self.closest.config.schedule!r} ({self.closest.config.label()})"
                + (f"; {cost}" if cost else "") + ".")


def closest_spec(spec: RunSpec, schedule: str, **params: int) -> RunSpec | None:
    """``spec`` with ``schedule`` (and its parameters) instead of its own, the other fields kept; its
    partition is kept when the stage count stays the same, else left to the planner; None when that
    schedule cannot be built for it (e.g. interleaved with N not a multiple of D)."""
    kept = {k: v for k, v in spec.config.model_dump().items() if k not in SCHEDULE_PARAMETERS}
    try:
        cfg = Config(**{**kept, "schedule": schedule, **params})
        out = RunSpec(config=cfg, microbatches=spec.microbatches)
        sched = out.schedule()
    except ValueError:
        return None
    if spec.partition and len(spec.partition) == sched.stages:
        out = out.model_copy(update={"partition": list(spec.partition)})
    return out


def closest_specs(spec: RunSpec, choices: list[tuple[str, dict[str, int]]]) -> list[RunSpec]:
    """Those of ``choices`` (schedule, parameters; most alike first) that can be built for ``spec``, in order, each
    configuration once; :class:`ExportError` when none can."""
    out: list[RunSpec] = []
    for name, params in choices:
        built = closest_spec(spec, name, **params)
        if built is not None and built not in out:
            out.append(built)
    if not out:
        raise ExportError(f"no schedule of {choices} can run {spec.config.label()}")
    return out


def unsupported(framework: str, spec: RunSpec, choices: list[tuple[str, dict[str, int]]],
                reason: str) -> UnsupportedSchedule:
    """The refusal of ``spec``'s schedule by ``framework``: the closest is the first of ``choices`` that can be
    built for ``spec``, the others buildable follow (:class:`UnsupportedSchedule`)."""
    first, *others = closest_specs(spec, choices)
    return UnsupportedSchedule(framework, spec, first, reason, tuple(others))


def unplanned_policy_note(assumed: str, lacks: str) -> str:
    """An export's note where the plan's times assume a recomputation policy (``assumed``, in words) the
    framework cannot run (``lacks``, why): it runs without it."""
    return (f"the plan's times assume {assumed}; {lacks}, so this runs without it: less time and more activation "
            "memory than planned")


def runtime_line(inp: ExportInput) -> str | None:
    """What the prediction assumes of the kernels and the runtime, in words (:func:`planner.profile.
    runtime_words` at the candidate's t and recomputation; None where the profile says nothing of them): the
    same must run for the measured time to match the predicted one."""
    env = {"attention": inp.attention, "attention_impl": inp.attention_impl,
           "dropout": None if inp.dropout is None else str(inp.dropout).lower(),
           "sequence_parallel": "true" if inp.sequence_parallel else None,
           "recompute_granularity": inp.recompute_granularity, "p2p": inp.p2p, "dp_allreduce": inp.dp_allreduce,
           "kernels": inp.kernels}
    # (sharded weights have no data-parallel all-reduce: their collectives are said below)
    parts = runtime_words({k: v for k, v in env.items() if v is not None}, tensor=inp.config.tensor,
                          recompute=inp.config.recompute, sharded_weights=inp.fsdp)
    if inp.fsdp:
        parts.append(f"the weights, gradients and optimizer state sharded over the {inp.config.data} data-parallel "
                     f"replicas (FSDP: weights gathered "
                     + ("per micro-batch" if inp.config.pipeline == 1 else "once per iteration") + ")")
    elif inp.shard_optimizer and inp.config.data > 1:
        parts.append(f"the optimizer state sharded over the {inp.config.data} data-parallel replicas")
    return "the prediction assumes " + ", ".join(parts) if parts else None


def header(inp: ExportInput, framework: str, comment: str = "#") -> list[str]:
    """Comment lines naming the candidate, its prediction (and, where the planner predicts it does not fit in
    memory, that and why) and what the prediction assumes."""
    c = inp.config
    pred = f"; predicted {inp.predicted:.4g} s per iteration" if inp.predicted is not None else ""
    lines = [f"pipeplan export --format {framework}: {c.label()}, N={inp.spec.microbatches} micro-batches "
             f"per pipeline, global batch {inp.spec.global_batch}{pred}",
             f"world size t*D*W = {inp.world_size}"]
    if inp.does_not_fit:
        lines.append(f"WARNING: the planner predicts this configuration does not fit in memory: {inp.does_not_fit}")
    if inp.model is not None:
        lines.append(f"model {inp.model.name}: {inp.model.layers} layers, hidden {inp.model.hidden}, "
                     f"{inp.model.heads} heads, sequence {inp.model.seq}")
    assumed = runtime_line(inp)
    if assumed:
        lines.append(assumed)
    return [f"{comment} {x}" for x in lines]


def first_supported(check: object, candidates: list[dict[str, object]]) -> tuple[int, RunSpec] | None:
    """The first (fastest) of a plan's candidate documents whose schedule ``check`` (a format's
    ``check(spec)``) accepts: its index and run spec."""
    for i, doc in enumerate(candidates):
        try:
            spec = RunSpec.from_document(doc)  # type: ignore[arg-type]
            check(spec)  # type: ignore[operator]
        except ValueError:
            continue
        return i, spec
    return None


def best_supported_note(title: str, check: object, candidates: list[dict[str, object]],
                        ref: str = "--candidate {i}") -> str:
    """``the plan's fastest candidate that <title> runs is <ref> (<label>, predicted s)`` (or that none is).
    ``ref`` names it with ``{i}``, its 0-based index in ``candidates`` (``{n}``: i + 1, the plan page's ``#n``):
    what ``export --candidate`` takes, and the API's ``/candidates/{rank}`` and ``candidate_index`` too (both count
    from 0; a 1-based ``rank`` here once named another candidate than the path it was quoted for)."""
    found = first_supported(check, candidates)
    if found is None:
        return f"None of the plan's {len(candidates)} candidates runs on {title}"
    i, spec = found
    t = candidates[i].get("iteration_time")
    pred = f", predicted {t:.4g} s" if isinstance(t, int | float) else ""
    return f"The plan's fastest candidate that {title} runs is {ref.format(i=i, n=i + 1)} ({spec.config.label()}{pred})"


def export_same_run(module: Any, inp: ExportInput, alternatives: list[str] | tuple[str, ...] = ()) -> Export:
    """``module.export(inp)``; where the framework lacks the candidate's schedule but has one of the schedules the
    candidate runs the same as (its ``alternatives``, :func:`planner.equivalence.collapse`: a D = 1 ZB-H1 is
    1F1B's plain forward and backward per micro-batch), the export of that one, said in a note. Only bare
    schedule names are tried (the same t, D, W, b, N, recomputation and partition); otherwise the framework's
    :class:`UnsupportedSchedule` stands."""
    try:
        return module.export(inp)
    except UnsupportedSchedule as err:
        for alt in alternatives:
            if alt not in ALL_SCHEDULES or alt == inp.config.schedule:
                continue
            cfg = inp.config.model_copy(update={"schedule": alt, **{k: None for k in SCHEDULE_PARAMETERS}})
            try:
                out = module.export(replace(inp, spec=inp.spec.model_copy(update={"config": cfg})))
            except UnsupportedSchedule:
                continue
            note = (f"{inp.config.label()} runs the same as {alt} (the plan's alternatives): exported as {alt}, "
                    f"which {module.TITLE} has")
            return Export(out.format, out.files, (note, *out.notes))
        raise err


def pipeline_outermost_note(inp: ExportInput, title: str, axes: str) -> str | None:
    """For such a framework (its rank axes ``axes``, outermost first): where the candidate was timed with the
    pipeline inside data parallelism (``tp-pp-dp``) and the orders differ, what runs differently."""
    c = inp.config
    if pipeline_outermost_order(c.pipeline, c.data) == c.order:
        return None
    return (f"{title} orders ranks {axes} (the pipeline outermost: ranks=tp-dp-pp); this candidate was timed with the "
            f"pipeline inside data parallelism (ranks=tp-pp-dp), pipeline neighbours {c.tensor} rank(s) apart where "
            f"{title} places them {c.tensor * c.data} apart, so its point-to-point messages may cross slower links "
            f"and its gradient reduction faster ones than predicted; plan with --rank-order tp-dp-pp for "
            f"{title}'s placement")


def experts_refusal(inp: ExportInput, title: str) -> None:
    """Refuse, naming the Megatron export, a candidate whose experts a framework's export here does not place:
    expert parallelism (``e > 1``) or whole experts (``expert_tensor``: :mod:`planner.expert_parallel`)."""
    c = inp.config
    what = ([f"expert parallelism (e = {c.expert})"] if c.expert > 1 else []) + (
        ["experts whole on each rank (etp = 1)"] if c.expert_tensor else [])
    if what:
        raise ExportError(f"{title}: {' and '.join(what)} is not written by this export; the megatron export writes "
                          "it (--expert-model-parallel-size, --expert-tensor-parallel-size)")
