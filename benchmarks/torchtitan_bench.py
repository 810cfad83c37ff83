"""Predicted against measured: torchtitan's published FSDP2 runs of Llama 2 and 3 on 64 A100 80GB GPUs
(tests/data/torchtitan_runs.json; :mod:`planner.fidelity_torchtitan`), with the operator model's eager PyTorch
kernels (what torchtitan runs without ``torch.compile``) and, for comparison, its fused Megatron / Transformer
Engine kernels on the same rows.

Then the peak memory of torchtitan's two published H100 FSDP rows of Llama 3.1 8B (8 and 128 GPUs): the model
state, the stash of its checkpointed layers and the loss's fp32 logits and gradients held while it runs
(:func:`planner.cost.layer_transient`), against the caching allocator's maximum reserved. And the one
published pair that isolates the kernels: Llama 3.1 8B on 8 H100s, FSDP, selective op
checkpointing, eager 5,762 against compiled 6,667 tokens/s/GPU (torch.compile fuses the element-wise ops). Their
H100s (96 GB HBM2e, 2.4 TB/s, 500 W) are not the shipped H100 description, so only the ratio is compared,
on the shipped description and with its memory bandwidth set to theirs; compile fuses less than the fused
kernel set (torchtitan's complex-number RoPE stays eager under Inductor), so the measured ratio is a lower
bound of fused over eager.

Run: ``python benchmarks/torchtitan_bench.py`` (a few seconds). Prints figures; asserts nothing.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.device import get_device  # noqa: E402
from planner.fidelity_torchtitan import h100_memory, predict_h100, predict_row, torchtitan_runs  # noqa: E402

DATA = ROOT / "tests" / "data" / "torchtitan_runs.json"


def h100_pair(bandwidth: float | None) -> float:
    """Predicted fused / eager throughput of the H100 pair (8 GPUs, local batch 2, op checkpointing)."""
    dev = get_device("H100-SXM5-80GB")
    if bandwidth is not None:
        dev = dev.model_copy(update={"memory_bandwidth": bandwidth})
    return predict_h100(8, "eager", dev).iteration_time / predict_h100(8, "fused", dev).iteration_time


def main() -> None:
    t0 = time.perf_counter()
    data = json.loads(DATA.read_text())
    runs = torchtitan_runs(data)
    print("torchtitan FSDP2 on 64 A100 80GB (t 1, D 1, W 64), flash SDPA, fp32 reduce-scatter; dgx-a100-80gb;\n"
          "meas s = local batch x sequence (8192 Llama 3, 4096 Llama 2) / the published tokens/s/GPU; error = "
          "predicted / measured - 1 (negative: predicted too fast); eager: --kernels eager, fused: the same with "
          "--kernels fused")
    print(f"{'row':<34} {'meas s':>7} {'eager s':>8} {'error':>7} {'fused s':>8} {'error':>7} {'mem GiB':>8}")
    errors: dict[str, list[float]] = {"eager": [], "fused": []}
    notes = set()
    for run in runs:
        meas = run.measured_seconds()
        pred = {k: predict_row(run, k) for k in ("eager", "fused")}
        for k, p in pred.items():
            errors[k].append(p.seconds / meas - 1)
        mem = pred["eager"].memory_gib
        flag = " *" if pred["eager"].note else ""
        notes.add(pred["eager"].note)
        print(f"{run.label + flag:<34} {meas:>7.3f} {pred['eager'].seconds:>8.3f} {100 * errors['eager'][-1]:>+6.1f}% "
              f"{pred['fused'].seconds:>8.3f} {100 * errors['fused'][-1]:>+6.1f}% {mem:>8.1f}"
              + (" (over 80 GiB: the run fit)" if mem > 80 else ""))
    for k in ("eager", "fused"):
        e = errors[k]
        print(f"{k:>6}: median |error| {100 * statistics.median(abs(x) for x in e):.1f}%, worst "
              f"{100 * max(abs(x) for x in e):.1f}%, median signed {100 * statistics.median(e):+.1f}%")
    for n in sorted(notes - {""}):
        print(f"  * {n}")
    # leave-one-out: one time scale fitted on the other rows (what calibrating the cluster on measured runs of
    # this stack, `pipeplan calibrate --runs`, would do; fidelity_bench.py prints the same for Megatron's rows)
    ratios = [1 / (1 + e) for e in errors["eager"]]  # measured / predicted
    loo = [abs((1 + e) * statistics.median(ratios[:i] + ratios[i + 1:]) - 1) for i, e in enumerate(errors["eager"])]
    print(f"leave-one-out with one fitted time scale (eager; calibration, not shipped): median |error| "
          f"{100 * statistics.median(loo):.1f}%, worst {100 * max(loo):.1f}%")
    for oom in torchtitan_runs(data, "out_of_memory"):
        print(f"stated out of memory: {oom.label}: predicted {predict_row(oom, 'eager').memory_gib:.1f} GiB "
              "(eager) of 80")
    mem = data["h100_fsdp_memory"]["rows"]
    print("H100 FSDP memory (Llama 3.1 8B, b 2, eager, op checkpointing; measured: the allocator's maximum reserved): "
          + ", ".join(f"{r['gpus']} GPUs predicted {h100_memory(r['gpus']):.1f} GiB, measured {r['memory_gib']}"
                      for r in mem))
    pair = data["h100_compile_pair"]
    measured = pair["compiled_wps"] / pair["eager_wps"]
    print(f"\nH100 pair (Llama 3.1 8B, 8 GPUs, b 2, op checkpointing): measured compiled / eager throughput "
          f"{measured:.3f}; predicted fused / eager {h100_pair(None):.3f} (shipped H100, 3.35 TB/s), "
          f"{h100_pair(2.4e12):.3f} (at their 2.4 TB/s)")
    print(f"(benchmark ran in {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
