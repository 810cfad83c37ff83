"""What the command-line tests share: a refusal is exit code 2 with one ``error:`` line last, no traceback."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from pipeplan.cli import app

runner = CliRunner()


def run(args: list[Any]) -> Any:
    """``pipeplan ARGS`` in-process (paths and numbers as text)."""
    return runner.invoke(app, [str(a) for a in args])


def refused(args: list[Any], *needles: str) -> str:
    """Run ``args``; check that the command refused them with one ``error:`` line holding every needle, and no
    exception escaped as a traceback; its output."""
    r = run(args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert not isinstance(r.exception, ArithmeticError | ValueError | OSError | MemoryError), r.exception
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: "), r.output
    for n in needles:
        assert n in r.output, (n, r.output)
    return r.output
