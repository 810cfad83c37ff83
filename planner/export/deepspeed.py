"""Export to DeepSpeed: its JSON config with the pipeline engine's settings, and the parser.

DeepSpeed's config (``deepspeed/runtime/config.py``; the pipeline tutorial, deepspeed.ai/tutorials/pipeline):

* ``train_micro_batch_size_per_gpu`` = b, ``gradient_accumulation_steps`` = N (the pipeline engine runs
  that many micro-batches per ``train_batch()``), ``train_batch_size`` = W N b (DeepSpeed checks
  ``train_batch_size = micro * steps * data-parallel world``, so W is carried);
* ``pipeline``: what ``get_pipeline_config`` reads (``stages``, ``partition``, ``seed_layers``,
  ``activation_checkpoint_interval``; DeepSpeed keeps keys it does not know), here ``stages`` = D (for
  ``PipelineModule(num_stages=...)``), ``partition`` = ``"uniform"`` (``partition_method``: DeepSpeed's
  layer list is our profile's, one entry per profile layer), ``activation_checkpoint_interval`` = 1 with
  recomputation (every layer checkpointed) else 0, and ``topology`` = the keyword arguments of
  ``PipeModelDataParallelTopology(num_pp=D, num_mp=t, num_dp=W)`` (tensor parallelism comes from the
  model's own layers, Megatron-DeepSpeed style), ``parts``: the plan's stage boundaries;
* ``zero_optimization.stage`` 0 (the plan keeps whole optimizer state per device), or 1 where the plan's
  request shards the optimizer state over the W replicas (``shard_optimizer``; the pipeline engine allows
  ZeRO-1 at most), or 3 where it shards the weights too (``shard_parameters``) without a pipeline (D = 1: the
  model under ``deepspeed.initialize`` without ``PipelineModule``; with one it is refused; and
  ``communication_data_type`` fp32, the plan's gradient reduction), ``bf16``/``fp16`` from the profile's dtype.

DeepSpeed's pipeline engine has one schedule, ``TrainSchedule``: 1F1B with a flush (PipeDream-Flush;
``deepspeed/runtime/pipe/schedule.py``). Every other schedule is refused, naming 1F1B.
"""

from __future__ import annotations

import json

from planner.export.common import (
    SYNCHRONOUS_ONLY,
    Export,
    ExportError,
    ExportFile,
    ExportInput,
    Parsed,
    experts_refusal,
    header,
    pipeline_outermost_note,
    unplanned_policy_note,
    unsupported,
)
from planner.placement import pipeline_outermost_order
from planner.profile import OP_WORDS
from planner.request import Config
from planner.runspec import RunSpec

NAME = "deepspeed"
TITLE = "DeepSpeed"
SCHEDULES = ("1f1b",)

_REASONS = {
    "gpipe": "its pipeline engine runs one schedule, TrainSchedule (1F1B with a flush); GPipe's all-forwards-"
             "first order is not it",
    "interleaved": "its pipeline engine holds one stage per rank (no virtual stages)",
    "zb-h1": "its pipeline engine does not split the backward (zero-bubble)",
    "chimera": "its pipeline engine runs one direction with one replica per stage",
    "hanayo": "its pipeline engine holds one stage per rank (no waves)",
    "gems": "its pipeline engine holds one model replica per rank",
    "1f1b-rr": "its topology gives every stage the same data-parallel width; 1F1B-RR replicates stages unevenly",
    **SYNCHRONOUS_ONLY,
}


def check(spec: RunSpec) -> None:
    """Raise :class:`UnsupportedSchedule` unless ``spec`` runs 1F1B."""
    if spec.config.schedule == "1f1b":
        return
    raise unsupported(TITLE, spec, [("1f1b", {})], _REASONS.get(spec.config.schedule, "it has no such schedule"))


def config(inp: ExportInput) -> dict[str, object]:
    """DeepSpeed's config dictionary for ``inp``."""
    c = inp.config
    if inp.fsdp and c.pipeline > 1:  # before the schedule: no schedule of this pipeline would do
        raise ExportError("deepspeed: the plan shards the weights over the data-parallel replicas (ZeRO-3) in a "
                          f"{c.pipeline}-stage pipeline; DeepSpeed's pipeline engine allows ZeRO stage 1 at most "
                          "(plan with --shard-optimizer, or export a D = 1 candidate)")
    check(inp.spec)
    experts_refusal(inp, "deepspeed")
    dtype = inp.dtype.lower()
    out: dict[str, object] = {
        "train_batch_size": inp.spec.global_batch,
        "train_micro_batch_size_per_gpu": c.micro_batch,
        "gradient_accumulation_steps": inp.spec.microbatches,
        "zero_optimization": {"stage": 3 if inp.fsdp else 1 if inp.shard_optimizer and c.data > 1 else 0},
        "bf16": {"enabled": dtype in ("bf16", "bfloat16")},
        "fp16": {"enabled": dtype in ("fp16", "float16", "half")},
        "activation_checkpointing": {"partition_activations": False, "contiguous_memory_optimization": False,
                                     "cpu_checkpointing": False},
        "pipeline": {"stages": c.pipeline, "partition": "uniform", "seed_layers": False,
                     "activation_checkpoint_interval": 1 if c.recompute else 0,
                     "topology": {"num_pp": c.pipeline, "num_mp": c.tensor, "num_dp": c.data}},
    }
    if inp.spec.partition:
        parts = [a for a, _ in inp.spec.partition] + [inp.spec.partition[-1][1]]
        out["pipeline"]["parts"] = parts  # type: ignore[index]
    if inp.fsdp:  # the plan's gradients are reduce-scattered in fp32 (planner.fsdp.REDUCE_BYTES)
        out["communication_data_type"] = "fp32"
    return out


def placement_note(inp: ExportInput) -> str | None:
    """:func:`planner.export.common.pipeline_outermost_note` with this framework's axes."""
    return pipeline_outermost_note(inp, TITLE, "pipe, data, model")


def export(inp: ExportInput) -> Export:
    """``ds_config.json``: :func:`config`, with a ``_pipeplan`` entry naming the candidate (DeepSpeed ignores
    keys it does not read)."""
    cfg = config(inp)
    notes = [n for n in [placement_note(inp)] if n]
    if inp.spec.partition and not inp.fsdp:
        notes.append("pipeline.parts are the plan's stage boundaries over the profile's layers; "
                     "PipelineModule(partition_method='uniform') balances layer counts, which may differ")
    if inp.config.tensor > 1 and inp.fsdp:
        notes.append(f"t = {inp.config.tensor}: tensor parallelism comes from the model's own Megatron-style layers "
                     "(Megatron-DeepSpeed), its data-parallel group the W ranks ZeRO-3 shards over")
    elif inp.config.tensor > 1:
        notes.append(f"t = {inp.config.tensor}: DeepSpeed's pipeline engine takes tensor parallelism from the "
                     "model (PipeModelDataParallelTopology(**pipeline.topology) and Megatron-style layers)")
    if inp.fsdp:
        notes.append("ZeRO stage 3: run the model under deepspeed.initialize without PipelineModule (the pipeline "
                     "engine allows stage 1 at most; the pipeline section is not read then); communication_data_type "
                     "fp32 reduces the gradients in fp32 as the plan costed")
    if inp.recompute_granularity == "op" and not inp.config.recompute:
        notes.append(unplanned_policy_note(OP_WORDS, "DeepSpeed checkpoints whole layers or none"))
    doc = {"_pipeplan": [h.lstrip("# ") for h in header(inp, NAME)] + notes, **cfg}
    return Export(NAME, (ExportFile("ds_config.json", json.dumps(doc, indent=2) + "\n", "application/json"),),
                  tuple(notes))


def parse(text: str) -> Parsed:
    """Read a :func:`export` back: b, N, W (train batch / (b N)), D and t (the pipeline section), 1F1B,
    recomputation (a checkpoint interval above 0) and DeepSpeed's rank order (the pipeline outermost)."""
    doc = json.loads(text)
    b, N = int(doc["train_micro_batch_size_per_gpu"]), int(doc["gradient_accumulation_steps"])
    total = int(doc["train_batch_size"])
    if total % (b * N):
        raise ExportError(f"deepspeed config: train_batch_size {total} is not micro * steps * a whole W")
    pipe = doc.get("pipeline", {})
    topo = pipe.get("topology", {})
    D = int(pipe.get("stages", topo.get("num_pp", 1)))
    W = total // (b * N)
    config = Config(tensor=int(topo.get("num_mp", 1)), pipeline=D, data=W, micro_batch=b, schedule="1f1b",
                    recompute=int(pipe.get("activation_checkpoint_interval", 0)) > 0,
                    order=pipeline_outermost_order(D, W))
    parts = pipe.get("parts")
    partition = [(parts[i], parts[i + 1]) for i in range(len(parts) - 1)] if parts else None
    return Parsed(config=config, microbatches=N, partition=partition)
