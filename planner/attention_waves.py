"""How evenly a fused attention kernel's thread blocks fill the SMs: the load balance of a flash kernel's grid.

A flash attention kernel (FlashAttention-2, Dao 2023, section 3.2 "Parallelism"; FlashAttention-3, Shah et al.
2024, section 3; cuDNN's fused attention likewise) launches one thread block per (batch, head, block of
``block`` rows): the forward parallelises over query blocks, the backward over key blocks (FlashAttention-2,
section 3.2, "for the backward pass ... parallelize over the sequence length dimension ... of the key"). Each
block loops over the other dimension's blocks. With a causal mask the loop is a triangle: query block ``i``
reads key blocks ``0..i`` (``i + 1`` tiles), key block ``j`` is read by query blocks ``j..n-1``
(``n - j`` tiles), where ``n = ceil(s / block)``; without a mask every block does ``n`` tiles.

The SMs take the blocks in launch order (the grid's x index, the sequence block, fastest), each SM the next
block as soon as its current one ends (one resident block per SM: FlashAttention-2's 128-row tiles with head
dim 128 fill an SM's registers and shared memory). The kernel ends when the last SM does, so its time is the
busiest SM's tiles, against ``total / sm_count`` for a perfectly even split: :func:`balance` is that ratio,
computed by list scheduling. A kernel with many blocks per SM balances almost perfectly (the papers'
measured shapes: 16k tokens of 16 heads, 16-128 blocks per SM); a few heads of one sequence per GPU -- a
tensor-parallel shard at micro-batch 1, GPT-3 175B at t = 4 has 24 -- give 3-4 blocks per SM of unequal
length, and the SMs idle for a quarter of the kernel.

Measured on a lent H100 (benchmarks/DEVICE_CHECK.md, 'Runs'; ``sm_count`` 132, ``block`` 128): the public
runs' per-GPU attention ran at 0.63-0.82 of the rate of the papers' shape at the same sequence length where
the heads were few (GPT-3 175B, 24 heads at 2k; Nemotron-4 340B, 12 heads at 4k: FlashAttention-2 and cuDNN,
forward and backward), and at 0.96-1.01 with 48 (Nemotron-4 15B at micro-batch 4). This rule gives 0.76-0.79
and 0.98 for them; :meth:`planner.device.DeviceSpec.attention_time` scales the papers' efficiency by the
shape's balance over the papers' shape's balance.
"""

from __future__ import annotations

import heapq
import math
from functools import lru_cache

#: more blocks than this many waves are balanced to within ~1%: the heads are cut to this many waves' worth
#: (a slightly pessimistic stand-in that keeps the computation small; the balance only rises with more waves)
MAX_WAVES = 32


@lru_cache(maxsize=4096)
def balance(heads: int, seq: int, block: int, sms: int, *, causal: bool, backward: bool) -> float:
    """Useful SM time over ``sms`` times the kernel's time (module docstring) for ``heads`` (batch x heads)
    sequences of ``seq`` tokens cut into ``block``-row blocks; 1.0 is a perfect fill."""
    if heads < 1 or seq < 1 or block < 1 or sms < 1:
        raise ValueError(f"balance: heads, seq, block and sms must be >= 1, got {heads}, {seq}, {block}, {sms}")
    n = math.ceil(seq / block)
    if not causal:  # equal blocks: wave quantisation alone
        blocks = heads * n
        return blocks / (sms * math.ceil(blocks / sms))
    heads = min(heads, max(1, math.ceil(MAX_WAVES * sms / n)))
    work = [n - i for i in range(n)] if backward else [i + 1 for i in range(n)]
    free = [0] * sms
    for _ in range(heads):
        for w in work:
            heapq.heapreplace(free, free[0] + w)
    return heads * sum(work) / (sms * max(free))
