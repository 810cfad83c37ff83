"""The setting where PipeDream's uneven replication wins (issue 17), shared by the tests and the figures:
a model whose first layer dominates the compute (a convolutional front, as in PipeDream's VGG-16 results,
section 5.2) and whose later layers hold the weights (VGG-16's fully connected layers), on 4 devices whose
memory cannot hold the later layers' state on one device. A hand-built profile; times in seconds."""

from __future__ import annotations

from planner.cluster import Cluster
from planner.profile import LayerProfile, ModelProfile
from planner.request import TrainingRequest

MB = 2**20


def front_heavy_profile() -> ModelProfile:
    """Layer 0: 30 ms forward + 60 ms backward per sample and few weights; layers 1-4: 5 + 10 ms each and
    20 M parameters each (320 MB of state at 16 bytes per parameter)."""
    def layer(name: str, f: float, params: int) -> LayerProfile:
        return LayerProfile(name=name, kind="block", fwd_time={1: f, 2: 2 * f}, bwd_time={1: 2 * f, 2: 4 * f},
                            output_bytes_per_sample=64 * 1024, stashed_bytes_per_sample=256 * 1024,
                            input_bytes_per_sample=64 * 1024, params=params, param_bytes=4 * params)
    layers = [layer("conv-front", 0.030, 100_000)] + [layer(f"fc{i}", 0.005, 20_000_000) for i in range(1, 5)]
    return ModelProfile(name="front-heavy", layers=layers, device="cpu", dtype="fp32", source="measured",
                        notes="hand-built: first layer dominates compute, later layers hold the weights")


def small_memory_cluster() -> Cluster:
    """This machine's 4 gloo processes (examples/clusters/local-cpu-4.json links) with 1 GiB per device: the
    later layers' 1.28 GB of state needs at least two devices."""
    return Cluster(name="local-cpu-4-1gib", nodes=1, gpus_per_node=4, device="cpu", memory_bytes=2**30,
                   peak_flops=5e10, intra={"alpha": 7e-5, "beta": 1.7e-10}, inter={"alpha": 7e-5, "beta": 1.7e-10},
                   memory_bandwidth=2e10, allreduce="rabenseifner")


def request(batch: int = 8) -> TrainingRequest:
    return TrainingRequest(global_batch=batch, gpus=4, micro_batches=[1], allow_recompute=False, max_tensor=1,
                           memory_reserve_bytes=64 * MB, top=50)
