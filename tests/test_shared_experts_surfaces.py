"""Shared experts and dense layers (ModelSpec's ``shared_expert_ffn_hidden``, ``shared_expert_gate``, ``dense_layers``)
on the surfaces that read a model: measured profiles (the zoo's, profiler.run; a Hugging Face model's,
profiler.hf_model) time one block of each kind and give each block its kind's parameters and routed-expert parameters;
the Megatron-LM export writes and reads back ``--moe-shared-expert-intermediate-size``, ``--moe-shared-expert-gate``
and ``--moe-layer-freq`` (refusing a shared expert with biases, as Megatron-Core does); torchtitan's and DeepSpeed's
exports, which write no mixture of experts, export it (torchtitan's note naming the fields)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from surfaces_support import two_stage_input

from planner.analytic import analytic_profile
from planner.export import ExportError, ExportInput, export, parse
from planner.export.common import model_of
from planner.export.megatron import moe_layer_freq, parse_moe_layer_freq
from planner.model import ModelSpec
from planner.placement import pipeline_outermost_order
from planner.request import Config
from planner.runspec import RunSpec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

#: a tiny Llama-family mixture of experts: layers 0 and 2 dense (ffn_hidden 64), 1 and 3 with 4 experts of 24 and a
#: gated shared expert of 40
TINY = ModelSpec(name="tiny-shared-moe", layers=4, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, seq=16, vocab=128,
                 gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary", bias=False, experts=4,
                 experts_per_token=2, expert_ffn_hidden=24, shared_expert_ffn_hidden=40, shared_expert_gate=True,
                 dense_layers=(0, 2))
ROUTED = 4 * TINY.expert_params()  # a block's routed experts: what expert parallelism splits


@pytest.fixture(scope="module")
def measured():
    from profiler.run import profile_model

    return profile_model(TINY, micro_batches=[1, 2], repeats=1, warmup=0, threads=1)


def test_the_spec_kinds_differ() -> None:
    """(The shapes the tests below tell apart: a dense block, and one with experts and a gated shared expert.)"""
    assert TINY.block_params(0) == TINY.layer_params(False) != TINY.block_params(1) == TINY.layer_params(True)
    assert TINY.shared_expert_params() == 3 * 32 * 40 + 32 and ROUTED == 4 * 3 * 32 * 24


def test_measured_layers_one_block_of_each_kind() -> None:
    from executor.models import get_config
    from profiler.run import kind_firsts, measured_layers, source_layer

    cfg = get_config(TINY)
    assert kind_firsts(cfg) == {False: 0, True: 1}
    assert measured_layers(cfg, all_layers=False) == [0, 1, 2, 5]  # embedding, block.0 (dense), block.1, head
    assert [source_layer(cfg, i, [0, 1, 2, 5]) for i in range(6)] == [0, 1, 2, 1, 2, 5]
    assert measured_layers(cfg, all_layers=True) == list(range(6))
    # DeepSeek-V3's order, dense layers first: the first block with experts is block.3
    first_dense = get_config(TINY.model_copy(update={"layers": 6, "dense_layers": (0, 1, 2)}))
    assert measured_layers(first_dense, all_layers=False) == [0, 1, 4, 7]
    # a model without dense layers: block.0 only, as before
    plain = get_config(TINY.model_copy(update={"dense_layers": ()}))
    assert measured_layers(plain, all_layers=False) == [0, 1, 5]


def test_measured_profile_times_dense_blocks_apart(measured) -> None:
    prof = measured
    blocks = prof.layers[1:-1]
    assert [b.name for b in blocks] == [f"block.{i}" for i in range(4)]
    # each block's parameters are those of its kind (the layer built), fp32 bytes of the block it was timed on
    assert [b.params for b in blocks] == [TINY.block_params(i) for i in range(4)]
    assert [b.param_bytes for b in blocks] == [4 * TINY.block_params(i) for i in range(4)]
    # routed experts only: none in a dense block, never the shared expert
    assert [b.expert_params for b in blocks] == [0, ROUTED, 0, ROUTED]
    # the dense blocks take block.0's times, those with experts block.1's: two measurements
    assert blocks[2].fwd_time == blocks[0].fwd_time and blocks[2].bwd_time == blocks[0].bwd_time
    assert blocks[3].fwd_time == blocks[1].fwd_time and blocks[3].bwd_time == blocks[1].bwd_time
    assert blocks[0].fwd_time != blocks[1].fwd_time
    assert prof.environment["repeated_blocks"] == "block.2 (dense) reuses block.0; block.3 (experts) reuses block.1"
    assert "only the first block of each kind" in prof.notes
    assert prof.total_params == TINY.total_params()
    assert prof.shape is not None and (prof.shape.experts, prof.shape.shared_expert_ffn_hidden) == (4, 40)
    # the model an export writes out: with its shared expert and dense layers
    spec = model_of(prof)
    assert spec is not None and spec.dense_layers == (0, 2) and spec.shared_expert_gate
    assert json.loads(prof.environment["model_spec"])["shared_expert_ffn_hidden"] == 40


def test_measured_profile_all_layers() -> None:
    from profiler.run import profile_model

    prof = profile_model(TINY, micro_batches=[1], repeats=1, warmup=0, threads=1, all_layers=True)
    assert prof.environment["repeated_blocks"] == "none: every layer measured"
    assert [b.expert_params for b in prof.layers[1:-1]] == [0, ROUTED, 0, ROUTED]
    assert [b.params for b in prof.layers[1:-1]] == [TINY.block_params(i) for i in range(4)]


def _qwen3_moe_every_other() -> dict:
    """Qwen3 MoE with ``decoder_sparse_step`` 2: layers 0 and 2 dense, 1 and 3 with experts."""
    data = json.loads((FIXTURES / "tiny-qwen3-moe" / "config.json").read_text())
    return {**data, "decoder_sparse_step": 2}


@pytest.mark.parametrize("measure", [1, 2, 4])
def test_hf_model_builds_both_kinds(measure: int) -> None:
    """The lowered model holds a layer of each kind, numbered anew in its ``mlp_only_layers``; every block reuses
    the last measured one of its kind; routed experts per layer with experts only."""
    from profiler.hf_model import built_layers, hf_layer_model, repeated_blocks

    lm, spec = hf_layer_model(_qwen3_moe_every_other(), "q3-every-other", measure_layers=measure)
    assert spec.dense_layers == (0, 2)
    built = built_layers(spec, measure)
    assert built == {1: [0, 1], 2: [0, 1], 4: [0, 1, 2, 3]}[measure]
    decoders = lm.layers[1:-1]
    assert [type(d.layer.mlp).__name__ for d in decoders] == [
        "Qwen3MoeMLP" if spec.dense_layers and i in spec.dense_layers else "Qwen3MoeSparseMoeBlock" for i in built]
    assert [sum(p.numel() for p in d.parameters()) for d in decoders] == [spec.block_params(i) for i in built]
    # profile layer -> measured layer: block.2 reuses block.0 (dense), block.3 block.1 (experts)
    assert lm.repeat == ({1: [0, 1, 2, 1, 2, 3], 2: [0, 1, 2, 1, 2, 3], 4: [0, 1, 2, 3, 4, 5]}[measure])
    assert lm.expert_params == {2: 4 * spec.expert_params(), 4: 4 * spec.expert_params()}
    assert repeated_blocks(spec, measure) == ("none: every layer measured" if measure == 4 else
                                              "block.2 (dense) reuses block.0; block.3 (experts) reuses block.1")


def test_hf_qwen2_moe_profile() -> None:
    """Qwen2 MoE (a gated shared expert; layer 1 dense) measured with one decoder layer asked for: the first dense
    layer is built too; each block's parameters are the library's modules', its expert_params the routed experts'."""
    from profiler.hf_model import hf_layer_model
    from profiler.layer_model import profile_layer_model

    data = json.loads((FIXTURES / "tiny-qwen2-moe" / "config.json").read_text())
    lm, spec = hf_layer_model(data, "tiny-qwen2-moe", measure_layers=1)
    assert spec.dense_layers == (1,) and spec.shared_expert_ffn_hidden == 80 and spec.shared_expert_gate
    kinds = [type(d.layer.mlp).__name__ for d in lm.layers[1:-1]]
    assert kinds == ["Qwen2MoeSparseMoeBlock", "Qwen2MoeMLP"]
    prof = profile_layer_model(lm, [1], repeats=1, warmup=0)
    blocks = prof.layers[1:-1]
    assert [b.params for b in blocks] == [spec.block_params(i) for i in range(4)]
    routed = 4 * 3 * 64 * 48  # 4 experts of 48, gated; not the shared expert (80 wide) nor the router
    assert spec.mlp_params(True) == routed + spec.shared_expert_params() + 64 * 4
    assert [b.expert_params for b in blocks] == [routed, 0, routed, routed]
    assert blocks[2].fwd_time == blocks[0].fwd_time == blocks[3].fwd_time != blocks[1].fwd_time
    assert prof.shape is not None and prof.shape.shared_expert_ffn_hidden == 80
    assert prof.total_params == spec.total_params()


def _inp(model: ModelSpec, **cfg: object) -> ExportInput:
    return two_stage_input(model, 4, **{"tensor": 1, **cfg})


DEEPSEEKISH = ModelSpec(name="deepseekish", layers=8, hidden=256, heads=8, ffn_hidden=512, seq=128, vocab=1000,
                        gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary", bias=False, experts=8,
                        experts_per_token=2, expert_ffn_hidden=128, shared_expert_ffn_hidden=256,
                        dense_layers=(0, 1, 2))


def test_moe_layer_freq_form() -> None:
    assert moe_layer_freq(61, (0, 1, 2)) == "([0]*3+[1]*58)"
    assert moe_layer_freq(5, (1, 4)) == "([1]+[0]+[1]*2+[0])"
    # Megatron's own examples (moe_freq_type): the list form and the integer form
    assert parse_moe_layer_freq("([1]*3+[0]*1)*3", 12) == (3, 7, 11)
    assert parse_moe_layer_freq("([0]+[1]*23)", 24) == (0,)
    assert parse_moe_layer_freq("[0,1,1,1]", 4) == (0,)
    assert parse_moe_layer_freq("2", 6) == (1, 3, 5)
    assert parse_moe_layer_freq("1", 6) == ()
    for bad in ("__import__('os')", "[2]*4", "([0]*3+[1]*58)", "[[0]]*4"):
        with pytest.raises(ExportError, match="moe-layer-freq"):
            parse_moe_layer_freq(bad, 4)


def test_megatron_writes_and_reads_back_the_shared_expert_and_dense_layers() -> None:
    inp = _inp(DEEPSEEKISH)
    out = export("megatron", inp)
    text = out.main.content
    assert "--moe-shared-expert-intermediate-size 256 \\" in text
    assert "--moe-shared-expert-gate" not in text  # not gated
    assert "--moe-layer-freq '([0]*3+[1]*5)' \\" in text
    assert "--ffn-hidden-size 512 \\" in text and "--moe-ffn-hidden-size 128 \\" in text
    back = parse(out)
    assert back.config == inp.config and back.microbatches == 4 and back.layer_counts == [4, 4]
    assert (back.shared_expert_ffn_hidden, back.shared_expert_gate, back.dense_layers) == (256, False, (0, 1, 2))

    gated = _inp(TINY, tensor=1)
    back = parse(export("megatron", gated))
    assert (back.shared_expert_ffn_hidden, back.shared_expert_gate, back.dense_layers) == (40, True, (0, 2))


def test_megatron_without_shared_expert_or_dense_layers_writes_neither() -> None:
    plain = DEEPSEEKISH.model_copy(update={"shared_expert_ffn_hidden": None, "dense_layers": ()})
    out = export("megatron", _inp(plain))
    assert "--moe-shared-expert" not in out.main.content and "--moe-layer-freq" not in out.main.content
    back = parse(out)
    assert (back.shared_expert_ffn_hidden, back.shared_expert_gate, back.dense_layers) == (None, False, ())


def test_megatron_refuses_a_shared_expert_with_biases() -> None:
    biased = DEEPSEEKISH.model_copy(update={"bias": True})
    with pytest.raises(ExportError, match=r"shared_expert_ffn_hidden \(256\) with bias.*not supported in the shared"):
        export("megatron", _inp(biased))
    # biases without a shared expert: Megatron-Core's routed experts take them
    export("megatron", _inp(biased.model_copy(update={"shared_expert_ffn_hidden": None})))


def test_megatron_export_of_an_analytical_profile() -> None:
    """The profile's model_spec carries the fields to the export."""
    prof = analytic_profile(DEEPSEEKISH, "a100-80gb")
    run = RunSpec(config=Config(tensor=2, pipeline=2, data=2, micro_batch=1, schedule="1f1b"), microbatches=4,
                  partition=[(0, 5), (5, 10)])
    text = export("megatron", ExportInput.from_profile(run, prof)).main.content
    assert "--moe-shared-expert-intermediate-size 256" in text and "--moe-layer-freq '([0]*3+[1]*5)'" in text


@pytest.mark.parametrize("fmt", ["torchtitan", "deepspeed"])
def test_other_exports_run_it_and_say_what_they_do_not_write(fmt: str) -> None:
    """Neither writes a mixture of experts (torchtitan names a model flavor to register; DeepSpeed's model is the
    user's PipelineModule): they export the plan, torchtitan's note naming what its settings leave out."""
    inp = _inp(TINY)
    out = export(fmt, inp)
    back = parse(out)
    assert back.config == inp.config.model_copy(update={"order": pipeline_outermost_order(2, 2)})
    assert back.microbatches == 4
    if fmt == "torchtitan":
        note = next(n for n in out.notes if "mixture of 4 experts" in n)
        assert "layers 0, 2 (dense_layers" in note
        assert "a gated shared expert 40 wide (shared_expert_ffn_hidden, shared_expert_gate)" in note
    # expert parallelism stays refused, as for every mixture of experts (the megatron export writes it)
    with pytest.raises(ExportError, match="expert parallelism"):
        export(fmt, _inp(TINY, expert=2))
