"""The executor's optimizer (:mod:`executor.sgd`): torch.optim.SGD's update, without importing torch._dynamo."""

from __future__ import annotations

import pytest
from one_rank import one_rank


def test_step_is_torch_sgd_bit_for_bit() -> None:
    import torch

    from executor.sgd import SGD

    gen = torch.Generator().manual_seed(0)
    shapes = [((64, 48), torch.float32), ((48,), torch.float32), ((7, 5), torch.float64), ((3,), torch.float64)]
    ours = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=d)) for s, d in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt, ref = SGD(ours, lr=0.37), torch.optim.SGD(theirs, lr=0.37)
    for _ in range(3):
        for i, (p, q) in enumerate(zip(ours, theirs, strict=True)):
            if i != 1:  # one parameter without a gradient: left as it is by both
                g = torch.randn(p.shape, generator=gen, dtype=p.dtype)
                p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        opt.zero_grad()
        ref.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in ours)
        for p, q in zip(ours, theirs, strict=True):
            assert torch.equal(p, q)


@pytest.mark.parametrize("recompute", [False, True])
def test_a_rank_imports_torch_dynamo_only_where_checkpoints_do(recompute: bool) -> None:
    """A rank's whole run (forward, backward, the optimizer step, the check against single-process training)
    without recomputation never imports torch._dynamo (2.2-2.5 s of CPU per process here), so the supervisor
    need not preload it; with recomputation torch.utils.checkpoint does, and the supervisor preloads it."""
    out = one_rank(f"""
        for schedule in ("1f1b", "gpipe") if {recompute} else ("1f1b", "pipedream-2bw"):
            plan = RunPlan.direct(schedule, 1, 2, model="gpt-tiny", iterations=1, recompute={recompute})
            assert run_plan(plan, 0, 1, check=True)["check"]["ok"]
        print("torch._dynamo imported:", "torch._dynamo" in sys.modules)
    """)
    assert out.strip() == f"torch._dynamo imported: {recompute}"
