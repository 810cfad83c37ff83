"""Zero-bubble's split backward on a recorded autograd graph: ``I`` the input gradient, ``W`` the weights'.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR'24), section 2: a backward pass splits into ``B`` (the
gradient with respect to the stage's input, which the previous stage waits for) and ``W`` (the gradients
with respect to the weights, which nothing waits for), and a linear layer's ``W`` needs only the gradient
that reached its output and its saved input: ``dW = dY^T X``. The planner's cost model times them that way
(:meth:`planner.cost.ConfigCosts.work`: ``I`` the input-gradient work, ``W`` the weight-gradient work, ``I +
W = B``).

Asking autograd for the input gradient first (``torch.autograd.grad(out, x)``) and the weights' later
(``torch.autograd.backward(out, inputs=params)``) does not split it: the second pass walks the graph from
the output again, and to reach the first layers' weights it recomputes every input gradient on the way.
Measured on this 2-core machine (4 encoder blocks, hidden 256, sequence 64, micro-batch 2, one thread):
``I`` 12.3 ms and ``W`` 23.4 ms against a whole backward of 24.2 ms (1.48 of it; with each block
checkpointed, 1.64).

So :func:`split_input` walks the graph once (Python, at ``I``): a node is *weight-only* when every path
from it towards the leaves ends at a parameter; a *join* is a node that is not weight-only and has a
weight-only input -- the point where a parameter's branch (a transpose, the parameter's accumulator) meets
the activations' path (a GEMM's backward node, a norm's, an add's). ``I`` runs the input gradient with a
hook on each join that keeps the gradient arriving there; ``W`` (:meth:`Split.weights`) then runs, per join,
only that join's weight branch from the kept gradient: the engine computes just the outputs that lead to
the requested parameters (``should_compute_output``), so a GEMM's backward does its weight-gradient GEMM
and not its input-gradient one. The same idea as ``torch.distributed.pipelining``'s ``stage_backward_input``
/ ``stage_backward_weight`` (its "param groups" of intermediates); written here on our own terms.

A parameter reached by more than one join (a weight used twice in the stage), or by none, is left to a
whole backward from the output restricted to those parameters (the old way): correct, only not split. The
first stage's input (token ids) needs no gradient, so every node of its graph would be weight-only: the
interpreter cuts that graph after the embedding (:class:`executor.interpreter.StageModule`), ``I`` computes
the gradient at the cut and ``W`` carries it on into the parameters the graph before the cut reaches
(``tail``, ``behind``), as the cost model splits the first stage too; a weight reached on both sides of the
cut (on one stage, the token embedding that the LM head shares) gets both parts. With activation
recomputation (non-reentrant ``torch.utils.checkpoint``) each call of ``W`` unpacks GEMM inputs that the
checkpoint recomputes once per backward call (a whole layer's forward per join: measured 94 ms for ``W``
against a 41 ms backward on the blocks above), so a checkpointed stage is not split: ``I`` the input
gradient and ``W`` one backward for the weights, as before.

Memory: from ``I`` to ``W`` a micro-batch keeps its graph (what the forward saved) and the gradients kept at
the joins (on the blocks above 7.3 MB against 21.5 MB of saved tensors); ``W`` frees them. The planner counts
a micro-batch's activations alive until its ``W`` (:mod:`planner.schedules.zb_h1`), as the paper does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

Node = Any  # torch.autograd.graph.Node


@dataclass
class Split:
    """What ``I`` left for ``W``: per join, the gradient that arrived there and the parameters its weight
    branch reaches; the parameters no single join reaches (done by a whole backward from the output)."""

    joins: list[tuple[Node, list[torch.Tensor]]] = field(default_factory=list)
    captured: dict[int, tuple[torch.Tensor | None, ...]] = field(default_factory=dict)
    rest: list[torch.Tensor] = field(default_factory=list)
    #: parameters the graph before a cut reaches (the first stage's embedding; a weight tied to the LM head
    #: on the same stage too: its head branch is a join's) and, once ``I`` ran, the tensor before the cut with
    #: the input gradient ``I`` found there
    behind: list[torch.Tensor] = field(default_factory=list)
    tail: tuple[torch.Tensor, torch.Tensor] | None = None

    def weights(self, out: torch.Tensor, grad: torch.Tensor | None, retain_graph: bool) -> None:
        """``W``: accumulate every parameter's gradient into ``.grad``, each join's branch from the gradient
        ``I`` kept there, the rest by a backward from ``out`` (seeded with ``grad``) limited to them."""
        calls = [(i, node, params) for i, (node, params) in enumerate(self.joins) if i in self.captured]
        # a join I did not run (none should: each lies on a path to the input) is left to the whole backward
        self.rest += [p for i, (_, params) in enumerate(self.joins) if i not in self.captured for p in params]
        for n, (i, node, params) in enumerate(calls):
            grads = self.captured.pop(i)
            edges = [GradientEdge(node, k) for k, g in enumerate(grads) if g is not None]
            seeds = [g for g in grads if g is not None]
            if not edges:
                continue
            last = n == len(calls) - 1 and not self.rest
            torch.autograd.backward(edges, seeds, retain_graph=retain_graph or not last, inputs=params)
        if self.rest:
            torch.autograd.backward(out, grad, retain_graph=retain_graph, inputs=self.rest)
        if self.tail is not None and self.behind:
            torch.autograd.backward(self.tail[0], self.tail[1], retain_graph=retain_graph, inputs=self.behind)


def split_input(out: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor, params: list[torch.Tensor],
                tail: torch.Tensor | None = None) -> tuple[torch.Tensor, Split]:
    """``I``: the gradient of ``out`` (seeded with ``grad``; None for a scalar loss) with respect to ``x``,
    and the :class:`Split` that lets ``W`` do only the weights' part (module docstring). The graph is kept.
    ``tail``: ``x`` is a leaf cut from ``tail`` (the first stage's embedding output); ``W`` then also carries
    the input gradient on from ``tail`` into the parameters behind the cut."""
    split = _plan(out, x, params)
    handles = [node.register_prehook(_keeper(split, i)) for i, (node, _) in enumerate(split.joins)]
    try:
        dx = torch.autograd.grad(out, x, grad, retain_graph=True)[0]
    finally:
        for h in handles:
            h.remove()
    if tail is not None:
        split.tail, split.behind = (tail, dx), _reached(tail, params)
    return dx, split


def _reached(t: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The parameters among ``params`` whose gradient accumulators ``t``'s graph reaches."""
    leaf = {get_gradient_edge(p).node: p for p in params if p.requires_grad}
    seen: set[Node] = set()
    stack = [t.grad_fn] if t.grad_fn is not None else []
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(f for f, _ in n.next_functions if f is not None)
    return [p for acc, p in leaf.items() if acc in seen]


def _keeper(split: Split, i: int) -> Any:
    def hook(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        split.captured[i] = tuple(grad_outputs)
    return hook


def _plan(out: torch.Tensor, x: torch.Tensor, params: list[torch.Tensor]) -> Split:
    """Find the joins of ``out``'s graph and the parameters each one's weight branch reaches."""
    leaf = {get_gradient_edge(p).node: p for p in params if p.requires_grad}
    x_node = get_gradient_edge(x).node if x.requires_grad else None
    root = out.grad_fn
    if root is None or x_node is None:
        return Split(rest=list(leaf.values()))
    weight_only: dict[Node, bool] = {}
    below: dict[Node, frozenset[Node]] = {}  # a weight-only node: the parameter accumulators under it

    def visit(node: Node) -> bool:  # iterative post-order: the graphs are deeper than Python's recursion
        stack = [(node, False)]
        while stack:
            n, done = stack.pop()
            if n in weight_only:
                continue
            nxt = [f for f, _ in n.next_functions if f is not None]
            if not done:
                stack.append((n, True))
                stack.extend((f, False) for f in nxt if f not in weight_only)
                continue
            if n is x_node:
                weight_only[n] = False
            elif n in leaf:
                weight_only[n] = True
                below[n] = frozenset((n,))
            else:
                weight_only[n] = all(weight_only[f] for f in nxt)
                if weight_only[n]:
                    below[n] = frozenset().union(*(below[f] for f in nxt))
        return weight_only[node]

    visit(root)
    reached: dict[Node, list[Node]] = {}  # parameter accumulator -> the joins that reach it
    joins: list[tuple[Node, frozenset[Node]]] = []
    for n, only in weight_only.items():
        if only:
            continue
        under = frozenset().union(*(below[f] for f, _ in n.next_functions if f is not None and weight_only[f]))
        if under:
            joins.append((n, under))
            for acc in under:
                reached.setdefault(acc, []).append(n)
    single = {acc for acc, js in reached.items() if len(js) == 1}
    split = Split(rest=[p for acc, p in leaf.items() if acc in weight_only and acc not in single])
    for n, under in joins:
        mine = [leaf[acc] for acc in under if acc in single]
        if mine:
            split.joins.append((n, mine))
    return split
