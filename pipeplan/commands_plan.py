"""``pipeplan plan``, ``predict`` and ``profile-analytic``: the planner from the command line. The device and
operator models load with ``profile-analytic`` only."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError

from pipeplan.options import (
    BytesPerParamOpt,
    ChunksOpt,
    ConcatOpt,
    MemoryReserveOpt,
    OrderOpt,
    PipesOpt,
    RankOrderOpt,
    ReplicationOpt,
    ShardOptimizerOpt,
    ShardParametersOpt,
    WavesOpt,
    as_options,
    fail,
    load_input,
    memory_reserve_bytes,
    rank_order,
    validation_summary,
    warn_option,
)
from planner.cluster import Cluster, load_cluster
from planner.equivalence import schedule_label
from planner.expert_parallel import expert_count
from planner.jsondoc import finite
from planner.limits import MAX_GLOBAL_BATCH
from planner.mismatch import device_warnings, size_warnings
from planner.model import PRESETS, ModelSpec
from planner.placement import DEFAULT_ORDER, ORDERS, orders_differ, placement_text
from planner.profile import ModelProfile, load_profile, runtime_words, save_profile
from planner.request import Config, TrainingRequest
from planner.reserve import resolve_reserve
from planner.search import Candidate, PlanResult, plan, predict
from planner.units import devices, is_cpu

if TYPE_CHECKING:  # rich loads with the table: ``plan --json`` prints none
    from rich.console import Console
    from rich.table import Table

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEVICES = {  # --device of profile-analytic -> example cluster file (its device names the description)
    "a100-80gb": "dgx-a100-80gb", "a100-40gb": "dgx-a100-40gb", "h100-80gb": "dgx-h100-80gb",
    "h200-141gb": "dgx-h200-141gb", "v100-32gb": "dgx1-v100-32gb", "p100-16gb": "piz-daint-p100-16gb",
}


def _load(profile: Path, cluster: Path) -> tuple[ModelProfile, Cluster]:
    return load_input("--profile", profile, load_profile), load_input("--cluster", cluster, load_cluster)


def strict_json(doc: object) -> str:
    """``doc`` as strict JSON (:func:`planner.jsondoc.finite`): a time or figure that is not finite is ``null``,
    not Python's ``Infinity``, which JSON parsers other than Python's refuse."""
    return json.dumps(finite(doc), allow_nan=False)


def profile_note(prof: ModelProfile) -> dict[str, object]:
    """What a plan file says of the profile it was made from (``"profile"`` of ``plan --json`` and ``predict
    --json``): ``pipeplan run --plan`` names it where the model it builds is another
    (:func:`executor.plan.planned_profile`)."""
    return {"name": prof.name, "source": prof.source, "device": prof.device, "layers": len(prof.layers)}


def _request(**kw: object) -> TrainingRequest:
    batch = kw.get("global_batch")
    if isinstance(batch, int) and batch > MAX_GLOBAL_BATCH:
        fail(f"--global-batch: at most {MAX_GLOBAL_BATCH} samples per iteration (as the API), got {batch}")
    try:
        return TrainingRequest(**{k: v for k, v in kw.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as e:
        fail(validation_summary(e, most=1, options=True))
    raise AssertionError  # unreachable


def _memory_cell(c: Candidate) -> str:
    """The fullest device's peak as the model's own bytes + the request's reserve (``--memory-reserve``, GiB): the
    reserve alone (2 GiB by default on GPUs, :mod:`planner.reserve`) would otherwise read as the model's memory
    on a small model."""
    return f"{max(c.model_memory, default=0) / 2**30:.3g} + {c.memory_reserve / 2**30:.2f}"


def _table(cands: list[Candidate], title: str) -> Table:
    """The rows' table; the expert-parallel size ``e`` (:attr:`planner.request.Config.expert`) has a column after
    ``W`` only where some row has ``e > 1``, the experts held whole (:attr:`planner.request.Config.expert_tensor`) an
    ``etp`` column after ``e`` only where some row has them (:func:`_etp_cell`), and the rank order
    (:attr:`planner.request.Config.order`) a ``ranks`` column after ``rc`` only where some row has the pipeline
    outermost (:func:`_orders`): a dense model's table, and one whose rows all keep the default order, stay as they
    were."""
    from rich.table import Table

    t = Table(title=title)
    alternatives = any(c.alternatives for c in cands)
    experts = any(c.config.expert > 1 for c in cands)
    whole = _whole_experts(cands)
    orders = _orders(cands)
    for col in ("#", "t", "D", "W", *(["e"] if experts else []), *(["etp"] if whole else []), "b", "N", "schedule",
                "rc", *(["ranks"] if orders else []), "iter (s)", "samples/s", "idle", "peak mem GiB (model + reserve)",
                *(["the same as"] if alternatives else [])):
        t.add_column(col, justify="left" if col in ("schedule", "ranks", "the same as") else "right")
    for i, c in enumerate(cands):
        cfg = c.config
        t.add_row(str(i), str(cfg.tensor), str(cfg.pipeline), str(cfg.data),
                  *([str(cfg.expert)] if experts else []), *([_etp_cell(cfg)] if whole else []),
                  str(cfg.micro_batch),
                  str(c.microbatches), c.name or schedule_label(cfg),
                  "yes" if cfg.recompute else "", *([cfg.order] if orders else []),
                  f"{c.iteration_time:.4g}", f"{c.throughput:.4g}",
                  f"{c.bubble_ratio:.3f}", _memory_cell(c),
                  *([", ".join(c.alternatives)] if alternatives else []))
    return t


def _etp_cell(cfg: Config) -> str:
    """The ``etp`` column's cell: ``1`` where the row holds its experts whole (``expert_tensor``: the label's
    ``etp=1``, Megatron-Core's ``--expert-tensor-parallel-size 1``), empty where they split over ``t`` as the dense
    MLP (Megatron-Core's default, ``etp = t``). Not :attr:`planner.request.Config.etp` on every row: a t = 1 row's
    experts are whole too and would read 1 like a whole-experts row, and the split rows' etp repeats their ``t``;
    the cell marks the rows that differ from the default, as ``rc``'s ``yes`` does (the ones pipeplan's executor
    does not run and the Megatron export writes with the option)."""
    return str(cfg.expert_tensor) if cfg.expert_tensor else ""


def _orders(cands: list[Candidate]) -> bool:
    """Whether some row has another rank order than the default (the table's ``ranks`` column)."""
    return any(c.config.order != DEFAULT_ORDER for c in cands)


def _whole_experts(cands: list[Candidate]) -> bool:
    """Whether some row holds its experts whole (the table's ``etp`` column)."""
    return any(c.config.expert_tensor for c in cands)


def _print_whole_experts(console: Console) -> None:
    """What the ``etp`` column's 1 is (under a table that has it)."""
    console.print("etp 1: each rank holds its experts whole, e over a stage's t W ranks (Megatron-Core's "
                  "--expert-tensor-parallel-size 1, which pipeplan export --format megatron writes; pipeplan run "
                  "splits the experts over t only); empty: the experts split over t as the dense MLP", highlight=False)


def _print_orders(console: Console) -> None:
    """What the ``ranks`` column's orders are (under a table that has it)."""
    console.print("ranks (innermost first): " + "; ".join(
        f"{o}: {placement_text(o).removeprefix('ranks: ')}" for o in ORDERS), highlight=False)


def _warn(console: Console, warnings: list[str]) -> None:
    for w in warnings:
        console.print(f"[bold yellow]warning:[/bold yellow] {w}", highlight=False)


def _print_assumed(console, prof: ModelProfile, req: TrainingRequest) -> None:  # noqa: ANN001
    """What the profile's times assume (kernels, runtime) and what rows without full recomputation re-run:
    the lines above ``plan``'s table and ``predict``'s row."""
    assumed = runtime_words(prof.environment, runtime_defaults=prof.source == "analytical",
                            sharded_weights=req.shard_parameters)
    if assumed:
        console.print("the profile's times assume " + ", ".join(assumed), highlight=False)
    if prof.environment.get("recompute_granularity") == "selective":
        console.print("recomputation: rows with rc re-run every layer; the others re-run the attention core "
                      "selectively (profile: --recompute-granularity selective"
                      + (": the flash kernel's forward" if prof.environment.get("attention") == "flash"
                         else "") + ")", highlight=False)
    elif prof.environment.get("recompute_granularity") == "op":
        console.print("recomputation: rows with rc re-run every layer; the others re-run every other GEMM and the "
                      "element-wise ops (profile: --recompute-granularity op, torchtitan's selective op "
                      "checkpointing)", highlight=False)


def _print_reserve(console: Console, req: TrainingRequest, cl: Cluster) -> None:
    """The memory reserve counted on every device, and where it came from (``--memory-reserve``, or the
    default for the cluster's devices: :func:`planner.reserve.resolve_reserve`)."""
    resolved, source = resolve_reserve(req, cl)
    if "memory_reserve_bytes" in req.model_fields_set:  # the command's option, as the user typed it
        source = "--memory-reserve"
    console.print(f"memory reserve: {(resolved.memory_reserve_bytes or 0.0) / 2**30:.2f} GiB per device "
                  f"({source})", highlight=False)


def _print_clock(console, cands: list) -> None:  # noqa: ANN001
    """The matrix rate the rows' steps hold under the device's power limit (planner.power), where it has one."""
    held = [c.held_rate for c in cands if c.held_rate is not None]
    if held:
        console.print(f"clock: each row at the matrix rate its busy share holds under the power limit, "
                      f"{min(held):.2f}-{max(held):.2f} of the burst rate (planner/power.py)", highlight=False)


def nothing_fits(res: PlanResult, prof: ModelProfile, cl: Cluster | None = None,
                 req: TrainingRequest | None = None) -> str:
    """Why a plan has no candidate, in one line: the rejection most configurations had, the profile's sequence
    (a Hugging Face config profiled at its longest sequence ran out of memory everywhere), and, where ``--gpus`` was
    not given, that every configuration used the whole cluster (t D W = P: a small model on a 512-GPU cluster had
    more pipeline stages than layers everywhere, and the message did not say what to change)."""
    top = max(res.rejected.items(), key=lambda kv: kv[1], default=None)
    shape = prof.shape
    whole = (f"; every configuration uses all {cl.gpus} GPUs of the cluster (t*D*W = --gpus, by default the "
             "cluster's): give --gpus to plan on fewer") if cl is not None and req is not None and req.gpus is None \
        else ""
    return ("no configuration fits" + (f": most were rejected for '{top[0]}' ({top[1]})" if top else "")
            + (f"; the profile's sequence is {shape.seq}" if shape is not None else "") + whole)


def _print_plan(res: PlanResult, prof: ModelProfile, cl: Cluster, req: TrainingRequest, global_batch: int) -> None:
    """The table of ``pipeplan plan`` and the lines under it."""
    from rich.console import Console

    console = Console(width=160)
    n = req.gpus or cl.gpus
    on = devices(cl.device, n) if is_cpu(cl.device) else f"{n} x {cl.device}"
    _print_assumed(console, prof, req)
    console.print(_table(res.candidates, f"{prof.name} on {on}, B^={global_batch}"))
    if _whole_experts(res.candidates):
        _print_whole_experts(console)
    if _orders(res.candidates):
        _print_orders(console)
    console.print(f"evaluated {res.evaluated} configurations, simulated {res.simulated}; rejected: "
                  + ", ".join(f"{k} ({v})" for k, v in sorted(res.rejected.items())))
    _print_reserve(console, req, cl)
    _print_clock(console, res.candidates)
    if req.shard_parameters:
        console.print(f"model state: {req.bytes_per_param:g} bytes per parameter, all split over the W replicas, "
                      "weights gathered where they compute (--shard-parameters: FSDP)", highlight=False)
    elif req.shard_optimizer or "bytes_per_param" in req.model_fields_set:
        console.print(f"model state: {req.bytes_per_param:g} bytes per parameter"
                      + (f", the optimizer's {req.optimizer_bytes():g} of them split over the W replicas "
                         "(--shard-optimizer)" if req.shard_optimizer else " (--bytes-per-param)"), highlight=False)
    _warn(console, res.warnings)  # last: what the user reads first after the table


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        profile: Annotated[Path, typer.Option(help="model profile JSON")],
        cluster: Annotated[Path, typer.Option(help="cluster JSON")],
        global_batch: Annotated[int, typer.Option(help="samples per iteration B^")],
        gpus: Annotated[int | None, typer.Option(help="GPU budget (default: the whole cluster)")] = None,
        top: Annotated[int, typer.Option(help="how many candidates")] = 10,
        schedules: Annotated[str | None, typer.Option(help="comma-separated allowed schedules")] = None,
        allow_async: Annotated[bool, typer.Option("--allow-async", help="include PipeDream and 2BW")] = False,
        max_tensor: Annotated[int | None, typer.Option(help="largest t (default GPUs per node)")] = None,
        max_expert: Annotated[int | None, typer.Option(
            help="largest expert-parallel size e of a mixture of experts: its experts split over e of the W "
                 "data-parallel replicas, or over e of a stage's t W ranks for the rows holding them whole (etp 1, "
                 "tried at t > 1 on a profile made with --sequence-parallel) (default: every e dividing both its "
                 "experts and W, or t W; 1: none)")] = None,
        rank_order_: RankOrderOpt = None,
        memory_reserve: MemoryReserveOpt = None,
        bytes_per_param: BytesPerParamOpt = None,
        shard_optimizer: ShardOptimizerOpt = False,
        shard_parameters: ShardParametersOpt = False,
        json_out: Annotated[bool, typer.Option("--json", help="JSON for machines")] = False,
        processes: Annotated[int | None, typer.Option(
            help="processes searching: 1, or 2 (a forked child searches half of a large search; the same result); "
                 "default: 2 where a core is idle (load average under the cores less a half), else 1")] = None,
    ) -> None:
        """Rank every valid configuration by predicted throughput.

        Exit code 0 with candidates; 1 when no configuration fits (an empty table, or --json's plan with no
        candidates, and the reason on stderr); 2 for bad input."""
        if processes is not None and processes not in (1, 2):
            fail(f"--processes: 1 or 2 (the search splits in two at most), got {processes}")
        reserve = memory_reserve_bytes(memory_reserve)
        order = rank_order("--rank-order", rank_order_)
        stamps = [time.perf_counter()]
        prof, cl = _load(profile, cluster)
        names = None if schedules is None else [n.strip() for n in schedules.split(",")]
        if names is not None and not all(names):
            fail(f"--schedules: an empty name in {schedules!r}; give comma-separated names, e.g. 1f1b,interleaved "
                 f"(leave the option out to allow all of them)")
        req = _request(global_batch=global_batch, gpus=gpus, top=top, allow_async=allow_async,
                       max_tensor=max_tensor, max_expert=max_expert, rank_order=order, schedules=names,
                       shard_optimizer=shard_optimizer,
                       shard_parameters=shard_parameters, bytes_per_param=bytes_per_param,
                       memory_reserve_bytes=reserve)
        if max_expert is not None and max_expert > 1 and not expert_count(prof):
            warn_option(f"max-expert {max_expert}: profile {prof.name!r} has no mixture of experts; every row has "
                        "e = 1")
        budget = gpus or cl.gpus
        if order is not None and budget <= cl.gpus_per_node:
            warn_option(f"rank-order {order}: {devices(cl.device, budget)} fit in one node of {cl.gpus_per_node}: both "
                        "orders place every group alike (the same times)")
        stamps.append(time.perf_counter())
        try:
            res = plan(prof, cl, req, processes=processes)
        except ValueError as e:
            fail(as_options(str(e)))
            raise
        stamps.append(time.perf_counter())
        if json_out:
            typer.echo(strict_json({**res.to_dict(), "profile": profile_note(prof)}))
        else:
            _print_plan(res, prof, cl, req, global_batch)
        if not res.candidates:  # an empty table read as a success, and a script went on with an empty plan
            typer.echo(f"error: {nothing_fits(res, prof, cl, req)}", err=True)
            raise typer.Exit(code=1)
        if os.environ.get("PIPEPLAN_TIMES"):  # benchmarks/plan_cli_bench.py --phases
            stamps.append(time.perf_counter())
            # and this process's own CPU seconds since it started (a forked child's are not in them)
            typer.echo("times: " + ", ".join(f"{name} {b - a:.4f}" for name, a, b in zip(
                ("inputs", "search", "output"), stamps, stamps[1:], strict=False))
                + f", own-cpu {time.process_time():.4f}", err=True)

    @app.command("predict")
    def predict_cmd(
        profile: Annotated[Path, typer.Option(help="model profile JSON")],
        cluster: Annotated[Path, typer.Option(help="cluster JSON")],
        global_batch: Annotated[int, typer.Option(help="samples per iteration B^")],
        tensor: Annotated[int, typer.Option(help="tensor-parallel size t")],
        pipeline: Annotated[int, typer.Option(help="pipeline devices D")],
        data: Annotated[int, typer.Option(help="data-parallel width W")],
        micro_batch: Annotated[int, typer.Option(help="micro-batch size b")],
        schedule: Annotated[str, typer.Option(help="schedule name")],
        recompute: Annotated[bool, typer.Option("--recompute", help="activation recomputation")] = False,
        expert: Annotated[int, typer.Option(
            help="expert-parallel size e of a mixture of experts: its experts split over e of the W data-parallel "
                 "replicas (a divisor of W and of the experts; with --expert-tensor 1, of t W)")] = 1,
        expert_tensor: Annotated[int | None, typer.Option(
            help="expert tensor-parallel size: 1 holds each rank's experts whole (Megatron-Core's "
                 "--expert-tensor-parallel-size 1; t > 1, a profile made with --sequence-parallel), e then over a "
                 "stage's t W ranks (default: the experts split over t as the dense MLP)")] = None,
        order: OrderOpt = DEFAULT_ORDER,
        chunks: ChunksOpt = None,
        waves: WavesOpt = None,
        pipelines: PipesOpt = None,
        concat: ConcatOpt = None,
        replication: ReplicationOpt = None,
        bytes_per_param: BytesPerParamOpt = None,
        shard_optimizer: ShardOptimizerOpt = False,
        shard_parameters: ShardParametersOpt = False,
        memory_reserve: MemoryReserveOpt = None,
        json_out: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Predict one configuration you name, with its time breakdown.

        A row of plan under the same options (--memory-reserve, --bytes-per-param, --shard-optimizer,
        --shard-parameters) is the same prediction."""
        reserve = memory_reserve_bytes(memory_reserve)
        rank_order("--order", order)
        prof, cl = _load(profile, cluster)
        req = _request(global_batch=global_batch, shard_optimizer=shard_optimizer, shard_parameters=shard_parameters,
                       bytes_per_param=bytes_per_param, memory_reserve_bytes=reserve)
        try:
            cfg = Config(tensor=tensor, pipeline=pipeline, data=data, expert=expert, expert_tensor=expert_tensor,
                         order=order,  # type: ignore[arg-type]
                         micro_batch=micro_batch, schedule=schedule, recompute=recompute, chunks=chunks, waves=waves,
                         pipelines=pipelines, concat=concat, replication=replication)
        except ValidationError as e:
            fail(validation_summary(e, most=1, options=True))
            raise
        if tensor * pipeline * data > cl.gpus:
            fail(f"t*D*W = {tensor * pipeline * data} exceeds the cluster's {devices(cl.device, cl.gpus)}")
        try:
            cand = predict(prof, cl, req, cfg)
        except ValueError as e:
            fail(as_options(f"{cfg.label()}: {e}"))
            raise
        warnings = device_warnings(prof, cl, req) + size_warnings(prof, [cfg.micro_batch])
        if json_out:  # refused or not fitting too: "fits": false, the reason, and null for what was not predicted
            typer.echo(strict_json({**cand.to_dict(), "warnings": warnings, "profile": profile_note(prof)}))
            return
        if cand.simulation is None:  # refused: the reason alone (the warnings are about a prediction), exit 2
            fail(as_options(cand.reason))
        for w in warnings:
            typer.echo(f"warning: {w}", err=True)
        from rich.console import Console

        console = Console(width=160)
        _print_assumed(console, prof, req)
        console.print(_table([cand], cfg.label()))
        if cfg.expert_tensor:
            _print_whole_experts(console)
        if cfg.order != DEFAULT_ORDER or orders_differ(tensor, pipeline, data, cl.gpus_per_node):
            console.print(placement_text(cfg.order), highlight=False)  # where the order places groups differently
        console.print("breakdown (s): " + ", ".join(f"{k} {v:.4g}" for k, v in cand.breakdown.items()))
        console.print("closed forms (s): " + ", ".join(
            f"{k} {v:.4g}" for k, v in cand.closed_forms.items() if v is not None))
        _print_reserve(console, req, cl)
        _print_clock(console, [cand])
        if not cand.fits:
            console.print(f"[red]{cand.reason}[/red]")

    @app.command("profile-analytic")
    def profile_analytic_cmd(
        out: Annotated[Path, typer.Option(help="where to write the profile JSON")],
        preset: Annotated[str | None, typer.Option(help=f"one of {', '.join(PRESETS)}")] = None,
        hf_config: Annotated[Path | None, typer.Option(
            "--hf-config", help="a Hugging Face config.json (with --seq: the sequence trained with)")] = None,
        layers: Annotated[int | None, typer.Option()] = None,
        hidden: Annotated[int | None, typer.Option()] = None,
        heads: Annotated[int | None, typer.Option()] = None,
        seq: Annotated[int | None, typer.Option()] = None,
        vocab: Annotated[int | None, typer.Option()] = None,
        device: Annotated[str, typer.Option(
            help=f"one of {', '.join(DEVICES)}, a shipped device (planner/devices) or a device .json")] = "a100-80gb",
        dtype: Annotated[str, typer.Option()] = "bf16",
        name: Annotated[str | None, typer.Option()] = None,
        encoder: Annotated[bool, typer.Option("--encoder", help="BERT-style encoder (a shape given by --layers etc.; "
                                              "a preset or config says its own)")] = False,
        # the decoder, as without --encoder (a flag alone keeps the help's option column narrow at 80 columns:
        # an --encoder/--no-encoder pair widened it until names were cut); kept for the commands that give it
        no_encoder: Annotated[bool, typer.Option("--no-encoder", hidden=True)] = False,
        attention: Annotated[str, typer.Option(help="unfused (Megatron 2021) or flash")] = "unfused",
        attention_impl: Annotated[str, typer.Option(
            help="the flash kernel's implementation, timed at its published rate on the device: flash2 "
                 "(FlashAttention-2, what Megatron-LM's --use-flash-attn runs), flash3 (FlashAttention-3, "
                 "Hopper) or cudnn (cuDNN's fused attention, Transformer Engine's choice on Hopper)")] = "flash2",
        sequence_parallel: Annotated[bool, typer.Option(
            "--sequence-parallel", help="Megatron sequence parallelism")] = False,
        recompute_granularity: Annotated[str, typer.Option(
            help="none, selective (Megatron's --recompute-granularity selective, Korthikanti et al. 2022: "
                 "layers not fully recomputed re-run the attention core in the backward instead of stashing "
                 "it -- with flash attention its forward, as Megatron-Core checkpoints it) or op (torchtitan's "
                 "selective op checkpointing: they keep every other GEMM's output and the attention kernel's "
                 "and re-run the rest). Full recomputation stays the planner's per-candidate choice (the rc "
                 "column)")] = "none",
        kernels: Annotated[str, typer.Option(
            help="fused (Megatron-LM / Transformer Engine: one kernel per norm, rotary embedding, activation "
                 "and residual add; torch.compile'd code comes close) or eager (PyTorch without torch.compile, "
                 "as torchtitan and Hugging Face code run: each of those as separate ops, RMSNorm in fp32)")] = "fused",
        expert_gemm: Annotated[str, typer.Option(
            help="a mixture of experts' expert GEMMs: grouped (one grouped GEMM over the experts: Megatron-Core's "
                 "--moe-grouped-gemm, torchtitan, transformers 5's default) or sequential (one expert at a time: "
                 "Hugging Face's eager experts, Megatron-Core's SequentialMLP)")] = "grouped",
        p2p: Annotated[str, typer.Option(
            help="how the runtime you will train with posts its pipeline sends: overlapped (they overlap "
                 "compute: pipeplan's executor, Megatron-Core with --overlap-p2p-communication) or blocking "
                 "(the sender waits and synchronizes the device: Megatron-LM 2021-22, Megatron-Core's "
                 "default batched sends)")] = "overlapped",
        dp_allreduce: Annotated[str, typer.Option(
            "--dp-allreduce",
            help="when it all-reduces the data-parallel gradients: after-backward (pipeplan's executor, "
                 "Megatron-LM's local DDP) or overlapped (in buckets during the last backward of a one-stage "
                 "pipeline: PyTorch DDP, Megatron-Core's --overlap-grad-reduce)")] = "after-backward",
        p2p_scatter_gather: Annotated[bool, typer.Option(
            "--p2p-scatter-gather",
            help="the runtime sends each pipeline boundary tensor by Megatron-LM's scatter/gather (its default "
                 "in 2021-22, its scatter-gather-tensors-in-pipeline argument): each tensor-parallel rank sends "
                 "1/t of it and the receivers all-gather it; without it every rank sends the whole tensor (pipeplan's "
                 "executor, Megatron-Core), or its 1/t of the sequence under --sequence-parallel")] = False,
    ) -> None:
        """Write an analytical profile: the operator-level model on the device description, per (b, t)."""
        # imported here: ``plan`` and ``predict`` need none of the device and operator models
        from planner.analytic import analytic_profile
        from planner.device import ATTENTION_IMPLS, find_device
        from planner.operators import OperatorOptions

        dev = (find_device(load_cluster(EXAMPLES / "clusters" / f"{DEVICES[device]}.json").device)
               if device in DEVICES else load_input("--device", device, find_device, "device description"))
        if dev is None:
            fail(f"--device must be one of {', '.join(DEVICES)}, a shipped device or a device .json, got {device!r}")
        if attention not in ("unfused", "flash"):
            fail(f"--attention must be unfused or flash, got {attention!r}")
        if attention_impl not in ATTENTION_IMPLS:
            fail(f"--attention-impl must be {', '.join(ATTENTION_IMPLS[:-1])} or {ATTENTION_IMPLS[-1]}, "
                 f"got {attention_impl!r}")
        if recompute_granularity not in ("none", "selective", "op"):
            fail(f"--recompute-granularity must be none, selective or op, got {recompute_granularity!r} (full "
                 "recomputation is chosen per candidate by the planner)")
        if kernels not in ("fused", "eager"):
            fail(f"--kernels must be fused or eager, got {kernels!r}")
        if expert_gemm not in ("grouped", "sequential"):
            fail(f"--expert-gemm must be grouped or sequential, got {expert_gemm!r}")
        from planner.analytic import runtime_environment

        try:
            runtime_environment(p2p, dp_allreduce)
        except ValueError as e:  # "p2p must be ..." / "dp_allreduce must be ...": named as the options are
            field, rest = str(e).split(" ", 1)
            fail(f"--{field.replace('_', '-')} {rest}")
        dropout = OperatorOptions().dropout
        shape = {"layers": layers, "hidden": hidden, "heads": heads, "seq": seq, "vocab": vocab}
        for opt, value in shape.items():
            if value is not None and value < 1:
                fail(f"--{opt} must be a positive integer, got {value}")
        # a preset's or a config's shape is its own: an option beside it would be silently ignored
        ignored = [f"--{k}" for k, v in shape.items() if v is not None and (preset is not None or k != "seq")]
        if encoder and no_encoder:
            fail("--encoder and --no-encoder: give one")
        if encoder or no_encoder:  # (the architecture is the shape's too)
            ignored.append("--encoder" if encoder else "--no-encoder")
        if ignored and (preset is not None or hf_config is not None):
            fail(f"{', '.join(ignored)}: not with --{'preset' if preset is not None else 'hf-config'}, whose shape "
                 f"is its own" + ("" if preset is not None else " (--seq may change its sequence)"))
        caveats: list[str] = []  # what reading --hf-config leaves out, warned of and kept in the profile's notes
        if hf_config is not None:
            from profiler.hf_config import HFConfigError, SeqError, read_hf_config, read_hf_json, trains_with_dropout

            if preset is not None:
                fail("give --preset or --hf-config, not both")
            try:
                spec = read_hf_config(hf_config, seq=seq, name=name,
                                      warn=lambda sentence: (warn_option(sentence), caveats.append(sentence)))
                dropout = trains_with_dropout(read_hf_json(hf_config))
            except SeqError as e:  # "seq: ...": the option's (GPT-2's learned positions end at n_positions)
                fail(f"--{e}")
            except HFConfigError as e:
                fail(f"--hf-config {hf_config}: {e}")
        elif preset is not None:
            if preset not in PRESETS:
                fail(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
            spec = PRESETS[preset]
        else:
            missing = [n for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads),
                                      ("seq", seq), ("vocab", vocab)) if v is None]
            if missing:
                fail("give --preset or all of --layers --hidden --heads --seq --vocab (missing: "
                      + ", ".join("--" + m for m in missing) + ")")
        if preset is None and hf_config is None:
            try:
                spec = ModelSpec(name=name or f"transformer-{layers}x{hidden}", layers=layers, hidden=hidden,
                                 heads=heads, seq=seq, vocab=vocab, architecture="encoder" if encoder else "decoder")
            except ValidationError as e:  # the shape's own options: --hidden, --layers, ...
                fail(validation_summary(e, options=True))
        try:
            prof = analytic_profile(spec, dev, dtype=dtype, name=name or spec.name,  # type: ignore[arg-type]
                                    options=OperatorOptions(attention=attention,  # type: ignore[arg-type]
                                                            attention_impl=attention_impl,  # type: ignore[arg-type]
                                                            sequence_parallel=sequence_parallel, dropout=dropout,
                                                            recompute=recompute_granularity,  # type: ignore[arg-type]
                                                            kernels=kernels,  # type: ignore[arg-type]
                                                            expert_gemm=expert_gemm),  # type: ignore[arg-type]
                                    p2p=p2p, dp_allreduce=dp_allreduce, p2p_scatter_gather=p2p_scatter_gather,
                                    caveats=caveats)
        except ValidationError as e:
            fail(validation_summary(e))
            raise
        except ValueError as e:
            fail(str(e))
            raise
        try:
            save_profile(prof, out)
        except OSError as e:
            fail(f"--out {out}: cannot write it: {e.strerror or e}")
        where = (": the config's longest, --seq to choose" if hf_config is not None and seq is None else "")
        typer.echo(f"wrote {out} ({len(prof.layers)} layers, {prof.total_params / 1e9:.2f}B parameters, "
                   f"sequence {prof.shape.seq if prof.shape is not None else spec.seq}{where})")
