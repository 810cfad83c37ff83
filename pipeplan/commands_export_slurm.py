"""``pipeplan export --plan plan.json --candidate I --format slurm``: the ``sbatch`` script that runs a planned
candidate on a Slurm cluster, as ``pipeplan agent --launcher slurm`` submits it (:mod:`executor.slurm`), for
users who submit by hand::

    pipeplan export --plan plan.json --candidate 0 --format slurm --gpus-per-node 8 \\
        --option partition=gpu --option account=proj1 --option time=01:00:00 --option model=gpt2-medium

Nodes: ceil(t*D*W / G) with G from ``--gpus-per-node`` or the ``--cluster`` file's ``gpus_per_node``.
``--option KEY=VALUE`` keys: :data:`executor.slurm.EXPORT_OPTIONS`. The ``export`` command
(:mod:`pipeplan.commands_export`) calls :func:`export_slurm` for ``--format slurm``; nothing here imports
torch.
"""

from __future__ import annotations

from pathlib import Path


def parse_options(items: list[str]) -> dict[str, str]:
    """``["key=value", ...]`` as a dict; a malformed item is a ValueError naming it."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--option: {item!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out


def export_slurm(plan: Path, candidate: int, gpus_per_node: int | None, cluster: Path | None,
                 options: list[str]) -> str:
    """The script's text; ValueError (the CLI prints it, exit 2) naming the field and the rule."""
    from executor.slurm import SlurmError, export_script

    if gpus_per_node is None:
        if cluster is None:
            raise ValueError("--format slurm needs --gpus-per-node G or --cluster c.json (devices per node: a plan "
                             "of P processes runs on ceil(P/G) nodes)")
        from pipeplan.options import load_input
        from planner.cluster import load_cluster

        gpus_per_node = load_input("--cluster", cluster, load_cluster).gpus_per_node
    try:
        return export_script(plan, candidate, gpus_per_node=gpus_per_node, options=parse_options(options))
    except SlurmError as e:
        raise ValueError(str(e)) from None
