"""The README's export commands run as written (a newcomer pastes them): the "Export to the frameworks" block
and the Slurm section's `pipeplan export --format slurm`, each command in a fresh directory with the
repository's `examples/`; each must exit 0 and write what it says. (Unrestricted, the GPT-3 plan's first
candidate is zero-bubble H1, which Megatron-LM and DeepSpeed refuse: the README's plan names their schedules.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _block_after(heading: str, contains: str) -> list[str]:
    """The commands (continuation lines joined) of the first ```bash/```sh block after ``heading`` that holds
    ``contains``."""
    rest = README[README.index(heading):]
    for body in re.findall(r"```(?:bash|sh)\n(.*?)```", rest, flags=re.S):
        if contains in body:
            return [c.strip() for c in body.replace("\\\n", " ").splitlines()
                    if c.strip() and not c.strip().startswith("#")]
    raise AssertionError(f"no block with {contains!r} after {heading!r} in README.md")


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_readme_export_commands_run_as_written(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    export = _block_after("## Export to the frameworks", "--format megatron")
    slurm = [c for c in _block_after("### Slurm", "--format slurm") if c.startswith("pipeplan export")]
    assert slurm, "the Slurm section's pipeplan export example is gone"
    for cmd in export + slurm:
        r = _run(cmd, tmp_path)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert "--pipeline-model-parallel-size" in _run(export[2], tmp_path).stdout  # the megatron script
    assert (tmp_path / "tt" / "job_config.toml").is_file()
    assert '"train_batch_size": 1536' in (tmp_path / "ds_config.json").read_text()
    assert "#SBATCH --nodes=" in (tmp_path / "job.sbatch").read_text()
