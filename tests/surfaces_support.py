"""What the export-surface tests share (tests/test_*_surfaces.py): a model's export input on two pipeline stages; a
written Megatron-LM script's lines and flags, and the script edited."""

from __future__ import annotations

import pytest

from planner.export import ExportInput
from planner.export.common import EMBEDDING, HEAD, TRANSFORMER
from planner.model import ModelSpec
from planner.request import Config
from planner.runspec import RunSpec

# ---- the export's input and the script it writes ---------------------------------------------------------------------

def two_stage_input(model: ModelSpec, microbatches: int, **cfg: object) -> ExportInput:
    """``model`` on two pipeline stages (the embedding and the first half of its layers, then the rest and the head),
    ``microbatches`` a step, under ``cfg`` over pipeline 2, data 2, micro batch 1, 1F1B."""
    config = Config(**{"pipeline": 2, "data": 2, "micro_batch": 1, "schedule": "1f1b", **cfg})
    L = model.layers
    spec = RunSpec(config=config, microbatches=microbatches, partition=[(0, L // 2 + 1), (L // 2 + 1, L + 2)])
    return ExportInput(spec=spec, model=model, layer_kinds=(EMBEDDING, *[TRANSFORMER] * L, HEAD))


def script_lines(text: str) -> list[str]:
    """The script's lines, stripped, without their continuation backslash."""
    return [ln.strip().removesuffix(" \\") for ln in text.splitlines()]


def script_flags(text: str) -> dict[str, str]:
    """The script's ``--flag value`` lines (a switch: "")."""
    return {ln.split(" ")[0]: ln.partition(" ")[2] for ln in script_lines(text) if ln.startswith("--")}


def edited(text: str, drop: tuple[str, ...] = (), add: str = "") -> str:
    """The Megatron-LM script ``text`` without the lines of the flags ``drop``, and with the line ``add`` (a flag and
    its value) before its ``"$@"``."""
    lines = [ln for ln in text.splitlines() if not any(ln.strip().startswith(d + " ") or ln.strip() == d + " \\"
                                                        for d in drop)]
    i = lines.index('    "$@"')
    return "\n".join([*lines[:i], *([f"    {add} \\"] if add else []), *lines[i:]]) + "\n"



def assert_megatron_refuses(refused: list[tuple[str, str]]) -> None:
    """Each ``(script, words)``: Megatron's parser refuses ``script`` with a "megatron script: " error holding
    ``words``."""
    from planner.export import ExportError
    from planner.export.megatron import parse

    for script, words in refused:
        with pytest.raises(ExportError, match="megatron script: ") as err:
            parse(script)
        assert words in str(err.value), (words, str(err.value))
