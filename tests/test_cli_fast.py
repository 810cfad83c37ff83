"""The command line stays light (issue 13): commands that run no model import no torch, and the command
table that ``pipeplan --help`` prints without importing anything matches what the modules register."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import click
import typer
from typer.testing import CliRunner

from pipeplan.cli import COMMANDS, LazyGroup, app, load_module

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_plan_and_help_import_no_torch(tmp_path: Path) -> None:
    prof = tmp_path / "p.json"
    out = _python(f"""
        import sys
        from pipeplan.cli import app
        from typer.testing import CliRunner
        r = CliRunner().invoke(app, ["--help"])
        assert r.exit_code == 0, r.output
        print("after help:", "torch" in sys.modules, "numpy" in sys.modules)
        r = CliRunner().invoke(app, ["profile-analytic", "--preset", "gpt2-medium", "--out", {str(prof)!r}])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(app, ["plan", "--profile", {str(prof)!r}, "--cluster",
                                     "examples/clusters/dgx-a100-80gb.json", "--global-batch", "64", "--gpus", "16"])
        assert r.exit_code == 0, r.output
        assert "evaluated" in r.output, r.output
        print("after plan:", "torch" in sys.modules)
    """)
    assert "after help: False False" in out
    assert "after plan: False" in out


def test_every_command_module_imports_without_torch() -> None:
    mods = sorted({m for m, _ in COMMANDS.values()})
    out = _python(f"""
        import importlib, sys
        for m in {mods!r}:
            importlib.import_module(m)
        print("torch loaded:", "torch" in sys.modules)
    """)
    assert "torch loaded: False" in out


def test_run_validates_and_launches_without_importing_torch(tmp_path: Path) -> None:
    """``pipeplan run``'s own process reads the plan, validates it and hands it to the launcher; only the ranks
    build layers. It imported torch (~3 s of CPU on the 2-core machine) before every run: here the launch is
    replaced by a stand-in that records what the parent had imported when it launched. (``--hf-config`` reads
    the configuration with transformers, which imports torch.)"""
    out = _python("""
        import sys
        import executor.launch
        from pipeplan.cli import app
        from typer.testing import CliRunner

        def launch(plans, nproc, **kw):
            print("at launch:", "torch" in sys.modules, plans[0].schedule().devices, nproc)
            raise SystemExit(0)

        executor.launch.launch = launch
        for args in (["--schedule", "1f1b", "--devices", "2", "--microbatches", "4", "--check"],
                     ["--schedule", "interleaved", "--devices", "2", "--microbatches", "4", "--chunks", "2",
                      "--model", "bert-tiny"]):
            r = CliRunner().invoke(app, ["run", *args])
            assert r.exit_code == 0, (r.output, r.exception)
            print(r.output, end="")
    """)
    assert out.splitlines() == ["at launch: False 2 2"] * 2, out


def test_command_table_matches_the_modules() -> None:
    """Each module registers exactly the commands the table gives it, with the table's one-line help."""
    commands: dict[str, click.Command] = {}
    for module in sorted({m for m, _ in COMMANDS.values()}):
        group = LazyGroup(name="t")
        load_module(group, module)
        listed = {n for n, (m, _) in COMMANDS.items() if m == module}
        assert set(group.commands) == listed, (
            f"{module} registers {sorted(group.commands)}, pipeplan.cli.COMMANDS lists {sorted(listed)}: "
            f"add each command there with its module and the first line of its docstring")
        commands.update(group.commands)
    for name, (_module, help_) in COMMANDS.items():
        real = commands[name].get_short_help_str(1000)
        assert real == help_, f"pipeplan.cli.COMMANDS[{name!r}] should read {real!r}"


def test_unknown_command_is_refused() -> None:
    res = CliRunner().invoke(app, ["no-such-command"])
    assert res.exit_code == 2 and "No such command" in res.output


def test_help_lists_every_command() -> None:
    res = CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0
    for name in COMMANDS:
        assert name in res.output
    ctx = click.Context(typer.main.get_command(app))
    assert ctx.command.list_commands(ctx) == list(COMMANDS)


def test_a_command_missing_from_the_table_still_runs(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pipeplan.cli as cli

    table = dict(cli.COMMANDS)
    del table["simulate"]
    monkeypatch.setattr(cli, "COMMANDS", table)
    res = CliRunner().invoke(app, ["simulate", "-s", "1f1b", "-D", "2", "-N", "2"])
    assert res.exit_code == 0 and "makespan" in res.output, res.output


def test_every_module_with_commands_is_in_the_table() -> None:
    """A package's command module (one defining ``register(app)``) that ``COMMANDS`` does not name would never
    be loaded: its commands would be missing from the CLI."""
    found = set()
    for pkg in ("pipeplan", "profiler", "executor", "api", "planner"):
        for path in (ROOT / pkg).rglob("*.py"):
            if "def register(app" in path.read_text():
                found.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    listed = {m for m, _ in COMMANDS.values()}
    assert found <= listed, f"add the commands of {sorted(found - listed)} to pipeplan.cli.COMMANDS"
