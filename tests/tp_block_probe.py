"""One transformer block against its t = 2 tensor-parallel shard (gloo, two processes, float64), for the executor's
model tests: run as ``python tests/tp_block_probe.py STORE SPECS OUT`` by :func:`run_support.tp_block_errors`, which
imports torch once and forks rank 1 from rank 0 (as ``executor.supervise`` forks its ranks: nothing has started a
thread by then; two interpreters each importing torch cost ~2.5 s more of CPU per test module). Each rank writes its
figures to ``OUT/rank{r}.json``.

``SPECS``: JSON ``{name: [model spec, layer]}``; each named layer is built (seed 3), perturbed the same way on both
ranks (a routing far from uniform, every bias and every norm's weight off their initial values, a shared expert's
gate well away from 1/2, DeepSeek-V3's bias spread over the experts), split, and run forward and backward on the same
input. Every bias is drawn anew (they start at zero): a zero bias hides a column-parallel bias split wrongly (each
rank adding another rank's columns, or all of them) and a row-parallel one added on every rank before the all-reduce
(``t`` times over). Printed per name: the largest differences of output, input gradient and parameter
gradients (the shard's gathered under the whole block's names), the smallest gradient norm, the router's gradient
difference and norm where the block has one, the parameter names, those the shard splits, and the element counts of
the all-reduces the shard ran."""

from __future__ import annotations

import copy
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from executor.models import build_layers, get_config
from executor.tensor_parallel import TensorParallelLlamaBlock
from planner.model import ModelSpec


def _perturb(block: torch.nn.Module) -> None:
    torch.manual_seed(11)  # (the same changes on both ranks; build_layers leaves the global generator unseeded)
    with torch.no_grad():
        for n, p in block.named_parameters():
            if "norm" in n:  # (every norm's weight: at one, a norm's weight split wrongly would not show)
                p.uniform_(0.5, 1.5)
            elif n.endswith(".bias"):  # (every linear layer's: zero at first but for gpt-oss's router's, small)
                p.normal_()
        moe = getattr(block, "moe", None)
        if moe is not None:
            moe.router.weight.mul_(20)
            if moe.shared_expert_gate is not None:
                moe.shared_expert_gate.weight.mul_(50)
            if getattr(moe.router, "expert_bias", None) is not None:
                # (+-0.1: it changes some tokens' choice and leaves every expert of the probed layers some tokens;
                # +-0.3 left GLM-4.5's first expert of its first group none, a gradient of zeros on both sides)
                moe.router.expert_bias.copy_(torch.linspace(-0.1, 0.1, len(moe.experts)))


def main(rank: int, store: str, specs: dict, out: Path) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    torch.set_num_threads(1)
    errors = {}
    for name, (spec, layer) in specs.items():
        block = build_layers(get_config(ModelSpec.model_validate(spec)), seed=3, start=1 + layer, stop=2 + layer)[0]
        block = block.double()
        _perturb(block)
        shard = TensorParallelLlamaBlock.from_block(copy.deepcopy(block), rank, 2, None)
        gen = torch.Generator().manual_seed(7)
        x = torch.randn(2, 16, spec["hidden"], dtype=torch.float64, generator=gen)
        probe = torch.randn(x.shape, dtype=torch.float64, generator=gen)
        x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        y1 = block(x1)
        (y1 * probe).sum().backward()
        calls: list[int] = []
        reduce = dist.all_reduce

        def counted(t, *a, calls=calls, reduce=reduce, **k):  # type: ignore[no-untyped-def]
            calls.append(t.numel())
            return reduce(t, *a, **k)

        dist.all_reduce = counted
        y2 = shard(x2)
        (y2 * probe).sum().backward()
        dist.all_reduce = reduce
        with torch.no_grad():  # the gradients under the full block's names: the shards' grads gathered as parameters
            for p in shard.parameters():
                p.copy_(p.grad)
        grads = shard.full_state()
        full = dict(block.named_parameters())
        assert set(grads) == set(full), set(grads) ^ set(full)
        e = {"output": (y1 - y2).abs().max().item(), "input grad": (x1.grad - x2.grad).abs().max().item(),
             "grads": max((grads[n] - p.grad).abs().max().item() for n, p in full.items()),
             "min grad norm": min(p.grad.norm().item() for p in full.values()),
             "names": sorted(full), "split": [n for n, p in shard.named_parameters() if p.shape != full[n].shape],
             "all-reduces": calls}
        if "moe.router.weight" in full:
            router = full["moe.router.weight"]
            e |= {"router grad": (grads["moe.router.weight"] - router.grad).abs().max().item(),
                  "router grad norm": router.grad.norm().item()}
        errors[name] = e
    (out / f"rank{rank}.json").write_text(json.dumps(errors))
    # both ranks done before either leaves: a rank exiting while its peer's gloo pair is still open aborts the peer
    # ("terminate called without an active exception", seen 2 runs in 6 without these two lines)
    dist.barrier()
    dist.destroy_process_group()


def forked(store: str, specs: dict, out: Path) -> int:
    """Rank 1 forked from this process, rank 0 here; the exit status: 0 when both ranks ended well."""
    child = os.fork()
    rank = 1 if child == 0 else 0
    code = 0
    try:
        main(rank, store, specs, out)
    except BaseException:  # noqa: BLE001 - the traceback goes to stderr, the status says it failed
        traceback.print_exc()
        code = 1
    if child == 0:
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(child, 0)
    return code or (0 if status == 0 else 1)


if __name__ == "__main__":
    sys.exit(forked(sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])))
