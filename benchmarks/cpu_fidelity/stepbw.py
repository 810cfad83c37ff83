# ruff: noqa: E402, E501, E741, B007, B023
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

torch.set_num_threads(1)


def as_run(params=4_000_000, width=512, rows=64, repeats=7):
    n = max(1, round(params / (width * width)))
    g = torch.Generator().manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(n)])
    x = torch.randn(rows, width, generator=g)
    opt = torch.optim.SGD(layers.parameters(), lr=1e-6)
    total = sum(p.numel() for p in layers.parameters())
    times = []
    for i in range(repeats + 2):
        layers(x).square().mean().backward()
        c0 = time.thread_time()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 2:
            times.append(time.thread_time() - c0)
    return 16.0 * total / statistics.median(times), n


from profiler.local_cluster import measure_step_bandwidth

print("load", os.getloadavg())
for _ in range(3):
    print(
        f"hot probe {measure_step_bandwidth() / 1e9:.1f} GB/s; as run {as_run()[0] / 1e9:.1f} GB/s ({as_run()[1]} Linear 512x512)"
    )
