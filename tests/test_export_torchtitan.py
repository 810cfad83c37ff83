"""The torchtitan export loaded by torchtitan's own ``ConfigManager`` (torchtitan 0.2.2, installed with
``--no-deps`` beside the pinned torch: ``make venv``), its fields read back from torchtitan's ``JobConfig``,
its schedule names resolved by torch's ``get_schedule_class`` and its CSV by torch's action parser and
validator.

torchtitan's package ``__init__`` imports its float8/MoE kernels (triton, absent on CPU); its config
package needs only torch, tyro and its logger, so the test imports ``torchtitan.config`` with the package's
``__init__`` skipped (an empty package module over the installed directory)."""

from __future__ import annotations

import csv
import importlib.util
import sys
import types
from pathlib import Path

import pytest

from planner.export import ExportInput, export
from planner.export.common import EMBEDDING, HEAD, TRANSFORMER
from planner.model import ModelSpec
from planner.request import Config
from planner.runspec import RunSpec


def _config_manager() -> type:
    if "torchtitan" not in sys.modules:
        found = importlib.util.find_spec("torchtitan")
        if found is None or found.submodule_search_locations is None:
            pytest.skip("torchtitan is not installed (make venv installs torchtitan==0.2.2 --no-deps)")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(found.submodule_search_locations)
        sys.modules["torchtitan"] = pkg
    try:
        from torchtitan.config import ConfigManager
    except ImportError as e:
        pytest.skip(f"torchtitan's config package does not import: {e}")
    return ConfigManager


CASES = [
    ("gpipe", 4, 8, {}),
    ("1f1b", 4, 8, {}),
    ("1f1b", 1, 4, {}),
    ("interleaved", 4, 8, {"chunks": 2}),
    ("interleaved", 2, 6, {"chunks": 3}),
    ("zb-h1", 4, 8, {}),
    ("hanayo", 4, 8, {"waves": 1}),
]


def _input(name: str, D: int, N: int, kw: dict[str, int], recompute: bool) -> ExportInput:
    config = Config(tensor=2, pipeline=D, data=3, micro_batch=2, schedule=name, recompute=recompute, **kw)
    spec = RunSpec(config=config, microbatches=N)
    stages = spec.schedule().stages
    L = 2 * stages
    partition = [(0, 3), *[(1 + 2 * s, 3 + 2 * s) for s in range(1, stages - 1)], (2 * stages - 1, L + 2)]
    if stages == 1:
        partition = [(0, L + 2)]
    model = ModelSpec(name="tiny", layers=L, hidden=128, heads=4, seq=256, vocab=1000)
    return ExportInput(spec=spec.model_copy(update={"partition": partition}), model=model,
                       layer_kinds=(EMBEDDING, *[TRANSFORMER] * L, HEAD))


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("name,D,N,kw", CASES)
def test_torchtitan_loads_the_export(tmp_path: Path, name: str, D: int, N: int, kw: dict[str, int],
                                     recompute: bool) -> None:
    manager = _config_manager()
    from torch.distributed.pipelining import schedules as torch_schedules

    inp = _input(name, D, N, kw, recompute)
    exported = export("torchtitan", inp)
    for f in exported.files:
        (tmp_path / f.name).write_text(f.content)
    cfg = manager().parse_args(["--job.config_file", str(tmp_path / "job_config.toml")])
    par, c = cfg.parallelism, inp.config
    # what torchtitan will run, read from its own JobConfig
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (c.tensor, c.pipeline)
    assert par.data_parallel_replicate_degree * max(1, par.data_parallel_shard_degree) == c.data
    assert par.pipeline_parallel_microbatch_size == c.micro_batch
    assert cfg.training.local_batch_size // par.pipeline_parallel_microbatch_size == N
    assert cfg.training.global_batch_size == inp.spec.global_batch
    assert cfg.activation_checkpoint.mode == ("full" if recompute else "none")
    assert len(par.module_fqns_per_model_part) == inp.spec.schedule().stages
    assert [m for part in par.module_fqns_per_model_part for m in part] == (
        ["tok_embeddings", *[f"layers.{i}" for i in range(inp.model.layers)], "norm", "output"])  # type: ignore[union-attr]
    cls = torch_schedules.get_schedule_class(par.pipeline_parallel_schedule)
    if name == "interleaved":
        assert cls is torch_schedules.ScheduleInterleaved1F1B
        assert len(par.module_fqns_per_model_part) // D == kw["chunks"]
    if name in ("zb-h1", "hanayo"):
        path = Path(par.pipeline_parallel_schedule_csv)
        path = path if path.is_absolute() else tmp_path / path
        rows = list(csv.reader(path.open()))
        actions = {r: [torch_schedules._Action.from_str(x) for x in row] for r, row in enumerate(rows)}
        sched = inp.spec.schedule()
        stage_to_rank = torch_schedules._validate_schedule(actions, D, sched.stages, N)
        assert stage_to_rank == {s: sched.placement[0][s] for s in range(sched.stages)}
        if name == "hanayo":  # torchtitan's "v" placement: rank r holds stages r and 2D-1-r
            assert cls is torch_schedules.ScheduleZBVZeroBubble
            assert all(stage_to_rank[r] == stage_to_rank[2 * D - 1 - r] == r for r in range(D))
        else:
            assert issubclass(cls, torch_schedules.PipelineScheduleSingle)
    else:
        assert not par.pipeline_parallel_schedule_csv
        expected = {"gpipe": torch_schedules.ScheduleGPipe, "1f1b": torch_schedules.Schedule1F1B}.get(name)
        if expected is not None:
            assert cls is expected


def test_torchtitan_loads_op_checkpointing(tmp_path: Path) -> None:
    """A profile made with torchtitan's selective op checkpointing (``recompute_granularity`` op) exports
    ``mode = "selective"`` with ``selective_ac_option = "op"``, which torchtitan's JobConfig reads back; a
    candidate that recomputes fully still exports full."""
    manager = _config_manager()
    base = _input("1f1b", 1, 4, {}, False)
    for inp, mode in ((base, "selective"),
                      (ExportInput(spec=_input("1f1b", 1, 4, {}, True).spec, model=base.model,
                                   layer_kinds=base.layer_kinds), "full")):
        inp = ExportInput(**{**inp.__dict__, "recompute_granularity": "op", "kernels": "eager"})
        for f in export("torchtitan", inp).files:
            (tmp_path / f.name).write_text(f.content)
        cfg = manager().parse_args(["--job.config_file", str(tmp_path / "job_config.toml")])
        assert cfg.activation_checkpoint.mode == mode
        if mode == "selective":
            assert cfg.activation_checkpoint.selective_ac_option == "op"
