"""Cluster description: nodes x GPUs, device memory and speed, and the links as alpha-beta models.

The alpha-beta (latency-bandwidth) model of a message of L bytes is ``alpha + beta * L`` (Chimera 3.4,
"Latency-Bandwidth (alpha-beta) cost model"). ``intra`` is the link between GPUs of one node (NVLink),
``inter`` between nodes (InfiniBand, Aries); both per GPU, per direction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from planner.jsondoc import refuse_duplicate_keys
from planner.limits import (
    MAX_BANDWIDTH,
    MAX_COUNT,
    MAX_FLOPS,
    MAX_GPUS_PER_NODE,
    MAX_LINK_SECONDS,
    MAX_MEMORY_BYTES,
    MAX_NODES,
    MAX_SECONDS,
    MIN_BANDWIDTH,
    MIN_FLOPS,
)

#: a time in seconds: finite, at least 0, at most MAX_SECONDS
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
#: a calibration's compute_scale and link_scale stay within [1 / SCALE_BOUND, SCALE_BOUND] (planner.calibrate's
#: docstring says why); a stored or hand-written cluster is held to the same range (the fit's bound, rounding aside)
SCALE_BOUND = 4.0


def _in_scale_range(value: float) -> float:
    if not (1 - 1e-9) / SCALE_BOUND <= value <= SCALE_BOUND * (1 + 1e-9):  # (the fit's bound, rounding aside)
        raise ValueError(f"a correction factor within [{1 / SCALE_BOUND:g}, {SCALE_BOUND:g}] (the physical range "
                         f"planner.calibrate fits in), got {value:g}")
    return value


#: a correction factor of a calibration: finite, within [1 / SCALE_BOUND, SCALE_BOUND]
Scale = Annotated[float, Field(allow_inf_nan=False), AfterValidator(_in_scale_range)]

#: a host's measured slowdown and cache inflation: a process slowed more than this by sharing cores is no
#: measurement of a host the executor runs on (measured 1-2.5 here, profiler.local_cluster)
MAX_HOST_FACTOR = 1000.0


class Link(BaseModel):
    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(ge=0, le=MAX_LINK_SECONDS, allow_inf_nan=False, description="latency, seconds")
    beta: float = Field(ge=0, le=MAX_LINK_SECONDS, allow_inf_nan=False, description="seconds per byte")

    def time(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes if nbytes > 0 else 0.0


class ExecutorOverhead(BaseModel):
    """Host time our executor spends per action of each kind beyond the work itself (Python dispatch, the
    posting of p2p groups, autograd bookkeeping), seconds. Measured by ``pipeplan profile-links`` on the
    machine it runs on (:mod:`profiler.overhead`: actions that do nearly nothing, timed per kind); costed
    per action by :mod:`planner.cost` so that real-compute runs are predicted too (issue 11 item 4)."""

    model_config = ConfigDict(extra="forbid")

    compute: Seconds = Field(default=0.0, description="per F/B/I/W action")
    send: Seconds = Field(default=0.0, description="per SEND_F/SEND_B (posting)")
    recv: Seconds = Field(default=0.0, description="per RECV_F/RECV_B (posting, wait)")
    allreduce: Seconds = Field(default=0.0, description="per ALLREDUCE action")
    step: Seconds = Field(default=0.0, description="per STEP (the iteration's end)")
    #: zero-bubble's split backward (:mod:`executor.split_backward`), per layer of a stage it splits: the graph
    #: walk its ``I`` makes and the backward call per join its ``W`` makes, beyond ``compute``
    split_input: Seconds = Field(default=0.0,
                               description="per layer of the stage, added to an I action (split backward)")
    split_weight: Seconds = Field(default=0.0,
                                description="per layer of the stage, added to a W action (split backward)")
    #: the same, measured with compute emulated (``pipeplan run --emulate``): an emulated action sleeps instead of
    #: running the stage module and autograd, so its overhead is the sleep's overshoot and the walker's own
    #: bookkeeping, not the real action's (:func:`profiler.overhead.measure_overhead` with ``emulated``)
    emulated: ExecutorOverhead | None = None
    source: str = ""


class AllReduceFit(BaseModel):
    """A measured all-reduce of ``ranks`` processes as a whole: ``alpha + beta * L`` for the collective
    (``pipeplan profile-links``' all-reduce fit, :mod:`profiler.links`). For all-reduces of up to that
    many ranks on one node (data-parallel gradients, tensor-parallel activations) :mod:`planner.cost` uses
    it instead of Chimera 3.4's algorithm costs from the p2p link: on a shared CPU a gloo collective's
    latency is not ``2 log2(r)`` p2p latencies (issue 13: 1.7-3.4 ms measured with 4 processes), and a
    smaller group's collective runs while the other groups run theirs on the same cores (each tensor or
    data group of a job reduces at the same time), so it costs about what the whole group's does (issue
    13: a t=2, W=2 gpt-tiny job's forward took 30 ms, 8 all-reduces of 512 KiB at the fit's 2.1+ ms)."""

    model_config = ConfigDict(extra="forbid")

    ranks: int = Field(ge=2, le=MAX_NODES * MAX_GPUS_PER_NODE)
    link: Link


class HostCpu(BaseModel):
    """A node whose devices are processes sharing the host's CPU cores (the local CPU cluster), as opposed to
    devices of their own (GPUs). Used by :mod:`planner.cost` (``host_share``, issue 11 item 4, issue 13):

    * the node's processes run their compute, the executor's Python and the optimizer on ``effective_cores``
      cores: while ``k`` of them have work at once, each runs at ``min(1, effective_cores / k)`` of its own
      speed (the kernel's fair share among runnable processes, Linux CFS; processor sharing, Kleinrock 1967);
    * ``comm_overlaps_compute`` false: gloo moves messages with memory copies on those same cores, so a
      process waiting in a collective or a message holds back no core but the copies themselves take core
      time (their measured costs, :class:`AllReduceFit` and the links, are taken as they were measured).

    ``effective_cores`` is measured (:func:`profiler.local_cluster.measure_host`): ``processes`` copies of
    one compute loop run at once, ``slowdown`` their wall time per second of CPU time; ``processes /
    slowdown`` cores' worth of compute is what they got, which includes what else the machine was running
    then (a shared machine's load). The profile's times are core time on the CPU (:mod:`profiler.timing`),
    so the load is counted here once.

    ``cpu_inflation``: the same measurement's CPU time together over the loop's CPU time alone. Processes that
    outnumber the cores take turns on them (a time slice of a few milliseconds, Linux CFS/EEVDF), and each turn
    starts with the caches holding the other process's data, so the same work costs more core time (Mogul and
    Borg, "The effect of context switches on cache performance", ASPLOS 1991). :mod:`planner.cost` stretches
    core time by it in proportion to how far the sharing goes (``host_inflation``). 1 when not measured."""

    model_config = ConfigDict(extra="forbid")

    cores: int = Field(ge=1, le=MAX_COUNT, description="CPU cores of the host (os.cpu_count())")
    effective_cores: float = Field(ge=0.01, le=MAX_COUNT, allow_inf_nan=False,
                                   description="cores' worth of compute the node's processes get at once (at "
                                               "most cores; at least 1% of one)")
    processes: int = Field(default=0, ge=0, le=MAX_COUNT,
                           description="processes the effective cores were measured with")
    slowdown: float = Field(default=1.0, gt=0, le=MAX_HOST_FACTOR, allow_inf_nan=False,
                            description="measured: wall time per CPU second of a loop, `processes` at once")
    cpu_inflation: float = Field(default=1.0, ge=1, le=MAX_HOST_FACTOR, allow_inf_nan=False,
                                 description="measured: CPU time of that loop, `processes` at once, over its CPU "
                                             "time alone (processes taking turns on a core refill its caches)")
    comm_overlaps_compute: bool = False
    source: str = Field(default="", max_length=2_000)

    @model_validator(mode="after")
    def _at_most_cores(self) -> HostCpu:
        if self.effective_cores > self.cores:
            raise ValueError(f"effective_cores: {self.effective_cores:g} is more than the host's {self.cores} cores "
                             "(the processes share them: at most cores)")
        return self


#: a factor :class:`Calibration` fits (:data:`planner.calibrate.FACTORS`)
Factor = Literal["compute_scale", "action_overhead", "link_scale"]


class Calibration(BaseModel):
    """Correction factors fitted to a cluster's finished jobs (:mod:`planner.calibrate`): compute times
    (F/B/I/W, optimizer step) are multiplied by ``compute_scale``, communication times (p2p, all-reduce,
    tensor-parallel collectives) by ``link_scale``, and every action costs ``action_overhead`` seconds more.
    The identity (1, 1, 0) changes nothing."""

    model_config = ConfigDict(extra="forbid")

    compute_scale: Scale = 1.0
    link_scale: Scale = 1.0
    action_overhead: Seconds = Field(default=0.0, description="seconds per action")
    jobs: int = Field(default=0, ge=0, le=2**31 - 1, description="finished jobs it was fitted to (a 32-bit count: "
                                                                 "the database stores it as one)")
    fitted: list[Factor] = Field(default_factory=list, max_length=3, description="the factors the jobs determined")
    at_bound: dict[Factor, Annotated[float, Field(allow_inf_nan=False)]] = Field(
        default_factory=dict, description="the factors the fit left at a bound of their physical range, with "
        "that bound (planner.calibrate): the jobs asked for more, so the model and the measurements disagree for "
        "a reason these factors do not describe")
    error_before: float | None = Field(default=None, ge=0, allow_inf_nan=False,
                                       description="median |relative error| before the fit")
    error_after: float | None = Field(default=None, ge=0, allow_inf_nan=False,
                                      description="median |relative error| after the fit")
    notes: str = Field(default="", max_length=20_000)


def node_layout(processes: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, processes per node) for ``processes`` on nodes of ``gpus_per_node`` devices: the fewest nodes, at
    least ``ceil(P / G)``, over which P divides evenly (a launcher -- torchrun, ``pipeplan run`` under Slurm --
    starts the same number on every node: 6 on 4-GPU nodes is 2 x 3, 5 is 5 x 1). One rule for the Slurm
    script and the exported launch lines."""
    if gpus_per_node < 1 or processes < 1:
        raise ValueError(f"node layout: needs processes and gpus_per_node >= 1, got {processes} and {gpus_per_node}")
    nodes = -(-processes // gpus_per_node)
    while processes % nodes:
        nodes += 1
    return nodes, processes // nodes


def calibrated_from(jobs: int) -> str:
    """How a cluster's label names its calibration (api/cluster_versions.py, ``pipeplan calibrate``):
    "calibrated from 3 jobs", or "calibrated" when the number of jobs is not known (0)."""
    return f"calibrated from {jobs} job{'' if jobs == 1 else 's'}" if jobs else "calibrated"


class Cluster(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    # strict: ``true`` or ``"8"`` is not a count (JSON's booleans and strings are not taken as numbers here)
    nodes: int = Field(gt=0, le=MAX_NODES, strict=True)
    gpus_per_node: int = Field(gt=0, le=MAX_GPUS_PER_NODE, strict=True)
    device: str = Field(description="device name, e.g. 'A100-SXM4-80GB'")
    memory_bytes: int = Field(gt=0, le=MAX_MEMORY_BYTES, strict=True, description="memory per GPU (at most 1 PiB)")
    peak_flops: float = Field(ge=MIN_FLOPS, le=MAX_FLOPS, allow_inf_nan=False,
                              description="peak FLOP/s per GPU at the dtype used")
    intra: Link
    inter: Link
    memory_bandwidth: float = Field(default=1.5e12, ge=MIN_BANDWIDTH, le=MAX_BANDWIDTH, allow_inf_nan=False,
                                    description="device memory bandwidth, bytes/s (optimizer step)")
    allreduce: Literal["rabenseifner", "ring"] = "rabenseifner"
    notes: str = ""
    executor: ExecutorOverhead | None = Field(default=None, description="measured per-action executor overhead")
    allreduce_fit: AllReduceFit | None = Field(default=None, description="measured all-reduce of one node")
    calibration: Calibration | None = Field(default=None, description="factors fitted to finished jobs")
    host: HostCpu | None = Field(default=None, description="devices are processes sharing these CPU cores")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def content_hash(self) -> str:
        import hashlib
        import json

        body = self.model_dump(mode="json")
        # absent = as before these fields existed: same hash
        for key in ("executor", "calibration", "allreduce_fit", "host"):
            if body.get(key) is None:
                body.pop(key, None)
        if body.get("executor") is not None and body["executor"].get("emulated") is None:
            body["executor"].pop("emulated", None)  # measured before it existed: same hash
        if body.get("calibration") is not None and not body["calibration"].get("at_bound"):
            body["calibration"].pop("at_bound", None)  # calibrated before it existed, or nothing at a bound
        if body.get("host") is not None and body["host"].get("cpu_inflation") == 1.0:
            body["host"].pop("cpu_inflation")  # a host measured before it existed: same hash
        data = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(data.encode()).hexdigest()


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a cluster description (JSON; a key given twice in one object is refused)."""
    text = Path(path).read_text()
    refuse_duplicate_keys(text)
    return Cluster.model_validate_json(text)


def save_cluster(cluster: Cluster, path: str | Path) -> None:
    Path(path).write_text(cluster.model_dump_json(indent=2) + "\n")
