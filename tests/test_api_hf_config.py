"""POST /profiles/hf-config: a Hugging Face config.json in, an analytical profile stored (and planned from); a bad
config is a 422 naming its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_support import AUTH, tiny_cluster

from planner.profile import FUSED_WORDS

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"


def _config(name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((MODELS / name / "config.json").read_text())


@pytest.mark.slow
def test_upload_hf_config_makes_a_profile_and_a_plan(client) -> None:  # type: ignore[no-untyped-def]
    cluster = client.post("/clusters", json=tiny_cluster(8, 2), headers=AUTH)
    assert cluster.status_code == 201, cluster.text
    cid = cluster.json()["id"]
    r = client.post("/profiles/hf-config", json={"config": _config("llama-3.1-8b"), "cluster_id": cid,
                                                 "seq": 4096, "name": "llama-3.1-8b"}, headers=AUTH)
    assert r.status_code == 201, r.text
    prof = r.json()
    assert prof["name"] == "llama-3.1-8b" and prof["num_layers"] == 34 and prof["device"] == "A100-SXM4-80GB"
    assert abs(prof["total_params"] / 1e9 - 8.03) < 0.005
    again = client.post("/profiles/hf-config", json={"config": _config("llama-3.1-8b"), "cluster_id": cid,
                                                     "seq": 4096, "name": "llama-3.1-8b"}, headers=AUTH)
    assert again.status_code == 200 and again.json()["id"] == prof["id"]
    body = client.get(f"/profiles/{prof['id']}", headers=AUTH).json()["profile"]
    assert body["shape"]["seq"] == 4096 and body["shape"]["ffn_hidden"] == 14336
    plan = client.post("/plans", json={"profile_id": prof["id"], "cluster_id": cid, "global_batch": 64, "gpus": 16},
                       headers=AUTH)
    assert plan.status_code in (201, 202), plan.text
    qwen3 = client.post("/profiles/hf-config", json={"config": _config("qwen3-8b"), "device": "h100", "seq": 4096},
                        headers=AUTH)
    assert qwen3.status_code == 201 and abs(qwen3.json()["total_params"] / 1e9 - 8.19) < 0.005, qwen3.text
    assert qwen3.json()["name"] == "qwen3-8.2b"  # no name given: the config's model_type and size
    assert qwen3.json()["caveats"] == []
    beyond = client.post("/profiles/hf-config", json={"config": _config("gemma-3-1b"), "device": "h100",
                                                      "seq": 40000}, headers=AUTH)
    assert beyond.status_code == 201 and beyond.json()["caveats"][0].startswith("seq 40000 is beyond"), beyond.text
    mm = {"model_type": "gemma3", "text_config": {**_config("gemma-3-1b"), "model_type": "gemma3_text"}}
    multimodal = client.post("/profiles/hf-config", json={"config": mm, "device": "h100", "seq": 4096}, headers=AUTH)
    assert multimodal.status_code == 201 and "vision tower" in multimodal.json()["caveats"][0], multimodal.text
    by_device = client.post("/profiles/hf-config", json={"config": _config("gpt2"), "device": "h100-sxm5-80gb"},
                            headers=AUTH)
    assert by_device.status_code == 201 and by_device.json()["device"] == "H100-SXM5-80GB", by_device.text
    gemma2 = client.post("/profiles/hf-config", json={"config": _config("gemma-2-9b"), "device": "h100", "seq": 8192,
                                                      "attention": "flash"}, headers=AUTH)
    assert gemma2.status_code == 201 and gemma2.json()["total_params"] == 9_241_705_984, gemma2.text
    layers = client.get(f"/profiles/{gemma2.json()['id']}", headers=AUTH).json()["profile"]["layers"]
    # Gemma 2's window (4096 of 8192 tokens) on every other layer: those layers' attention is cheaper (flash)
    assert layers[1]["fwd_time"] != layers[2]["fwd_time"] and layers[1]["fwd_time"] == layers[3]["fwd_time"]


def test_bad_hf_config_is_422_naming_the_field(client) -> None:  # type: ignore[no-untyped-def]
    good = _config("mistral-7b")
    cases = [
        ({"config": {**good, "num_key_value_heads": 5}, "device": "h100"}, "config.num_key_value_heads"),
        ({"config": {**good, "model_type": "jamba"}, "device": "h100"}, "config.model_type"),
        # a Mistral as a Mixtral without its experts: transformers' default (8, Mixtral 8x7B's) is not taken
        ({"config": {**good, "model_type": "mixtral"}, "device": "h100"}, "config.num_local_experts: missing"),
        ({"config": {k: v for k, v in good.items() if k != "model_type"}, "device": "h100"}, "config.model_type"),
        ({"config": {**good, "hidden_size": -1}, "device": "h100"}, "config.hidden_size"),
        ({"config": good}, "cluster_id, device"),
        ({"config": good, "device": "tpu-v9"}, "device: unknown"),
        ({"config": good, "device": "/etc/passwd.json"}, "device: unknown"),
        ({"config": "llama", "device": "h100"}, "config"),
        ({"config": good, "cluster_id": 2**70}, "cluster_id"),  # past any database's integer: 422, not 500
        ({"config": good, "device": "h100", "recompute_granularity": "full"}, "recompute_granularity"),
        ({"config": good, "device": "h100", "p2p": "blocked"}, "p2p"),
        ({"config": good, "device": "h100", "kernels": "compiled"}, "kernels"),
        ({"config": good, "device": "h100", "dp_allreduce": "before"}, "dp_allreduce"),
        ({"config": good, "device": "h100", "attention": "fused"}, "attention"),
        ({"config": good, "device": "h100", "attention": "flash", "attention_impl": "flash4"}, "attention_impl"),
        ({"config": good, "device": "h100", "attention_impl": "cudnn"}, "attention_impl: only with attention"),
        ({"config": good, "device": "a100", "attention": "flash", "attention_impl": "flash3"},
         "attention_impl: A100-SXM4-80GB has no figures for flash3"),
        ({"config": good, "device": "h100", "sequence_parallel": "sometimes"}, "sequence_parallel"),
        # GPT-2's learned positions end at n_positions (1024): the table grew to 4096 rows, silently (201)
        ({"config": _config("gpt2"), "device": "h100", "seq": 4096},
         "seq: 4096 is beyond the model's learned positions: its n_positions is 1024"),
        # transformers refusing the file: its reason, once prefixed (was "config.config: ... Class validation
        # error for validator 'validate_architecture': ValueError: ...")
        ({"config": {**good, "num_attention_heads": 7}, "device": "h100"}, "config: transformers cannot read it: "),
    ]
    for body, field in cases:
        r = client.post("/profiles/hf-config", json=body, headers=AUTH)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"].startswith(field), r.json()["detail"]
        assert "Error:" not in r.json()["detail"] and "validator" not in r.json()["detail"], r.json()["detail"]
    r = client.post("/profiles/hf-config", json={"config": good, "cluster_id": 999}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"] == "cluster_id: cluster 999 not found", r.text  # as /plans
    assert client.post("/profiles/hf-config", json={"config": good, "device": "h100"}).status_code == 401
    assert client.get("/profiles", headers=AUTH).json() == []  # nothing stored by the failures


def test_hf_config_on_a_cpu_device_defaults_to_its_dtype(client) -> None:  # type: ignore[no-untyped-def]
    """The README's curl (and the new-plan page's "Make profile" on `make serve`'s default cluster, the local CPU
    one) names no dtype: the CPU has only an fp32 GEMM curve, so the default is fp32 there, bf16 on a GPU."""
    cfg = _config("llama-3.1-8b")
    cpu = client.post("/profiles/hf-config", json={"config": cfg, "device": "cpu", "seq": 8192}, headers=AUTH)
    assert cpu.status_code == 201, cpu.text
    assert (cpu.json()["device"], cpu.json()["dtype"]) == ("cpu", "fp32")
    gpu = client.post("/profiles/hf-config", json={"config": cfg, "device": "h100", "seq": 8192}, headers=AUTH)
    assert gpu.status_code == 201 and gpu.json()["dtype"] == "bf16", gpu.text
    forced = client.post("/profiles/hf-config", json={"config": cfg, "device": "cpu", "seq": 8192, "dtype": "bf16"},
                         headers=AUTH)  # an explicit dtype the device lacks is still refused, naming the table
    assert forced.status_code == 422 and forced.json()["detail"].startswith("gemm_efficiency"), forced.text


def test_hf_config_with_selective_recomputation(client) -> None:  # type: ignore[no-untyped-def]
    """recompute_granularity = selective (Megatron's flag) is recorded in the stored profile's environment and
    drops the attention core's s x s stash of its layers (planner.operators; GPT-2 trains with dropout)."""
    cfg = _config("gpt2")
    plain = client.post("/profiles/hf-config", json={"config": cfg, "device": "a100"}, headers=AUTH)
    sel = client.post("/profiles/hf-config", json={"config": cfg, "device": "a100",
                                                   "recompute_granularity": "selective"}, headers=AUTH)
    assert plain.status_code == 201 and sel.status_code == 201, sel.text
    bodies = [client.get(f"/profiles/{r.json()['id']}", headers=AUTH).json()["profile"] for r in (plain, sel)]
    assert [b["environment"].get("recompute_granularity") for b in bodies] == [None, "selective"]
    stash = [next(x for x in b["layers"] if x["kind"] == "transformer")["stashed_bytes_per_sample"] for b in bodies]
    s, a = cfg["n_positions"], cfg["n_head"]
    assert stash[0] - stash[1] == 5 * a * s * s  # Korthikanti eq. 1's 5 a s^2 b bytes, b = 1


def test_hf_config_runtime_is_recorded(client) -> None:  # type: ignore[no-untyped-def]
    """p2p / dp_allreduce: the training runtime the profile is for, in its environment (planner.analytic)."""
    body = {"config": _config("gpt2"), "device": "h100", "p2p": "blocking", "dp_allreduce": "overlapped",
            "p2p_scatter_gather": True}
    r = client.post("/profiles/hf-config", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
    env = client.get(f"/profiles/{r.json()['id']}", headers=AUTH).json()["profile"]["environment"]
    assert (env["p2p"], env["dp_allreduce"], env["p2p_scatter_gather"]) == ("blocking", "overlapped", "on")
    bad = client.post("/profiles/hf-config", json={**body, "p2p_scatter_gather": "maybe"}, headers=AUTH)
    assert bad.status_code == 422 and "p2p_scatter_gather" in bad.text, bad.text


def test_hf_config_with_flash_attention_and_sequence_parallelism(client) -> None:  # type: ignore[no-untyped-def]
    """attention / attention_impl / sequence_parallel: the kernels the run uses, as profile-analytic's options.
    Llama trains without dropout; at s = 8192 the causal flash kernel is far cheaper than the unfused core, and
    stashes no s x s tensors; sequence parallelism splits the layer's replicated stash over t."""
    cfg = _config("llama-3.1-8b")
    common = {"config": cfg, "device": "h100", "seq": 8192}
    unfused = client.post("/profiles/hf-config", json=common, headers=AUTH)
    flash = client.post("/profiles/hf-config", json={**common, "attention": "flash", "attention_impl": "cudnn",
                                                     "sequence_parallel": True}, headers=AUTH)
    assert unfused.status_code == 201 and flash.status_code == 201, flash.text
    bodies = [client.get(f"/profiles/{r.json()['id']}", headers=AUTH).json()["profile"] for r in (unfused, flash)]
    env = bodies[1]["environment"]
    assert (env["attention"], env["attention_impl"], env["sequence_parallel"]) == ("flash", "cudnn", "true")
    # a profile's answer says what its times assume (the new-plan page's line under the list, the plan page's);
    # the listing does not (it loads no document)
    listed = {r.json()["id"]: client.get(f"/profiles/{r.json()['id']}", headers=AUTH).json()["assumes"]
              for r in (unfused, flash)}
    for pid, words in listed.items():  # the pages ask for the words alone, without the document
        assert client.get(f"/profiles/{pid}/assumes", headers=AUTH).json() == {"id": pid, "assumes": words}
    assert client.get("/profiles/999/assumes", headers=AUTH).status_code == 404
    assert "assumes" not in client.get("/profiles", headers=AUTH).json()[0]
    assert listed[flash.json()["id"]] == [
        "cuDNN's fused attention", "no dropout", "sequence parallelism", FUSED_WORDS, "overlapped pipeline sends",
        "the data-parallel all-reduce after the backward"]
    assert listed[unfused.json()["id"]][0].startswith("the unfused attention core")
    assert bodies[0]["environment"]["attention"] == "unfused" and "attention_impl" not in bodies[0]["environment"]
    blocks = [next(x for x in b["layers"] if x["kind"] == "transformer") for b in bodies]
    assert blocks[1]["fwd_time"]["1"] < 0.8 * blocks[0]["fwd_time"]["1"]
    assert blocks[1]["stashed_bytes_per_sample"] < 0.5 * blocks[0]["stashed_bytes_per_sample"]
    t8 = [b["tensor_times"]["8"]["stashed_bytes_per_sample"] for b in blocks]
    assert t8[1] < blocks[1]["stashed_bytes_per_sample"] / 7  # sequence parallel: nearly all of it split over t


def test_hf_config_with_eager_kernels_and_op_checkpointing(client) -> None:  # type: ignore[no-untyped-def]
    """kernels = eager and recompute_granularity = op (torchtitan's stack) are recorded in the stored profile's
    environment; its layers take longer than the fused kernels' and stash less (every other GEMM re-run)."""
    cfg = _config("llama-3.1-8b")
    fused = client.post("/profiles/hf-config", json={"config": cfg, "device": "a100", "seq": 4096,
                                                     "attention": "flash"}, headers=AUTH)
    eager = client.post("/profiles/hf-config", json={"config": cfg, "device": "a100", "seq": 4096, "attention": "flash",
                                                     "kernels": "eager", "recompute_granularity": "op"}, headers=AUTH)
    assert fused.status_code == 201 and eager.status_code == 201, eager.text
    bodies = [client.get(f"/profiles/{r.json()['id']}", headers=AUTH).json()["profile"] for r in (fused, eager)]
    assert [(b["environment"].get("kernels"), b["environment"].get("recompute_granularity")) for b in bodies] == [
        (None, None), ("eager", "op")]
    blocks = [next(x for x in b["layers"] if x["kind"] == "transformer") for b in bodies]
    assert blocks[1]["bwd_time"]["1"] > blocks[0]["bwd_time"]["1"]
    assert blocks[1]["stashed_bytes_per_sample"] < blocks[0]["stashed_bytes_per_sample"]


def test_hf_config_of_a_mixture_of_experts(client) -> None:  # type: ignore[no-untyped-def]
    """Mixtral 8x7B and Qwen3-30B-A3B uploaded: a 201, their layers holding every expert and the router
    (ModelSpec.layer_params: 1,451,270,144 for Mixtral's, 8 x 3 x 4096 x 14336 of it in experts) and their
    published sizes; a bad mixture of experts (a top-k beyond the experts, every layer dense, a Qwen2 MoE without its
    shared expert's width, gpt-oss without its attention biases, a Llama 4 without its dense layers' width) is a 422
    naming the config's field."""
    from profiler.hf_config import spec_from_hf_dict

    for name, total in (("mixtral-8x7b", 46_702_792_704), ("qwen3-30b-a3b", 30_532_122_624)):
        cfg = _config(name)
        r = client.post("/profiles/hf-config", json={"config": cfg, "device": "h100", "seq": 4096, "name": name},
                        headers=AUTH)
        assert r.status_code == 201 and r.json()["total_params"] == total, r.text
        layers = client.get(f"/profiles/{r.json()['id']}", headers=AUTH).json()["profile"]["layers"]
        spec = spec_from_hf_dict(cfg, name)
        blocks = [x for x in layers if x["kind"] == "transformer"]
        assert len(blocks) == spec.layers and {x["params"] for x in blocks} == {spec.layer_params()}
    assert spec_from_hf_dict(_config("mixtral-8x7b")).layer_params() == 1_451_270_144
    mixtral, qwen = _config("mixtral-8x7b"), _config("qwen3-30b-a3b")
    cases = [
        ({**mixtral, "num_experts_per_tok": 9}, "config.num_experts_per_tok: 9 is more than the 8 experts"),
        ({**qwen, "num_experts_per_tok": 129}, "config.num_experts_per_tok: 129 is more than the 128 experts"),
        ({**qwen, "num_experts": 1, "num_experts_per_tok": 1}, "config.num_experts: "),
        ({**mixtral, "num_local_experts": "eight"}, "config.num_local_experts: must be a positive integer"),
        ({**qwen, "mlp_only_layers": list(range(48))}, "config.mlp_only_layers: every one of the 48 layers"),
        ({**qwen, "decoder_sparse_step": 0}, "config.decoder_sparse_step: "),
        ({k: v for k, v in qwen.items() if k != "moe_intermediate_size"}, "config.moe_intermediate_size: missing"),
        ({**qwen, "model_type": "qwen2_moe"}, "config.shared_expert_intermediate_size: missing"),
        ({**qwen, "model_type": "gpt_oss"}, "config.attention_bias: false: gpt-oss's experts and router always carry"),
        ({**qwen, "model_type": "llama4_text"}, "config.intermediate_size_mlp: missing"),
    ]
    for config, words in cases:
        r = client.post("/profiles/hf-config", json={"config": config, "device": "h100"}, headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"].startswith(words), (words, r.text)


def test_hf_config_with_shared_experts_and_dense_layers(client) -> None:  # type: ignore[no-untyped-def]
    """Qwen1.5-MoE-A2.7B (a gated shared expert in every layer) and Qwen3-30B-A3B with its first layer dense
    (``mlp_only_layers``): a 201 with the parameter count transformers' model has, the dense block's parameters and
    times apart from the others', and no experts in it."""
    from profiler.hf_config import spec_from_hf_dict

    qwen15 = client.post("/profiles/hf-config", json={"config": _config("qwen1.5-moe-a2.7b"), "device": "h100",
                                                      "seq": 4096}, headers=AUTH)
    assert qwen15.status_code == 201 and qwen15.json()["total_params"] == 14_315_784_192, qwen15.text
    cfg = {**_config("qwen3-30b-a3b"), "mlp_only_layers": [0]}
    r = client.post("/profiles/hf-config", json={"config": cfg, "device": "h100", "seq": 4096}, headers=AUTH)
    spec = spec_from_hf_dict(cfg, "q")
    assert r.status_code == 201 and r.json()["total_params"] == spec.total_params(), r.text
    blocks = [x for x in client.get(f"/profiles/{r.json()['id']}", headers=AUTH).json()["profile"]["layers"]
              if x["kind"] == "transformer"]
    assert blocks[0]["params"] == spec.layer_params(False) and not blocks[0].get("expert_params")
    assert {x["params"] for x in blocks[1:]} == {spec.layer_params()}
    assert all(x["expert_params"] == 128 * spec.expert_params() for x in blocks[1:])
    assert blocks[0]["fwd_time"] != blocks[1]["fwd_time"]


def test_deepseek_config_as_a_browser_sends_it(client) -> None:  # type: ignore[no-untyped-def]
    """DeepSeek-V2-Lite's config.json after JavaScript's JSON.parse/stringify (the UI's upload): its ``0.0`` and
    ``1.0`` arrive as ``0`` and ``1``, which transformers' strict DeepSeek config refuses for float fields; the API
    takes them as the floats they were (a 201, not a 500 from the dropout check), and a field of the wrong type is a
    422 naming it."""
    cfg = {**_config("deepseek-v2-lite"), "attention_dropout": 0, "routed_scaling_factor": 1}
    r = client.post("/profiles/hf-config", json={"config": cfg, "device": "h100", "seq": 4096}, headers=AUTH)
    assert r.status_code == 201 and r.json()["total_params"] == 15_706_484_224, r.text
    r = client.post("/profiles/hf-config", json={"config": {**cfg, "attention_dropout": "none"}, "device": "h100"},
                    headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"].startswith("config.attention_dropout: "), r.text
    # Gemma 2 9B's soft-caps 30.0 and 50.0 as the browser sends them (a 422 before: "expected float, got int")
    gemma = {**_config("gemma-2-9b"), "final_logit_softcapping": 30, "attn_logit_softcapping": 50}
    r = client.post("/profiles/hf-config", json={"config": gemma, "device": "h100", "seq": 4096}, headers=AUTH)
    assert r.status_code == 201 and r.json()["total_params"] == 9_241_705_984, r.text


def test_hf_config_of_llama4_scout(client) -> None:  # type: ignore[no-untyped-def]
    """Llama 4 Scout's published config.json uploaded as it is (the multimodal llama4, its text_config's
    attn_temperature_tuning the whole number 4 that transformers 5 refuses): a 201 with the language model's
    107,769,861,120 parameters (transformers' Llama4ForCausalLM), the vision tower said to be left out, every block
    ModelSpec's (16 experts of 8192, the router and the shared expert); its NoPE layers (3, 7, ...) are costed
    apart from the chunked rotary ones at a sequence beyond the 8192-token chunk."""
    from profiler.hf_config import spec_from_hf_dict

    cfg = _config("llama-4-scout")
    assert cfg["model_type"] == "llama4" and cfg["text_config"]["attn_temperature_tuning"] == 4
    r = client.post("/profiles/hf-config", json={"config": cfg, "device": "h100", "seq": 16384, "attention": "flash",
                                                 "name": "llama-4-scout"}, headers=AUTH)
    assert r.status_code == 201 and r.json()["total_params"] == 107_769_861_120, r.text
    assert any("vision tower" in c for c in r.json()["caveats"]), r.json()["caveats"]
    layers = client.get(f"/profiles/{r.json()['id']}", headers=AUTH).json()["profile"]["layers"]
    spec = spec_from_hf_dict(cfg, "llama-4-scout", seq=16384)
    blocks = [x for x in layers if x["kind"] == "transformer"]
    assert len(blocks) == 48 and {x["params"] for x in blocks} == {spec.layer_params()}
    # flash attention within the 8192-token chunks on the rotary layers: less work than the NoPE layers' causal
    # attention over all 16384
    fwd = [x["fwd_time"]["1"] for x in blocks]
    assert fwd[0] == fwd[1] < fwd[3] == fwd[7], fwd[:8]
