# ruff: noqa: E402, E501, E741, B007, B023
"""What the optimizer step costs on this CPU: SGD.step + zero_grad(set_to_none) over (a) the bandwidth probe's
16 tensors of 4M params, hot grads (measure_step_bandwidth); (b) the gpt-small stage-0 module's parameters with
gradients made by a real backward each time (as in a run); (c) the same parameters with hot, reused grads;
(d) per-tensor cost: 200 tiny tensors. Thread CPU time, medians of 9."""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
import torch

torch.set_num_threads(1)
from stage_cpu import setup


def med(f, n=9):
    out = []
    for i in range(n + 2):
        pre = f()
        c0 = time.thread_time()
        pre()
        d = time.thread_time() - c0
        if i >= 2:
            out.append(d)
    return statistics.median(out)


print("load", os.getloadavg())
ps = [torch.nn.Parameter(torch.randn(250_000)) for _ in range(16)]
for p in ps:
    p.grad = torch.randn_like(p)
opt = torch.optim.SGD(ps, lr=1e-6)
t_probe = med(lambda: opt.step)
print(
    f"(a) probe 4M params in 16 tensors: step {t_probe * 1e3:.2f} ms -> {4e6 * 16 / t_probe / 1e9:.1f} GB/s (16 B/param)"
)
mod, opt2, ids, tg, hid, bounds = setup(0)
params = list(mod.parameters())
n = sum(p.numel() for p in params)
print(f"stage 0: {len(params)} tensors, {n / 1e6:.2f} M params, foreach default: {opt2.defaults.get('foreach')}")


def fresh():
    for m in range(8):
        out = mod(ids[m * 2 : (m + 1) * 2], None)[0]
        out.backward(torch.ones_like(out))

    def go():
        opt2.step()
        opt2.zero_grad(set_to_none=True)

    return go


t_fresh = med(fresh, 5)
for p in params:
    p.grad = torch.randn_like(p)
t_hot = med(lambda: opt2.step)
t_zero = med(lambda: lambda: [setattr(p, "grad", None) for p in params])
print(f"(b) stage 0 step + zero_grad after real backwards: {t_fresh * 1e3:.2f} ms -> {n * 16 / t_fresh / 1e9:.1f} GB/s")
print(f"(c) stage 0 step, hot reused grads: {t_hot * 1e3:.2f} ms -> {n * 16 / t_hot / 1e9:.1f} GB/s")
tiny = [torch.nn.Parameter(torch.randn(8)) for _ in range(200)]
for p in tiny:
    p.grad = torch.randn_like(p)
o3 = torch.optim.SGD(tiny, lr=1e-6)
t_tiny = med(lambda: o3.step)
print(f"(d) 200 tiny tensors: {t_tiny * 1e3:.2f} ms -> {t_tiny / 200 * 1e6:.1f} us per tensor")
for _fe in (True,):
    o4 = torch.optim.SGD(tiny, lr=1e-6, foreach=True)
    print(f"    foreach=True: {med(lambda: o4.step) / 200 * 1e6:.1f} us per tensor")
print("load", os.getloadavg())
import resource


def split():
    for m in range(8):
        out = mod(ids[m * 2 : (m + 1) * 2], None)[0]
        out.backward(torch.ones_like(out))
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c0 = time.thread_time()
    opt2.step()
    c1 = time.thread_time()
    opt2.zero_grad(set_to_none=True)
    c2 = time.thread_time()
    return c1 - c0, c2 - c1, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0


rs = [split() for _ in range(7)][2:]
print("(b') step / zero_grad / faults:", [(round(a * 1e3, 2), round(b * 1e3, 2), c) for a, b, c in rs])


def split2():
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c0 = time.thread_time()
    for m in range(8):
        out = mod(ids[m * 2 : (m + 1) * 2], None)[0]
        out.backward(torch.ones_like(out))
    return time.thread_time() - c0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0


print("F+B x8 cpu, faults:", [(round(a * 1e3, 1), b) for a, b in [split2() for _ in range(3)]])
