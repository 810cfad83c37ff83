"""Model configurations and named presets of the model zoo.

Sources of the presets:

* ``gpt2-medium``: GPT-2 medium (Radford et al. 2019): 24 layers, hidden 1024, 16 heads, context 1024.
* ``gpt2-1.3b``: the GPT-2 model "with 1.3 billion parameters" of Chimera (Li & Hoefler, SC'21,
  section 4: "the max sequence length of Bert-48 and GPT-2 are set to 128 and 632"). Chimera's Table 4
  is not in our transcription; 24 layers x hidden 2048 gives 12*2048^2*24 + 50257*2048 ~ 1.31e9
  parameters, which matches the stated size (a 64-layer x 1280 model would too).
* ``bert-48``: Chimera section 4, Bert-48: 48 layers, hidden 1024, 16 heads, sequence length 128.
* ``gpt3-175b``: GPT-3 (Brown et al. 2020, Table 2.1): 96 layers, hidden 12288, 96 heads, context 2048.
* ``hanayo-bert`` / ``hanayo-gpt``: Hanayo (Liu et al., SC'23) section 5: "The BERT-style model consists
  of 64 layers, 64 attention heads, and a hidden size of 2560, while the GPT-style model has 128 layers,
  16 attention heads, and a hidden size of 1024". Sequence length and vocabulary are not given there;
  we use BERT's 512 / 30522 and GPT-3's 2048 / 51200 (assumption).
* ``gpt-tiny`` / ``bert-tiny``: small models for tests and CPU profiling.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

Family = Literal["gpt", "bert"]


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a transformer language model; ``ffn_hidden`` 0 means ``4 * hidden``."""

    family: Family
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn_hidden: int = 0
    tied_embeddings: bool = True
    dropout: float = 0.0
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if self.family not in ("gpt", "bert"):
            raise ValueError(f"family must be 'gpt' or 'bert', got {self.family!r}")
        for attr in ("layers", "hidden", "heads", "seq", "vocab"):
            if getattr(self, attr) < 1:
                raise ValueError(f"{attr} must be >= 1, got {getattr(self, attr)}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} must be divisible by heads {self.heads}")
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def num_profile_layers(self) -> int:
        """Layers of :func:`executor.models.build_layers`: embedding, the blocks, the head with the loss."""
        return self.layers + 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (e.g. a shorter sequence for profiling)."""
        return replace(self, **changes)


_PRESET_TABLE: list[tuple[str, Family, int, int, int, int, int]] = [
    # name,         family, layers, hidden, heads, seq,  vocab
    ("gpt-tiny", "gpt", 4, 64, 4, 32, 256),
    ("bert-tiny", "bert", 4, 64, 4, 32, 256),
    ("gpt2-medium", "gpt", 24, 1024, 16, 1024, 50257),
    ("gpt2-1.3b", "gpt", 24, 2048, 16, 632, 50257),
    ("bert-48", "bert", 48, 1024, 16, 128, 30522),
    ("gpt3-175b", "gpt", 96, 12288, 96, 2048, 51200),
    ("hanayo-bert", "bert", 64, 2560, 64, 512, 30522),
    ("hanayo-gpt", "gpt", 128, 1024, 16, 2048, 51200),
]

PRESETS: dict[str, ModelConfig] = {
    name: ModelConfig(family, layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, name=name)
    for name, family, layers, hidden, heads, seq, vocab in _PRESET_TABLE
}


def get_config(name_or_config: str | ModelConfig) -> ModelConfig:
    """A preset by name (see :data:`PRESETS`), or the given config unchanged."""
    if isinstance(name_or_config, ModelConfig):
        return name_or_config
    try:
        return PRESETS[name_or_config]
    except KeyError:
        raise ValueError(f"unknown model {name_or_config!r}; presets: {', '.join(sorted(PRESETS))}") from None
