"""Full activation recomputation's memory: one rule (:func:`planner.profile.checkpointed`) for the executor, the
profiler and the memory model.

Full recomputation checkpoints each transformer layer (Megatron-LM ``--recompute-method uniform
--recompute-num-layers 1``; Korthikanti et al. 2022, section 5 and Table 2, "full activation recomputation":
``2 s b h L`` bytes per micro-batch for ``L`` layers at 16 bits, ``/ t`` only with sequence parallelism); the
embedding and the LM head keep their stash. The tests check the memory model's figure against the paper, the
executor's saved tensors against the memory model, and the search's rows against both."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.cost import ConfigCosts, layer_stash, stage_infos
from planner.model import PRESETS
from planner.operators import OperatorOptions
from planner.profile import checkpointed
from planner.request import Config, TrainingRequest
from planner.schedules import build
from planner.search import Planner

ROOT = Path(__file__).resolve().parents[1]
DGX = ROOT / "examples" / "clusters" / "dgx-a100-80gb.json"


def _g3(sequence_parallel: bool = False):  # type: ignore[no-untyped-def]
    return analytic_profile(PRESETS["gpt3-175b"], "a100-80gb", dtype="fp16", micro_batches=(1, 2),
                            tensor_sizes=(1, 8), options=OperatorOptions(sequence_parallel=sequence_parallel))


@pytest.mark.parametrize("sp", [False, True])
def test_full_recomputation_keeps_each_layer_input_korthikanti_table2(sp: bool) -> None:
    """A GPT stage of L transformer layers at t = 8 keeps ``2 s b h L`` bytes per micro-batch under full
    recomputation (Korthikanti et al. 2022, Table 2), ``2 s b h L / t`` with sequence parallelism; its
    recomputation working set is one layer's stash (eq. 2 at t = 8)."""
    prof = _g3(sp)
    spec = PRESETS["gpt3-175b"]
    s, h, t, b, L = spec.seq, spec.hidden, 8, 2, 6
    cfg = Config(tensor=t, pipeline=4, data=1, micro_batch=b, schedule="1f1b", recompute=True)
    bounds = [(0, 10), (10, 10 + L), (10 + L, 40), (40, len(prof.layers))]
    costs = ConfigCosts(prof, load_cluster(DGX), TrainingRequest(global_batch=8), cfg, build("1f1b", 4, 4), bounds)
    assert costs.stages[1].transformer_layers == L
    assert costs.activation(1) == pytest.approx(2 * s * b * h * L / (t if sp else 1))
    block = prof.layers[1]
    assert costs.stages[1].recompute_working_bytes == pytest.approx(layer_stash(block, t, prof.shape))
    # the first stage keeps the embedding's whole stash besides its 9 layers' inputs; the last the head's
    emb, head = prof.layers[0], prof.layers[-1]
    assert costs.activation(0) == pytest.approx(
        b * (layer_stash(emb, t, prof.shape) + 9 * 2 * s * h / (t if sp else 1)))
    n_last = bounds[3][1] - bounds[3][0] - 1
    assert costs.activation(3) == pytest.approx(
        b * (layer_stash(head, t, prof.shape) + n_last * 2 * s * h / (t if sp else 1)))
    # without recomputation: the whole stash
    plain = ConfigCosts(prof, load_cluster(DGX), TrainingRequest(global_batch=8),
                        cfg.model_copy(update={"recompute": False}), build("1f1b", 4, 4), bounds)
    assert plain.activation(1) == pytest.approx(b * L * layer_stash(block, t, prof.shape))


def test_not_checkpointed_layers_keep_their_plain_backward_time() -> None:
    """The embedding and the LM head are not checkpointed: their backward under recomputation is the plain one,
    whatever a profile recorded (an old measured profile timed them checkpointed)."""
    prof = _g3()
    emb = prof.layers[0].model_copy(update={"recompute_time": {1: 9.0, 2: 9.0}})
    assert not checkpointed(emb.kind) and checkpointed(prof.layers[1].kind)
    assert emb.time("recompute", 1) == emb.time("bwd", 1)
    assert emb.shard_time("recompute", 1, 8) == emb.shard_time("bwd", 1, 8)
    block = prof.layers[1]
    assert block.time("recompute", 1) > block.time("bwd", 1)


def _measured_slope(mod: torch.nn.Module, start: int, config) -> float:  # type: ignore[no-untyped-def]
    """Bytes per sample autograd keeps for a micro-batch's backward after ``mod``'s forward (the saved tensors,
    storages counted once, parameters not: :func:`profiler.memory.saved_bytes`), as the profiler's slope
    between 2 and 4 samples (per-micro-batch constants drop out)."""
    from profiler.memory import saved_bytes

    def at(rows: int) -> int:
        gen = torch.Generator().manual_seed(rows)
        if start == 0:
            x = torch.randint(0, config.vocab, (rows, config.seq), generator=gen)
        else:
            x = torch.randn(rows, config.seq, config.hidden, generator=gen, requires_grad=True)
        targets = [torch.randint(0, config.vocab, (rows, config.seq), generator=gen)]
        return saved_bytes(mod, lambda: mod(x, targets if mod.has_head else None))

    return (at(4) - at(2)) / 2


def test_executor_keeps_what_the_memory_model_charges() -> None:
    """On the CPU, what the executor's stage keeps for a micro-batch in flight (its saved tensors) is what the
    memory model charges per sample: under recomputation each transformer layer's input plus the embedding's
    and the head's stash; without it the whole stash. The profile is measured from the same layers."""
    from executor.interpreter import StageModule
    from executor.models import build_layers, get_config, layer_kinds
    from profiler.run import profile_model

    config = get_config("gpt-tiny")
    prof = profile_model(config, micro_batches=[1, 2], repeats=1, warmup=0, threads=1)
    n, kinds = config.num_profile_layers, layer_kinds(config)
    block_input = config.seq * config.hidden * 4  # fp32
    for a, b in [(0, 3), (1, n - 1), (3, n)]:
        info = stage_infos(prof, [(a, b)], 1)[0]
        for rc in (True, False):
            mod = StageModule(build_layers(config, 0, a, b), a, 4, rc, kinds[a:b])
            got = _measured_slope(mod, a, config)
            want = info.recompute_kept_bytes if rc else info.stash_bytes
            assert got == pytest.approx(want, abs=8), (a, b, rc)
        # per layer, not per stage: each checkpointed block keeps its input (Korthikanti Table 2's 2 s b h L)
        assert info.recompute_kept_bytes >= info.transformer_layers * block_input


def test_profiled_recompute_time_is_plain_backward_for_embedding_and_head() -> None:
    """The profiler times the recomputed backward of the blocks; the embedding's and the head's is their plain
    backward (they are not checkpointed)."""
    from profiler.run import profile_model

    prof = profile_model("gpt-tiny", micro_batches=[1], repeats=1, warmup=0, recompute=True, threads=1)
    for lay in prof.layers:
        assert lay.recompute_time is not None
        if not checkpointed(lay.kind):
            assert lay.recompute_time == lay.bwd_time, lay.name


def test_gpt3_plan_rows_with_recomputation_carry_every_layer_input() -> None:
    """The search's GPT-3 175B rows on 1024 A100-80GB (batch 1536) with recomputation: stage 0 holds, per
    micro-batch in flight (D of them in 1F1B), the embedding's stash plus ``2 s b h`` per transformer layer
    (t = 8, no sequence parallelism), and once the recomputed layer's stash."""
    prof = analytic_profile(PRESETS["gpt3-175b"], "a100-80gb", micro_batches=(1, 2), tensor_sizes=(1, 8))
    spec = PRESETS["gpt3-175b"]
    s, h, el = spec.seq, spec.hidden, 2
    req = TrainingRequest(global_batch=1536, gpus=1024, schedules=["1f1b"], micro_batches=[1], max_tensor=8,
                          top=400)
    planner = Planner(prof, load_cluster(DGX), req)
    result = planner.search()
    rows = [c for c in result.candidates if c.config.recompute and c.config.tensor == 8]
    assert rows
    for cand in rows:
        cfg = cand.config
        ref, costs = planner.prepare(cfg)
        assert costs is not None
        planner.evaluate(ref, costs)
        assert cand.memory == pytest.approx(ref.memory)
        st0 = costs.stages[0]
        L0, b, D = st0.transformer_layers, cfg.micro_batch, cfg.pipeline
        per_mb = b * (layer_stash(prof.layers[0], 8, prof.shape) + L0 * el * s * h)
        working = b * layer_stash(prof.layers[1], 8, prof.shape)
        inflight = min(D, cand.microbatches)
        activations = cand.memory[0] - cand.state[0] - cand.memory_reserve
        assert activations == pytest.approx(inflight * per_mb + working, rel=1e-9)


@pytest.mark.parametrize("sp", [False, True])
def test_partition_fitting_sums_what_stage_infos_charges(sp: bool) -> None:
    """:meth:`planner.memory.MemoryModel.partition_fitting`'s running sums give, for any layer range, the
    same recomputation figures as :func:`planner.cost.stage_infos` of that range (kept bytes, working set)."""
    from planner.memory import MemoryModel
    from planner.shapes import ScheduleCache

    prof = _g3(sp)
    mem = MemoryModel(prof, load_cluster(DGX), TrainingRequest(global_batch=8), ScheduleCache())
    _, _, stash, kept, biggest, transient = mem._layer_memory(8, 16.0, 16.0)
    n = len(prof.layers)
    for i, j in [(0, 1), (0, 7), (1, 13), (40, 60), (90, n), (0, n)]:
        info = stage_infos(prof, [(i, j)], 8)[0]
        assert kept[j] - kept[i] == pytest.approx(info.recompute_kept_bytes)
        assert stash[j] - stash[i] == pytest.approx(info.stash_bytes)
        assert biggest[i, j] == pytest.approx(info.recompute_working_bytes)
        assert transient[i, j] == pytest.approx(info.transient_bytes)
    assert transient[n - 1, n] > 0 and transient[0, n - 1] == 0  # the loss, in the LM head only
