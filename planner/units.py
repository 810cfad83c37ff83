"""What a cluster's devices are called in words: GPUs, or -- on a CPU cluster, whose "devices" are processes
sharing the host's cores (:class:`planner.cluster.HostCpu`, the local cluster of ``make serve``) -- CPU
processes. One rule for the CLI's tables and messages and the API's errors; the web UI has its twin
(``PP.devices`` in ``api/static/ui.js``). Pure Python.
"""

from __future__ import annotations


def is_cpu(device: str) -> bool:
    """Whether ``device`` (a cluster's or a profile's device name) is a CPU: ``cpu``, any case, or a name
    starting ``cpu`` (e.g. ``cpu-x86_64``)."""
    return device.strip().lower().startswith("cpu")


def device_noun(device: str, n: int = 2) -> str:
    """``GPU``/``GPUs`` or ``CPU process``/``CPU processes`` for ``n`` devices of ``device``."""
    if is_cpu(device):
        return "CPU process" if n == 1 else "CPU processes"
    return "GPU" if n == 1 else "GPUs"


def devices(device: str, n: int) -> str:
    """``n`` devices in words: ``8 GPUs``, ``1 GPU``, ``4 CPU processes``."""
    return f"{n} {device_noun(device, n)}"
