"""Cluster description: nodes x GPUs, device memory and speed, and the links as alpha-beta models.

The alpha-beta (latency-bandwidth) model of a message of L bytes is ``alpha + beta * L`` (Chimera 3.4,
"Latency-Bandwidth (alpha-beta) cost model"). ``intra`` is the link between GPUs of one node (NVLink),
``inter`` between nodes (InfiniBand, Aries); both per GPU, per direction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Link(BaseModel):
    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(ge=0, allow_inf_nan=False, description="latency, seconds")
    beta: float = Field(ge=0, allow_inf_nan=False, description="seconds per byte")

    def time(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes if nbytes > 0 else 0.0


class Cluster(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    device: str = Field(description="device name, e.g. 'A100-SXM4-80GB'")
    memory_bytes: int = Field(gt=0, description="memory per GPU")
    peak_flops: float = Field(gt=0, allow_inf_nan=False, description="peak FLOP/s per GPU at the dtype used")
    intra: Link
    inter: Link
    memory_bandwidth: float = Field(default=1.5e12, gt=0, allow_inf_nan=False,
                                    description="device memory bandwidth, bytes/s (optimizer step)")
    allreduce: Literal["rabenseifner", "ring"] = "rabenseifner"
    notes: str = ""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def content_hash(self) -> str:
        import hashlib
        import json

        data = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(data.encode()).hexdigest()


def load_cluster(path: str | Path) -> Cluster:
    return Cluster.model_validate_json(Path(path).read_text())


def save_cluster(cluster: Cluster, path: str | Path) -> None:
    Path(path).write_text(cluster.model_dump_json(indent=2) + "\n")
