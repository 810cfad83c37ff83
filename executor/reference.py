"""Plain single-process training on the same global batch: what every synchronous schedule must equal.

The whole model (:func:`executor.models.build_layers`, same seed, same dtype), one optimizer step per
iteration with the same SGD. A decoder's (GPT, Llama) loss is the mean over the whole global batch in one
forward; for BERT
(masked LM, losses averaged over the masked positions of each micro-batch) it is the mean of the
micro-batch losses, the quantity the pipelined run computes.
"""

from __future__ import annotations

import torch

from executor.models import Stage
from executor.models.llama import expert_bias_state, update_expert_bias
from executor.plan import RunPlan
from executor.sgd import SGD

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def train_reference(plan: RunPlan, steps: int) -> dict[str, torch.Tensor]:
    """``"{layer}.{name}" -> tensor`` after ``steps`` single-process SGD steps, each followed by DeepSeek-V3's bias
    update (with ``router_bias``: the routers' ``expert_bias``, buffers, among the tensors)."""
    source = plan.source()
    layers = [m.to(DTYPES[plan.dtype]) for m in source.build(plan.seed, 0)]
    model = Stage(layers)
    opt = SGD(model.parameters(), lr=plan.lr)
    for step in range(steps):
        inputs, targets = source.batch(plan.spec.global_batch, plan.seed, step)
        inputs = inputs.to(DTYPES[plan.dtype]) if inputs.is_floating_point() else inputs
        if not source.mean_of_micro_batches:
            loss = model(inputs, targets)
        else:
            losses = [model(x, t) for x, t in zip(inputs.split(plan.rows), targets.split(plan.rows), strict=True)]
            loss = torch.stack(losses).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        update_expert_bias([model], plan.expert_bias_rate)  # (DeepSeek-V3's: the whole batch's loads)
    out = {f"{i}.{n}": p.detach().clone() for i, layer in enumerate(layers) for n, p in layer.named_parameters()}
    return out | {f"{i}.{n}": b for i, layer in enumerate(layers) for n, b in expert_bias_state(layer).items()}


def compare(pipelined: dict[str, list[torch.Tensor]], reference: dict[str, torch.Tensor],
            rtol: float | None = None, atol: float | None = None) -> str | None:
    """None when every copy of every parameter equals the reference, else a message naming the first
    differing parameter (in model order)."""
    def order(key: str) -> tuple[int, str]:
        layer, name = key.split(".", 1)
        return int(layer), name

    for key in sorted(reference, key=order):
        copies = pipelined.get(key)
        if not copies:
            return f"parameter {key} is held by no rank"
        for i, t in enumerate(copies):
            try:
                torch.testing.assert_close(t, reference[key], rtol=rtol, atol=atol)
            except AssertionError as e:
                first = str(e).strip().splitlines()
                return f"parameter {key} (copy {i}) differs from single-process training: " + " ".join(first[:3])
    extra = sorted(set(pipelined) - set(reference))
    if extra:
        return f"parameters not in the model: {', '.join(extra[:3])}"
    return None
