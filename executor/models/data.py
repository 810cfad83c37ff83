"""Training data: deterministic synthetic batches and a memory-mapped token file (nanoGPT's train.bin).

Every pipeline stage that needs the batch (the first for the inputs, the last for the targets) can
rebuild it from ``(seed, step)`` or read it from the same file at the same offsets, so targets never
travel between stages.

Batches are ``(inputs, targets)`` int64 tensors of shape ``(batch, seq)``:

* GPT and Llama (decoders, next-token prediction): a window of ``seq + 1`` tokens, ``inputs = w[:-1]``,
  ``targets = w[1:]``.
* BERT (masked LM, Devlin et al. 2019 section 3.1, simplified): ``mask_prob`` of the positions (at least
  one per sequence) are replaced by the ``[MASK]`` id ``vocab - 1`` in the inputs; targets hold the
  original token there and ``-100`` (ignored) elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from executor.models.config import ModelConfig

IGNORE_INDEX = -100


def _generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def mask_for_mlm(
    tokens: torch.Tensor, vocab: int, generator: torch.Generator, mask_prob: float = 0.15
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT-style ``(inputs, targets)`` from clean ``tokens``; at least one masked position per row."""
    masked = torch.rand(tokens.shape, generator=generator) < mask_prob
    first = torch.randint(0, tokens.shape[1], (tokens.shape[0],), generator=generator)
    masked[torch.arange(tokens.shape[0]), first] = True
    inputs = tokens.masked_fill(masked, vocab - 1)
    targets = tokens.masked_fill(~masked, IGNORE_INDEX)
    return inputs, targets


def synthetic_batch(
    config: ModelConfig, batch: int, seed: int = 0, step: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of training step ``step``: uniform random tokens, deterministic in (seed, step)."""
    gen = _generator(seed, step)
    if config.family != "bert":
        window = torch.randint(0, config.vocab, (batch, config.seq + 1), generator=gen)
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()
    tokens = torch.randint(0, config.vocab - 1, (batch, config.seq), generator=gen)
    return mask_for_mlm(tokens, config.vocab, gen)


def micro_batches(
    inputs: torch.Tensor, targets: torch.Tensor, micro_batch: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cut a global batch into consecutive micro-batches of ``micro_batch`` rows (must divide it)."""
    if micro_batch < 1 or inputs.shape[0] % micro_batch:
        raise ValueError(f"micro-batch size {micro_batch} must divide the batch size {inputs.shape[0]}")
    return list(zip(inputs.split(micro_batch), targets.split(micro_batch), strict=True))


def micro_batch(
    config: ModelConfig, batch: int, micro_batch_size: int, index: int, seed: int = 0, step: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch ``index`` of the synthetic global batch of ``step``."""
    return micro_batches(*synthetic_batch(config, batch, seed, step), micro_batch_size)[index]


class TokenFile:
    """A flat array of token ids on disk, memory-mapped: ``.npy`` (any int dtype) or raw ``.bin``.

    Raw ``.bin`` files are read with ``dtype`` (nanoGPT writes ``uint16``; use ``uint32`` for vocabularies
    over 65535). Batches are windows at random offsets (as nanoGPT's ``get_batch``), reproducible from
    ``(seed, step)``.
    """

    def __init__(self, path: str | Path, dtype: str = "uint16") -> None:
        path = Path(path)
        if path.suffix == ".npy":
            self.tokens: np.ndarray = np.load(path, mmap_mode="r")
        else:
            self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        if self.tokens.ndim != 1:
            raise ValueError(f"{path}: expected a flat array of tokens, got shape {self.tokens.shape}")

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def batch(self, batch: int, seq: int, seed: int = 0, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of shape ``(batch, seq)``: windows of ``seq + 1`` tokens shifted by one."""
        if len(self) < seq + 1:
            raise ValueError(f"token file has {len(self)} tokens, fewer than seq + 1 = {seq + 1}")
        starts = torch.randint(0, len(self) - seq, (batch,), generator=_generator(seed, step))
        windows = np.stack(
            [np.asarray(self.tokens[s : s + seq + 1], dtype=np.int64) for s in starts.tolist()]
        )
        data = torch.from_numpy(windows)
        return data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def batches(
        self, batch: int, seq: int, seed: int = 0, steps: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches for steps 0, 1, ... (``steps`` of them, or forever)."""
        step = 0
        while steps is None or step < steps:
            yield self.batch(batch, seq, seed, step)
            step += 1
