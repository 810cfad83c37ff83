"""The memory a device sets aside for the framework before any model (the request's ``memory_reserve_bytes``):
its default depends on what the cluster's devices are (issue 13, newcomer pass). Pure Python.

* GPU devices: :data:`GPU_RESERVE_BYTES`, 2 GiB -- the CUDA context (several hundred MiB, depending on the
  CUDA version and lazy module loading), NCCL's communicator buffers (``NCCL_BUFFSIZE``, 4 MiB by default, per
  channel and peer), cuBLAS's workspace (``CUBLAS_WORKSPACE_CONFIG=:4096:8``: 8 buffers of 4 MiB) and the
  caching allocator's slack. A round figure kept from the planner's first version; not measured in this
  project (its sessions have no GPU): pass the request's value where it is known.
* CPU devices (:func:`planner.units.is_cpu`; the processes of :class:`planner.cluster.HostCpu`):
  :data:`CPU_RESERVE_BYTES`, measured -- the peak resident memory of an executor process after importing
  what a rank imports and building its gloo process group, before any model
  (:func:`profiler.local_cluster.measure_reserve`, figures in the constant's comment), rounded up.

An explicit request value always wins; :func:`resolve_reserve` says which applied.
"""

from __future__ import annotations

from planner.cluster import Cluster
from planner.request import TrainingRequest
from planner.units import is_cpu

GiB = 2**30
MiB = 2**20

#: GPU default (module docstring)
GPU_RESERVE_BYTES = 2 * GiB
GPU_RESERVE_SOURCE = ("default for GPU devices: 2 GiB for the CUDA context, NCCL buffers, cuBLAS workspace "
                      "and allocator slack (planner.reserve)")

#: CPU default: ``.venv/bin/python -c "from profiler.local_cluster import measure_reserve;
#: print(measure_reserve(4))"`` on the 2-core development machine (torch 2.13.0+cpu, 4 gloo processes):
#: peak resident memory 299.1, 298.0, 298.0, 298.0 MiB per rank (2026-11-23, load average 4.5 from other work),
#: rounded up to 320 MiB. Resident memory counts torch's shared libraries in each process (they are mapped
#: once per host): per process it is what the process holds, over the host it is an upper bound.
CPU_RESERVE_BYTES = 320 * MiB
CPU_RESERVE_SOURCE = ("default for CPU devices: 320 MiB, an executor process's peak resident memory before any "
                      "model (torch and its gloo process group: 299 MiB measured, "
                      "profiler.local_cluster.measure_reserve), rounded up")


def default_reserve(device: str) -> tuple[float, str]:
    """The default reserve, bytes, of a device named ``device``, and where it comes from."""
    if is_cpu(device):
        return float(CPU_RESERVE_BYTES), CPU_RESERVE_SOURCE
    return float(GPU_RESERVE_BYTES), GPU_RESERVE_SOURCE


def resolve_reserve(request: TrainingRequest, cluster: Cluster) -> tuple[TrainingRequest, str]:
    """``request`` with ``memory_reserve_bytes`` set (the request's own value, else the default of the
    cluster's device), and a sentence saying which applied."""
    if request.memory_reserve_bytes is not None:
        return request, "the request's memory_reserve_bytes"
    value, source = default_reserve(cluster.device)
    return request.model_copy(update={"memory_reserve_bytes": value}), source


def reserve_error(reserve: float, memory_bytes: int, given: bool = True) -> str | None:
    """Why a reserve of ``reserve`` bytes per device leaves nothing of a device of ``memory_bytes`` for the model
    (None: it leaves some). Every candidate would otherwise read as if its model state did not fit: a plan page
    said "the model's weights ... alone exceed each device's memory" of a model of 3.5 MB. ``given``: the request
    named the reserve; else it is the device's default, and what is wrong is more likely the cluster's memory (a
    cluster file of ``memory_bytes: 1000`` was answered "--memory-reserve: ... give a smaller reserve", an option
    the user had not given)."""
    if reserve < memory_bytes:
        return None
    if not given:
        return (f"memory_bytes: the cluster's devices hold {memory_bytes / 2**30:.4g} GiB, not more than the default "
                f"reserve of {reserve / 2**30:.4g} GiB per device (planner/reserve.py): give the devices' memory, or a "
                "smaller reserve")
    return (f"memory_reserve_bytes: the reserve of {reserve / 2**30:.4g} GiB per device leaves nothing of the "
            f"device's {memory_bytes / 2**30:.4g} GiB for the model: give a smaller reserve")
