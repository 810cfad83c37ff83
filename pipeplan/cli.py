"""The ``pipeplan`` command line (typer). Commands live in the modules of their packages, each adding
itself with ``register(app)``; this module imports none of them up front. ``COMMANDS`` names the module
of every command and its one-line help, so ``pipeplan --help`` lists them without importing numpy,
pydantic or torch (under 0.3 s), and a command imports only its own module: ``pipeplan plan`` never
loads torch. ``tests/test_cli_fast.py`` checks that the table matches what the modules register.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from typing import Any

from planner import cpuidle

cpuidle.mark()  # before the heavy imports: how busy the cores are while they run (planner.split_search)

import typer  # noqa: E402
from typer.core import TyperGroup  # noqa: E402

#: command -> (module whose ``register(app)`` adds it, its one-line help: the docstring's first sentence)
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("pipeplan.commands_schedule",
                 "Simulate a schedule with stage times FWD/BWD and message time COMM; print its figures."),
    "show": ("pipeplan.commands_schedule",
             "Draw the timeline: one row per device, one cell per time unit, micro-batch numbers in the cells."),
    "export": ("pipeplan.commands_export", "Export a schedule, or a planned candidate as Megatron-LM, torchtitan or "
                                          "DeepSpeed settings."),
    "profile": ("profiler.cli", "Profile a model layer by layer (a zoo preset, a Hugging Face config or your own "
                                "module) and write a ModelProfile JSON."),
    "profile-links": ("profiler.cli", "Measure point-to-point and all-reduce alpha/beta; run under torchrun "
                                      "(or with --local-procs N)."),
    "profile-device": ("profiler.cli", "Measure this machine's device description with torch (GEMM and "
                                       "memory-copy sweeps)."),
    "plan": ("pipeplan.commands_plan", "Rank every valid configuration by predicted throughput."),
    "predict": ("pipeplan.commands_plan", "Predict one configuration you name, with its time breakdown."),
    "profile-analytic": ("pipeplan.commands_plan", "Write an analytical profile: the operator-level model on the "
                                                "device description, per (b, t)."),
    "run": ("executor.cli", "Run a plan with one process per device (D*W*t) on this machine or on --nnodes "
                            "machines, measure it, optionally --check it."),
    "calibrate": ("pipeplan.commands_calibrate", "Fit compute scale, link scale and per-action overhead to "
                                                 "finished runs; store them with the cluster."),
    "db-upgrade": ("api.cli", "Upgrade the database schema to the latest migration."),
    "seed": ("api.cli", "Store the example clusters, analytic profiles of a few presets and a gpt-tiny profile "
                        "measured on this CPU (idempotent)."),
    "serve": ("api.cli", "Run the API with uvicorn (settings from PIPEPLAN_* and DATABASE_URL)."),
    "agent": ("api.cli", "Register with the API, claim jobs and run them with the executor until stopped "
                         "(Ctrl-C)."),
}


def load_module(group: TyperGroup, module: str) -> None:
    """Import ``module`` and add the commands its ``register(app)`` defines to ``group``."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:  # the package is not built yet / not installed: its commands are absent
        if e.name and not module.startswith(e.name):
            raise
        return
    sub = typer.Typer()
    mod.register(sub)
    for name, cmd in typer.main.get_group(sub).commands.items():
        group.commands.setdefault(name, cmd)


class LazyGroup(TyperGroup):
    """A typer group that imports a command's module when the command is looked up."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMANDS, *(n for n in self.commands if n not in COMMANDS)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands:
            if cmd_name in COMMANDS:
                load_module(self, COMMANDS[cmd_name][0])
            else:  # a command a module added without a line in COMMANDS: found, slowly (the test names it)
                for module in dict.fromkeys(m for m, _ in COMMANDS.values()):
                    load_module(self, module)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The command list from ``COMMANDS`` (no imports)."""
        rows = [(name, help_) for name, (_mod, help_) in COMMANDS.items()]
        rows += [(n, c.get_short_help_str(80)) for n, c in self.commands.items() if n not in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


# plain click help at the top (rich's would look every command up); each command's own help stays rich
app = typer.Typer(cls=LazyGroup, help="pipeplan: plan, simulate and run pipeline-parallel training.",
                  no_args_is_help=True, add_completion=False, rich_markup_mode=None)


@app.callback()
def _root() -> None:
    """pipeplan: plan, simulate and run pipeline-parallel training."""


#: commands that compute, print and exit: the process runs them with the cyclic garbage collector off, and
#: ends them without the interpreter's finalization (:func:`exit_now`). The search keeps ~0.5M small objects
#: alive to the end (the action lists behind the returned timelines); a collection after it would visit every
#: one (0.15 s on GPT-3 175B / 1024 GPUs) to free nothing that the exit does not free, and the finalization
#: collects once more and frees them one by one (0.27-0.37 s measured at load 4-5).
SHORT_LIVED = frozenset({"plan", "predict"})


def main() -> None:
    if not SHORT_LIVED.intersection(sys.argv[1:2]):
        app()
        return
    gc.disable()
    try:
        app()
    except SystemExit as e:
        exit_now(e.code)
    exit_now(0)


def exit_now(code: object) -> None:
    """End the process with ``code`` (as ``SystemExit`` reads it) once its output is flushed, without the
    interpreter's finalization: nothing is left to do for a short-lived command (no atexit handler of ours;
    logging's handlers are flushed here)."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what could be written was
            status = status or 1
    os._exit(status)


if __name__ == "__main__":
    main()
