"""Emulated-compute mode (``pipeplan run --emulate profile.json``): checks the simulator against a real run
with many processes on few cores.

Instead of running the model, every compute action (F/B/I/W and the optimizer step) waits for its
duration under :class:`planner.cost.ConfigCosts` for the plan's configuration and a cluster file --
``time.sleep``, used only here, and every output says ``"emulated": true``. Communication (:attr:`Emulator.comm`):

* ``"real"`` -- when the cluster's links are this machine's: no cluster given (:data:`LOCAL_CLUSTER`, gloo
  over loopback) or a cluster measured here (``cluster.host``: :func:`profiler.local_cluster.measured_cluster`).
  Activations and gradients are ``uint8`` tensors of the profile's byte counts (``output_bytes_per_sample *
  samples / t``), and every stage all-reduce moves the stage's ``param_bytes / t``: what the prediction costs
  with those links is what the run moves.
* ``"emulated"`` -- any other cluster (a GPU cluster, or a hand-written one such as
  ``tests/pipedream_front.small_memory_cluster``): its links are not the ones this machine's gloo runs
  on (issue 11: a uniform 1f1b D=2 W=2 plan all-reducing 160 MB per stage ran at 4.18x its prediction), so
  communication waits for its predicted duration too, with the simulator's rules
  (:mod:`planner.simulate`): a message is a one-element token carrying its arrival time -- the end of the
  producing action or of the device's previous send, whichever is later, plus ``costs.p2p`` -- and the
  receiver waits until then; an all-reduce is a MAX all-reduce of the holders' post times (a post is at the
  later of the device's compute and send streams) and ends ``costs.allreduce`` after the latest post or the
  device's previous all-reduce; STEP waits for the device's last send and all-reduce. The times are
  ``time.perf_counter`` (``CLOCK_MONOTONIC``), shared by the processes of one machine: a run whose ranks are
  on several hosts falls back to ``"real"`` (:meth:`Emulator.use_real_comm`).

:meth:`Emulator.predict` is the simulator's prediction with the very same costs, so predicted and measured
compare field by field.
"""

from __future__ import annotations

import time
from typing import Any

from planner.cluster import Cluster, Link, load_cluster
from planner.cost import ConfigCosts
from planner.dtypes import DTYPE_BYTES
from planner.expert_parallel import expert_error, expert_view
from planner.profile import ModelProfile, load_profile
from planner.request import TrainingRequest
from planner.schedules.ir import RECV_F, Schedule
from planner.simulate import simulate

#: default for emulated runs on one machine: gloo over loopback (latency ~50 us, a few GB/s)
LOCAL_CLUSTER = Cluster(name="local-gloo", nodes=1, gpus_per_node=1024, device="cpu-emulated",
                        memory_bytes=2**40, peak_flops=1e12, intra=Link(alpha=5e-5, beta=5e-10),
                        inter=Link(alpha=5e-5, beta=5e-10), memory_bandwidth=1e12)


def executor_request(plan: Any) -> TrainingRequest:
    """The request the executor's own run of ``plan`` answers: its global batch, and the model state our
    executor keeps per parameter -- a weight and a gradient in the run's dtype, no optimizer state (plain SGD,
    :mod:`executor.interpreter`) -- where the planner's default is mixed-precision Adam's 16 bytes (ZeRO 3.1).
    The optimizer step reads and writes that state once (:meth:`planner.cost.ConfigCosts.step`): 16 bytes
    per parameter in float32 (:class:`executor.sgd.SGD`: the weight and gradient read, the weight written, 12),
    where 16-byte Adam state would cost 32."""
    el = DTYPE_BYTES.get(str(getattr(plan, "dtype", "float32")), 4)
    return TrainingRequest(global_batch=plan.spec.global_batch, bytes_per_param=2.0 * el)


class Emulator:
    def __init__(self, plan: Any, compute_schedule: Schedule, profile: ModelProfile | str,
                 cluster: Cluster | str | None = None, emulated: bool = True) -> None:
        """``emulated`` false: the costs of the real run of ``plan`` (its compute takes core time on a
        shared CPU host, ``cluster.host``), for :meth:`predict` only."""
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.cluster = load_cluster(cluster) if isinstance(cluster, str) else (cluster or LOCAL_CLUSTER)
        self.plan = plan
        self.schedule = compute_schedule
        config = plan.spec.config
        request = executor_request(plan)
        self.bounds = plan.bounds(compute_schedule.stages, len(self.profile.layers))
        if (why := expert_error(self.profile, config.expert)) is not None:
            raise ValueError(why)
        # expert parallelism: what one EP rank holds and runs (its all-to-alls are in F and B, waited for as compute)
        self.costs = ConfigCosts(expert_view(self.profile, config.expert), self.cluster, request, config,
                                 compute_schedule, self.bounds, emulated=emulated)
        if self.costs.power is not None:  # a power-limited GPU: compute at the clock the step holds, as planned
            self.costs.hold_clock(simulate(compute_schedule, self.costs),
                                  lambda: simulate(compute_schedule, self.costs))
        self.slept = 0.0
        #: "real" or "emulated" communication (module docstring)
        self.comm = "real" if cluster is None or self.cluster.host is not None else "emulated"

    def use_real_comm(self, reason: str) -> None:
        """Move real messages (the ranks share no clock, e.g. several hosts): ``comm_note`` says why."""
        self.comm = "real"
        self.comm_note = reason

    def wait_until(self, at: float) -> None:
        """Emulated communication: wait until ``at`` (``time.perf_counter``), the predicted arrival/end."""
        self._sleep(at - time.perf_counter())

    def p2p_time(self, send: Any, device: int) -> float:
        """Predicted duration of the lowered ``send`` action (SEND_F/SEND_B) of ``device``: the simulator's
        ``costs.p2p`` with the same arguments."""
        return self.costs.p2p(send.kind, send.stage, send.span, device, send.peer)

    def allreduce_time(self, stage: int, replica: int, device: int) -> float:
        return self.costs.allreduce(stage, replica, device)

    def _sleep(self, seconds: float) -> None:
        """The only ``time.sleep`` of the executor: emulated compute."""
        if seconds > 0:
            time.sleep(seconds)
            self.slept += seconds

    def sleep_compute(self, kind: str, stage: int, span: int, device: int) -> None:
        self._sleep(self.costs.work(kind, stage, span))  # the executor's own overhead is real here

    def sleep_step(self, device: int) -> None:
        self._sleep(self.costs.step_work(device))

    def message_bytes(self, kind: str, stage: int, span: int) -> int:
        """Size of the message a RECV_F (activation into ``stage``) or RECV_B (gradient of ``stage``'s
        output) receives: what each tensor-parallel rank sends (:meth:`planner.cost.ConfigCosts.p2p_bytes`)."""
        return max(1, int(self.costs.p2p_bytes(stage - 1 if kind == RECV_F else stage, span)))

    def allreduce_elements(self, stage: int) -> int:
        """Float32 elements of the stage all-reduce real communication moves: the stage's gradients over t, less a
        mixture of experts' experts under expert parallelism (:meth:`expert_elements`)."""
        info = self.costs.stages[stage]
        experts = info.expert_param_bytes if self.costs.expert > 1 else 0.0
        return max(1, int((info.param_bytes - experts) / self.costs.t / 4))

    def expert_elements(self, stage: int) -> int:
        """Float32 elements of the experts' gradients real communication all-reduces over their W/e replicas
        (:mod:`planner.expert_parallel`); 0 without expert parallelism."""
        if self.costs.expert == 1:
            return 0
        return int(self.costs.stages[stage].expert_param_bytes / self.costs.t / 4)

    def predict(self) -> dict[str, Any]:
        res = simulate(self.schedule, self.costs)
        out = res.to_dict()
        out["iteration_time"] = out.pop("makespan")
        return out


def uniform_profile(layers: int, fwd: float, bwd: float, out_bytes: int = 4096, param_bytes: int = 4096,
                    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)) -> ModelProfile:
    """A profile of ``layers`` identical layers (fwd/bwd seconds per sample, linear in b): emulation tests
    and benchmarks."""
    from planner.profile import LayerProfile

    lays = [LayerProfile(name=f"layer.{i}", kind="transformer",
                         fwd_time={b: fwd * b for b in micro_batch_sizes},
                         bwd_time={b: bwd * b for b in micro_batch_sizes},
                         recompute_time={b: (fwd + bwd) * b for b in micro_batch_sizes},
                         output_bytes_per_sample=out_bytes, stashed_bytes_per_sample=out_bytes,
                         input_bytes_per_sample=out_bytes, params=param_bytes // 4, param_bytes=param_bytes)
            for i in range(layers)]
    return ModelProfile(name="uniform", layers=lays, device="emulated", dtype="float32", source="analytical",
                        notes="synthetic profile for emulated runs")
