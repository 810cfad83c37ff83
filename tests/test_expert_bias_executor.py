"""DeepSeek-V3's auxiliary-loss-free load balancing in the executor (DeepSeek-V3 technical report, section 2.1.2;
Megatron-Core's ``--moe-router-bias-update-rate`` / ``get_updated_expert_bias``): each router with a bias
(``ModelSpec.router_bias``) counts the tokens it routes to each expert over a step (forwards only, a checkpoint's
recomputation not counted), and at the step's end ``bias += rate sign(mean - load)`` with the loads summed over every
copy of the router (executor/models/llama.py's Router.update_bias, update_expert_bias; the interpreter's STEP; the
plan's ``expert_bias_rate``). Multi-process runs (gloo, float64) at e = 2 W = 2, t = 2 and on 2-stage pipelines
(with recomputation too) move the biases as single-process training does, and ``--check`` compares them (buffers)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from moe_support import TINY_DEEPSEEK_V3
from run_support import direct, launched_fixture

from executor.interpreter import StageModule
from executor.models import Stage, build_layers, get_config
from executor.models.llama import (
    Router,
    biased_routers,
    expert_bias_state,
    not_counted,
    update_expert_bias,
)
from executor.plan import PlanError, RunPlan
from executor.reference import compare, train_reference
from planner.model import ModelSpec

torch.set_num_threads(1)

#: the tiny DeepSeek-V3 (tests/moe_support.py): layers 2 and 3 (blocks 1 and 2) are mixtures of experts
V3 = TINY_DEEPSEEK_V3
#: the same without the bias (DeepSeek-V2's form of the choice)
NO_BIAS = V3.with_(name="tiny-deepseek-v3-no-bias", router_bias=False)
#: a bias update speed above V3's 0.001: the tiny model's scores differ by a few hundredths, so that the biases move
#: the choice within the runs' three steps
RATE = 0.02


def moe_block(spec: ModelSpec = V3, seed: int = 1):  # type: ignore[no-untyped-def]
    return build_layers(get_config(spec), seed=seed, start=2, stop=3)[0].double()


def test_update_rule_sign_rate_reset() -> None:
    """``bias += rate sign(mean - load)``: above the mean down, below it up, at it unchanged; the loads reset; the
    update adds to the bias already there."""
    router = moe_block().moe.router
    assert router.expert_bias.dtype == torch.float64 and router.expert_load.dtype == torch.int64
    load = torch.tensor([5, 0, 3, 3, 1, 4, 3, 5])  # mean 3
    router.expert_load.copy_(load)
    router.update_bias(router.expert_load.clone(), 0.01)
    expected = torch.tensor([-0.01, 0.01, 0, 0, 0.01, -0.01, 0, -0.01], dtype=torch.float64)
    assert torch.equal(router.expert_bias, expected)
    assert torch.equal(router.expert_load, torch.zeros(8, dtype=torch.int64))
    router.update_bias(torch.tensor([1, 1, 1, 1, 1, 1, 1, 9]), 0.5)
    assert torch.equal(router.expert_bias, expected + torch.tensor([0.5] * 7 + [-0.5], dtype=torch.float64))
    router.update_bias(torch.full((8,), 7), 0.5)  # a balanced load: no change
    assert torch.equal(router.expert_bias, expected + torch.tensor([0.5] * 7 + [-0.5], dtype=torch.float64))
    # rate 0: the bias stays, the loads reset all the same
    router.expert_load.fill_(3)
    before = router.expert_bias.clone()
    router.update_bias(torch.tensor([9, 0, 0, 0, 0, 0, 0, 0]), 0.0)
    assert torch.equal(router.expert_bias, before) and not router.expert_load.any()


def test_forward_counts_the_choices() -> None:
    """A forward adds each token's k choices to ``expert_load`` (int64), exactly the routed experts; inside
    ``not_counted`` or without autograd nothing; without ``router_bias`` there are no loads and nothing to update."""
    block = moe_block()
    router = block.moe.router
    x = torch.randn(2, 16, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    _, index = router.choose(x.reshape(-1, 64), torch.float64)
    assert torch.equal(router.expert_load, torch.bincount(index.reshape(-1), minlength=8))
    assert int(router.expert_load.sum()) == 2 * 16 * 2
    block(x)
    assert torch.equal(router.expert_load, 2 * torch.bincount(index.reshape(-1), minlength=8))
    with not_counted():
        block(x)
    with torch.no_grad():  # (no training forward: Megatron-Core's rule)
        block(x)
    assert int(router.expert_load.sum()) == 2 * 2 * 16 * 2
    plain = moe_block(NO_BIAS)
    assert plain.moe.router.expert_bias is None and plain.moe.router.expert_load is None
    plain(x)
    assert biased_routers(plain) == [] and expert_bias_state(plain) == {}
    update_expert_bias([plain], 0.1)  # (nothing to do)
    assert "moe.router.expert_load" not in block.state_dict()  # (not model state: a step's tally)
    assert "moe.router.expert_bias" in block.state_dict()


@pytest.mark.parametrize("recompute", [False, True])
def test_recomputation_does_not_count_twice(recompute: bool) -> None:
    """A stage of both MoE blocks, each under its own checkpoint when recomputing (the executor's StageModule): after
    a forward and two backward calls (each recomputing the forward) each router has counted every token's k choices
    once, the same loads as without recomputation."""
    cfg = get_config(V3)
    layers = [m.double() for m in build_layers(cfg, seed=4, start=2, stop=4)]
    mod = StageModule(layers, 2, 2, recompute, ["block", "block"])
    assert mod.checkpointed == [recompute, recompute]
    x = torch.randn(2, 16, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(5), requires_grad=True)
    (out,) = mod(x)
    assert [int(r.expert_load.sum()) for r in biased_routers(mod)] == [2 * 16 * 2] * 2
    # two backward calls through the checkpoints, as zero-bubble's I and W make: each recomputes the forward
    (dx,) = torch.autograd.grad(out.square().sum(), x, retain_graph=True)
    out.square().sum().backward()
    assert torch.equal(dx, x.grad)
    loads = [r.expert_load.clone() for r in biased_routers(mod)]
    assert [int(v.sum()) for v in loads] == [2 * 16 * 2] * 2
    plain = StageModule([m.double() for m in build_layers(cfg, seed=4, start=2, stop=4)], 2, 2, False,
                        ["block", "block"])
    plain(x.detach())
    assert all(torch.equal(a, r.expert_load) for a, r in zip(loads, biased_routers(plain), strict=True))


def test_copies_summed_and_reduced() -> None:
    """``update_expert_bias`` over copies of the same layers (one process's replicas of a stage) and a reduction (the
    other processes'): every copy's routers get the update of the loads summed over all of them, and stay equal."""
    a = moe_block()
    b = copy.deepcopy(a)
    a.moe.router.expert_load.copy_(torch.tensor([4, 0, 0, 0, 0, 0, 0, 0]))
    b.moe.router.expert_load.copy_(torch.tensor([0, 0, 0, 0, 0, 0, 3, 1]))
    seen = []

    def reduce(total: torch.Tensor) -> None:  # another process's loads added, as an all-reduce would
        seen.append(total.clone())
        total += torch.tensor([0, 2, 2, 2, 2, 2, 0, 1])

    update_expert_bias([a, b], 0.25, reduce)
    assert torch.equal(seen[0], torch.tensor([4, 0, 0, 0, 0, 0, 3, 1]))  # (this process's two copies)
    # global loads [4, 2, 2, 2, 2, 2, 3, 2]: mean 2.375
    expected = torch.tensor([-0.25, 0.25, 0.25, 0.25, 0.25, 0.25, -0.25, 0.25], dtype=torch.float64)
    for block in (a, b):
        assert torch.equal(block.moe.router.expert_bias, expected)
        assert not block.moe.router.expert_load.any()


def test_plan_rate_validated() -> None:
    """``expert_bias_rate``: a finite number >= 0 (0 turns the update off), refused naming the field; V3's 0.001 by
    default; it travels in the plan's dictionary."""
    plan = direct(V3, "1f1b", 1, 2)
    assert plan.expert_bias_rate == 0.001
    plan.validate()
    for bad in (-0.001, math.nan, math.inf, "0.1", True, None):
        with pytest.raises(PlanError, match="expert_bias_rate"):
            direct(V3, "1f1b", 1, 2, expert_bias_rate=bad).validate()
    for good in (0, 0.0, 1e-3, 2):
        direct(V3, "1f1b", 1, 2, expert_bias_rate=good).validate()
    assert RunPlan.from_dict(direct(V3, "1f1b", 1, 2, expert_bias_rate=0.5).to_dict()).expert_bias_rate == 0.5


def test_single_process_training_moves_the_bias() -> None:
    """The reference (single-process training) updates the biases after each step, which the comparison includes:
    non-zero after a step, multiples of the rate, zero with rate 0; they change the parameters of later steps; a
    differing bias fails the comparison, naming it."""
    plan = direct(V3, "1f1b", 1, 2, expert_bias_rate=RATE)
    ref = train_reference(plan, 3)
    biases = {k: v for k, v in ref.items() if k.endswith("expert_bias")}
    assert sorted(biases) == ["2.moe.router.expert_bias", "3.moe.router.expert_bias"]
    for v in biases.values():
        assert v.abs().max() > 0
        steps = v / RATE
        assert torch.allclose(steps, steps.round()) and steps.abs().max() <= 3
    off = train_reference(direct(V3, "1f1b", 1, 2, expert_bias_rate=0), 3)
    assert all(not off[k].any() for k in biases)
    assert any(not torch.equal(ref[k], off[k]) for k in ref if not k.endswith("expert_bias"))
    plain = train_reference(direct(NO_BIAS, "1f1b", 1, 2), 1)
    assert not any(k.endswith("expert_bias") for k in plain)
    pipelined = {k: [v.clone()] for k, v in ref.items()}
    assert compare(pipelined, ref) is None
    pipelined["3.moe.router.expert_bias"][0][0] += RATE
    assert "3.moe.router.expert_bias" in (compare(pipelined, ref) or "")
    del pipelined["3.moe.router.expert_bias"]
    assert "3.moe.router.expert_bias" in (compare(pipelined, ref) or "")


def test_stage_module_state_names_match_the_reference() -> None:
    """The names the interpreter reports the biases under (``{layer}.moe.router.expert_bias``) are the reference's."""
    layers = build_layers(get_config(V3), seed=0)
    names = {f"{i}.{n}" for i, layer in enumerate(layers) for n in expert_bias_state(layer)}
    assert names == {"2.moe.router.expert_bias", "3.moe.router.expert_bias"}
    assert isinstance(Stage(layers).layers[2].moe.router, Router)


def P(schedule: str, D: int, N: int, **kw) -> RunPlan:  # type: ignore[no-untyped-def]
    return direct(V3, schedule, D, N, warmup=1, expert_bias_rate=RATE, **kw)  # (three steps)


RUNS_2 = {
    "e=2 W=2": P("1f1b", 1, 2, data=2, expert=2),
    "W=2": P("1f1b", 1, 2, data=2),
    "t=2": P("1f1b", 1, 2, tensor=2),
    "1f1b D=2": P("1f1b", 2, 4),
    "1f1b D=2 recompute": P("1f1b", 2, 4, recompute=True),
    "zb-h1 D=2 recompute (I and W each recompute)": P("zb-h1", 2, 4, recompute=True),
    "chimera D=2 (each stage on both devices)": P("chimera", 2, 4),
    "pipedream-2bw D=2": P("pipedream-2bw", 2, 4),
}
RUNS_3 = {
    "pipedream-rr D=3 (stage 0 on two devices)": P("pipedream-rr", 3, 4, replication="2,1"),
}


runs = launched_fixture((RUNS_2, 2), (RUNS_3, 3))


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS_2, *RUNS_3])
def test_run_moves_the_bias_as_single_process(runs, name) -> None:  # type: ignore[no-untyped-def]
    """Real runs (gloo, float64, three steps) with --check: the parameters and the routers' biases equal
    single-process training's (PipeDream-RR's: weight stashing's in one process, the biases updated once per
    iteration), biases which have moved. The loads must be summed over the copies that route tokens of their own:
    without the all-reduce of the loads, the runs with W = 2 (e = 2 or not) and those with a stage on two devices
    (Chimera's, PipeDream-RR's) fail (their routing, hence their parameters, differ from the second step on);
    counted twice on every rank (t = 2 adding its tensor ranks' loads, a recomputation counted again), each load
    would double and the update, a sign, not change: test_recomputation_does_not_count_twice tests that."""
    check = runs[name]["check"]
    assert check["ok"] is True, check["message"]
    plan = {**RUNS_2, **RUNS_3}[name]
    if plan.synchronous or plan.spec.config.schedule == "pipedream-2bw":
        ref = train_reference(plan, 3)
    else:
        from executor.stash_reference import train_stashed_reference

        ref = train_stashed_reference(plan, 3)
    assert all(ref[k].abs().max() > 0 for k in ("2.moe.router.expert_bias", "3.moe.router.expert_bias"))
