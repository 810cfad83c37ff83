"""Export of a planned candidate to the frameworks people train with (issue 15): Megatron-LM's command
line (:mod:`.megatron`), a torchtitan TOML job config (:mod:`.torchtitan`) and DeepSpeed's JSON config
(:mod:`.deepspeed`), each with the parser that reads it back (the round-trip tests), and the refusal of a
schedule a framework lacks with the closest it has (:class:`UnsupportedSchedule`; its predicted cost:
:func:`planner.export.switch.switch_cost`). Pure Python.

Every format module has ``NAME``, ``TITLE``, ``SCHEDULES`` (ours it runs), ``check(spec)`` (raises
:class:`UnsupportedSchedule`), ``export(inp) -> Export`` and ``parse(...) -> Parsed``.
"""

from __future__ import annotations

from types import ModuleType

from planner.export import deepspeed, megatron, torchtitan
from planner.export.common import (
    Export,
    ExportError,
    ExportFile,
    ExportInput,
    Parsed,
    UnsupportedSchedule,
    model_of,
)

#: framework format name -> its module
FRAMEWORKS: dict[str, ModuleType] = {m.NAME: m for m in (megatron, torchtitan, deepspeed)}


def framework(name: str) -> ModuleType:
    """The format module called ``name``; the error names the known ones."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise ExportError(f"format: unknown framework {name!r}; known: {', '.join(FRAMEWORKS)}") from None


def export(name: str, inp: ExportInput) -> Export:
    """Export ``inp`` for framework ``name`` (:class:`UnsupportedSchedule` when it lacks the schedule)."""
    return framework(name).export(inp)


def parse(exported: Export) -> Parsed:
    """Read an :class:`Export` back with its format's parser."""
    mod = framework(exported.format)
    if mod is torchtitan:
        csv = next((f.content for f in exported.files[1:] if f.name.endswith(".csv")), None)
        return torchtitan.parse(exported.main.content, csv)
    return mod.parse(exported.main.content)


__all__ = ["FRAMEWORKS", "Export", "ExportError", "ExportFile", "ExportInput", "Parsed", "UnsupportedSchedule",
           "export", "framework", "model_of", "parse"]
