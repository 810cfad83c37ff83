"""Expert parallelism in the executor (executor/expert_parallel.py; GShard's all-to-all dispatch and combine,
Megatron-Core's MoEAlltoAllTokenDispatcher): the all-to-all's gradient is the reverse all-to-all; a mixture of
experts split over e = 2 ranks computes, for each rank's own tokens, the whole layer's output and input gradient,
and its experts' gradients are the sums over the ranks' tokens. Processes: gloo on the CPU, float64."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from profiler.hf_config import read_hf_config

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPO = FIXTURES.parent.parent
MIXTRAL_CONFIG = FIXTURES / "tiny-mixtral" / "config.json"
# 4 blocks, hidden 64, 4 experts of width 96, top-2 (renormalised); Qwen3 MoE: 4 experts of 48, query/key norms
MIXTRAL = read_hf_config(MIXTRAL_CONFIG).model_dump()
QWEN3_MOE = read_hf_config(FIXTURES / "tiny-qwen3-moe" / "config.json").model_dump()
# experts with biases and no gate (their down biases split over the tensor ranks at t = 2), not renormalised
BIASED = read_hf_config(MIXTRAL_CONFIG, name="tiny-mixtral-biased").with_(
    gated_mlp=False, bias=True, activation="gelu", normalize_topk=False).model_dump()


def run_ranks(body: str, world: int, *args: str) -> list[dict]:  # type: ignore[type-arg]
    """``body`` in ``world`` gloo processes (argv: rank, store, *args); each prints one JSON object."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen([sys.executable, "-c", body, str(r), str(Path(tmp) / "store"), *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
                 for r in range(world)]
        outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    return [json.loads(out) for out, _ in outs]


# ---- the all-to-all and the layer, two processes -----------------------------------------------------------------

MODULE_BODY = """
import copy, json, sys
import torch
import torch.distributed as dist
from executor.expert_parallel import ExpertParallelMoE, all_to_all
from executor.models import build_layers, get_config
from executor.models.llama import route
from planner.model import ModelSpec

rank, store, specs = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
torch.set_num_threads(1)
out = {}

# the all-to-all: rank r sends SENDS[r][j] rows to rank j (uneven, one empty); y = all_to_all(x), loss = <y, probe>
SENDS = [[2, 3], [0, 4]]
def rows(r):
    return torch.randn(sum(SENDS[r]), 3, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + r))
def received(r):  # what rank r receives: rank 0's part for r, then rank 1's
    return torch.cat([rows(j)[sum(SENDS[j][:r]):sum(SENDS[j][:r + 1])] for j in range(2)])
def probe(r):
    return torch.randn(sum(SENDS[j][r] for j in range(2)), 3, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(20 + r))
x = rows(rank).requires_grad_(True)
y = all_to_all(x, [SENDS[j][rank] for j in range(2)], SENDS[rank], None)
(y * probe(rank)).sum().backward()
# d loss / d x: each block of x goes to rank j, which multiplied it by its rows of probe(j)
want = torch.cat([probe(j)[sum(SENDS[i][j] for i in range(rank)):][:SENDS[rank][j]] for j in range(2)])
out["all_to_all"] = {"output": (y - received(rank)).abs().max().item(), "grad": (x.grad - want).abs().max().item(),
                     "grad norm": want.norm().item()}

# the layer: experts 2 rank, 2 rank + 1 here; each rank's own tokens against the whole layer on them
for name, spec in specs.items():
    block = build_layers(get_config(ModelSpec.model_validate(spec)), seed=3, start=1, stop=2)[0].double()
    torch.manual_seed(11)
    with torch.no_grad():
        block.moe.router.weight.mul_(20)  # a routing far from uniform
        for e in block.moe.experts:
            if e.down.bias is not None:
                e.down.bias.normal_()
    whole = block.moe
    ep = ExpertParallelMoE(copy.deepcopy(whole), rank, 2, None)
    def tokens(r):
        return torch.randn(2, 8, spec["hidden"], dtype=torch.float64, generator=torch.Generator().manual_seed(30 + r))
    def probe_of(r):
        return torch.randn(2, 8, spec["hidden"], dtype=torch.float64, generator=torch.Generator().manual_seed(40 + r))
    x = tokens(rank).requires_grad_(True)
    y = ep(x)
    (y * probe_of(rank)).sum().backward()
    errs = {}
    for r in (0, 1):  # the whole layer on each rank's tokens: its output and input gradient, and its gradients summed
        xr = tokens(r).requires_grad_(True)
        yr = whole(xr)
        before = whole.router.weight.grad.clone() if r else 0
        (yr * probe_of(r)).sum().backward()
        if r == rank:
            errs["output"] = (y - yr).abs().max().item()
            errs["input grad"] = (x.grad - xr.grad).abs().max().item()
            router_grad = whole.router.weight.grad - before
    errs["router grad"] = (ep.router.weight.grad - router_grad).abs().max().item()
    full = dict(whole.named_parameters())
    mine = dict(ep.named_parameters())
    errs["names"] = sorted(n for n in mine if n.startswith("experts."))
    errs["expert grads"] = max((p.grad - full[n].grad).abs().max().item() for n, p in mine.items()
                               if n.startswith("experts."))
    errs["expert grad norm"] = min(p.grad.norm().item() for n, p in mine.items() if n.startswith("experts."))
    _, index = route(whole.router(tokens(rank).view(-1, spec["hidden"])), whole.top_k, whole.normalize, x.dtype)
    errs["sent to each rank"] = torch.bincount(index.view(-1) // 2, minlength=2).tolist()
    out[name] = errs
print(json.dumps(out))
dist.barrier()  # (both ranks done before either leaves: tests/test_moe_executor.py)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def module_results() -> list[dict]:  # type: ignore[type-arg]
    specs = {"gated": MIXTRAL, "biases, no gate": BIASED}
    return run_ranks(MODULE_BODY, 2, json.dumps(specs))


@pytest.mark.slow
def test_all_to_all_gradient_is_the_reverse_all_to_all(module_results) -> None:  # type: ignore[no-untyped-def]
    """AllToAll with uneven splits (one of them empty) on two processes: the output is each peer's rows for this
    rank, in rank order, and the gradient of <output, probe> with respect to the input is, block by block, the
    receivers' probe rows for it."""
    for res in module_results:
        e = res["all_to_all"]
        assert e["grad norm"] > 1
        assert e["output"] == 0 and e["grad"] == 0, e


@pytest.mark.slow
def test_expert_parallel_layer_equals_the_whole_layer(module_results) -> None:  # type: ignore[no-untyped-def]
    """ExpertParallelMoE at e = 2 (each rank experts 2i, 2i+1 under their own names; different tokens per rank):
    each rank's output and input gradient are the whole layer's on its tokens, its router gradient the whole
    layer's on its tokens (the router is replicated: the data-parallel all-reduce sums them), and each expert's
    gradient on its owner is the sum over both ranks' tokens of the whole layer's -- gated experts, and experts
    with biases and no gate. The routing sends rows to both ranks from each."""
    for rank, res in enumerate(module_results):
        for name in ("gated", "biases, no gate"):
            e = res[name]
            assert e["names"] == sorted(f"experts.{j}.{lin}.{p}" for j in (2 * rank, 2 * rank + 1)
                                        for lin in (("gate", "up", "down") if name == "gated" else ("up", "down"))
                                        for p in (("weight",) if name == "gated" else ("weight", "bias"))), e["names"]
            assert min(e["sent to each rank"]) > 0 and e["expert grad norm"] > 1e-3, (name, e)
            for what in ("output", "input grad", "router grad", "expert grads"):
                assert e[what] < 1e-12, (rank, name, what, e)
