"""Export to torchtitan: a TOML job config (torchtitan 0.2's ``JobConfig``, read by its ``ConfigManager``
with ``--job.config_file``) and, for schedules torch names no class for, our action lists as a CSV for
``parallelism.pipeline_parallel_schedule_csv``; with the parser that reads both back.

torchtitan's fields (``torchtitan/config/job_config.py``, ``torchtitan/distributed/pipeline_parallel.py``):

* ``parallelism.tensor_parallel_degree`` = t, ``pipeline_parallel_degree`` = D (ranks, not stages),
  ``data_parallel_replicate_degree`` = W with ``data_parallel_shard_degree`` = 1 (DDP: whole gradients
  all-reduced, as our cost model assumes; FSDP would shard them); where the plan's request shards the
  optimizer state (``shard_optimizer``) torchtitan has no ZeRO-1, so ``data_parallel_shard_degree`` = W
  (FSDP: weights and gradients sharded too, said in a note); where it shards the weights
  (``shard_parameters``) that is what the plan costed (:mod:`planner.fsdp`: torchtitan's default reshard policy
  and fp32 gradient reduction);
* ``training.local_batch_size`` = N b (per data-parallel rank), ``training.global_batch_size`` = W N b,
  ``parallelism.pipeline_parallel_microbatch_size`` = b: torchtitan runs ``local / b`` = N micro-batches;
* ``parallelism.pipeline_parallel_schedule``: torch's class names -- ``GPipe``, ``1F1B``,
  ``Interleaved1F1B`` (our interleaved: its order is torch's ``ScheduleInterleaved1F1B``'s, tested in
  ``tests/test_torch_csv.py``), and ``ZBVZeroBubble`` / ``InterleavedZeroBubble`` / ``DualPipeV`` which
  we do not plan. Our zero-bubble ZB-H1 (one stage per rank) and Hanayo with one wave (a "V": stage ``s``
  and ``2D-1-s`` on one rank, torchtitan's "v" placement) go as a CSV of compute actions
  (:mod:`planner.schedules.torch_csv`; torch's ``_PipelineScheduleRuntime._load_csv``), the schedule name
  then only choosing torchtitan's stage placement (``1F1B``: one stage per rank; ``ZBVZeroBubble``: V);
* ``parallelism.module_fqns_per_model_part``: the plan's partition, one list of module names per stage
  (torchtitan's Llama names: ``tok_embeddings``, ``layers.i``, ``norm`` + ``output``), so chunks and
  partition are the plan's;
* ``activation_checkpoint.mode`` = ``full`` (every block recomputed) or ``none``.

The model is named, not written: ``[model]`` names torchtitan's llama3 (qwen3 with query/key norms), and a note names
what of the model their settings cannot say (:func:`planner.export.common.model_gaps_note`), among them partial rotary
(``rotary_dim``: llama3's ``precompute_freqs_cis(dim // n_heads)`` turns all of each head) and, for llama3, a head width
that is not ``dim // n_heads`` (GLM-4.5's 128 beside 4096 / 96). OLMo 2, OLMo 3 and OLMoE are named qwen3 (query/key
norms), which is not them: its norms are over each head and on each branch's input, theirs over the whole query and key
projections (``qk_norm_scope``) and, OLMo 2's and 3's, on each branch's output (``post_norm``), and torchtitan has no
model with those norms (OLMo's, MiniMax-M2's too); the gaps note names both fields and a note says the family is not the
model (:func:`olmo_note`). Llama 4 is named llama3 too, the gaps note naming its layers without rotary positions
(``nope_layers``), its query/key L2 norm (``qk_l2_norm``), its attention chunks and query temperature where they act at
the sequence (``attention_chunk``, ``query_temperature``) and its routing (``router_weights_on_input``); a note points
at torchtitan's own llama4 model, saying field by field what it has of them and what it lacks (:func:`llama4_note`), and
another where a chunk or a temperature acts on no position of the sequence.

Hanayo with more than one wave needs a placement torchtitan has not ("loop" or a single "V"); Chimera,
GEMS (two replicas), 1F1B-RR (uneven replication) and PipeDream's asynchronous schedules are refused.
"""

from __future__ import annotations

import tomllib

from planner.export.common import (
    EMBEDDING,
    HEAD,
    SYNCHRONOUS_ONLY,
    TRANSFORMER,
    Export,
    ExportError,
    ExportFile,
    ExportInput,
    Parsed,
    check_heads,
    chunk_limits,
    experts_refusal,
    header,
    layer_ranges,
    llama4_inert_notes,
    model_gaps_note,
    pipeline_outermost_note,
    routing_words,
    temperature_from,
    unsupported,
)
from planner.model import ModelSpec
from planner.placement import pipeline_outermost_order
from planner.request import Config
from planner.runspec import RunSpec
from planner.schedules import build
from planner.schedules.torch_csv import export_torch_csv, import_torch_csv

NAME = "torchtitan"
TITLE = "torchtitan"
CSV_NAME = "pipeline_schedule.csv"
#: our schedule -> torch's schedule class name (torchtitan's pipeline_parallel_schedule)
NAMED = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}
#: schedules exported as a CSV, with the class name that gives torchtitan their stage placement
AS_CSV = {"zb-h1": "1F1B", "hanayo": "ZBVZeroBubble"}
SCHEDULES = (*NAMED, *AS_CSV)

_REASONS = {
    "chimera": "torch places every stage on one rank; Chimera's bidirectional pipelines hold two replicas of it",
    "gems": "torch places every stage on one rank; GEMS holds two model replicas",
    "1f1b-rr": "its pipeline stages are one rank each; 1F1B-RR replicates stages unevenly",
    **SYNCHRONOUS_ONLY,
}


def check(spec: RunSpec) -> None:
    """Raise :class:`UnsupportedSchedule` when torchtitan cannot run ``spec``'s schedule."""
    c = spec.config
    if c.schedule in NAMED or c.schedule == "zb-h1" or (c.schedule == "hanayo" and (c.waves or 1) == 1):
        return
    if c.schedule == "hanayo":
        reason = (f"{c.waves} waves place {2 * (c.waves or 1)} stages per rank in a zigzag; torchtitan places "
                  f"them in a loop or a single V")
        choices = [("hanayo", {"waves": 1}), ("interleaved", {"chunks": 2 * (c.waves or 1)}), ("1f1b", {})]
    else:
        reason = _REASONS.get(c.schedule, "it has no such schedule")
        choices = [("1f1b", {})]
    raise unsupported(TITLE, spec, choices, reason)


def _fqns(kinds: tuple[str, ...], stage_layers: list[list[int]]) -> list[list[str]]:
    """torchtitan's module names of every stage (Llama's ``tok_embeddings``, ``layers.i``, ``norm``,
    ``output``)."""
    block = {}
    for i, k in enumerate(kinds):
        if k == TRANSFORMER:
            block[i] = len(block)
    out = []
    for layers in stage_layers:
        names: list[str] = []
        for i in layers:
            fixed = {EMBEDDING: ["tok_embeddings"], HEAD: ["norm", "output"]}
            names += fixed.get(kinds[i], [f"layers.{block.get(i, i)}"])
        out.append(names)
    return out


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def _dtype(dtype: str) -> str:
    return "float32" if dtype.lower() in ("fp32", "float32") else "bfloat16"


def placement_note(inp: ExportInput) -> str | None:
    """:func:`planner.export.common.pipeline_outermost_note` with this framework's axes."""
    return pipeline_outermost_note(inp, TITLE, "pp, dp_replicate, fsdp, tp")


def olmo_note(m: ModelSpec, family: str) -> str | None:
    """Where ``m`` has OLMo's layers (``qk_norm_scope`` projection, ``post_norm``), that the ``family`` named in
    ``[model]`` is not the model, and why; None otherwise (OLMo's; MiniMax-M2's norms are OLMoE's). torchtitan has no
    model with them (``torchtitan/models/__init__.py`` at 00c7d452: llama3, llama3_ft, deepseek_v3, qwen3;
    ``torchtitan/experiments/__init__.py`` at 009815e6: flux, gpt_oss, simple_fsdp, vlm, compiler_toolkit); its qwen3
    norms each head's query and key (``Attention``: ``q_norm = nn.RMSNorm(head_dim)`` over ``xq.view(bs, seqlen, -1,
    head_dim)``) and, as llama3, each branch's input (``TransformerBlock``: ``x + attention(attention_norm(x))``,
    ``x + feed_forward(ffn_norm(x))``), ``torchtitan/models/qwen3/model/model.py`` at
    33d4f3b25a2f5fa507b86327403051d05dc653ea."""
    what = []
    if m.qk_norm and m.qk_norm_scope == "projection":  # (named qwen3: qk_norm)
        what.append(f"its query and key norms are nn.RMSNorm(head_dim) over each head, the model's one over the whole "
                    f"query projection ({m.q_dim}) and one over the whole key projection ({m.kv_dim}) (qk_norm_scope "
                    "projection)")
    if m.post_norm:
        what.append("its blocks norm each branch's input (x + attention(attention_norm(x))), the model each branch's "
                    "output (x + norm(attention(x)), post_norm)")
    if not what:
        return None
    return (f"torchtitan's {family} is not this model: {'; '.join(what)}; torchtitan has no model with these norms "
            "(OLMo 2/3's, OLMoE's, MiniMax-M2's), so register a model of your own and name it in [model]")


def _nth(n: int) -> str:
    """``2nd``, ``3rd``, ``4th``, ``11th``, ``21st``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def is_llama4(m: ModelSpec) -> bool:
    """Whether ``m`` has any of Llama 4's layers (ModelSpec's ``nope_layers``, ``qk_l2_norm``, ``attention_chunk``,
    ``query_temperature``, ``router_weights_on_input``)."""
    return bool(m.nope_layers or m.qk_l2_norm or m.attention_chunk is not None or m.query_temperature is not None
                or m.router_weights_on_input)


def llama4_note(m: ModelSpec) -> str | None:
    """Where ``m`` has Llama 4's layers (:func:`is_llama4`), what torchtitan's llama4 model has of them and what it
    lacks, field by field; None otherwise. torchtitan's llama4 (``torchtitan/models/llama4/model/model.py`` at
    33d4f3b25a2f5fa507b86327403051d05dc653ea; ``TransformerModelArgs`` in ``model/args.py`` at
    10d56e914b6b88e46a7429edc5fa0001fb203143; ``MoEArgs`` in ``torchtitan/models/moe/moe.py`` at
    003edbe52d6f4a622cbf708b674564c551d36868): ``TransformerBlock`` drops the rotary on layers ``layer_id %
    every_n_layers_nope == 0`` (0, n, 2n, ...; Llama 4's are n-1, 2n-1, ...) and gives the others a
    ``fixed_attn_block_size`` (their mask under flex attention; its sdpa path takes no mask), experts on layers
    ``(layer_id + 1) % interleave_moe_layer_step == 0``; ``apply_rotary_emb`` turns adjacent pairs
    (``view_as_complex``: ``rope_interleaved``); ``Attention`` has no query/key norm and scales no query by its
    position; ``MoE`` routes by ``score_func`` (sigmoid by default) to ``top_k`` experts and, with
    ``score_before_experts`` (its default), multiplies each expert's input by the weight (``router_weights_on_input``),
    beside ``num_shared_experts`` shared ones."""
    if not is_llama4(m):
        return None
    has, lacks = [], []
    if m.nope_layers:
        nope = list(m.nope_layers)
        n = nope[1] - nope[0] if len(nope) > 1 else m.layers
        if nope[0] == 0 and n >= 2 and nope == list(range(0, m.layers, n)):
            has.append(f"no rotary positions on every {_nth(n)} layer from layer 0 (every_n_layers_nope {n})")
        else:
            lacks.append(f"the model's layers without rotary positions, {layer_ranges(m.nope_layers)} (nope_layers): "
                         "its every_n_layers_nope n drops them on layers 0, n, 2n, ... (layer_id % n == 0), not on "
                         "n-1, 2n-1, ...")
    if m.rope_interleaved:
        has.append("rotary positions turning adjacent pairs (view_as_complex: rope_interleaved)")
    if m.attention_chunk is not None and chunk_limits(m):
        has.append(f"attention within chunks on the layers with rotary positions (fixed_attn_block_size "
                   f"{m.attention_chunk}, with flex attention only: its sdpa path attends causally)")
    if m.qk_l2_norm:
        lacks.append("the L2 norm of each head's query and key (qk_l2_norm): its Attention has no query/key norm")
    if temperature_from(m) is not None:
        lacks.append("the queries' temperature on the layers without rotary positions (query_temperature): its "
                     "Attention scales no query by its position")
    if m.moe:
        k = int(m.experts_per_token or 0)
        has.append(f"{m.router_score} routing to the top {k} (MoEArgs score_func, top_k, route_norm "
                   f"{str(m.normalize_topk).lower()})")
        if m.router_weights_on_input:
            has.append("the routing weight on each expert's input (score_before_experts, its default: "
                       "router_weights_on_input)")
        else:
            has.append("the routing weight on each expert's output (score_before_experts false)")
        if m.shared_expert_ffn_hidden is not None:
            has.append("a shared expert (num_shared_experts)")
        moe_layers = [i for i in range(m.layers) if i not in m.dense_layers]
        step = moe_layers[0] + 1
        if moe_layers == list(range(step - 1, m.layers, step)):
            has.append(f"experts on every {_nth(step)} layer from layer {step - 1} (interleave_moe_layer_step {step})"
                       if step > 1 else "experts on every layer (interleave_moe_layer_step 1)")
        else:
            lacks.append(f"the model's dense layers, {layer_ranges(m.dense_layers)} (dense_layers): its "
                         "interleave_moe_layer_step s puts experts on layers s-1, 2s-1, ... and dense MLPs between")
    text = "torchtitan's llama4 model (torchtitan/models/llama4) has " + ("; ".join(has) or "none of them")
    if lacks:
        text += "; it lacks " + "; and ".join(lacks)
    return text + (": register a flavor of this model there and name it in [model] instead"
                   + (", adding what it lacks" if lacks else ""))


def export(inp: ExportInput, csv_path: str = CSV_NAME) -> Export:
    """The TOML job config (``job_config.toml``) and, for ZB-H1 and Hanayo, the CSV schedule it names
    (``csv_path``, relative to where torchtitan runs)."""
    check(inp.spec)
    check_heads(inp, "torchtitan")
    experts_refusal(inp, "torchtitan")
    c, notes = inp.config, [n for n in [placement_note(inp)] if n]
    fsdp = (inp.shard_optimizer or inp.shard_parameters) and c.data > 1
    if fsdp and not inp.shard_parameters:
        notes.append(f"the plan shards the optimizer state over the {c.data} data-parallel replicas (ZeRO-1); "
                     "torchtitan has no ZeRO-1, so this is FSDP (data_parallel_shard_degree): it shards weights "
                     "and gradients too, so it needs less memory than planned, and it all-gathers the weights "
                     "in every forward and backward, which the plan did not cost")
    sections: dict[str, dict[str, object]] = {
        "job": {"description": f"pipeplan: {c.label()}, N={inp.spec.microbatches}"},
        "training": {"local_batch_size": inp.spec.microbatches * c.micro_batch,
                     "global_batch_size": inp.spec.global_batch,
                     "mixed_precision_param": _dtype(inp.dtype)},
        "parallelism": {"data_parallel_replicate_degree": 1 if fsdp else c.data,
                        "data_parallel_shard_degree": c.data if fsdp else 1,
                        "tensor_parallel_degree": c.tensor, "pipeline_parallel_degree": c.pipeline,
                        "pipeline_parallel_schedule": NAMED.get(c.schedule) or AS_CSV[c.schedule],
                        "pipeline_parallel_microbatch_size": c.micro_batch},
        "activation_checkpoint": ({"mode": "full"} if c.recompute else
                                  {"mode": "selective", "selective_ac_option": "op"}
                                  if inp.recompute_granularity == "op" else {"mode": "none"}),
    }
    if inp.recompute_granularity == "selective" and not c.recompute:
        notes.append("the plan's times re-run each layer's attention core in the backward (Megatron's selective "
                     "recomputation); torchtitan has no such policy, so this runs without it: less time and more "
                     "activation memory than planned (profile with --recompute-granularity op for torchtitan's)")
    if c.tensor > 1 and inp.sequence_parallel is False:
        notes.append("torchtitan's tensor parallelism is sequence-parallel (norms and element-wise ops on T/t rows "
                     "per rank); the plan's times replicate them on every rank, more than torchtitan runs (profile "
                     "with --sequence-parallel)")
    if inp.kernels == "fused":
        notes.append("the plan's times assume fused norm, rotary, activation and residual kernels (Megatron-LM / "
                     "Transformer Engine); torchtitan runs them as separate eager ops unless compiled ([compile] "
                     "enable = true), slower than planned (profile with --kernels eager for its eager times)")
    if inp.model is not None:
        # torchtitan's llama3 has no query/key norms; its qwen3 model has them (Qwen3's q_norm / k_norm)
        family = "qwen3" if inp.model.qk_norm else "llama3"
        sections["model"] = {"name": family, "flavor": inp.model.name}
        sections["training"]["seq_len"] = inp.model.seq
        m = inp.model
        dims = f"dim {m.hidden}, n_layers {m.layers}, n_heads {m.heads}, n_kv_heads {m.k}, vocab {m.vocab}"
        if family == "qwen3":  # (Qwen3ModelArgs.head_dim: torchtitan/models/qwen3/model/args.py at 1380887b)
            dims += f", head_dim {m.d}"
        note = (f"[model] names torchtitan's {family} with flavor {m.name!r}: register a flavor of these dimensions "
                f"({dims}) or pick yours")
        if family == "llama3" and m.d * m.heads != m.hidden and not m.mla:
            # (torchtitan/models/llama3/model/model.py at 6404b932: Attention's head_dim = dim // n_heads, and
            # precompute_freqs_cis(dim // n_heads) rotates all of it: no head width or rotated part of its own)
            note += (f"; llama3 sizes each head dim // n_heads = {m.hidden // m.heads} wide, not the model's "
                     f"{m.d} (head_dim)")
        notes.append(note)
        if (gap := model_gaps_note(m, "torchtitan", f"{family} model settings")) is not None:
            notes.append(gap)
        if (olmo := olmo_note(m, family)) is not None:
            notes.append(olmo)
        notes += llama4_inert_notes(m)
        if (llama4 := llama4_note(m)) is not None:
            notes.append(llama4)
        elif m.mla:
            # (torchtitan/models/deepseek_v3: DeepSeekV3ModelArgs kv_lora_rank, q_lora_rank, qk_*_head_dim, v_head_dim,
            # n_expert_groups, n_limited_groups; MoEArgs score_func, route_norm, route_scale)
            notes.append("torchtitan's deepseek_v3 model has multi-head latent attention and DeepSeek's routing: "
                         "register a flavor of this model there and name it in [model] instead")
        elif m.moe and routing_words(m):
            # (torchtitan/models/deepseek_v3/model/args.py at 05c63359: DeepSeekV3ModelArgs has kv_lora_rank always,
            # no n_kv_heads, no attention biases)
            notes.append("torchtitan's deepseek_v3 model has DeepSeek's routing but multi-head latent attention only "
                         "(DeepSeekV3ModelArgs: a kv_lora_rank, no n_kv_heads): this model's standard attention with "
                         "that routing is no model of torchtitan's, so register one of your own and name it in "
                         "[model]")
        if m.attention_sinks or m.glu_clamp is not None or m.glu_linear_offset != 0.0:
            # (torchtitan/models/gpt_oss: Attention's sinks and biased wq, wk, wv, wo; GptOssGroupedExperts' biases
            # and swiglu(x, alpha=1.702, limit), out_glu * (x_linear + 1); GptOssModelArgs.sliding_window_size on
            # the even layers)
            notes.append("torchtitan's gpt_oss model has gpt-oss's attention sinks, biases, clamped quick_gelu gate "
                         "(the up projection plus 1) and window on every other layer: register a flavor of this "
                         "model there and name it in [model] instead")
    kinds, stage_layers = inp.kinds(), inp.stage_layers()
    par = sections["parallelism"]
    if kinds is not None and stage_layers is not None:
        par["module_fqns_per_model_part"] = _fqns(kinds, stage_layers)  # type: ignore[assignment]
    elif c.schedule == "interleaved":  # the chunks per rank are said by the module lists only
        raise ExportError("torchtitan: an interleaved candidate needs its partition and the profile's layer "
                          "kinds (give --profile) to say which modules each of its chunks holds")
    else:
        notes.append("no partition or layer kinds: torchtitan splits the layers itself "
                     "(pipeline_parallel_first/last_stage_less_layers)")
    files = []
    if c.schedule in AS_CSV:
        par["pipeline_parallel_schedule_csv"] = csv_path
        files.append(ExportFile(csv_path, export_torch_csv(inp.spec.schedule()), "text/csv"))
    lines = [*header(inp, NAME), "# torchtitan: run_train.sh / torchrun ... -m torchtitan.train "
             f"--job.config_file job_config.toml on {inp.world_size} processes"]
    if c.schedule in AS_CSV:
        lines.append(f"# schedule: our {c.schedule} action lists in {csv_path} (torch's compute-only CSV); "
                     f"pipeline_parallel_schedule only sets torchtitan's stage placement")
    lines += [f"# note: {n}" for n in notes]
    for name, fields in sections.items():
        lines += ["", f"[{name}]", *[f"{k} = {_toml_value(v)}" for k, v in fields.items()]]
    return Export(NAME, (ExportFile("job_config.toml", "\n".join(lines) + "\n", "application/toml"), *files),
                  tuple(notes))


def parse(toml_text: str, csv_text: str | None = None) -> Parsed:
    """Read a :func:`export` back: t, D, W, b, N, the schedule (from the class name, or for a CSV from its
    action lists, compared with our builders'), chunks (stages per rank, from the module lists),
    recomputation and the partition as profile-layer ranges when module lists are given."""
    doc = tomllib.loads(toml_text)
    par, tr = doc.get("parallelism", {}), doc.get("training", {})
    t, D = int(par.get("tensor_parallel_degree", 1)), int(par.get("pipeline_parallel_degree", 1))
    W = int(par.get("data_parallel_replicate_degree", 1)) * max(1, int(par.get("data_parallel_shard_degree", 1)))
    b = int(par.get("pipeline_parallel_microbatch_size", 1))
    local = int(tr.get("local_batch_size", 8))
    if local % b:
        raise ExportError(f"torchtitan config: local_batch_size {local} is not a multiple of the micro-batch {b}")
    N = local // b
    parts = par.get("module_fqns_per_model_part")
    stages = len(parts) if parts else None
    recompute = doc.get("activation_checkpoint", {}).get("mode", "selective") == "full"
    name = par.get("pipeline_parallel_schedule", "1F1B")
    params: dict[str, int] = {}
    if par.get("pipeline_parallel_schedule_csv"):
        if csv_text is None:
            raise ExportError("torchtitan config names a schedule CSV: give its text")
        schedule, params = _identify(import_torch_csv(csv_text), D, N)
    else:
        ours = {v: k for k, v in NAMED.items()}
        if name not in ours:
            raise ExportError(f"torchtitan config: schedule {name!r} is not one of ours ({', '.join(ours)})")
        schedule = ours[name]
        if schedule == "interleaved":
            if stages is None:
                raise ExportError("torchtitan config: an Interleaved1F1B config without module lists")
            params = {"chunks": stages // D}
    config = Config(tensor=t, pipeline=D, data=W, micro_batch=b, schedule=schedule, recompute=recompute,
                    order=pipeline_outermost_order(D, W), **params)
    return Parsed(config=config, microbatches=N, partition=_partition(parts) if parts else None)


def _identify(sched: object, D: int, N: int) -> tuple[str, dict[str, int]]:
    """Which of our CSV-exported schedules has exactly these action lists."""
    from planner.schedules.ir import Schedule

    assert isinstance(sched, Schedule)
    for name, params in (("zb-h1", {}), ("hanayo", {"waves": 1})):
        try:
            ours = build(name, D, N, **params)
        except ValueError:
            continue
        if ours.actions == sched.actions:
            return name, params
    raise ExportError(f"torchtitan CSV: its action lists are none of our schedules for D={D}, N={N}")


def _partition(parts: list[list[str]]) -> list[tuple[int, int]]:
    """Profile-layer ranges of the module lists (embedding, blocks, norm + output = one layer each)."""
    out, start = [], 0
    for names in parts:
        n = sum(1 for x in names if x != "norm")  # norm and output are the profile's one lm_head layer
        out.append((start, start + n))
        start += n
    return out
