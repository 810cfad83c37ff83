"""Expert parallelism in the executor (executor/expert_parallel.py; GShard's all-to-all dispatch and combine,
Megatron-Core's MoEAlltoAllTokenDispatcher): the all-to-all's gradient is the reverse all-to-all; a mixture of
experts split over e = 2 ranks computes, for each rank's own tokens, the whole layer's output and input gradient,
and its experts' gradients are the sums over the ranks' tokens; the groups are laid out as executor/groups.py says;
runs at e = 2 and 4, with pipelines, t = 2 and every kind of schedule, equal single-process training; bad plans are
refused naming ``expert``. Processes: gloo on the CPU, float64."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from executor.plan import PlanError, RunPlan, load_plan_file
from pipeplan.cli import app
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
DENSE = read_hf_config(FIXTURES / "tiny-llama" / "config.json").model_dump()


def P(schedule: str, D: int, N: int, spec: dict | None = None, **kw) -> RunPlan:  # type: ignore[no-untyped-def, type-arg]
    spec = spec or MIXTRAL
    return RunPlan.direct(schedule, D, N, model=spec["name"], model_spec=spec, iterations=2, **kw)


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


# ---- process groups ----------------------------------------------------------------------------------------------

def test_expert_groups_layout(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Chimera (each stage held by both devices) at D = 2, W = 4, e = 2, t = 2: copy w is EP rank w % 2; a rank's
    expert group is the 2 copies of its EP group at its device and tensor rank; a stage's expert-data group the
    ranks of both holders whose copy has its EP rank (W/e = 2 copies each), at its tensor rank. Every rank creates
    the same groups in the same order."""
    import executor.groups as groups
    from executor.groups import Layout, make_groups

    created: list[list[int]] = []
    monkeypatch.setattr(groups.dist, "new_group", lambda ranks: created.append(list(ranks)) or tuple(ranks))
    sched = P("chimera", 2, 2, data=4, expert=2, tensor=2).schedule()
    layout = Layout(2, 4, 2, 2)
    orders = []
    for rank in range(16):
        created.clear()
        g = make_groups(sched, layout, rank, tied=False)
        orders.append(list(created))
        d, w, k = layout.coords(rank)
        assert layout.ep_rank(w) == w % 2 and layout.ep_copies(w) == [w - w % 2, w - w % 2 + 1]
        assert g.expert_ranks == [layout.rank(d, v, k) for v in layout.ep_copies(w)]
        assert g.expert == tuple(g.expert_ranks)
        for s in (0, 1):
            want = sorted(layout.rank(dd, v, k) for dd in (0, 1) for v in range(4) if v % 2 == w % 2)
            assert g.expert_data_ranks[s] == want and len(want) == 4
            assert g.stage_ranks[s] == sorted(layout.rank(dd, v, k) for dd in (0, 1) for v in range(4))
    assert all(o == orders[0] for o in orders)


# ---- runs against single-process training ------------------------------------------------------------------------

RUNS_2 = {
    "mixtral e=2 W=2 D=1": P("1f1b", 1, 2, data=2, expert=2),
    "mixtral e=2 W=2 D=1 recompute": P("1f1b", 1, 2, data=2, expert=2, recompute=True),
    "qwen3-moe e=2 W=2 D=1": P("1f1b", 1, 2, QWEN3_MOE, data=2, expert=2),
}


def _candidate_plan() -> RunPlan:
    """A plan file's candidate whose configuration says expert: 2 (as pipeplan plan --json writes it)."""
    with tempfile.TemporaryDirectory() as tmp:
        cand = {"run_spec": {"config": {"tensor": 1, "pipeline": 2, "data": 2, "expert": 2, "micro_batch": 1,
                                        "schedule": "1f1b"}, "microbatches": 2, "partition": [[0, 3], [3, 6]]}}
        path = Path(tmp) / "plan.json"
        path.write_text(json.dumps({"candidates": [cand]}))
        return load_plan_file(path, 0, model=MIXTRAL["name"], model_spec=MIXTRAL, iterations=2)


RUNS_4 = {
    "mixtral e=2 W=2 D=2 1f1b": P("1f1b", 2, 2, data=2, expert=2),
    "mixtral e=2 W=4 D=1 (experts reduced over 2 copies)": P("1f1b", 1, 2, data=4, expert=2),
    "qwen3-moe e=4 W=4 D=1": P("1f1b", 1, 2, QWEN3_MOE, data=4, expert=4),
    "mixtral t=2 e=2 W=2": P("1f1b", 1, 2, data=2, expert=2, tensor=2),
    "biased experts t=2 e=2 W=2": P("1f1b", 1, 2, BIASED, data=2, expert=2, tensor=2),
    "gpipe e=2": P("gpipe", 2, 2, data=2, expert=2),
    "interleaved v=2 e=2": P("interleaved", 2, 4, data=2, expert=2, chunks=2),
    "zb-h1 e=2": P("zb-h1", 2, 2, data=2, expert=2),
    "hanayo e=2": P("hanayo", 2, 2, data=2, expert=2, waves=1),
    "chimera e=2 (stages on both devices)": P("chimera", 2, 2, data=2, expert=2),
    "plan candidate with expert: 2": _candidate_plan(),
}


@pytest.fixture(scope="module")
def runs() -> dict:  # type: ignore[type-arg]
    from executor.launch import launch

    out = {}
    for plans, world in ((RUNS_2, 2), (RUNS_4, 4)):
        res = launch(list(plans.values()), world, check=True, timeout=120)
        out |= dict(zip(plans, res["runs"], strict=True))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS_2, *RUNS_4])
def test_expert_parallel_run_equals_single_process(runs, name) -> None:  # type: ignore[no-untyped-def]
    assert runs[name]["plan"]["spec"]["config"]["expert"] > 1
    check = runs[name]["check"]
    assert check["ok"] is True, check["message"]


# ---- refusals ----------------------------------------------------------------------------------------------------

def test_bad_expert_plans_are_refused_naming_expert() -> None:
    """e must divide W and the experts; e > 1 needs a mixture of experts of the zoo, and a real run."""
    with pytest.raises(PlanError, match=r"expert: the expert-parallel size 3 must divide data \(W = 2\)"):
        P("1f1b", 1, 2, data=2, expert=3)
    with pytest.raises(PlanError, match=r"expert: .*'tiny-llama' has no experts"):
        P("1f1b", 1, 2, DENSE, data=2, expert=2).validate()
    with pytest.raises(PlanError, match=r"expert: the expert-parallel size e=3 must divide the experts per layer "
                                        r"\(E = 4\)"):
        P("1f1b", 1, 2, data=3, expert=3).validate()
    module = str(REPO / "examples" / "custom_model.py") + ":build"
    with pytest.raises(PlanError, match=r"expert: .*\(--module\)"):
        RunPlan.direct("1f1b", 1, 2, data=2, expert=2, model="custom_model", module=module).validate()
    from executor.emulate import uniform_profile
    from planner.profile import save_profile

    with tempfile.TemporaryDirectory() as tmp:
        save_profile(uniform_profile(4, fwd=1e-3, bwd=2e-3), Path(tmp) / "p.json")
        with pytest.raises(PlanError, match=r"expert: expert parallelism \(2\) needs a mixture of experts; profile "
                                            r"'uniform' has none"):
            P("1f1b", 1, 2, data=2, expert=2, emulate=str(Path(tmp) / "p.json")).validate()
    P("1f1b", 1, 2, data=4, expert=4).validate()  # e = E = W
    assert _candidate_plan().spec.config.expert == 2


def test_cli_run_takes_expert() -> None:
    """``pipeplan run --expert``: refused before launching when it does not divide W (exit 2, naming expert)."""
    res = CliRunner().invoke(app, ["run", "--hf-config", str(MIXTRAL_CONFIG), "-s", "1f1b", "-D", "1", "-N", "2",
                                   "-W", "2", "--expert", "4"])
    assert res.exit_code == 2 and "expert" in res.output, res.output
    res = CliRunner().invoke(app, ["run", "--model", "gpt-tiny", "-s", "1f1b", "-D", "1", "-N", "2", "-W", "2",
                                   "--expert", "2"])
    assert res.exit_code == 2 and "has no experts" in res.output, res.output


def _moe_profile(path: Path) -> str:
    """An analytical profile of a 4-block mixture of experts (8 experts, top-2) on an H100: milliseconds a layer."""
    from planner.analytic import analytic_profile
    from planner.model import ModelSpec
    from planner.operators import OperatorOptions
    from planner.profile import save_profile

    spec = ModelSpec(name="moe-4l", layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816,
                     expert_ffn_hidden=1024, gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary",
                     tied_embeddings=False, bias=False, vocab=32000, seq=2048, experts=8, experts_per_token=2)
    save_profile(analytic_profile(spec, "H100-SXM5-80GB", micro_batches=(1, 2), tensor_sizes=(1,),
                                  options=OperatorOptions(attention="flash", dropout=False)), path)
    return str(path)


def test_emulated_compute_waits_for_the_alltoalls(tmp_path: Path) -> None:
    """Emulated compute at e > 1 runs one EP rank's view of the profile (planner.expert_parallel.expert_view): its
    F and B wait for the layers' compute and the experts' all-to-alls, the stage all-reduce real communication moves
    is the dense gradients', the experts' go over their W/e replicas."""
    from executor.emulate import Emulator
    from planner.cluster import load_cluster

    prof = _moe_profile(tmp_path / "p.json")
    cluster = str(REPO / "examples" / "clusters" / "dgx-h100-80gb.json")
    plan = RunPlan.direct("1f1b", 2, 2, data=4, expert=2, emulate=prof, cluster=cluster, iterations=1, warmup=0)
    plan.validate()
    emu = Emulator(plan, plan.compute_schedule(), prof, load_cluster(cluster))
    costs = emu.costs
    assert costs.expert == 2 and costs.ep_comm(0, 1) > 0
    assert costs.work("F", 0, 1) == pytest.approx(costs._plain_fwd(0, 1) + costs.ep_comm(0, 1) + costs.ep_counts(0))
    info = costs.stages[0]
    assert emu.expert_elements(0) == int(info.expert_param_bytes / 4) > 0
    assert emu.allreduce_elements(0) == int((info.param_bytes - info.expert_param_bytes) / 4)


@pytest.mark.slow
def test_emulated_run_with_experts_split(tmp_path: Path) -> None:
    """An emulated run at e = 2, W = 4, D = 2 (8 processes, this machine's links: the experts' all-reduce over
    their two replicas moves real bytes) runs to the end and says it was emulated."""
    from executor.launch import launch

    prof = _moe_profile(tmp_path / "p.json")
    plan = RunPlan.direct("1f1b", 2, 2, data=4, expert=2, emulate=prof, iterations=1, warmup=1)
    res = launch([plan], 8, timeout=240)
    run = res["runs"][0]
    assert run["emulated"] and run["communication"] == "real"
    assert run["measured"]["iteration_time"] > 0
