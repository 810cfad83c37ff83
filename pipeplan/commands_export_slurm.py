"""``pipeplan export --plan plan.json --candidate I --format slurm``: the ``sbatch`` script that runs a planned
candidate on a Slurm cluster, as ``pipeplan agent --launcher slurm`` submits it (:mod:`executor.slurm`), for
users who submit by hand::

    pipeplan export --plan plan.json --candidate 0 --format slurm --gpus-per-node 8 \\
        --option partition=gpu --option account=proj1 --option time=01:00:00 --option model=gpt2-medium

Nodes: ceil(t*D*W / G) with G from ``--gpus-per-node`` or the ``--cluster`` file's ``gpus_per_node``.
``--option KEY=VALUE`` keys: :data:`executor.slurm.EXPORT_OPTIONS`. A ``--cluster`` of CPU devices
(:func:`planner.units.is_cpu`) makes ``gpus`` default to ``no``: no ``#SBATCH --gpus-per-node``, ``pipeplan run
--backend gloo`` (the plan's processes are CPU processes; NCCL needs GPUs). The model ``pipeplan run`` builds
(``--option model``, else its default, :data:`executor.plan.DEFAULT_MODEL`) must have the layers the candidate's
partition covers (:meth:`planner.model.ModelSpec.profile_layers`), or the job would fail at its start ("partition
does not cover the model"): refused here instead. The ``export`` command
(:mod:`pipeplan.commands_export`) calls :func:`export_slurm` for ``--format slurm``; nothing here imports
torch.
"""

from __future__ import annotations

from pathlib import Path


def parse_options(items: list[str]) -> dict[str, str]:
    """``["key=value", ...]`` as a dict; a malformed item, an empty value (``out=`` wrote ``--out ''`` into the
    script, which the run refuses at the job's start) or a key given twice (the last was kept without a word) is a
    ValueError naming it."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"--option: {item!r} is not KEY=VALUE")
        if not value.strip():
            raise ValueError(f"--option: {key} has no value ({item!r}); leave the option out for its default")
        if key in out:
            raise ValueError(f"--option: {key} is given twice ({out[key]!r} and {value!r})")
        out[key] = value
    return out


def check_model(plan: Path, candidate: int, opts: dict[str, str]) -> None:
    """ValueError unless the model the script's ``pipeplan run`` builds has the layers candidate ``candidate`` of
    ``plan`` partitions: ``--option model``'s preset, else (with the default run command) run's default,
    :data:`executor.plan.DEFAULT_MODEL`. Nothing is checked for a candidate without a partition (the executor splits any
    model evenly), nor for a custom ``run-command`` without ``model`` (it may name its model its own way)."""
    from executor.plan import DEFAULT_MODEL
    from pipeplan.commands_export import load_candidate
    from planner.model import PRESETS, get_model
    from planner.runspec import RunSpec

    if "model" not in opts and "run-command" in opts:
        return
    name = opts.get("model", DEFAULT_MODEL)
    try:
        spec = get_model(name)
    except ValueError as e:
        raise ValueError(f"--option model={name}: {e}") from None
    try:
        partition = RunSpec.from_document(load_candidate(plan, candidate)).partition
    except ValueError:
        return  # (export_script names what is wrong with the plan)
    if not partition or partition[-1][1] == spec.profile_layers:
        return
    planned = partition[-1][1]
    fits = sorted(n for n, m in PRESETS.items() if m.profile_layers == planned)
    given = f"--option model={name}" if "model" in opts else f"pipeplan run's default model {name} (no --option model)"
    raise ValueError(f"{given}: {spec.profile_layers} layers ({spec.layers} blocks, the embedding and the head), "
                     f"but candidate {candidate} of {plan} partitions {planned} layers: the job would fail at its "
                     "start; give --option model=NAME of the model the plan was made for"
                     + (f" (of {planned} layers: {', '.join(fits)})" if fits else ""))


def export_slurm(plan: Path, candidate: int, gpus_per_node: int | None, cluster: Path | None,
                 options: list[str]) -> str:
    """The script's text; ValueError (the CLI prints it, exit 2) naming the field and the rule."""
    from executor.slurm import SlurmError, export_script

    opts = parse_options(options)
    if cluster is not None:
        from pipeplan.options import load_input
        from planner.cluster import load_cluster
        from planner.units import is_cpu

        cl = load_input("--cluster", cluster, load_cluster)
        if gpus_per_node is None:
            gpus_per_node = cl.gpus_per_node
        if is_cpu(cl.device):  # CPU processes: no GPUs to ask Slurm for, and gloo (NCCL needs GPUs)
            opts.setdefault("gpus", "no")
    if gpus_per_node is None:
        raise ValueError("--format slurm needs --gpus-per-node G or --cluster c.json (devices per node: a plan "
                         "of P processes runs on ceil(P/G) nodes)")
    check_model(plan, candidate, opts)
    try:
        return export_script(plan, candidate, gpus_per_node=gpus_per_node, options=opts)
    except SlurmError as e:
        raise ValueError(str(e)) from None
