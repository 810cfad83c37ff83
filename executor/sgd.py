"""The executor's optimizer: plain SGD, ``p <- p - lr * grad``, for every stage replica a run holds and for the
single-process references it is compared with (:mod:`executor.reference`; :mod:`executor.stash_reference`
writes the same update out per version).

It is ``torch.optim.SGD`` with its defaults (no momentum, dampening, weight decay or Nesterov) written out:
that optimizer's step is ``param.add_(grad, alpha=-lr)`` per parameter (``_single_tensor_sgd``, its CPU
default) or ``torch._foreach_add_(params, grads, alpha=-lr)`` (``_multi_tensor_sgd``, its CUDA default), the
same element-wise update; this one calls the latter on every device. Written out because ``torch.optim``
imports ``torch._dynamo`` on a process's first ``step`` or ``zero_grad`` (``torch.optim.optimizer``:
``_use_grad_for_differentiable``, ``torch._disable_dynamo``): 2.2-2.5 s of CPU on the 2-core development
machine, which every launch paid once (:mod:`executor.supervise` imported it before forking the ranks) and
every local measurement of the step (:func:`profiler.local_cluster.measure_step_bandwidth`) too.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class SGD:
    """Plain SGD over ``params`` with learning rate ``lr``: :meth:`step` applies the gradients that are set,
    :meth:`zero_grad` drops them (``set_to_none``, as ``torch.optim`` does by default)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float) -> None:
        self.params = list(params)
        self.lr = float(lr)

    @torch.no_grad()
    def step(self) -> None:
        with_grad = [p for p in self.params if p.grad is not None]
        if with_grad:
            torch._foreach_add_(with_grad, [p.grad for p in with_grad], alpha=-self.lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
