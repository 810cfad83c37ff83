"""Predictions of published, measured training runs (Megatron-LM SC'21 Tables 1 and 2, figures 11-16 and 18;
Korthikanti et al. 2022, Table 5).

A published run gives the model shape, (t, p, d), the global batch and the measured FLOP/s per GPU; with
Megatron's FLOP count (Narayanan et al. SC'21, appendix: ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` per
iteration with activation recomputation) that is a measured time per iteration. :func:`predict_run` builds
the operator-model profile of the model on the device (fp16, unfused attention with Megatron's fused
softmax and dropout: what the 2021 runs did), a cluster of DGX A100 nodes of the run's size, and predicts
the iteration with the simulator for the run's schedule, full recomputation on. The configuration is the one
the run used: Table 1's micro-batch size b, model chunks v (1: plain 1F1B) and data-parallel implementation
are those of the paper's reproduction scripts (NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh``; section
5.1: "we use the interleaved pipeline schedule with the scatter/gather optimization", with v given there
as ``--num-layers-per-virtual-pipeline-stage``); Table 2 states b = 1 and we take v from the scripts for the
same model and (t, p) (``tests/data/megatron_tables.json``, ``schedule_note``). Only where a run states
neither (none of the shipped rows) is the fastest predicted b in (1, 2, 4, 8) and v chosen, which biases a
prediction fast: the reported b and v say which was used. The runtime is Megatron 2021's: blocking
pipeline sends (profile environment ``p2p = blocking``), the data-parallel all-reduce after the backward
(``--DDP-impl local``) or, for the rows that ran PyTorch DDP (``--DDP-impl torch``: Table 1's p = 1 rows),
overlapped with the last backward (``dp_allreduce = overlapped``; :mod:`planner.cost`), and Megatron's
even layer split (:func:`megatron_split`: the first stage also holds the embedding, the last the LM head and
loss) instead of the planner's time-balanced partition.

A second, independent check (:func:`korthikanti_runs`, :func:`predict_fixed`): Korthikanti et al. 2022
(arXiv 2205.05198) Table 5 measured iteration times of 22B/175B/530B/1T GPT models at t = 8 with full
recomputation, on the same machine a year later, with the parallel configuration stated (nothing chosen
by us). Its 22B row is one pipeline stage, one micro-batch of 4 and no data parallelism: a direct check of
the layer model (48 layers, forward + recomputed forward + backward) plus the LM head and the optimizer.

The second half of the same Table 5 (``seconds_seqsel``: sequence parallelism + selective activation
recomputation, the paper's own method, same t/p/b/v) is predicted with :data:`SEQSEL` options (the profile
re-runs the unfused attention core in the backward and shards norms/dropouts over ``T/t`` rows, the
backward re-gathers the column-parallel GEMMs' inputs: :meth:`planner.cost.ConfigCosts._sp_regather`) and
``recompute=False`` in the planner's configuration (:func:`predict_fixed`).

Nothing here is fitted to the tables: the device and cluster descriptions are the shipped ones.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from planner.analytic import analytic_profile
from planner.cluster import Cluster
from planner.device import DeviceSpec
from planner.model import ModelSpec
from planner.operators import OperatorOptions
from planner.placement import pipeline_outermost_order
from planner.profile import ModelProfile
from planner.request import Config, TrainingRequest
from planner.search import Candidate, Planner


@dataclass(frozen=True)
class PublishedRun:
    """One measured run: model shape, parallel sizes, global batch, measured TFLOP/s per GPU."""

    label: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    t: int
    p: int
    gpus: int
    batch: int
    tflops: float
    micro_batch: int | None = None
    #: model chunks per device (1: plain 1F1B; None: not stated) and Megatron's ``--DDP-impl`` of the run
    chunks: int | None = None
    ddp: str | None = None
    #: whether the run sent its pipeline tensors by scatter/gather (Megatron-LM's default; figure 18 turns it off)
    scatter_gather: bool = True

    @property
    def d(self) -> int:
        return self.gpus // (self.t * self.p)

    def flops(self) -> float:
        """Megatron's FLOPs per iteration with recomputation (SC'21 appendix)."""
        s, n, h, V, B = self.seq, self.layers, self.hidden, self.vocab, self.batch
        return 96 * B * s * n * h * h * (1 + s / (6 * h) + V / (16 * n * h))

    def measured_seconds(self) -> float:
        return self.flops() / (self.gpus * self.tflops * 1e12)

    def spec(self) -> ModelSpec:
        return ModelSpec(name=self.label, layers=self.layers, hidden=self.hidden, heads=self.heads,
                         seq=self.seq, vocab=self.vocab)


@dataclass
class RunPrediction:
    run: PublishedRun
    seconds: float
    micro_batch: int
    schedule: str
    chunks: int | None
    peak_memory: float
    fits: bool
    compute: str | None
    breakdown: dict[str, float]

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return self.seconds / self.run.measured_seconds() - 1


def load_tables(path: str | Path) -> dict:
    """The JSON of tests/data/megatron_tables.json."""
    return json.loads(Path(path).read_text())


def table_runs(data: dict, table: str) -> list[PublishedRun]:
    out = []
    for i, row in enumerate(data[table]):
        out.append(PublishedRun(
            label=f"{table}[{i}] {row['params_b']:g}B g={row['gpus']}", layers=row["layers"], hidden=row["hidden"],
            heads=row["heads"], seq=data["seq"], vocab=data["vocab"], t=row["t"], p=row["p"], gpus=row["gpus"],
            batch=row["batch"], tflops=row["tflops"], micro_batch=row.get("micro_batch"), chunks=row.get("chunks"),
            ddp=row.get("ddp")))
    return out


def run_cluster(base: Cluster, gpus: int) -> Cluster:
    """``base`` (a DGX cluster description) with enough nodes for ``gpus``."""
    return base.model_copy(update={"nodes": max(1, math.ceil(gpus / base.gpus_per_node)),
                                   "name": f"{base.name}-{gpus}"})


def run_profile(run: PublishedRun, device: DeviceSpec, micro_batches: tuple[int, ...],
                options: OperatorOptions | None = None, blocking_p2p: bool = True) -> ModelProfile:
    """The operator-model profile of the run's model; ``blocking_p2p``: Megatron 2021's runtime waited for
    its pipeline sends and synchronized the device (``planner.cost``, "Blocking p2p"). Megatron-LM 2021-22 sent
    its boundary tensors with the scatter/gather optimization (section 4.1; on by default:
    ``--scatter-gather-tensors-in-pipeline``, off under sequence parallelism), unless the run turned it off."""
    env: dict[str, str] = {"p2p_scatter_gather": "on"} if run.scatter_gather else {}
    if blocking_p2p:
        env["p2p"] = "blocking"
    if run.ddp == "torch":  # PyTorch DDP overlaps the gradient all-reduce with the backward (planner.cost)
        env["dp_allreduce"] = "overlapped"
    return spec_profile(run.spec(), device, micro_batches, run.t, dtype="fp16",
                        options=options or OperatorOptions(attention="unfused", dropout=True), environment=env)


def spec_profile(spec: ModelSpec, device: DeviceSpec, micro_batches: tuple[int, ...], t: int, dtype: str,
                 options: OperatorOptions, environment: dict[str, str] | None = None) -> ModelProfile:
    """The operator-model profile of any :class:`ModelSpec` (GPT or Llama-shaped) at tensor-parallel size
    ``t`` (and 1), with ``environment`` entries of the runtime added to the profile's (``p2p``,
    ``dp_allreduce``, ...: :mod:`planner.cost`)."""
    prof = analytic_profile(spec, device, dtype=dtype, micro_batches=micro_batches,
                            tensor_sizes=(1, t) if t > 1 else (1,), options=options)
    if not environment:
        return prof
    return prof.model_copy(update={"environment": {**prof.environment, **environment}})


def candidate_configs(run: PublishedRun, micro_batches: tuple[int, ...] = (1, 2, 4, 8),
                      max_chunks: int = 4) -> list[Config]:
    """The (b, schedule, v) choices of a run (module docstring): the stated ones where the run states them
    (``run.micro_batch``, ``run.chunks``), else every b of ``micro_batches`` dividing the per-replica batch and
    every v up to ``max_chunks`` dividing the layers per stage; ``max_chunks=1``: plain 1F1B only."""
    per_replica = run.batch // run.d
    bs = [run.micro_batch] if run.micro_batch else [b for b in micro_batches if per_replica % b == 0]
    out = []
    for b in bs:
        if run.chunks is not None:
            out.append(Config(tensor=run.t, pipeline=run.p, data=run.d, micro_batch=b, recompute=True,
                              schedule="interleaved" if run.chunks > 1 else "1f1b",
                              chunks=run.chunks if run.chunks > 1 else None))
            continue
        if run.p == 1:
            out.append(Config(tensor=run.t, pipeline=1, data=run.d, micro_batch=b, schedule="1f1b", recompute=True))
            continue
        m = per_replica // b
        per_stage = run.layers // run.p if run.layers % run.p == 0 else 0
        chunks = [v for v in range(2, max_chunks + 1) if per_stage and per_stage % v == 0 and m % run.p == 0]
        if not chunks:
            out.append(Config(tensor=run.t, pipeline=run.p, data=run.d, micro_batch=b, schedule="1f1b",
                              recompute=True))
        for v in chunks:
            out.append(Config(tensor=run.t, pipeline=run.p, data=run.d, micro_batch=b, schedule="interleaved",
                              recompute=True, chunks=v))
    return out


def predict_run(run: PublishedRun, base: Cluster, device: DeviceSpec,
                micro_batches: tuple[int, ...] = (1, 2, 4, 8), max_chunks: int = 4,
                options: OperatorOptions | None = None) -> RunPrediction:
    """The fastest predicted configuration of ``run`` among :func:`candidate_configs` that fits."""
    configs = candidate_configs(run, micro_batches, max_chunks)
    prof = run_profile(run, device, tuple(sorted({c.micro_batch for c in configs})), options)
    cl = run_cluster(base, run.gpus)
    req = TrainingRequest(global_batch=run.batch, gpus=run.gpus, max_tensor=max(run.t, 1))
    best: tuple[Candidate, Config] | None = None
    for cfg in configs:
        cand = predict_megatron(prof, cl, req, cfg)
        if cand.simulation is None:
            continue
        key = (not cand.fits, cand.iteration_time)
        if best is None or key < (not best[0].fits, best[0].iteration_time):
            best = (cand, cfg)
    if best is None:
        raise ValueError(f"{run.label}: no configuration could be simulated")
    cand, cfg = best
    return RunPrediction(run=run, seconds=cand.iteration_time, micro_batch=cfg.micro_batch, schedule=cfg.schedule,
                         chunks=cfg.chunks, peak_memory=max(cand.memory, default=0.0), fits=cand.fits,
                         compute=cand.costs.compute_source if cand.costs is not None else None,
                         breakdown=dict(cand.breakdown))


@dataclass
class RankingResult:
    figure: str
    claim: str
    batch: int
    #: ((t, p, d, b, v, sg), predicted seconds) in the order the figure lists them: each (t, p, d) of the claim
    #: with each of its (micro-batch b, model chunks v, scatter/gather sg) variants (v = 1: plain 1F1B)
    predicted: list[tuple[tuple[int, int, int, int, int, bool], float]]
    expect: str
    ok: bool
    #: the last configuration's time over the first's, less 1 (what the first gains over the last)
    gain: float
    #: the claim's ``trend`` ("gap_closes": ``gain`` must shrink from each batch size to the next), or None
    trend: str | None = None


def ranking_checks(data: dict, base: Cluster, device: DeviceSpec) -> list[RankingResult]:
    """Each ranking claim of ``data["rankings"]`` at each of its batch sizes: predict every (t, p, d) of the
    claim with each of its ``variants`` -- (micro-batch, model chunks) pairs, or (micro-batch, model chunks,
    scatter/gather) where a claim turns that off (figure 18), default the stated micro-batch with plain 1F1B
    (figures 11 and 13-15 compare parallel sizes, not schedules) -- with recomputation and Megatron's even
    split, and check the claim:

    * ``"best"``: the configuration ``best`` names (a prefix of (t, p, d, b, v)) is predicted fastest;
    * ``"order"``: predicted time grows along the listed configurations. Where the model gives
      ``layers_per_stage`` instead of ``layers`` (figure 11's weak scaling), it has that many layers per
      pipeline stage and every GPU the same work: time growing is throughput per GPU falling;
    * ``"trend": "gap_closes"``, beside either: the first configuration's gain over the last must shrink from
      each batch size to the next (figure 12: interleaving gains less as the batch grows; figure 11: the
      larger batch scales better); a batch where it does not is a violation too."""
    out = []
    for claim in data["rankings"]:
        m = claim["model"]
        # (micro-batch, chunks[, scatter/gather]): scatter/gather on unless the variant turns it off
        variants = [(x[0], x[1], x[2] if len(x) > 2 else True)
                    for x in claim.get("variants", [[claim["micro_batch"], 1]])]
        trend = claim.get("trend")
        rows = []
        for batch in claim["batches"]:
            preds = []
            for t, p, d in claim["configs"]:
                for b, v, sg in variants:
                    # weak scaling (figure 11): the model grows with the pipeline, ``layers_per_stage`` per stage
                    layers = m["layers"] if "layers" in m else m["layers_per_stage"] * p
                    run = PublishedRun(label=f"fig{claim['figure']} t={t} p={p} d={d} b={b} v={v} sg={sg} B={batch}",
                                       layers=layers, hidden=m["hidden"], heads=m["heads"], seq=data["seq"],
                                       vocab=data["vocab"], t=t, p=p, gpus=t * p * d, batch=batch, tflops=0.0,
                                       micro_batch=b, chunks=v, scatter_gather=sg)
                    preds.append(((t, p, d, b, v, sg), predict_run(run, base, device).seconds))
            times = [x[1] for x in preds]
            if claim["expect"] == "best":
                best = tuple(claim["best"])
                ok = preds[times.index(min(times))][0][:len(best)] == best
            else:
                ok = all(a < b for a, b in zip(times, times[1:], strict=False))
            rows.append(RankingResult(claim["figure"], claim["claim"], batch, preds, claim["expect"], ok,
                                      times[-1] / times[0] - 1, trend))
        if trend == "gap_closes":
            for prev, row in zip(rows, rows[1:], strict=False):
                row.ok = row.ok and row.gain < prev.gain
        out.extend(rows)
    return out


def median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def korthikanti_runs(data: dict) -> list[PublishedRun]:
    """The rows of tests/data/korthikanti_table5.json as runs (``tflops`` left 0: the measured seconds are
    ``data["runs"][i]["seconds_full"]`` with full recomputation and ``["seconds_seqsel"]`` with sequence
    parallelism + selective recomputation, the same t/p/b/v)."""
    return [PublishedRun(label=f"korthikanti {r['name']} g={r['gpus']}", layers=r["layers"], hidden=r["hidden"],
                         heads=r["heads"], seq=data["seq"], vocab=data["vocab"], t=r["t"], p=r["p"], gpus=r["gpus"],
                         batch=r["batch"], tflops=0.0, micro_batch=r["micro_batch"])
            for r in data["runs"]]


#: Korthikanti et al. 2022's own method (Table 5, ``seconds_seqsel``): sequence parallelism and selective
#: recomputation of the unfused attention core, fp16 with dropout (Megatron-LM of 2022)
SEQSEL = OperatorOptions(attention="unfused", dropout=True, sequence_parallel=True, recompute="selective")


def predict_fixed(run: PublishedRun, chunks: int, base: Cluster, device: DeviceSpec,
                  options: OperatorOptions | None = None, recompute: bool = True) -> Candidate:
    """The prediction of ``run`` in its stated configuration: micro-batch ``run.micro_batch``, interleaved
    with ``chunks`` model chunks where ``chunks > 1`` (else 1F1B), blocking p2p, full recomputation unless
    ``recompute=False`` (Table 5's ``seqsel`` rows: ``options=SEQSEL``, ``recompute=False``)."""
    b = run.micro_batch or 1
    prof = run_profile(run, device, (b,), options)
    return predict_stated(prof, run.t, run.p, run.gpus, run.batch, b, chunks, recompute, base, label=run.label)


def predict_stated(profile: ModelProfile, t: int, p: int, gpus: int, batch: int, micro_batch: int, chunks: int,
                   recompute: bool, base: Cluster, label: str = "run",
                   shard_optimizer: bool = False, check_memory: bool = True, expert: int = 1) -> Candidate:
    """The prediction of a run in its stated configuration on ``gpus`` GPUs of ``base`` (enough DGX nodes):
    ``t``, ``p``, ``d = gpus / (t p)``, micro-batch ``micro_batch``, interleaved with ``chunks`` model
    chunks where ``chunks > 1`` (else 1F1B), full recomputation or not, Megatron's even layer split
    (:func:`predict_megatron`); the runtime is the profile's environment. ``shard_optimizer``: the request's
    (a distributed optimizer keeps ``4 + 12/d`` bytes per parameter instead of mixed-precision Adam's 16 and
    steps its shard: :meth:`planner.request.TrainingRequest.state_bytes_per_param`).
    ``check_memory=False``: time the run even where the memory model says it does not fit (a published run
    did fit; the candidate's ``memory`` is still the model's figure, to compare with the device's).
    ``expert``: the expert-parallel size ``e`` of a mixture of experts (:mod:`planner.expert_parallel`; its
    experts split over ``e`` of the ``d`` data-parallel replicas, Megatron-Core's ``--expert-model-parallel-size``)."""
    d = gpus // (t * p)
    cfg = Config(tensor=t, pipeline=p, data=d, micro_batch=micro_batch, recompute=recompute,
                 schedule="interleaved" if chunks > 1 else "1f1b", chunks=chunks if chunks > 1 else None,
                 expert=expert)
    req = TrainingRequest(global_batch=batch, gpus=gpus, max_tensor=max(t, 1), shard_optimizer=shard_optimizer)
    cluster = run_cluster(base, gpus)
    if not check_memory:
        cluster = cluster.model_copy(update={"memory_bytes": 1 << 50})
    cand = predict_megatron(profile, cluster, req, cfg)
    if cand.simulation is None:
        raise ValueError(f"{label}: the stated configuration could not be simulated ({cand.reason})")
    return cand


def megatron_split(layers: int, stages: int) -> list[tuple[int, int]]:
    """Megatron-LM's partition (``ParallelTransformer``, 2021-22: ``num_layers // pipeline size`` layers per
    stage, or per model chunk with the interleaved schedule): ``layers`` transformer layers split evenly
    over ``stages`` (model order), the embedding on the first stage and the LM head on the last, as bounds
    over the profile's layers ``[embedding, block 0 .. block layers-1, lm_head]``."""
    if layers % stages:
        raise ValueError(f"stages: {layers} layers do not split evenly over {stages} stages (Megatron asserts so)")
    per = layers // stages
    cuts = [0] + [1 + k * per for k in range(1, stages)] + [layers + 2]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


class _MegatronSplit(Planner):
    """The planner with Megatron's even layer split instead of a time-balanced partition (what the measured
    runs did: the first stage also holds the embedding, the last the LM head and loss, so the last stage is
    the slowest and the pipeline runs at its pace)."""

    def partition(self, stages: int, samples: float, recompute: bool) -> list[tuple[int, int]] | None:
        n = sum(1 for lay in self.profile.layers if lay.kind == "transformer")
        return megatron_split(n, stages) if n % stages == 0 else None


def predict_megatron(profile: ModelProfile, cluster: Cluster, request: TrainingRequest, config: Config) -> Candidate:
    """:func:`planner.search.predict` with Megatron's even layer split (:func:`megatron_split`) and its default
    rank order, the pipeline outermost (``initialize_model_parallel`` of the 2021 code, which had no other, and
    Megatron-Core's and NeMo's default since: :func:`planner.placement.pipeline_outermost_order`)."""
    config = config.model_copy(update={"order": pipeline_outermost_order(config.pipeline, config.data)})
    planner = _MegatronSplit(profile, cluster, request)
    cand, costs = planner.prepare(config)
    if costs is None:
        return cand
    return planner.explain(planner.evaluate(cand, costs))


# ---- measured DGX H100 runs (NVIDIA's published BF16 recipes; tests/data/h100_public_runs.json) ----------------


@dataclass(frozen=True)
class PublicRun:
    """One published measured run of a dense model on DGX H100 (tests/data/h100_public_runs.json): the model's
    shape and recipe (sequence parallelism, attention kernel, recomputation, TP overlap, distributed
    optimizer) and one row of the table (GPUs, GBS, MBS, TP, PP, VP, measured step time and throughput)."""

    model: str
    spec: ModelSpec
    recipe: dict
    gpus: int
    batch: int
    micro_batch: int
    t: int
    p: int
    chunks: int
    step_time_s: float
    tokens_per_s: float
    mfu_percent: float
    model_flops_per_sample: float
    url: str

    @property
    def label(self) -> str:
        return f"{self.model} g={self.gpus}"

    @property
    def d(self) -> int:
        return self.gpus // (self.t * self.p)

    def measured_seconds(self) -> float:
        """Iteration time from the published throughput: ``GBS s / (tokens/s/GPU * GPUs)`` (the tables give
        tokens/s over all GPUs, so that is ``GBS s / tokens_per_s``)."""
        return self.batch * self.spec.seq / self.tokens_per_s

    def options(self) -> OperatorOptions:
        """The operator options of the recipe: bf16, the flash kernel (causal) of the stated implementation
        (``attention_impl``: FlashAttention-2 where the recipe turns cuDNN's off, cuDNN's fused attention where
        Transformer Engine picks it), dropout as trained, sequence parallelism, Megatron's gradient-accumulation
        fusion, selective recomputation as stated."""
        r = self.recipe
        return OperatorOptions(attention=r["attention"], attention_impl=r.get("attention_impl", "flash2"),
                               causal=True, dropout=bool(r["dropout"]),
                               sequence_parallel=bool(r["sequence_parallel"]), dtype="bf16",
                               grad_accumulation="fused" if r.get("gradient_accumulation_fusion") else "separate",
                               recompute="selective" if r["recompute"] == "selective" else "none")

    def environment(self) -> dict[str, str]:
        """The runtime of the recipe for :mod:`planner.cost` (:func:`recipe_environment`)."""
        return recipe_environment(self.recipe)

    def shards_optimizer(self) -> bool:
        """Whether the recipe's distributed optimizer shards the fp32 master weights and Adam moments over the
        ``d`` data-parallel ranks (the request's ``shard_optimizer``: ``4 + 12/d`` bytes per parameter)."""
        return bool(self.recipe.get("distributed_optimizer"))


def recipe_environment(recipe: dict) -> dict[str, str]:
    """The runtime of a Megatron-Core recipe for :mod:`planner.cost`: the data-parallel gradient reduction overlapped
    with the backward (the distributed optimizer's ``overlap_grad_sync``: ``dp_allreduce = overlapped``, which the
    cost model applies to one-stage pipelines only) and the pipeline sends as the recipe posts them. With
    ``batch_p2p_comm`` and without ``overlap_p2p_comm`` Megatron-Core's ``p2p_communication._communicate`` waits on the
    batched requests (``if config.batch_p2p_comm: assert wait_on_reqs``; ``req.wait()``) and then synchronizes the
    device (``batch_p2p_sync``, default True: ``torch.cuda.synchronize()``): ``p2p = blocking``, as Megatron-LM 2021
    ran. With ``overlap_p2p_comm`` (the interleaved schedule's default) the sends are posted and waited on only before
    the compute that needs them: non-blocking. The recipe's tensor-parallel communication overlap
    (``recipe["tp_comm_overlap"]``, Transformer Engine's userbuffers) is not modelled: every tensor-parallel
    collective is costed on the critical path, as Megatron-LM runs them (:func:`tp_collective_seconds` says how much
    that is)."""
    env = {"dp_allreduce": "overlapped"}
    if recipe.get("batch_p2p_comm") and not recipe.get("overlap_p2p_comm"):
        env["p2p"] = "blocking"
    return env


def public_runs(data: dict) -> list[PublicRun]:
    """The rows of tests/data/h100_public_runs.json as :class:`PublicRun` (CP = 1, no FSDP, no EP: the file
    holds only such rows; a row that is not is refused)."""
    out = []
    for key, m in data["models"].items():
        shape = {k: v for k, v in m["shape"].items() if not k.endswith("_note")}
        spec = ModelSpec(name=key, source=m["url"], **shape)
        for r in m["rows"]:
            if r.get("cp", 1) != 1 or r.get("fsdp", 0) or r.get("ep", 1) != 1:
                raise ValueError(f"{key} g={r['gpus']}: CP/FSDP/EP rows cannot be expressed by the planner")
            out.append(PublicRun(model=key, spec=spec, recipe=m["recipe"], gpus=r["gpus"], batch=r["gbs"],
                                 micro_batch=r["mbs"], t=r["tp"], p=r["pp"], chunks=r.get("vp", 1),
                                 step_time_s=r["step_time_s"], tokens_per_s=r["tokens_per_s"],
                                 mfu_percent=r["mfu_percent"], model_flops_per_sample=m["model_flops_per_sample"],
                                 url=m["url"]))
    return out


def predict_public(run: PublicRun, base: Cluster, device: DeviceSpec, options: OperatorOptions | None = None,
                   environment: dict[str, str] | None = None) -> Candidate:
    """The prediction of ``run`` in its stated configuration (t, p, VP chunks, MBS, the recipe's kernels and
    runtime: :meth:`PublicRun.options`, :meth:`PublicRun.environment`) on DGX H100 nodes, no full
    recomputation, Megatron's even layer split; timed even where the memory model says it does not fit
    (the run did: compare ``max(candidate.memory)`` with the device's memory). ``environment``: entries
    that replace the recipe's runtime (what-if analyses, e.g. ``{"p2p": "blocking"}``)."""
    prof = spec_profile(run.spec, device, (run.micro_batch,), run.t, "bf16", options or run.options(),
                        {**run.environment(), **(environment or {})})
    return predict_stated(prof, run.t, run.p, run.gpus, run.batch, run.micro_batch, run.chunks, False, base,
                          label=run.label, shard_optimizer=run.shards_optimizer(), check_memory=False)


def tp_collective_seconds(cand: Candidate) -> float:
    """Seconds per iteration the tensor-parallel collectives add to the compute stream of the pipeline device
    that has the most of them, as the cost model charges them (:class:`planner.cost.ConfigCosts`, all on the
    critical path): per micro-batch and stage it holds, the transformer layers' collectives of the forward
    (``_tp_comm``) and of the backward (twice with full recomputation), the embedding's and the LM head's
    (``_tp_edges``) and the sequence-parallel re-gathers of the backward (``_sp_regather``), times the
    micro-batches per replica. An upper bound on what an overlap of those collectives with the GEMMs (the
    recipes' ``tp_comm_overlap``) could take off the iteration."""
    costs = cand.costs
    if costs is None:
        raise ValueError("tp_collective_seconds: the candidate was not costed")
    return max(costs.tp_seconds(d) for d in range(costs.schedule.devices)) * cand.microbatches


@dataclass(frozen=True)
class YearApart:
    """One model run twice on the same machine (Selene, DGX A100 80GB) with the same pipeline -- the same t,
    p, model chunks v and micro-batch b -- a year apart: by Megatron-LM of 2021 (SC'21 Table 1 or 2) and of
    2022 (Korthikanti et al. Table 5, full recomputation, as the 2021 runs). Only the data-parallel width d
    and the number of micro-batches per pipeline N differ (the pairs are found by :func:`year_apart`).

    ``per_microbatch_*``: the measured iteration time over ``N + (p - 1) / v``, the micro-batch slots of an
    interleaved (v > 1) or 1F1B (v = 1) pipeline with its bubble (Narayanan et al. SC'21, sections 2.2.1-
    2.2.2: bubble fraction ``(p - 1) / (v N)``): the time one micro-batch occupies a device. ``dp_*``: the
    predicted exposed data-parallel all-reduce and optimizer step of that run (what d adds beyond the
    pipeline), so ``ratio_net`` compares the pipelines without them."""

    label: str
    old: PublishedRun
    new: PublishedRun
    new_seconds: float
    chunks: int
    dp_old: float
    dp_new: float

    def _per_slot(self, run: PublishedRun, seconds: float) -> float:
        """``seconds`` over ``run``'s micro-batch slots ``N + (p - 1) / v``."""
        n = run.batch / (run.d * (run.micro_batch or 1))
        return seconds / (n + (run.p - 1) / self.chunks)

    @property
    def per_microbatch_old(self) -> float:
        return self._per_slot(self.old, self.old.measured_seconds())

    @property
    def per_microbatch_new(self) -> float:
        return self._per_slot(self.new, self.new_seconds)

    @property
    def ratio(self) -> float:
        """How much longer a micro-batch took in 2021 than in 2022 (measured, bubble accounted)."""
        return self.per_microbatch_old / self.per_microbatch_new

    @property
    def ratio_net(self) -> float:
        """:attr:`ratio` with each run's predicted exposed data-parallel all-reduce and step taken out."""
        return (self._per_slot(self.old, self.old.measured_seconds() - self.dp_old)
                / self._per_slot(self.new, self.new_seconds - self.dp_new))


def _dp_and_step(breakdown: dict[str, float]) -> float:
    """The predicted exposed data-parallel all-reduce and optimizer step of a candidate's breakdown."""
    return breakdown.get("allreduce_exposed", 0.0) + breakdown.get("step", 0.0)


def year_apart(tables: dict, korthikanti: dict, base: Cluster, device: DeviceSpec,
               options: OperatorOptions | None = None,
               predicted: dict[str, RunPrediction] | None = None) -> list[YearApart]:
    """Every (SC'21 Table 1/2 row, Korthikanti Table 5 row) pair of the same model shape, t, p, v and b
    (:class:`YearApart`): 530B at t = 8, p = 35, v = 3, b = 1 (Table 2, three d) and 1T at t = 8, p = 64,
    v = 1, b = 1 (Table 1). A physics model of one software stack cannot be within a few percent of both
    halves of a pair whose measured per-micro-batch times differ by more than that. ``predicted``: the 2021
    rows' :func:`predict_run` results by run label, where the caller has them already (with the same
    ``base``, ``device`` and ``options``); a row not in it is predicted here."""
    out = []
    news = list(zip(korthikanti_runs(korthikanti), korthikanti["runs"], strict=True))
    dp_new: dict[int, float] = {}  # per 2022 run, predicted once however many 2021 rows share its pipeline
    for table in ("table1", "table2"):
        for run, row in zip(table_runs(tables, table), tables[table], strict=True):
            for i, (new, krow) in enumerate(news):
                same = ((run.layers, run.hidden, run.heads, run.t, run.p, run.micro_batch, row.get("chunks"))
                        == (new.layers, new.hidden, new.heads, new.t, new.p, new.micro_batch, krow["chunks"]))
                if not same:
                    continue
                if i not in dp_new:
                    dp_new[i] = _dp_and_step(dict(predict_fixed(new, krow["chunks"], base, device, options).breakdown))
                old_pred = (predicted or {}).get(run.label) or predict_run(run, base, device, options=options)
                out.append(YearApart(f"{krow['name']} t={run.t} p={run.p} v={krow['chunks']} b={run.micro_batch}",
                                     run, new, krow["seconds_full"], krow["chunks"], _dp_and_step(old_pred.breakdown),
                                     dp_new[i]))
    return out
