"""Every export of every schedule a framework runs reads back (its format's own parser) as the same t, D, W,
b, N, schedule, chunks and recomputation -- and the partition, where the format can say it. Schedules the
framework lacks are refused, naming a closest configuration that it runs. Over hypothesis-drawn candidates
and over the candidates the planner really returns."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.export import FRAMEWORKS, ExportError, ExportInput, UnsupportedSchedule, export, parse
from planner.export.common import EMBEDDING, HEAD, TRANSFORMER
from planner.model import PRESETS, ModelSpec
from planner.operators import OperatorOptions
from planner.placement import pipeline_outermost_order
from planner.profile import FUSED_WORDS
from planner.request import Config, TrainingRequest
from planner.runspec import RunSpec
from planner.schedules import ALL_SCHEDULES, ASYNC_SCHEDULES
from planner.search import plan

ROOT = Path(__file__).resolve().parent.parent
ALL = list(ALL_SCHEDULES)


def check_round_trip(fmt: str, inp: ExportInput) -> None:
    exported = export(fmt, inp)
    back = parse(exported)
    spec = inp.spec
    c = spec.config
    if fmt != "megatron":  # torchtitan and DeepSpeed always put the pipeline outermost, and say so where it differs
        c = c.model_copy(update={"order": pipeline_outermost_order(c.pipeline, c.data)})
        assert (c.order != spec.config.order) == any("ranks=tp-dp-pp" in n for n in exported.notes)
    assert back.config == c, (fmt, back.config.label(), c.label())
    assert back.microbatches == spec.microbatches
    if back.partition is not None:
        assert back.partition == [tuple(p) for p in spec.partition]
    counts = inp.transformer_counts()
    if back.layer_counts is not None and counts is not None and not any("cannot say" in n for n in exported.notes):
        assert back.layer_counts == counts


@st.composite
def candidates(draw: st.DrawFn) -> ExportInput:
    """A candidate of any schedule: t, D, W, b, N, the schedule's parameters, recomputation, and a partition
    of an L-layer model's profile (embedding, L blocks, head) into the schedule's stages."""
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1", "hanayo", "chimera", "gems"]))
    D = draw(st.sampled_from([1, 2, 4, 8] if name not in ("chimera", "gems") else [2, 4, 8]))
    params: dict[str, object] = {}
    N = D * draw(st.integers(1, 4))
    if name == "interleaved":
        params["chunks"] = draw(st.sampled_from([2, 3, 4]))
    if name == "hanayo":
        params["waves"] = draw(st.sampled_from([1, 2]))
    if name == "chimera":
        params["pipelines"] = 1
    W = draw(st.sampled_from([1, 2, 3, 16]))
    # (the planner names the order tp-dp-pp only where it differs from the default: D > 1 and W > 1)
    order = draw(st.sampled_from(["tp-pp-dp", "tp-dp-pp"] if D > 1 and W > 1 else ["tp-pp-dp"]))
    config = Config(tensor=draw(st.sampled_from([1, 2, 4, 8])), pipeline=D, data=W,
                    micro_batch=draw(st.sampled_from([1, 2, 4])), schedule=name,
                    recompute=draw(st.booleans()), order=order, **params)
    spec = RunSpec(config=config, microbatches=N)
    stages = spec.schedule().stages
    L = draw(st.integers(max(stages, 2), 3 * stages + 4))
    # stage boundaries over the L + 2 profile layers: strictly increasing cuts
    cuts = sorted(draw(st.sets(st.integers(1, L + 1), min_size=stages - 1, max_size=stages - 1)))
    bounds = [0, *cuts, L + 2]
    partition = [(bounds[i], bounds[i + 1]) for i in range(stages)]
    model = ModelSpec(name="m", layers=L, hidden=64 * config.tensor, heads=4 * config.tensor, seq=128, vocab=1000)
    return ExportInput(spec=spec.model_copy(update={"partition": partition}), model=model,
                       layer_kinds=(EMBEDDING, *[TRANSFORMER] * L, HEAD), dtype=draw(st.sampled_from(["bf16", "fp16"])),
                       gpus_per_node=draw(st.sampled_from([None, 4, 8])))


@pytest.mark.parametrize("fmt", list(FRAMEWORKS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inp=candidates())
def test_every_supported_export_round_trips(fmt: str, inp: ExportInput) -> None:
    mod = FRAMEWORKS[fmt]
    try:
        mod.check(inp.spec)
    except UnsupportedSchedule as err:
        assert inp.config.schedule not in mod.SCHEDULES or inp.config.schedule == "hanayo" or (
            inp.config.schedule == "interleaved" and inp.config.pipeline == 1)
        mod.check(err.closest)  # the closest is one it runs
        c, k = err.closest.config, inp.config
        assert (c.tensor, c.pipeline, c.data, c.expert, c.order, c.micro_batch, c.recompute) == (
            k.tensor, k.pipeline, k.data, k.expert, k.order, k.micro_batch, k.recompute)
        assert err.closest.microbatches == inp.spec.microbatches
        with pytest.raises(UnsupportedSchedule, match=f"cannot run schedule '{k.schedule}'.*closest it has is"):
            export(fmt, inp)
        check_round_trip(fmt, ExportInput(spec=err.closest, model=inp.model, layer_kinds=inp.layer_kinds))
        return
    assert inp.config.schedule in mod.SCHEDULES
    check_round_trip(fmt, inp)


@pytest.mark.parametrize("fmt,supported", [
    ("megatron", {"1f1b", "interleaved"}),
    ("torchtitan", {"gpipe", "1f1b", "interleaved", "zb-h1", "hanayo"}),
    ("deepspeed", {"1f1b"}),
])
def test_which_schedules_each_framework_runs(fmt: str, supported: set[str]) -> None:
    mod = FRAMEWORKS[fmt]
    runs = set()
    for name in ALL:
        params = PARAMS.get(name, {})
        D = 4
        config = Config(tensor=1, pipeline=D, data=1, micro_batch=1, schedule=name, **params)
        try:
            mod.check(RunSpec(config=config, microbatches=8))
            runs.add(name)
        except UnsupportedSchedule as err:
            assert err.closest.config.schedule in mod.SCHEDULES
    assert runs == supported


PARAMS: dict[str, dict[str, object]] = {"chimera": {"pipelines": 1}, "1f1b-rr": {"replication": "2,1,1"},
                                        "pipedream-rr": {"replication": "2,1,1"}}


@pytest.mark.parametrize("fmt", list(FRAMEWORKS))
@pytest.mark.parametrize("name", ALL)
def test_every_refusal_says_why(fmt: str, name: str) -> None:
    """A schedule a framework lacks is refused with its own reason, never the generic fallback; the
    asynchronous ones (weight stashing / double buffering) say that the framework's updates are synchronous."""
    config = Config(tensor=1, pipeline=4, data=1, micro_batch=1, schedule=name, **PARAMS.get(name, {}))
    try:
        FRAMEWORKS[fmt].check(RunSpec(config=config, microbatches=8))
    except UnsupportedSchedule as err:
        message = str(err)
        assert "no such schedule" not in message, message
        assert f"cannot run schedule '{name}'" in message
        if name in ASYNC_SCHEDULES:
            assert "its updates are synchronous" in message and "asynchronous" in message, message
        return
    assert name not in ASYNC_SCHEDULES, f"{fmt} accepted the asynchronous {name}"


@pytest.fixture(scope="module")
def planned() -> tuple[list, object, object]:
    prof = analytic_profile(PRESETS["gpt2-medium"], "A100-SXM4-80GB")
    cl = load_cluster(ROOT / "examples" / "clusters" / "dgx-a100-80gb.json")
    res = plan(prof, cl, TrainingRequest(global_batch=64, gpus=16, top=100))
    return res.candidates, prof, cl


@pytest.mark.parametrize("fmt", list(FRAMEWORKS))
def test_the_planners_candidates_round_trip(fmt: str, planned: tuple[list, object, object]) -> None:
    cands, prof, cl = planned
    assert len(cands) >= 50
    mod, exported, refused = FRAMEWORKS[fmt], 0, 0
    for cand in cands:
        inp = ExportInput.from_profile(cand.run_spec, prof, gpus_per_node=cl.gpus_per_node)
        try:
            check_round_trip(fmt, inp)
            exported += 1
        except UnsupportedSchedule as err:
            refused += 1
            mod.check(err.closest)
            check_round_trip(fmt, ExportInput.from_profile(err.closest, prof))
        except ExportError as e:  # pragma: no cover - would be a bug: say which candidate
            raise AssertionError(f"{fmt}: {cand.label()}: {e}") from e
    assert exported > 0 and exported + refused == len(cands)


def test_megatron_arguments_say_the_configuration() -> None:
    spec = RunSpec(config=Config(tensor=8, pipeline=4, data=2, micro_batch=1, schedule="interleaved", chunks=3,
                                 recompute=True), microbatches=8,
                   partition=[(0, 9), *[(9 + 8 * i, 17 + 8 * i) for i in range(10)], (89, 98)])
    text = export("megatron", ExportInput(spec=spec, model=PRESETS["gpt3-175b"], gpus_per_node=8)).main.content
    for arg in ("--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 4",
                "--num-layers-per-virtual-pipeline-stage 8", "--micro-batch-size 1", "--global-batch-size 16",
                "--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1",
                "--num-layers 96", "--hidden-size 12288", "--num-attention-heads 96", "--seq-length 2048"):
        assert arg in text, arg
    assert "torchrun --nnodes 8 --nproc-per-node 8" in text


def test_megatron_selective_recomputation_follows_the_profile() -> None:
    """A profile made with selective recomputation (Megatron's --recompute-granularity selective) exports that
    flag where the candidate does not recompute fully, the full-recomputation flags where it does, with flash
    attention too (Megatron-Core checkpoints the flash kernel as well); the round trip keeps recompute off."""
    spec = PRESETS["gpt2-medium"]

    def inp(recompute: bool, **kw: object) -> ExportInput:
        prof = analytic_profile(spec, "A100-SXM4-80GB", micro_batches=(1,), tensor_sizes=(1, 2),
                                options=OperatorOptions(recompute="selective", **kw))  # type: ignore[arg-type]
        run = RunSpec(config=Config(tensor=2, pipeline=1, data=1, micro_batch=1, schedule="1f1b",
                                    recompute=recompute), microbatches=4)
        return ExportInput.from_profile(run, prof, gpus_per_node=8)
    plain = export("megatron", inp(False)).main.content
    assert "--recompute-granularity selective" in plain and "--recompute-method" not in plain
    assert parse(export("megatron", inp(False))).config.recompute is False
    full = export("megatron", inp(True)).main.content
    assert "--recompute-granularity full" in full and "selective" not in full
    assert "--recompute-granularity selective" in export("megatron", inp(False, attention="flash")).main.content


def test_megatron_uneven_first_and_last_stage() -> None:
    # 24 blocks over D = 4: 5, 7, 7, 5 (first and last stages also hold the embedding and the head)
    spec = RunSpec(config=Config(tensor=1, pipeline=4, data=1, micro_batch=2, schedule="1f1b"), microbatches=4,
                   partition=[(0, 6), (6, 13), (13, 20), (20, 26)])
    inp = ExportInput(spec=spec, model=PRESETS["gpt2-medium"])
    ex = export("megatron", inp)
    assert "--decoder-first-pipeline-num-layers 5" in ex.main.content
    assert "--decoder-last-pipeline-num-layers 5" in ex.main.content
    assert parse(ex).layer_counts == [5, 7, 7, 5] == inp.transformer_counts()


def test_megatron_partitions_its_split_cannot_say_go_as_a_layout() -> None:
    """A virtual pipeline whose 8 stages do not divide 36 layers (a new user's plan: D = 2, v = 4) was written as
    --num-virtual-stages-per-pipeline-rank 4, which Megatron cannot split, with a note claiming it splits them
    evenly; it is now the plan's own partition as --pipeline-model-parallel-layout, and so is an uneven middle."""
    model = ModelSpec(name="m", layers=36, hidden=256, heads=4, seq=128, vocab=1000)
    kinds = (EMBEDDING, *[TRANSFORMER] * 36, HEAD)
    cuts = [0, 6, 10, 15, 19, 24, 28, 33, 38]  # E+5 | 4 | 5 | 4 | 5 | 4 | 5 | 4+L
    spec = RunSpec(config=Config(tensor=1, pipeline=2, data=1, micro_batch=1, schedule="interleaved", chunks=4),
                   microbatches=4, partition=[(cuts[i], cuts[i + 1]) for i in range(8)])
    ex = export("megatron", ExportInput(spec=spec, model=model, layer_kinds=kinds))
    assert "--pipeline-model-parallel-layout Et*5|t*4|t*5|t*4|t*5|t*4|t*5|t*4L" in ex.main.content.replace("'", "")
    assert "--num-virtual-stages-per-pipeline-rank" not in ex.main.content
    back = parse(ex)
    assert back.config == spec.config and back.layer_counts == [5, 4, 5, 4, 5, 4, 5, 4]
    uneven = RunSpec(config=Config(tensor=1, pipeline=4, data=1, micro_batch=1, schedule="1f1b"), microbatches=4,
                     partition=[(0, 9), (9, 20), (20, 29), (29, 38)])  # 8, 11, 9, 8 + L
    ex = export("megatron", ExportInput(spec=uneven, model=model, layer_kinds=kinds))
    assert "--pipeline-model-parallel-layout Et*8|t*11|t*9|t*8L" in ex.main.content.replace("'", "")
    assert "--decoder-first-pipeline-num-layers" not in ex.main.content
    assert parse(ex).layer_counts == [8, 11, 9, 8]


def test_deepspeed_config_keys() -> None:
    import json

    spec = RunSpec(config=Config(tensor=2, pipeline=4, data=8, micro_batch=2, schedule="1f1b", recompute=True),
                   microbatches=16)
    doc = json.loads(export("deepspeed", ExportInput(spec=spec, dtype="bf16")).main.content)
    assert doc["train_batch_size"] == 2 * 16 * 8 and doc["train_micro_batch_size_per_gpu"] == 2
    assert doc["gradient_accumulation_steps"] == 16 and doc["bf16"]["enabled"] and not doc["fp16"]["enabled"]
    assert doc["pipeline"]["stages"] == 4 and doc["pipeline"]["activation_checkpoint_interval"] == 1
    assert doc["pipeline"]["topology"] == {"num_pp": 4, "num_mp": 2, "num_dp": 8}
    assert doc["zero_optimization"] == {"stage": 0}


def test_a_hugging_face_profile_exports_its_architecture_kernels_and_runtime() -> None:
    """An analytical profile of a Llama config.json exports as Llama (GQA, SwiGLU, RMSNorm, rotary, untied, no
    biases: the profile's ``model_spec``), with Megatron's dropout turned off as the model trains, sequence
    parallelism as the profile's times assume it, the overlapped gradient reduction of its runtime, and the
    kernels and runtime the prediction assumes written in every format's header. Before, the profile exported
    as a GPT of the same width (dropout 0.1, no --sequence-parallel)."""
    from profiler.hf_config import read_hf_config

    spec = read_hf_config(ROOT / "examples" / "models" / "llama-3.1-8b" / "config.json", seq=8192)
    prof = analytic_profile(spec, "H100-SXM5-80GB", micro_batches=(1,), tensor_sizes=(1, 2),
                            options=OperatorOptions(attention="flash", attention_impl="cudnn", dropout=False,
                                                    sequence_parallel=True), dp_allreduce="overlapped")
    run = RunSpec(config=Config(tensor=2, pipeline=2, data=2, micro_batch=1, schedule="1f1b"), microbatches=4,
                  partition=[(0, 17), (17, 34)])
    inp = ExportInput.from_profile(run, prof)
    assert inp.model == spec.model_copy(update={"source": ""}) and inp.sequence_parallel and inp.dropout is False
    text = export("megatron", inp).main.content
    for arg in ("--group-query-attention", "--num-query-groups 8", "--swiglu", "--normalization RMSNorm",
                "--position-embedding-type rope", "--rotary-base 500000", "--untie-embeddings-and-output-weights",
                "--disable-bias-linear", "--ffn-hidden-size 14336", "--sequence-parallel",
                "--attention-dropout 0.0", "--hidden-dropout 0.0", "--overlap-grad-reduce"):
        assert arg in text, arg
    assert "--attention-backend fused" in text  # cuDNN's kernel named in a note
    assumed = (f"the prediction assumes cuDNN's fused attention, no dropout, sequence parallelism, {FUSED_WORDS}, "
               "overlapped pipeline sends, the data-parallel all-reduce overlapped with the backward")
    for fmt in FRAMEWORKS:
        assert assumed in "\n".join(f.content for f in export(fmt, inp).files), fmt
    assert parse(export("megatron", inp)).config == run.config
    t1 = ExportInput.from_profile(run.model_copy(update={"config": run.config.model_copy(update={"tensor": 1})}), prof)
    assert "sequence parallelism" not in export("megatron", t1).main.content  # nothing to split at t = 1
    assert "--qk-layernorm" not in text
    qwen3 = read_hf_config(ROOT / "examples" / "models" / "qwen3-8b" / "config.json", seq=4096)
    q_run = run.model_copy(update={"partition": [(0, 19), (19, 38)]})
    q_text = export("megatron", ExportInput.from_profile(q_run, analytic_profile(
        qwen3, "H100-SXM5-80GB", micro_batches=(1,), tensor_sizes=(1, 2)))).main.content
    assert "--qk-layernorm" in q_text and "--kv-channels" not in q_text and "--num-query-groups 8" in q_text
    q_titan = export("torchtitan", ExportInput.from_profile(q_run, analytic_profile(
        qwen3, "H100-SXM5-80GB", micro_batches=(1,), tensor_sizes=(1, 2)))).main.content
    assert 'name = "qwen3"' in q_titan and 'name = "llama3"' in export("torchtitan", inp).main.content
    # a GPT preset's default profile: dropout on (Megatron's default, no flag), unfused, nothing overlapped
    gpt_run = run.model_copy(update={"partition": [(0, 13), (13, 26)]})
    gpt = ExportInput.from_profile(gpt_run, analytic_profile(PRESETS["gpt2-medium"], "A100-SXM4-80GB",
                                                             micro_batches=(1,), tensor_sizes=(1, 2)))
    text = export("megatron", gpt).main.content
    assert "dropout" in text and "--attention-dropout" not in text and "--overlap-grad-reduce" not in text
    assert "--sequence-parallel" not in text and "the unfused attention core" in text


@pytest.mark.parametrize(("name", "eps", "written"), [("qwen2.5-7b", 1e-6, "1e-06"), ("llama-3.1-8b", 1e-5, None)])
def test_megatron_writes_the_norm_epsilon(name: str, eps: float, written: str | None) -> None:
    """Every norm's epsilon (ModelSpec.norm_eps, the config's rms_norm_eps) as --norm-epsilon where it is not Megatron's
    default 1e-5, and read back; the default left to Megatron (Llama 3.1: nothing written)."""
    from surfaces_support import script_flags, two_stage_input

    from planner.export.megatron import parse as megatron_parse
    from profiler.hf_config import read_hf_config

    model = read_hf_config(ROOT / "examples" / "models" / name, seq=4096)
    assert model.norm_eps == eps
    out = export("megatron", two_stage_input(model, 8, tensor=1))
    assert script_flags(out.main.content).get("--norm-epsilon") == written
    assert parse(out).norm_eps == (eps if written else None)
    with pytest.raises(ExportError, match="--norm-epsilon"):
        megatron_parse(out.main.content.replace('    "$@"', '    --norm-epsilon 2 \\\n    "$@"'))
