"""Command-line options shared by the commands that build a schedule (simulate, show, export, run) or plan one
(plan, predict)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from planner.jsondoc import unique_keys
from planner.placement import ORDERS, order_error
from planner.schedules import BUILDERS, SCHEDULE_PARAMETERS, Schedule, build, check_size, parameters

if TYPE_CHECKING:
    from pydantic import ValidationError

T = TypeVar("T")
P = TypeVar("P", str, Path)

ScheduleOpt = Annotated[str, typer.Option("--schedule", "-s", help=f"one of: {', '.join(sorted(BUILDERS))}")]
DevicesOpt = Annotated[int, typer.Option("--devices", "-D", help="devices of one pipeline (D)")]
MicroOpt = Annotated[int, typer.Option("--microbatches", "-N", help="micro-batches per iteration (N)")]
# the schedule parameters: declared beside the builders (planner.schedules.SCHEDULE_PARAMETERS)
ChunksOpt = Annotated[int | None, typer.Option(help=SCHEDULE_PARAMETERS["chunks"].help)]
WavesOpt = Annotated[int | None, typer.Option(help=SCHEDULE_PARAMETERS["waves"].help)]
PipesOpt = Annotated[int | None, typer.Option(help=SCHEDULE_PARAMETERS["pipelines"].help)]
ConcatOpt = Annotated[str | None, typer.Option(help=SCHEDULE_PARAMETERS["concat"].help)]
ReplicationOpt = Annotated[str | None, typer.Option(help=SCHEDULE_PARAMETERS["replication"].help)]
# the model state of the run planned for (planner.request.TrainingRequest): plan and predict
BytesPerParamOpt = Annotated[float | None, typer.Option(
    help="model state per parameter (default 16: mixed-precision Adam's bf16 weights and gradients and fp32 master "
         "weights and moments; Megatron-LM's bf16 runs keep fp32 gradients: 18)")]
ShardOptimizerOpt = Annotated[bool, typer.Option(
    "--shard-optimizer",
    help="the optimizer state (Adam's 12 bytes per parameter) is split over the W data-parallel replicas: ZeRO-1, "
         "Megatron-LM's --use-distributed-optimizer, DeepSpeed ZeRO stage 1; memory and the optimizer step count a "
         "device's share (exports carry it)")]
MemoryReserveOpt = Annotated[float | None, typer.Option(
    help="GiB per device set aside for the framework and workspace (default by the cluster's device: 2 "
         "on GPUs, 0.31 on CPUs), counted in each device's peak beside the model's own memory")]
#: the largest --memory-reserve, GiB: TrainingRequest's 2**60 bytes
MAX_MEMORY_RESERVE_GIB = 2**30
ShardParametersOpt = Annotated[bool, typer.Option(
    "--shard-parameters",
    help="the weights and gradients are split over the W data-parallel replicas too: ZeRO-3, PyTorch FSDP2 as "
         "torchtitan runs it (data_parallel_shard_degree = W); each layer's weights are all-gathered where it "
         "computes and its gradients reduce-scattered, costed per micro-batch without a pipeline and once per "
         "iteration with one (planner.fsdp); Chimera, GEMS and PipeDream's schedules are left out")]

# the rank order (planner.placement): plan searches both where they differ unless told one; predict takes one
_ORDERS_HELP = (f"{' or '.join(ORDERS)} (innermost first): {ORDERS[0]} keeps a replica's pipeline contiguous, "
                f"{ORDERS[1]} puts the pipeline outermost and a stage's data-parallel copies together (Megatron-LM's "
                "default order, torchtitan's, DeepSpeed's)")
RankOrderOpt = Annotated[str | None, typer.Option(
    "--rank-order", metavar="ORDER",
    help=f"rank order of every configuration, {_ORDERS_HELP} (default: both, where they place groups on "
         "different nodes)")]
OrderOpt = Annotated[str, typer.Option(
    "--order", metavar="ORDER", help=f"rank order of the configuration, {_ORDERS_HELP}")]


def rank_order(option: str, value: str | None) -> str | None:
    """``--rank-order`` (plan) or ``--order`` (predict) checked: a rank order, or None when not given; another
    value: one error line naming the option and the orders, exit 2."""
    if value is None:
        return None
    if (why := order_error(value)) is not None:
        fail(f"{option}: {why.split(': ', 1)[1]}")
    return value


def memory_reserve_bytes(gib: float | None) -> float | None:
    """``--memory-reserve`` (GiB per device, plan and predict) in bytes, None when not given; out of 0 to
    :data:`MAX_MEMORY_RESERVE_GIB` (or not finite): one error line, exit 2."""
    if gib is None:
        return None
    if not 0 <= gib <= MAX_MEMORY_RESERVE_GIB:
        fail(f"--memory-reserve: GiB per device, a finite number from 0 to {MAX_MEMORY_RESERVE_GIB}, got {gib:g}")
    return gib * 2**30


def schedule_from_options(schedule: str, devices: int, microbatches: int, chunks: int | None = None,
                          waves: int | None = None, pipelines: int | None = None,
                          concat: str | None = None, replication: str | None = None) -> Schedule:
    """Build a schedule from CLI options; an option the schedule does not take is a ValueError."""
    given = {"chunks": chunks, "waves": waves, "pipelines": pipelines, "concat": concat,
             "replication": replication}
    assert set(given) == set(SCHEDULE_PARAMETERS), "an option per declared schedule parameter"
    params = {k: v for k, v in given.items() if v is not None}
    if replication is not None and not replication.strip():  # (the builders read '' as no replication)
        raise ValueError("--replication: replica counts per stage separated by commas, e.g. 2,1,1; got ''")
    check_size(devices, microbatches, chunks, waves, pipelines=pipelines)
    if schedule in BUILDERS:
        allowed = parameters(schedule)
        for k in params:
            if k not in allowed:
                raise ValueError(f"--{k} does not apply to schedule {schedule!r} "
                                 f"(it takes: {', '.join('--' + p for p in allowed) or 'no extra options'})")
    return build(schedule, devices, microbatches, **params)


def warn_option(sentence: str) -> None:
    """A library's warning about an option's value (``seq 1000000 is beyond ...``: the sentence starts with the
    option's name), as the option: one ``warning: --...`` line on stderr."""
    typer.echo(f"warning: --{sentence}", err=True)


def validation_summary(error: ValidationError, most: int = 4, options: bool = False) -> str:
    """A pydantic error as the API words it (``field.path: message; ...``): one line, without pydantic's input
    echo and documentation links; past ``most`` errors, how many more. ``options``: the fields are the
    command's own options (``global_batch`` -> ``--global-batch``), as the user typed them."""
    errs = error.errors()
    def one(e: dict) -> str:  # type: ignore[type-arg]
        msg = str(e["msg"]).removeprefix("Value error, ")
        if options and msg.split(":")[0].isidentifier() and ": " in msg:  # a validator naming its field itself
            head, rest = msg.split(": ", 1)
            return f"--{head.replace('_', '-')}: {rest}"
        loc = ".".join(str(x) for x in e["loc"])
        if options and loc:
            loc = "--" + loc.replace("_", "-")
        return f"{loc}: {msg}" if loc else msg

    parts = [one(e) for e in errs[:most]]
    more = f" (and {len(errs) - most} more)" if len(errs) > most else ""
    return "; ".join(parts) + more


#: a request's or configuration's field as the plan/predict option that sets it (the planner's and the API's
#: messages name fields: ``gpus: budget 5000 exceeds ...``; on the command line the user typed ``--gpus``)
FIELD_OPTIONS = {"gpus": "gpus", "global_batch": "global-batch", "max_tensor": "max-tensor", "top": "top",
                 "max_expert": "max-expert", "expert": "expert",
                 "expert_tensor": "expert-tensor", "rank_order": "rank-order", "order": "order",
                 "schedules": "schedules", "memory_reserve_bytes": "memory-reserve",
                 "bytes_per_param": "bytes-per-param",
                 "tensor": "tensor", "pipeline": "pipeline", "data": "data", "micro_batch": "micro-batch",
                 "schedule": "schedule", "chunks": "chunks", "waves": "waves", "pipelines": "pipelines",
                 "concat": "concat", "replication": "replication"}


def as_options(message: str, fields: dict[str, str] = FIELD_OPTIONS) -> str:
    """``message`` with a leading field name (also after a configuration's label, ``t=1 D=2 ...: tensor: ...``)
    written as the option that sets it: ``--gpus: budget 5000 exceeds ...``."""
    def one(m: re.Match[str]) -> str:
        name = fields.get(m.group(2))
        return f"{m.group(1)}--{name}: " if name else m.group(0)

    return re.sub(r"(^|: )([a-z_]+): ", one, message, count=1)


def fail(message: str) -> None:
    """One line on stderr, exit code 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def read_problem(exc: OSError | UnicodeDecodeError, option: str, path: str | Path) -> str:
    """Why the file ``path`` given as ``option`` could not be read, in one line naming both."""
    if isinstance(exc, FileNotFoundError):
        return f"{option} {path}: no such file"
    if isinstance(exc, IsADirectoryError):
        return f"{option} {path}: is a folder; give a file"
    if isinstance(exc, PermissionError):
        return f"{option} {path}: not readable (permission denied)"
    if isinstance(exc, UnicodeDecodeError):
        return f"{option} {path}: not a text file (UTF-8)"
    return f"{option} {path}: cannot read it ({exc.strerror or exc})"


def read_json(option: str, path: str | Path) -> Any:
    """The JSON document of the file given as ``option`` (``--plan``, ``--runs``), or a ValueError in one line
    naming the option and the file: it cannot be read (:func:`read_problem`), it is not JSON, it nests past
    Python's recursion, or an object holds a key twice (JSON leaves that undefined; Python's reader kept the
    last). One reading, one wording, for every command that reads a plain JSON file."""
    try:
        return json.loads(Path(path).read_text(), object_pairs_hook=unique_keys)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(read_problem(e, option, path)) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{option} {path}: not JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{option} {path}: nested too deep to be read") from None
    except ValueError as e:
        raise ValueError(f"{option} {path}: {e}") from None


def load_input(option: str, path: P, load: Callable[[P], T], what: str | None = None) -> T:
    """``load(path)`` for the file given as ``option`` (``--profile``), or one ``error:`` line and exit 2: the file
    cannot be read (missing, a folder, not readable, not text), or it is not a valid ``what`` (pydantic's errors
    as :func:`validation_summary` words them, with the limits of :mod:`planner.limits`)."""
    from pydantic import ValidationError

    what = what or option.lstrip("-")
    try:
        return load(path)
    except (OSError, UnicodeDecodeError) as e:
        fail(read_problem(e, option, path))
    except ValidationError as e:
        fail(f"invalid {what} {path}: {validation_summary(e)}")
    except (ValueError, RecursionError) as e:  # the loader's own checks; JSON nested past Python's recursion
        fail(f"invalid {what} {path}: {str(e).removeprefix(f'{path}: ')}")  # (a loader naming the file itself)
    raise AssertionError  # unreachable: fail exits
