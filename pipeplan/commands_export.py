"""``pipeplan export``: a schedule (``--schedule``, torch's compute-only CSV, JSON or text) or a planned
candidate (``--plan plan.json --candidate I``) in a training framework's own terms.

``register(app)`` adds the command to a Typer application (the CLI module owns the application)::

    pipeplan export --schedule interleaved --devices 4 --microbatches 8 --chunks 2 --format torch-csv
    pipeplan export --plan plan.json --candidate 0 --format megatron --profile p.json --cluster c.json
    pipeplan export --plan plan.json --candidate 0 --format slurm --gpus-per-node 8 --option partition=gpu

Formats: :data:`SCHEDULE_FORMATS` (of a schedule, or of a candidate's schedule) and :data:`PLAN_FORMATS`,
a registry of format name -> the function that writes a ``--plan`` candidate in it from the command's
options (:class:`PlanArgs`), its module imported only when that format is asked for: the training
frameworks (:mod:`planner.export`, one entry each) and Slurm's sbatch script
(:mod:`pipeplan.commands_export_slurm`). A schedule a framework lacks is refused naming the closest one it
has, with the predicted cost of switching when ``--profile`` and ``--cluster`` are given (``--closest``
exports that one instead). With them, the closest is, of the framework's stand-ins on the same t, D, W, b and N,
the fastest that the planner predicts fits in memory (:func:`planner.export.switch.best_closest`); where none
fits, the most alike, and the exported file's header says it does not fit and why.

Errors (unknown schedule or format, bad parameters, a schedule the format cannot express) print one line
to stderr and exit with code 2.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from pipeplan.options import (
    ChunksOpt,
    ConcatOpt,
    PipesOpt,
    ReplicationOpt,
    WavesOpt,
    fail,
    load_input,
    read_json,
    schedule_from_options,
    validation_summary,
)
from planner.limits import MAX_GPUS_PER_NODE
from planner.outpath import parent_problem, shown
from planner.schedules import BUILDERS
from planner.schedules.ir import Schedule
from planner.schedules.torch_csv import export_torch_csv

#: formats of a schedule's action lists
SCHEDULE_FORMATS: tuple[str, ...] = ("torch-csv", "json", "text")
#: the file a schedule format writes into an ``--out`` folder: the format's extension, so that a json and a
#: torch-csv export to the same folder do not overwrite each other (both were ``schedule``)
SCHEDULE_FILES: dict[str, str] = {"torch-csv": "schedule.csv", "json": "schedule.json", "text": "schedule.txt"}
#: the training frameworks: format -> module with ``export(inp: ExportInput) -> Export`` (planner.export)
FRAMEWORK_MODULES: dict[str, str] = {
    "megatron": "planner.export.megatron",
    "torchtitan": "planner.export.torchtitan",
    "deepspeed": "planner.export.deepspeed",
}


@dataclass
class PlanArgs:
    """The ``export`` options a ``--plan`` format reads."""

    fmt: str
    plan: Path
    candidate: int = 0
    profile: Path | None = None
    cluster: Path | None = None
    model: str | None = None
    gpus_per_node: int | None = None
    options: list[str] = field(default_factory=list)
    closest: bool = False


#: what a plan format returns: its files (name, text; the first is printed without --out) and notes
Files = tuple[list[tuple[str, str]], list[str]]


def schedule_text(sched: Schedule, fmt: str) -> str:
    if fmt == "torch-csv":
        return export_torch_csv(sched)
    if fmt == "json":
        return sched.to_json(indent=1) + "\n"
    return sched.to_text() + "\n"


def load_candidate(plan: Path, index: int) -> dict[str, Any]:
    """Candidate ``index`` of a ``pipeplan plan --json`` document (or of ``GET /plans/{id}``)."""
    return load_candidates(plan, index)[index]


def load_candidates(plan: Path, index: int) -> list[dict[str, Any]]:
    """The candidates of a plan document, checking that ``index`` is one of them."""
    doc = read_json("--plan", plan)
    cands = doc.get("candidates") if isinstance(doc, dict) else doc
    if not isinstance(cands, list) or not cands:
        raise ValueError(f"--plan: {plan} has no candidates (write it with pipeplan plan --json)")
    if not 0 <= index < len(cands):
        raise ValueError(f"--candidate: {index} is out of range; the plan has {len(cands)} candidates "
                         f"(0-{len(cands) - 1})")
    bad = next((i for i, c in enumerate(cands) if not isinstance(c, dict)), None)
    if bad is not None:
        raise ValueError(f"--plan: {plan}: candidates[{bad}] is {json.dumps(cands[bad])[:40]}, not a candidate "
                         "object (write the plan with pipeplan plan --json)")
    return cands


def export_framework(a: PlanArgs) -> Files:
    """A training framework's files for the candidate (:func:`export_plan`); a framework takes no ``--option``."""
    if a.options:
        raise ValueError(f"--option: --format {a.fmt} takes none (--option KEY=VALUE sets --format slurm's "
                         f"sbatch settings), got {a.options[0]!r}")
    exported, notes = export_plan(a.fmt, a.plan, a.candidate, a.profile, a.cluster, a.model, a.closest,
                                  a.gpus_per_node)
    return [(f.name, f.content) for f in exported.files], [*notes, *exported.notes]


def export_slurm(a: PlanArgs) -> Files:
    """The sbatch script of the candidate (:mod:`pipeplan.commands_export_slurm`)."""
    from pipeplan.commands_export_slurm import export_slurm as script

    return [("job.sbatch", script(a.plan, a.candidate, a.gpus_per_node, a.cluster, a.options))], []


#: formats of a planned candidate: name -> the function writing it
PLAN_FORMATS: dict[str, Callable[[PlanArgs], Files]] = {
    **dict.fromkeys(FRAMEWORK_MODULES, export_framework),
    "slurm": export_slurm,
}


def check_preset_layers(name: str, preset: Any, plan: Path, candidate: int, planned: int | None,
                        prof: Any, profile: Path | None) -> None:
    """ValueError unless the ``--model`` preset has the layers the plan was made on (as the Slurm export checks
    its ``--option model``, :func:`pipeplan.commands_export_slurm.check_model`): the candidate's partition, else
    the ``--profile``'s layers, else what the plan document says of its profile (``profile.layers``). The preset
    replaces the profile's model in the exported file (``--num-layers``, the layers per stage), so a GPT-2 preset
    on a GPT-3 plan wrote a 24-layer script over the plan's 16 stages, under the plan's predicted time."""
    from planner.model import PRESETS

    if planned is not None:
        what = f"candidate {candidate} of {plan} partitions {planned} layers"
    elif prof is not None:
        planned, what = len(prof.layers), f"--profile {profile} ({prof.name}) has {len(prof.layers)} layers"
    else:
        doc = read_json("--plan", plan)
        meta = doc.get("profile") if isinstance(doc, dict) else None
        layers = meta.get("layers") if isinstance(meta, dict) else None
        if not isinstance(layers, int) or isinstance(layers, bool):
            return  # nothing says what the plan was made on
        planned, what = layers, f"{plan} was planned on {meta.get('name') or 'a profile'} of {layers} layers"
    if preset.profile_layers == planned:
        return
    fits = sorted(n for n, m in PRESETS.items() if m.profile_layers == planned)
    raise ValueError(f"--model {name}: {preset.profile_layers} layers ({preset.layers} blocks, the embedding and the "
                     f"head), but {what}: give --model NAME of the model the plan was made for"
                     + (f" (of {planned} layers: {', '.join(fits)})" if fits else ""))


def export_plan(fmt: str, plan: Path, candidate: int, profile: Path | None, cluster: Path | None,
                model: str | None, closest: bool,
                gpus_per_node: int | None = None) -> tuple[Any, list[str]]:
    """The :class:`planner.export.Export` of candidate ``candidate`` and the notes to print."""
    from planner.cluster import load_cluster
    from planner.export.common import ExportInput, UnsupportedSchedule, best_supported_note, export_same_run
    from planner.export.switch import best_closest, refusal, request_of
    from planner.jsondoc import flag, number
    from planner.model import get_model
    from planner.profile import load_profile
    from planner.runspec import RunSpec
    from planner.units import devices

    # the model name first: a misspelt --model is refused before the plan is read or any note printed
    preset = get_model(model) if model else None
    cands = load_candidates(plan, candidate)
    doc = cands[candidate]
    spec = RunSpec.from_document(doc)
    prof = load_input("--profile", profile, load_profile) if profile else None
    cl = load_input("--cluster", cluster, load_cluster) if cluster else None
    planned = max((end for _, end in spec.partition), default=None)
    if prof is not None and planned is not None and planned != len(prof.layers):
        # the stage boundaries index the planning profile's layers: another profile's would be cut wrongly
        raise ValueError(f"--profile {profile}: {prof.name} has {len(prof.layers)} layers, but candidate {candidate} "
                         f"of {plan} partitions {planned}: give the profile the plan was made with")
    if preset is not None:
        check_preset_layers(model, preset, plan, candidate, planned, prof, profile)
    # without the profile, what the candidate document says of it (the checkpointing and kernels its times assume)
    from_doc = ExportInput.document_fields(doc) if prof is None else {}
    where = f"--plan {plan}: candidate {candidate}"
    try:
        shard_optimizer, shard_parameters = flag(doc, "shard_optimizer"), flag(doc, "shard_parameters")
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    base = ExportInput.from_profile(spec, prof, preset,
                                    gpus_per_node=gpus_per_node or (cl.gpus_per_node if cl else None),
                                    predicted=number(doc.get("iteration_time")), plan_path=str(plan),
                                    candidate=candidate, shard_optimizer=shard_optimizer,
                                    shard_parameters=shard_parameters, **from_doc)
    try:  # what a hand-edited candidate may get wrong: its schedule, partition and t against the model
        spec.check(len(prof.layers) if prof is not None else None, base.model.heads if base.model else None)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if cl is not None and base.world_size > cl.gpus:
        c = spec.config
        raise ValueError(f"{where}: t*D*W = {c.tensor}*{c.pipeline}*{c.data} = "
                         f"{devices(cl.device, base.world_size)}, more than --cluster {cluster}'s {cl.gpus}")
    module = importlib.import_module(FRAMEWORK_MODULES[fmt])
    notes: list[str] = []
    try:
        return export_same_run(module, base, doc.get("alternatives") or ()), notes
    except UnsupportedSchedule as err:
        # the candidate's own request (sharded optimizer, state, reserve): both times as the plan costed them
        request = request_of(doc, spec.global_batch)
        closest_time, closest_why = None, None
        if prof is not None and cl is not None:  # of the stand-ins, one that fits, the fastest
            err, t, why = best_closest(err, prof, cl, request)
            closest_time, closest_why = (t if math.isfinite(t) else None), (why or None)
        message = (refusal(err, prof, cl, request) + " "
                   + best_supported_note(module.TITLE, module.check, cands) + ".")
        if not closest:
            raise ValueError(message + " --closest exports the closest configuration instead.") from None
        # (the message ends naming the fastest candidate the framework can run: "it" would read as that one)
        notes.append(message.rstrip(".") + f"; exporting the closest configuration, {err.closest.config.label()} "
                     "(--closest)")
        inp = ExportInput.from_profile(err.closest, prof, base.model, gpus_per_node=base.gpus_per_node,
                                       predicted=closest_time, does_not_fit=closest_why,
                                       plan_path=str(plan), candidate=candidate,
                                       shard_optimizer=base.shard_optimizer, shard_parameters=base.shard_parameters,
                                       **from_doc)
        return module.export(inp), notes


def export(
    fmt: Annotated[str, typer.Option("--format", help=f"of a schedule: {', '.join(SCHEDULE_FORMATS)}; of a "
                                                      f"--plan candidate also: {', '.join(PLAN_FORMATS)}")] = "json",
    schedule: Annotated[str | None, typer.Option("--schedule", "-s", help=f"one of: {', '.join(sorted(BUILDERS))}")
                        ] = None,
    devices: Annotated[int | None, typer.Option("--devices", "-D", help="devices of one pipeline (D)")] = None,
    microbatches: Annotated[int | None, typer.Option("--microbatches", "-N", help="micro-batches per iteration (N)")
                            ] = None,
    chunks: ChunksOpt = None,
    waves: WavesOpt = None,
    pipelines: PipesOpt = None,
    concat: ConcatOpt = None,
    replication: ReplicationOpt = None,
    plan: Annotated[Path | None, typer.Option("--plan", help="a plan (pipeplan plan --json): export a candidate")
                    ] = None,
    candidate: Annotated[int, typer.Option("--candidate", help="which candidate of --plan (0 = best)")] = 0,
    profile: Annotated[Path | None, typer.Option(help="the plan's profile: model shape, layer kinds, dtype; with "
                                                      "--cluster, the cost of a refused schedule's closest")] = None,
    cluster: Annotated[Path | None, typer.Option(help="the plan's cluster: GPUs per node, costs")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="devices per node (default: the --cluster's)")] = None,
    model: Annotated[str | None, typer.Option(help="a preset model (planner.model) when --profile names none")
                     ] = None,
    option: Annotated[list[str] | None, typer.Option("--option", help="KEY=VALUE for the format (repeat)")] = None,
    closest: Annotated[bool, typer.Option("--closest", help="export the closest schedule the framework has instead of "
                                               "refusing (with --profile and --cluster: the fastest of those "
                                               "that fit in memory; the header warns when none does)")] = False,
    out: Annotated[str | None, typer.Option("--out", help="write here instead of stdout (a directory when the "
                                                          "export has several files, or when OUT ends in / or is "
                                                          "one, made if missing; the folder it is in must "
                                                          "exist)")] = None,
) -> None:
    """Export a schedule, or a planned candidate as Megatron-LM, torchtitan or DeepSpeed settings."""
    known = (*SCHEDULE_FORMATS, *PLAN_FORMATS)
    if fmt not in known:
        fail(f"--format: unknown format {fmt!r}; known: {', '.join(known)}")
    if gpus_per_node is not None and not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        fail(f"--gpus-per-node: devices per node, 1 to {MAX_GPUS_PER_NODE}, got {gpus_per_node}")
    try:
        # an option of the other way to export would be ignored: refused by name
        schedule_opts = {"--schedule": schedule, "--devices": devices, "--microbatches": microbatches,
                         "--chunks": chunks, "--waves": waves, "--pipelines": pipelines, "--concat": concat,
                         "--replication": replication}
        plan_opts = {"--candidate": candidate or None, "--profile": profile, "--cluster": cluster,
                     "--gpus-per-node": gpus_per_node, "--model": model, "--option": option or None,
                     "--closest": closest or None}
        if plan is not None:
            if schedule is not None:
                raise ValueError("give --plan or --schedule, not both")
            given = [k for k, v in schedule_opts.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: not with --plan, whose candidate has its own schedule")
            if fmt in SCHEDULE_FORMATS:
                given = [k for k, v in plan_opts.items() if v is not None and k != "--candidate"]
                if given:
                    raise ValueError(f"{', '.join(given)}: not with --format {fmt}, which writes the candidate's "
                                     "schedule only")
                from planner.runspec import RunSpec

                files = [(SCHEDULE_FILES[fmt], schedule_text(RunSpec.from_document(load_candidate(plan, candidate))
                                                    .schedule(), fmt))]
            else:
                files, notes = PLAN_FORMATS[fmt](PlanArgs(fmt, plan, candidate, profile, cluster, model,
                                                          gpus_per_node, option or [], closest))
                for n in dict.fromkeys(notes):  # each note once (a note two writers add is one note)
                    typer.echo(f"note: {n}", err=True)
        else:
            if fmt not in SCHEDULE_FORMATS:
                raise ValueError(f"--format {fmt} exports a --plan candidate: give --plan plan.json --candidate I")
            given = [k for k, v in plan_opts.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only with --plan (a schedule built from --schedule has no "
                                 "candidate, model or cluster)")
            missing = [n for n, v in (("--schedule", schedule), ("--devices", devices),
                                      ("--microbatches", microbatches)) if v is None]
            if missing:
                raise ValueError(f"give --plan, or {', '.join(missing)} to build a schedule")
            sched = schedule_from_options(schedule, devices, microbatches, chunks, waves,  # type: ignore[arg-type]
                                          pipelines, concat, replication)
            files = [(SCHEDULE_FILES[fmt], schedule_text(sched, fmt))]
    except ValidationError as exc:  # a candidate of --plan that is not a configuration
        fail(f"--plan {plan}: candidate {candidate}: {validation_summary(exc)}")
        return
    except ValueError as exc:
        fail(str(exc))
        return
    if out is None:
        typer.echo(files[0][1], nl=False)
        if len(files) > 1:
            typer.echo(f"note: also {', '.join(n for n, _ in files[1:])}: --out DIR writes every file", err=True)
        return
    # `--out tt/` is a directory even when the export is one file (Path() would drop the slash and write a file
    # named tt); a one-file export to a plain path is that file
    target = Path(out)
    try:
        as_folder = out.endswith(("/", os.sep)) or target.is_dir()
    except OSError as exc:  # a name too long for the file system
        fail(f"--out {shown(out)}: {exc.strerror or exc}")
        return
    # the folder it goes in must be there (as for run's and profile's --out); only the --out folder itself is made
    problem = parent_problem(target)
    if problem:
        fail(problem)
        return
    if len(files) == 1 and not as_folder:
        try:
            target.write_text(files[0][1])
        except OSError as exc:
            fail(f"--out {out}: cannot write it ({exc.strerror or exc})")
            return
        typer.echo(f"wrote {target}", err=True)
        return
    try:
        target.mkdir(exist_ok=True)
        for name, text in files:
            (target / name).write_text(text)
    except OSError as exc:
        fail(f"--out {out}: cannot write there ({exc.strerror or exc})")
        return
    typer.echo(f"wrote {', '.join(str(target / n) for n, _ in files)}", err=True)


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to ``app``."""
    app.command("export")(export)
