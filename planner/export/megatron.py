"""Export to Megatron-LM: the ``torchrun ... pretrain_gpt.py`` command line of a candidate, and its parser.

Megatron-LM's arguments (``megatron/training/arguments.py``; Narayanan et al., "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", SC'21, sections 2.2 and 3.5):

* ``--tensor-model-parallel-size`` = t, ``--pipeline-model-parallel-size`` = D; data parallelism is not
  an argument: Megatron takes ``world size / (t D)`` (so the launch line's process count carries W);
* ``--micro-batch-size`` = b, ``--global-batch-size`` = W N b (Megatron derives N, its "number of
  micro-batches", as global / (b W));
* the interleaved schedule (section 2.2.2) is Megatron's *virtual pipeline*: with
  ``--num-layers-per-virtual-pipeline-stage`` = L / (D v), Megatron computes
  ``virtual_pipeline_model_parallel_size = (L / D) / that`` = v, our ``chunks``; where L / (D v) is not
  whole (or L unknown), ``--num-virtual-stages-per-pipeline-rank`` = v says the same directly. Without
  either, Megatron runs 1F1B (``forward_backward_pipelining_without_interleaving``, PipeDream-Flush);
* activation recomputation (section 3.5) of every layer's input: ``--recompute-granularity full
  --recompute-method uniform --recompute-num-layers 1``; without it, ``--recompute-granularity selective``
  where the profile was made with selective recomputation (Korthikanti et al. 2022 section 5: the
  attention core re-run in the backward; :attr:`ExportInput.recompute_granularity`);
* the rank order (:mod:`planner.placement`, a candidate's ``order``): ``tp-dp-pp`` is Megatron's default
  (tp-cp-ep-dp-pp, the pipeline outermost); ``tp-pp-dp`` (with D > 1 and W > 1) is ``--use-tp-pp-dp-mapping``
  (tp-cp-ep-pp-dp), so pipeline neighbours sit t ranks apart as predicted. Megatron-Core refuses expert parallelism
  in that mapping with a pipeline (``initialize_model_parallel``: "When not using pp-last rank ordering, the data
  parallel size of the attention and moe layers must be the same", i.e. unless ``e etp = t``), and so does the
  export, naming the configuration's ``tp-dp-pp`` twin;
* ``--sequence-parallel`` when the profile's tensor-parallel times assume it (Korthikanti et al. 2022);
* ``--use-distributed-optimizer`` where the plan's request shards the optimizer state (W > 1); where it shards
  the weights too (``shard_parameters``), PyTorch FSDP2 (``--use-torch-fsdp2 --no-gradient-accumulation-fusion
  --ckpt-format torch_dist``, Megatron-LM's FSDP2 recipe), without a pipeline only;
  ``--attention-dropout 0.0 --hidden-dropout 0.0`` where the profile's model trains without dropout (Megatron's
  defaults are 0.1); ``--overlap-grad-reduce`` where the profile's runtime overlaps the data-parallel
  all-reduce with the backward; the flash kernel the profile assumes is named in a note (its option depends on
  the release: ``--attention-backend``, before it ``--use-flash-attn``);
* uneven stages: ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` (the other
  stages split the rest evenly); any other partition, and a virtual pipeline whose stages do not divide the
  layers, as ``--pipeline-model-parallel-layout`` (Megatron-Core, 2025 on: each stage's ``E``, ``t*k``, ``L``;
  :func:`layout`).

A mixture of experts (Megatron-Core's ``megatron/core/transformer/moe``): ``--num-experts``, ``--moe-router-topk``,
``--moe-ffn-hidden-size``; a shared expert (:attr:`planner.model.ModelSpec.shared_expert_ffn_hidden`, Megatron-Core's
``SharedExpertMLP``) ``--moe-shared-expert-intermediate-size`` and, gated by ``sigmoid(x w)`` (Qwen2 MoE),
``--moe-shared-expert-gate``; Megatron-Core refuses biases in it ("bias is not supported in the shared experts"), and
so does the export for a model with ``bias``. Dense layers (``dense_layers``: the dense MLP, ``--ffn-hidden-size``
wide) are ``--moe-layer-freq`` in its list form, 1 for a layer with experts and 0 for a dense one, run-length
written as Megatron's ``moe_freq_type`` evaluates it: ``([0]*3+[1]*58)`` for DeepSeek-V3's three dense layers first
(:func:`moe_layer_freq`).

Routing (Megatron-Core's ``topk_routing_with_score_function`` and ``group_limited_topk``, ``moe_utils.py``): softmax
scores renormalised over the k chosen (``normalize_topk``) are its default, the softmax over all ``E`` without
renormalising ``--moe-router-pre-softmax``; sigmoid scores (``router_score``) ``--moe-router-score-function sigmoid``,
which Megatron-Core always renormalises over the k chosen when k > 1 and never at k = 1 (``--moe-router-pre-softmax``
does not act on them), so ``normalize_topk`` must be true at k > 1 and false at k = 1 (else refused, naming it); the
softmax at k = 1 needs ``--moe-router-pre-softmax`` (Megatron-Core refuses it otherwise: "Please use
--moe-router-pre-softmax when topk is 1"), so ``normalize_topk`` must be false there. Group-limited routing
(``router_groups``, ``router_group_topk``) is ``--moe-router-num-groups`` and ``--moe-router-group-topk``; Megatron-Core
scores a group by the sum of its best ``k / router_group_topk`` experts' scores (and needs k divisible by
``router_group_topk``), so the model's group score -- its best expert's with softmax scores (DeepSeek-V2), its best
two's with sigmoid scores (DeepSeek-V3) -- is Megatron's only at ``k = router_group_topk`` (softmax) or ``k = 2
router_group_topk`` (sigmoid); other combinations are refused, naming ``router_group_topk`` (DeepSeek-V2's top 6 in 3
groups among them: Megatron would score its groups by their best two). ``router_bias`` is
``--moe-router-enable-expert-bias`` (sigmoid only, as in the model; Megatron-Core updates it from the load, as
DeepSeek-V3's auxiliary-loss-free balancing does), ``routed_scaling`` ``--moe-router-topk-scaling-factor`` (applied
after the renormalisation, as the model does).

Multi-head latent attention (``kv_lora_rank``; Megatron-Core's ``MLASelfAttention``): ``--multi-latent-attention``,
``--q-lora-rank`` (when the queries have a latent), ``--kv-lora-rank``, ``--qk-head-dim`` (each head's unrotated
query/key part: ``head_dim - qk_rope_head_dim``), ``--qk-pos-emb-head-dim`` (``qk_rope_head_dim``), ``--v-head-dim``,
``--qk-layernorm`` (with latent attention: the RMSNorms over the latents, ``q_layernorm`` and ``kv_layernorm``) and
``--rope-type rope`` (Megatron-Core's latent attention takes YaRN by default; the model's rotary is plain), never
``--num-query-groups`` (every head its own key and value) nor ``--kv-channels``. (A model with both latent attention
and per-head query/key norms, ``qk_norm``, is refused by ModelSpec: ``--qk-layernorm`` is the latents' norms there.)

gpt-oss (OpenAI 2025; ModelSpec's ``attention_sinks``, ``activation`` quick_gelu with ``glu_linear_offset`` and
``glu_clamp``, ``bias``, a window on alternate layers) as Megatron-LM's own arguments say it: NVIDIA/Megatron-LM
``megatron/training/arguments.py`` at commit 000c4ac24f61159c138b0975def722c65245983c (``_add_network_size_args``,
``_add_training_args``, ``core_transformer_config_from_args``), and as NVIDIA-NeMo/Megatron-Bridge's GPT-OSS bridge sets
the same fields from a Hugging Face gpt-oss (``src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py`` at
0e4d6ed607e06973e29de76dcae494402568cf5e; ``gpt_oss_provider.py`` at 12bc34a8ee308a638d4bfd29401085944d4a468e):

* ``attention_sinks``: ``--softmax-type learnable`` (choices vanilla, off-by-one, learnable: "a fixed offset and
  learnable offset" in the softmax's denominator, one per head -- Transformer Engine's ``softmax_offset``, to which the
  bridge maps gpt-oss's ``self_attn.sinks``). Transformer Engine runs it in its fused (cuDNN) or unfused attention,
  not flash-attn, from TE 2.8 (the provider falls back to Megatron-Core's local attention before): said in a note.
* ``sliding_window`` w: ``--window-size w-1,0``. The pair is (left, right), both ends kept: Megatron-Core's
  ``get_sliding_window_causal_mask`` (``megatron/core/transformer/utils.py`` at
  00caa53af30912914981c86f39db123961678bbd) keeps the keys ``i - left`` to ``i + right`` of query ``i``, so ``w - 1``
  is the model's w keys, the query's own included (the bridge writes ``(sliding_window - 1, 0)``). ``global_every`` n:
  ``--window-attn-skip-freq n`` (``is_layer_window_attention`` there: 1-based layer ``l`` attends to the whole
  sequence where ``l % n == 0``, our 0-based layers n-1, 2n-1, ...: gpt-oss's 2, the window on every other layer from
  the first). A model's window on every layer (Mistral) is ``--window-size`` alone.
* quick_gelu under a gated MLP: ``--quick-geglu`` (``gated_linear_unit`` with ``quick_gelu``, ``x sigmoid(1.702 x)``)
  in place of ``--swiglu``, which Megatron asserts it is not given with; ``glu_linear_offset``: ``--glu-linear-offset``
  ("activation_func(x[0]) * (x[1] + offset)"); ``glu_clamp``: ``--activation-func-clamp-value`` (Megatron-Core's GLU,
  in the MLP and in the grouped experts' ``weighted_bias_quick_geglu_impl``, clamps the gate to at most it and the
  linear half to [-it, it], as the model does). Its help says the clamp is "Only used when activation_func is
  quick_gelu", and the fused SwiGLU (``bias_swiglu_impl``) takes neither the clamp nor the offset, so a model with
  either under another activation is refused, naming the field; so is quick_gelu without a gate (Megatron has no
  such activation). A dense MLP's fused activation path takes gelu and SwiGLU only ("Only support fusion of gelu and
  swiglu", Megatron-Core's ``MLP.forward``, and ``--quick-geglu`` keeps ``--bias-gelu-fusion``'s default on), so with
  a dense MLP (no experts, ``dense_layers``, a shared expert) ``--no-bias-gelu-fusion`` is written too: the unfused
  GLU applies the clamp and the offset.
* ``bias``: Megatron's default (``--disable-bias-linear`` is ``store_false`` on ``add_bias_linear``): every linear
  layer's bias -- the attention's QKV and output, the MLP's and each expert's ``linear_fc1`` and ``linear_fc2``, and
  the router's (Megatron-Core's ``Router`` holds a bias of E with ``add_bias_linear``; the bridge maps gpt-oss's
  ``mlp.router.bias`` to it), so nothing is written; without biases ``--disable-bias-linear``, and with biases on Q,
  K and V only ``--add-qkv-bias``.

gpt-oss's softmax over its top-k router logits is Megatron's default routing (the softmax renormalised over the k
chosen; the provider's ``moe_router_pre_softmax = False``). Its YaRN rotary scaling is not in ModelSpec: plain rope
is written.

Partial rotary (ModelSpec's ``rotary_dim``: GLM-4.5's 64 of 128, Phi-4-mini's 96 of 128) is ``--rotary-percent
rotary_dim / head_dim`` (``type=float, default=1.0`` in ``_add_network_size_args``, arguments.py at 000c4ac2).
Megatron-Core computes what transformers' Glm4Moe and Phi-3 ``apply_rotary_pos_emb`` do (``q[..., :rotary_dim]`` rotated
half against half, the rest passed through): ``gpt_builders.py`` (at 383d08f4f0ab961803594c1560eb055f6543aa55) hands
``args.rotary_percent`` to ``GPTModel``, which builds ``RotaryEmbedding(kv_channels=config.kv_channels, rotary_percent,
rotary_interleaved=config.rotary_interleaved)`` (``megatron/core/models/gpt/gpt_model.py`` at
007562f9413e6bf1ab2fa4e13596ad67c7cab383); there ``dim = int(kv_channels * rotary_percent)`` where the percent is below
1, ``inv_freq = 1 / base ** (arange(0, dim, 2) / dim)`` and the table ``cat((freqs, freqs))``
(``megatron/core/models/common/embeddings/rotary_pos_embedding.py`` at 00caa53af30912914981c86f39db123961678bbd), as
transformers' ``int(head_dim * partial_rotary_factor)`` and its ``inv_freq``; ``_apply_rotary_pos_emb_bshd``
(``rope_utils.py`` there, at 00c51e13247685110aec81e60aa3db91cbdbff7d) splits ``t[..., :rot_dim]`` from ``t[...,
rot_dim:]``, rotates the first with ``_rotate_half`` (``chunk(x, 2)``: ``cat(-x2, x1)``) and concatenates the second
unchanged. Transformer Engine's fused kernel, which Megatron-Core takes by default (``apply_rope_fusion``), does the
same with a table of ``d2 <= d`` (``transformer_engine/pytorch/attention/rope.py`` at
0dc141cf773e9b5427998dbf0a04174c484fd313: ``t[..., :rot_dim]`` rotated, ``t_pass`` kept). ``--rotary-interleaved``
turns adjacent pairs ``(x0, x1), (x2, x3), ...`` instead (GPT-J's form, ``_rotate_half``'s interleaved branch): written
for a model with ``rope_interleaved`` only (Llama 4, below), and read back as it. The written percent is the
smallest float at or above ``rotary_dim / head_dim`` whose ``int(head_dim * percent)`` is ``rotary_dim``
(:func:`rotary_percent`: 58 of 100 is 0.5800000000000001, since 100 * 0.58 is 57.99999999999999). Megatron-Bridge
maps a Hugging Face ``partial_rotary_factor`` to ``rotary_percent`` (``CONFIG_MAPPING`` in
``src/megatron/bridge/models/conversion/model_bridge.py`` at 0350b4ef4ef8892615e209b36e8dde4ca42d9232) and its GLM-4.5
providers set ``rotary_percent = 0.5`` with ``kv_channels = 128`` (``src/megatron/bridge/models/glm/glm45_provider.py``
at 5f28ae824bc6b22af924ec2034cba5caf8351941).

GLM-4.5 (``glm4_moe``) is otherwise written as any model here, as that provider and ``glm45_bridge.py`` (at
0fe9cb1dd9b1db0fb9ca59f943c8f6553200e4bb) set it: ``--kv-channels 128`` (96 heads of 128 in a hidden size of 4096),
``--disable-bias-linear --add-qkv-bias`` (biases on Q, K and V only), ``--qk-layernorm`` where ``qk_norm`` (GLM-4.5's,
not Air's; RMSNorm over each head before the rotary, as transformers' ``q_norm``), the shared expert
(``--moe-shared-expert-intermediate-size``, ungated), the dense first layers (``--moe-layer-freq``: the provider's ``[0]
* 1 + [1] * 45`` for Air), sigmoid scores with the expert bias (``--moe-router-score-function sigmoid
--moe-router-enable-expert-bias``), ``--moe-router-topk-scaling-factor`` (GLM-4.5's 2.5; Air's 1.0, no scaling, is
Megatron's default: not written) and groups where ``n_group > 1``. Not written: the multi-token prediction layers
(``--mtp-num-layers``: the planner does not cost them), and the bridge's training settings (``seq_aux_loss`` balancing,
``moe_router_dtype = "fp32"``, ``moe_router_bias_update_rate = 0``), which are the user's.

OLMo 2, OLMo 3 and OLMoE (ModelSpec's ``qk_norm_scope`` projection and ``post_norm``) are refused, naming the field
(:func:`olmo_refusal`): NVIDIA/Megatron-LM has no argument for either (``megatron/training/arguments.py`` at 000c4ac2;
``megatron/core/transformer/transformer_config.py`` at 002526d81b81f6ab534e93844f9a228709887494). Its one query/key
norm, ``--qk-layernorm`` (``_add_vision_args``; TransformerConfig's ``qk_layernorm``, "Whether to apply
`normalization` type of normalization to the query and key embeddings"), builds ``q_layernorm`` and ``k_layernorm``
``hidden_size_per_attention_head`` wide and applies them to the ``[s, b, heads, head_dim]`` queries and keys
(``SelfAttention``, ``megatron/core/transformer/attention.py`` at 00c2c0adeec16015f386548793c88ef08ff6acec): an RMSNorm
over each head, Qwen3's, not OLMo's one over the ``a d`` query projection and one over the ``k d`` key projection
(transformers' ``Olmo2Attention``: ``Olmo2RMSNorm(num_attention_heads * head_dim)`` on ``q_proj(x)``; OLMoE's the
same); ``--qk-l2-norm`` is Llama 4's L2 norm of each head, without a weight. Megatron-Core's ``TransformerLayer`` norms
each branch's input (``input_layernorm``, ``pre_mlp_layernorm``; ``transformer_layer.py`` at
dc13771018ffb32b2999a9d85fcbd850616710e9) and nothing after a branch; ``--apply-residual-connection-post-layernorm``
("If set, use original BERT residula connection ordering") adds the branch to the normed input rather than to the
input (the legacy ``ParallelTransformerLayer``'s ``residual = norm_output``, ``megatron/legacy/model/transformer.py`` at
00caa53a): ``norm(x) + attention(norm(x))``, not OLMo 2's ``x + norm(attention(x))`` (``Olmo2DecoderLayer``).
NVIDIA-NeMo/Megatron-Bridge does not say them with Megatron-LM's arguments either: it builds OLMo 2 with a layer spec of
its own (``src/megatron/bridge/models/olmo2/olmo2_provider.py`` at 57852623b64ad7f1333f2e1af0136b8fd14c4273:
``IdentityOp`` for ``input_layernorm`` and ``pre_mlp_layernorm``, ``linear_proj`` and ``linear_fc2`` as
``TERowParallelLinearPostLN``, the linear with an RMSNorm after it) and OLMoE with ``OLMoESelfAttention``
(``olmoe/olmoe_provider.py`` at 217dc58113a0fee81e7f6f639b30bf4a964bc8eb, ``olmoe/modeling_olmoe.py`` at
a1d4d4bfd9baf49e5d16ce04f091214af0d56168, ``olmoe/olmoe_bridge.py`` at 5c5ae23cd3892394558bb3a4898da4da4e118297:
``q_layernorm`` and ``k_layernorm`` ``hidden_size_per_attention_head * num_attention_heads`` wide over a rank's
flattened query and key, "Unlike Mcore QK Layernorm"). Its OLMo 2 spec keeps Megatron-Core's per-head ``q_layernorm``
and ``k_layernorm`` (``olmo2_bridge.py`` there: "per-head Q/K normalization"), onto which it maps transformers'
``a d``-wide ``q_norm``. FlagScale's fork of Megatron-LM adds ``--qk-layernorm-hidden-dim`` (the norms over the
projections); NVIDIA's has no such argument. MiniMax-M2 (``minimax_m2``) norms its projections so too
(transformers' ``MiniMaxM2Attention``: ``q_norm`` of ``num_attention_heads * head_dim`` on ``q_proj(x)``, ``k_norm`` of
``num_key_value_heads * head_dim``) and is refused the same way; Megatron-Bridge's MiniMax-M2 bridge sets
``qk_layernorm`` off and builds the norms in a layer spec of its own (``minimax_m2_layer_spec``'s ``FullDimQNorm`` and
``FullDimKNorm``, ``src/megatron/bridge/models/minimax_m2/minimax_m2_provider.py``).

Llama 4 (ModelSpec's ``nope_layers``, ``rope_interleaved``, ``qk_l2_norm``, ``attention_chunk``, ``query_temperature``,
``router_weights_on_input``) as Megatron-LM's arguments say it (``megatron/training/arguments.py`` at
307dcf37f03d44da131ba21999278abe4112d2ad: ``--no-rope-freq`` of ``no_rope_freq_type``, ``--rotary-interleaved``;
``megatron/core/transformer/transformer_config.py`` at 002526d81b81f6ab534e93844f9a228709887494: the fields
``no_rope_freq``, ``rotary_interleaved``, ``qk_l2_norm`` "llama 4-style qk L2 norm" and ``moe_apply_probs_on_input``
"Apply probs on input of experts", the last two flags ``--qk-l2-norm`` and ``--moe-apply-probs-on-input``, which
Megatron-LM's own Llama 4 scripts pass), and as Megatron-Bridge's ``Llama4ModelProvider`` sets them (``src/megatron/
bridge/models/llama/llama_provider.py``, in the huvunvidia/Megatron-Bridge fork at
29b05b284426b47560e72e5465ec1f1805fddcba: ``rotary_interleaved``, ``nope_layer_interval = 4``, ``moe_router_topk = 1``,
sigmoid scores, ``moe_apply_probs_on_input``, ``qk_l2_norm`` for 16 experts and not 128, ``moe_layer_freq = [0, 1] *
24`` for 128, ``attention_chunk_size = 8192``; its layer spec ``get_llama4_layer_spec`` in NVIDIA-NeMo/Megatron-Bridge
``src/megatron/bridge/models/llama/llama4_utils.py`` at 3865df2d90f0e27949e24a27dd25e9f28f7d817f):

* ``nope_layers``: ``--no-rope-freq`` (``TransformerConfig.no_rope_freq``: "1 means skip RoPE"; ``__post_init__`` turns
  an integer ``n`` into ``[0]*(n-1)+[1]`` repeated, asserting that ``n`` divides the layers; the attention drops the
  rotary embedding of a layer with 1). Every n-th layer, ``n-1, 2n-1, ...`` with ``n`` dividing the layers (Llama 4's
  3, 7, ...), is ``n``; any other pattern the list, ``([0]*3+[1])`` form, which Megatron accepts for any layers
  (:func:`no_rope_freq`): none is refused.
* ``rope_interleaved``: ``--rotary-interleaved``: ``RotaryEmbedding`` builds the table ``[f0, f0, f1, f1, ...]``
  (``rotary_pos_embedding.py``: ``torch.stack((freqs, freqs), dim=-1)`` where ``rotary_interleaved``) and
  ``_rotate_half``'s interleaved branch turns ``(x_2i, x_2i+1)`` by ``f_i`` (``rope_utils.py`` at
  00c51e13247685110aec81e60aa3db91cbdbff7d; the fused kernel is handed ``interleaved=config.rotary_interleaved``), as
  transformers' ``Llama4TextAttention`` turns adjacent pairs (``view_as_complex``). Megatron-Core takes it with the rope
  fusion from Transformer Engine 2.3 on (``TransformerConfig.__post_init__``: "rotary_interleaved does not work with
  apply_rope_fusion for TE < 2.3.0"): said in a note. Megatron-Core refuses it with latent attention, as ModelSpec does.
* ``qk_l2_norm``: ``--qk-l2-norm``: ``L2Norm`` (no weight: ``x * rsqrt(mean(x^2) + eps)``) as every layer's
  ``q_layernorm`` and ``k_layernorm`` (``megatron/core/models/gpt/gpt_layer_specs.py`` at
  00611e6eeb0b09b5ee074750956855215ddbd67f: ``L2Norm if qk_l2_norm``; ``gpt_builders.py`` at
  00caa53af30912914981c86f39db123961678bbd hands ``args.qk_l2_norm`` to the block spec, one spec per dense or expert
  layer). Megatron-Core norms before the rotary, transformers after it: the same, a rotation keeps each head's mean
  square. But it norms every layer, and Llama 4 only those with rotary positions (``use_qk_norm and use_rope``;
  Megatron-Bridge's ``get_llama4_layer_spec`` sets ``L2Norm`` where ``not is_nope_layer``, in code), so
  ``qk_l2_norm`` beside ``nope_layers`` -- Llama 4 Scout -- is refused, naming both (:func:`llama4_refusal`).
* ``attention_chunk`` where it limits the attention (shorter than the sequence): refused. ``TransformerConfig`` has no
  chunk and ``--window-size`` is a sliding window; Megatron-Bridge's ``Llama4SelfAttention`` chunks the queries, keys
  and values (``chunkify``) on every layer, the NoPE ones included, where the model's NoPE layers attend to the whole
  sequence. A chunk at least the sequence is causal attention: nothing written, said in a note.
* ``query_temperature`` where it scales a query at the sequence (from position ``floor - 1`` on, a scale above 0):
  refused; neither Megatron-Core nor Megatron-Bridge's Llama 4 scales queries by position. Llama 4's floor of 8192
  scales none of a shorter sequence: nothing written, said in a note.
* ``router_weights_on_input``: ``--moe-apply-probs-on-input`` (the expert's input times its weight, the output
  unweighted: the probabilities "reset to 1"); Megatron-Core's expert MLPs assert "`moe_apply_probs_on_input` only works
  with `moe_router_topk`=1", so more experts per token are refused. Llama 4's routing, the sigmoid of the one chosen
  expert's logit, is ``--moe-router-score-function sigmoid --moe-router-topk 1`` (not renormalised at k = 1: above);
  its shared expert ``--moe-shared-expert-intermediate-size``; Maverick's dense even layers ``--moe-layer-freq``'s list
  (its integer form would put the experts on the even layers).

Megatron has 1F1B and interleaved only: GPipe (its all-forward-then-all-backward order), zero-bubble, Chimera,
Hanayo, GEMS, 1F1B-RR and PipeDream's asynchronous schedules are refused, naming the closest it has.
"""

from __future__ import annotations

import ast
import math
import re
import shlex
from typing import Any

from planner.cluster import node_layout
from planner.export.common import (
    EMBEDDING,
    HEAD,
    SYNCHRONOUS_ONLY,
    TRANSFORMER,
    Export,
    ExportError,
    ExportFile,
    ExportInput,
    Parsed,
    check_heads,
    chunk_limits,
    header,
    layer_ranges,
    llama4_inert_notes,
    model_gaps_note,
    temperature_from,
    unplanned_policy_note,
    unsupported,
)
from planner.model import ModelSpec
from planner.placement import experts_placeable
from planner.profile import ATTENTION_WORDS, EAGER_WORDS, OP_WORDS
from planner.request import Config
from planner.runspec import RunSpec

NAME = "megatron"
TITLE = "Megatron-LM"
SCHEDULES = ("1f1b", "interleaved")
RECOMPUTE = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
#: Korthikanti et al. 2022 section 5: re-run only the attention core (a property of the profile, not of the
#: candidate: emitted when the candidate does not recompute fully)
SELECTIVE = ["--recompute-granularity", "selective"]

_REASONS = {
    "gpipe": "its pipeline schedules are 1F1B and interleaved 1F1B; GPipe's all-forwards-first order is not one",
    "zb-h1": "it does not split the backward into input and weight gradients (zero-bubble)",
    "chimera": "it runs one pipeline direction; Chimera's bidirectional pipelines hold two model replicas per device",
    "hanayo": "its virtual pipeline places chunks in a loop, not Hanayo's waves",
    "gems": "it holds one model replica per device; GEMS holds two, one per direction",
    "1f1b-rr": "it gives every stage the same number of devices; 1F1B-RR replicates stages unevenly",
    **SYNCHRONOUS_ONLY,
}


def check(spec: RunSpec) -> None:
    """Raise :class:`UnsupportedSchedule` when Megatron-LM cannot run ``spec``'s schedule."""
    c = spec.config
    if c.schedule == "1f1b":
        return
    if c.schedule == "interleaved" and c.pipeline > 1:
        return
    if c.schedule == "interleaved":
        reason = "its virtual pipeline needs pipeline-model-parallel-size > 1"
        choices = [("1f1b", {})]
    elif c.schedule == "hanayo":
        reason = _REASONS["hanayo"]
        choices = [("interleaved", {"chunks": 2 * (c.waves or 1)}), ("interleaved", {"chunks": 2})]
        choices = [*(choices if c.pipeline > 1 else []), ("1f1b", {})]
    else:
        reason = _REASONS.get(c.schedule, "it has no such schedule")
        choices = [("1f1b", {})]
    raise unsupported(TITLE, spec, choices, reason)


def layout(kinds: tuple[str, ...], stage_layers: list[list[int]]) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` of a partition: the (virtual) stages in order,
    separated by ``|``, each its embedding ``E``, its transformer layers ``t`` (``t*k`` for k of them) and the
    loss ``L`` (the LM head with its loss: our HEAD layer). Stage ``i`` is pipeline rank ``i mod D``'s model
    chunk ``i div D`` (megatron/core/transformer/pipeline_parallel_layer_layout.py, ``PipelineParallelLayerLayout``:
    ``layout[vpp_rank * pp + pp_rank]``), our interleaved schedule's placement (stage ``s`` on device ``s mod D``)."""
    stages = []
    for layers in stage_layers:
        k = sum(kinds[i] == TRANSFORMER for i in layers)
        body = "" if k == 0 else "t" if k == 1 else f"t*{k}"
        stages.append(("E" if any(kinds[i] == EMBEDDING for i in layers) else "") + body
                      + ("L" if any(kinds[i] == HEAD for i in layers) else ""))
    return "|".join(stages)


def _layer_args(inp: ExportInput, notes: list[str]) -> list[str]:
    """Virtual pipeline and uneven-stage arguments from the partition: the even split's arguments where
    Megatron's own split is the plan's; otherwise the plan's partition as ``--pipeline-model-parallel-layout``
    (Megatron-Core releases from 2025 on), where before, a virtual pipeline whose stages do not divide the layers was
    written as ``--num-virtual-stages-per-pipeline-rank``, which Megatron cannot split."""
    c = inp.config
    L = inp.transformer_layers()
    v = (c.chunks or 1) if c.schedule == "interleaved" else 1
    counts = inp.transformer_counts()
    kinds, stages = inp.kinds(), inp.stage_layers()
    even = counts is not None and L is not None and len(set(counts)) == 1 and L % (c.pipeline * v) == 0
    if counts is None or L is None or even:
        if v == 1:
            return []
        if L is not None and L % (c.pipeline * v) == 0:
            return ["--num-layers-per-virtual-pipeline-stage", str(L // (c.pipeline * v))]
        notes.append(f"the {c.pipeline * v} virtual stages' layers are not known (no partition or layer kinds): "
                     "Megatron-LM needs the transformer layers to divide by them")
        return ["--num-virtual-stages-per-pipeline-rank", str(v)]
    if v == 1 and c.pipeline >= 2 and len(set(counts[1:-1])) <= 1:  # the other stages split the rest evenly
        return ["--decoder-first-pipeline-num-layers", str(counts[0]),
                "--decoder-last-pipeline-num-layers", str(counts[-1])]
    assert kinds is not None and stages is not None  # counts came from them
    notes.append(f"the plan's partition ({counts} transformer layers per {'virtual ' if v > 1 else ''}stage) is "
                 "written as --pipeline-model-parallel-layout (Megatron-Core releases from 2025 on; earlier ones split "
                 "the layers evenly and cannot say it)")
    return ["--pipeline-model-parallel-layout", layout(kinds, stages)]


def rotary_percent(rotary_dim: int, head_dim: int) -> str:
    """``--rotary-percent`` of ``rotary_dim`` rotated dimensions of ``head_dim`` (``--kv-channels``): the smallest float
    at or above ``rotary_dim / head_dim`` whose ``int(head_dim * percent)`` -- Megatron-Core's ``RotaryEmbedding`` --
    is ``rotary_dim`` (``repr``: Megatron's ``type=float`` reads it back exactly); 0.5 for 64 of 128,
    0.5800000000000001 for 58 of 100 (0.58 gives 57)."""
    x = rotary_dim / head_dim
    while int(head_dim * x) < rotary_dim:  # (one step at most: x is r/d rounded to the nearest float)
        x = math.nextafter(x, math.inf)
    return repr(x)


def bit_pattern(bits: list[int]) -> str:
    """``bits`` as the Python list expression Megatron evaluates (``_eval_pattern``: only digits, commas, brackets,
    parentheses, ``+`` and ``*``), run-length: ``([0]*3+[1]*58)``, ``([1]+[0]+[1]*2)``; a pattern that repeats a
    shorter one of more than one run as that one times its repeats, ``([0]+[1])*24`` (Llama 4 Maverick's dense even
    layers, Megatron-Bridge's ``[0, 1] * 24``)."""

    def runs_of(part: list[int]) -> str:
        runs: list[list[int]] = []
        for bit in part:
            if runs and runs[-1][0] == bit:
                runs[-1][1] += 1
            else:
                runs.append([bit, 1])
        return "+".join(f"[{bit}]*{n}" if n > 1 else f"[{bit}]" for bit, n in runs)

    n = len(bits)
    period = next((p for p in range(1, n) if n % p == 0 and bits == bits[:p] * (n // p)), n)
    if period < n and len(set(bits)) > 1:
        return f"({runs_of(bits[:period])})*{n // period}"
    return f"({runs_of(bits)})"


def moe_layer_freq(layers: int, dense_layers: tuple[int, ...] | list[int]) -> str:
    """Megatron-Core's ``--moe-layer-freq`` list of ``layers`` transformer layers, 1 where a layer has experts and 0
    where it is one of ``dense_layers`` (:func:`bit_pattern`; ``moe_freq_type``)."""
    dense = set(dense_layers)
    return bit_pattern([0 if i in dense else 1 for i in range(layers)])


def no_rope_freq(layers: int, nope_layers: tuple[int, ...] | list[int]) -> str:
    """Megatron-Core's ``--no-rope-freq`` of ``layers`` transformer layers without rotary positions on ``nope_layers``
    (0-based): the integer ``n`` where they are every n-th, ``n - 1, 2n - 1, ...``, and ``n`` divides the layers
    (``TransformerConfig.__post_init__`` turns ``n`` into ``[0]*(n-1)+[1]`` repeated ``layers / n`` times and asserts
    the division; Llama 4's 4), else the list with 1 on each of them (:func:`bit_pattern`; ``no_rope_freq_type``)."""
    nope = sorted(set(nope_layers))
    n = nope[0] + 1
    if n >= 2 and layers % n == 0 and nope == list(range(n - 1, layers, n)):
        return str(n)
    return bit_pattern([1 if i in nope else 0 for i in range(layers)])


def parse_moe_layer_freq(text: str, layers: int | None) -> tuple[int, ...]:
    """The dense layers of a ``--moe-layer-freq``: an integer ``N`` (a layer with experts every ``N``: those ``i``
    with ``i % N == 0``, Megatron-Core's ``moe_layer_pattern``) or a list expression (:func:`moe_layer_freq`;
    validated as Megatron does, then evaluated without ``eval``). Its length must be ``layers`` where known."""
    text = text.strip()
    if (got := _frequency(text, "--moe-layer-freq", layers)) is not None:
        freq, total = got
        return tuple(i for i in range(total) if i % freq)
    return tuple(i for i, bit in enumerate(bit_list(text, "--moe-layer-freq", layers)) if bit == 0)


def _frequency(text: str, flag: str, layers: int | None) -> tuple[int, int] | None:
    """``text`` (stripped) as an integer frequency of 1 or more, with the ``layers`` it needs (``--num-layers``), or
    None for a list expression."""
    if not re.fullmatch(r"\d+", text):
        return None
    if int(text) < 1:
        raise ExportError(f"megatron script: {flag} {text}: a frequency of 1 or more")
    if layers is None:
        raise ExportError(f"megatron script: {flag} as a frequency needs --num-layers")
    return int(text), layers


def parse_no_rope_freq(text: str, layers: int | None) -> tuple[int, ...]:
    """The layers without rotary positions of a ``--no-rope-freq``: an integer ``n`` (every n-th, ``n - 1, 2n - 1,
    ...``; Megatron-Core asserts that ``n`` divides the layers) or a list expression, 1 on a layer without them
    (:func:`bit_list`; its length must be ``layers`` where known); refused where every layer is without them
    (ModelSpec's position none)."""
    text = text.strip()
    if (got := _frequency(text, "--no-rope-freq", layers)) is not None:
        n, layers = got
        if layers % n:
            raise ExportError(f"megatron script: --no-rope-freq {n} does not divide the {layers} layers (Megatron-Core "
                              "asserts it)")
        nope = tuple(range(n - 1, layers, n))
    else:
        nope = tuple(i for i, bit in enumerate(bit_list(text, "--no-rope-freq", layers)) if bit == 1)
    if layers is not None and len(nope) == layers:
        raise ExportError(f"megatron script: --no-rope-freq {text}: every layer without rotary positions (a model "
                          "without them: --position-embedding-type none)")
    return nope


def bit_list(text: str, flag: str, layers: int | None) -> list[int]:
    """The 0s and 1s of a Megatron list expression (``flag``'s value: ``--moe-layer-freq``,
    ``--window-attn-skip-freq``), validated as Megatron's ``_eval_pattern`` does, then evaluated without ``eval``; its
    length must be ``layers`` where known."""
    text = text.strip()
    if re.search(r"[^,\d\[\]()+*]", text):
        raise ExportError(f"megatron script: {flag} {text!r}: not a list expression Megatron evaluates "
                          "(digits, commas, brackets, parentheses, + and *)")

    def value(node: ast.AST) -> int | list[int]:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            items = [value(x) for x in node.elts]
            if not all(isinstance(x, int) for x in items):
                raise ValueError("a nested list")
            return items  # type: ignore[return-value]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            a, b = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(a, list) and isinstance(b, list):
                return a + b
            if isinstance(node.op, ast.Mult) and isinstance(a, list) != isinstance(b, list):
                return a * b  # type: ignore[operator]
            if isinstance(a, int) and isinstance(b, int):
                return a + b if isinstance(node.op, ast.Add) else a * b
        raise ValueError(f"{ast.dump(node)[:40]}")

    try:
        pattern = value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pattern = None
    if not isinstance(pattern, list) or not set(pattern) <= {0, 1}:
        raise ExportError(f"megatron script: {flag} {text!r}: not a list of 0s and 1s")
    if layers is not None and len(pattern) != layers:
        raise ExportError(f"megatron script: {flag} lists {len(pattern)} layers, --num-layers is {layers}")
    return pattern


def model_refusal(m: ModelSpec) -> None:
    """An :class:`ExportError` naming the field where Megatron-LM's arguments cannot say what ``m`` computes (module
    docstring): a rotary base that is not whole (``--rotary-base`` is an integer), quick_gelu without a gate, and a
    gated MLP's ``glu_linear_offset`` or ``glu_clamp`` under another activation than quick_gelu; a shared expert with
    biases; the routing weights Megatron-Core's ``topk_routing_with_score_function`` cannot make (``normalize_topk``
    against the score function and k), the group scores its ``group_limited_topk`` does not compute
    (``router_group_topk``); OLMo's layers (:func:`olmo_refusal`); what Llama 4 has that Megatron-LM's arguments do not
    compute (:func:`llama4_refusal`). (Per-head query/key norms beside latent attention ModelSpec refuses.)"""
    olmo_refusal(m)
    llama4_refusal(m)
    if m.position == "rotary" and not float(m.rope_theta).is_integer():
        raise ExportError(f"megatron: rope_theta {m.rope_theta:g}: Megatron-LM's --rotary-base is an integer "
                          "(type=int in megatron/training/arguments.py)")
    if m.activation == "quick_gelu" and not m.gated_mlp:
        raise ExportError("megatron: activation quick_gelu without gated_mlp: Megatron-LM's quick_gelu is "
                          "--quick-geglu, a gated MLP's (core_transformer_config_from_args sets gated_linear_unit with "
                          "it); it has no ungated quick_gelu")
    if m.gated_mlp and m.activation != "quick_gelu":
        glu = [name for name, on in (("glu_linear_offset", m.glu_linear_offset != 0.0),
                                     ("glu_clamp", m.glu_clamp is not None)) if on]
        if glu:
            raise ExportError(f"megatron: {' and '.join(glu)} with activation {m.activation}: Megatron-LM applies "
                              "--glu-linear-offset and --activation-func-clamp-value with --quick-geglu only (the "
                              "clamp is 'Only used when activation_func is quick_gelu'; the fused SwiGLU, "
                              "bias_swiglu_impl, takes neither)")
    if m.moe and m.shared_expert_ffn_hidden is not None and m.bias:
        raise ExportError(f"megatron: shared_expert_ffn_hidden ({m.shared_expert_ffn_hidden}) with bias: "
                          "Megatron-Core's shared expert has no biases (SharedExpertMLP: 'bias is not supported in the "
                          "shared experts', it needs --disable-bias-linear), and this model's linear layers have them")
    if not m.moe:
        return
    k = int(m.experts_per_token or 0)
    if m.router_score == "sigmoid" and (k > 1) != m.normalize_topk:
        raise ExportError(
            f"megatron: normalize_topk {str(m.normalize_topk).lower()} with router_score sigmoid and {k} expert"
            f"{'s' if k > 1 else ''} per token: Megatron-Core "
            + ("renormalises the k chosen sigmoid scores whenever k > 1 (topk_routing_with_score_function) and has no "
               "option to keep them" if k > 1 else
               "weights the one chosen expert by its sigmoid score at k = 1 (topk_routing_with_score_function), where "
               "the renormalised weight is 1"))
    if m.router_score == "softmax" and k == 1 and m.normalize_topk:
        raise ExportError("megatron: normalize_topk true with 1 expert per token (a weight of 1): Megatron-Core "
                          "refuses top-1 softmax routing without --moe-router-pre-softmax ('Please use "
                          "--moe-router-pre-softmax when topk is 1'), which weights the expert by its softmax "
                          "probability over all the experts (normalize_topk false)")
    if m.router_groups is not None:
        g = int(m.router_group_topk or 0)
        best = 2 if m.router_score == "sigmoid" else 1
        if k != best * g:
            model = ("its best two experts' sigmoid scores (DeepSeek-V3's noaux_tc)" if best == 2 else
                     "its best expert's softmax score (DeepSeek-V2's group_limited_greedy)")
            raise ExportError(f"megatron: router_group_topk {g} with {k} experts per token: Megatron-Core scores a "
                              f"group by the sum of its best k / router_group_topk = {k // g} experts' scores "
                              "(group_limited_topk; it needs k divisible by router_group_topk), the model by "
                              f"{model}: the two agree only at k = {'2 x ' if best == 2 else ''}"
                              "router_group_topk")


def olmo_refusal(m: ModelSpec) -> None:
    """An :class:`ExportError` naming ``qk_norm_scope`` projection and ``post_norm`` where ``m`` has them: no argument
    of Megatron-LM's computes either (module docstring), and the export writes no flag that computes something else in
    their stead (``--qk-layernorm`` norms each head; ``--apply-residual-connection-post-layernorm`` keeps the input
    norms)."""
    why = []
    if m.qk_norm and m.qk_norm_scope == "projection":
        why.append(f"qk_norm_scope projection: the model norms the whole query projection ({m.heads} heads x {m.d} = "
                   f"{m.q_dim} wide) and the whole key projection ({m.k} x {m.d} = {m.kv_dim}) with one RMSNorm each, "
                   "before the rotary (transformers' Olmo2Attention, OlmoeAttention and MiniMaxM2Attention: "
                   "q_norm(q_proj(x))); "
                   f"Megatron-LM's one query/key norm, --qk-layernorm, is an RMSNorm over each head's {m.d} "
                   "(Megatron-Core's SelfAttention builds q_layernorm and k_layernorm hidden_size_per_attention_head "
                   "wide), another function of the same queries, and no argument norms the whole projection "
                   "(--qk-l2-norm is Llama 4's L2 norm of each head, without a weight); Megatron-Bridge builds OLMoE "
                   "with a layer spec of its own (olmoe_layer_spec's OLMoESelfAttention: both norms "
                   "num_attention_heads x head_dim wide), and its OLMo 2 layer spec keeps Megatron-Core's per-head "
                   "q_layernorm")
    if m.post_norm:
        why.append("post_norm: each branch's output is normed before its residual add and its input is not (x + "
                   "norm(attention(x)), transformers' Olmo2DecoderLayer); Megatron-Core's layers norm each branch's "
                   "input (input_layernorm, pre_mlp_layernorm) and nothing after it, and no argument changes that: "
                   "--apply-residual-connection-post-layernorm keeps the input norm and adds the branch to the normed "
                   "input (norm(x) + attention(norm(x)): BERT's original residual ordering); "
                   "Megatron-Bridge builds OLMo 2 with a layer spec of its own (olmo2_layer_spec: IdentityOp input "
                   "norms, an RMSNorm after linear_proj and after linear_fc2)")
    if why:
        raise ExportError("megatron: " + "; and ".join(why) + ". Megatron-LM's arguments would train another model "
                          "than the one planned, so none are written (Megatron-Bridge's layer specs are code, not "
                          "arguments)")


def llama4_refusal(m: ModelSpec) -> None:
    """An :class:`ExportError` naming each of Llama 4's fields that ``m`` has and Megatron-LM's arguments cannot compute
    (module docstring): ``qk_l2_norm`` beside ``nope_layers`` (``--qk-l2-norm`` norms every layer's queries and keys,
    the model its rotary layers' only), ``attention_chunk`` where it limits the attention (:func:`chunk_limits`: no
    argument chunks it), ``query_temperature`` where it scales a query (:func:`temperature_from`: no argument scales
    them), and ``router_weights_on_input`` with more than one expert per token (``--moe-apply-probs-on-input`` works
    at top 1 only). Nothing is written in their stead."""
    why = []
    if m.qk_l2_norm and m.nope_layers:
        why.append(f"qk_l2_norm with nope_layers: the model divides each head's query and key by its root mean "
                   f"square on its layers with rotary positions only, not on layers {layer_ranges(m.nope_layers)} "
                   "(transformers' Llama4TextAttention builds qk_norm where use_rope); Megatron-LM's --qk-l2-norm "
                   "makes L2Norm every layer's q_layernorm and k_layernorm (gpt_layer_specs.py: 'L2Norm if "
                   "qk_l2_norm', one spec for every layer; gpt_builders.py hands it args.qk_l2_norm), so it would norm "
                   "the layers without rotary positions too; Megatron-Bridge's Llama 4 layer spec "
                   "(get_llama4_layer_spec: 'if config.qk_l2_norm and not is_nope_layer') skips them")
    if m.attention_chunk is not None and chunk_limits(m):
        why.append(f"attention_chunk {m.attention_chunk}: the model's layers with rotary positions attend within "
                   f"chunks of {m.attention_chunk} positions of its {m.seq}-token sequence (transformers' chunked "
                   "attention mask, the keys j <= i with i // chunk == j // chunk), and no argument of Megatron-LM's "
                   "chunks the attention: TransformerConfig has no such field, and --window-size is a sliding window "
                   "(a query sees the keys before it across a chunk's start); Megatron-Bridge chunks it in its own "
                   "Llama4SelfAttention (chunkify over attention_chunk_size), on every layer, the ones without "
                   "rotary positions included, which the model's attend to the whole sequence")
    if (start := temperature_from(m)) is not None:
        floor, scale = m.query_temperature  # type: ignore[misc]
        why.append(f"query_temperature ({floor}, {scale:g}): the model multiplies the queries of its layers without "
                   f"rotary positions by 1 + {scale:g} ln(1 + floor((m + 1) / {floor})), above 1 from position "
                   f"{start} of its {m.seq}-token sequence on (transformers' attn_temperature_tuning), and neither "
                   "Megatron-LM's arguments nor Megatron-Core nor Megatron-Bridge's Llama 4 scale a query by its "
                   "position")
    if m.router_weights_on_input and m.moe and int(m.experts_per_token or 0) > 1:
        why.append(f"router_weights_on_input with {m.experts_per_token} experts per token: Megatron-Core applies "
                   "--moe-apply-probs-on-input with moe_router_topk 1 only (its expert MLPs assert "
                   "'`moe_apply_probs_on_input` only works with `moe_router_topk`=1.')")
    if why:
        raise ExportError("megatron: " + "; and ".join(why) + ". Megatron-LM's arguments would train another model "
                          "than the one planned, so none are written (Megatron-Bridge's Llama 4 layer spec is code, "
                          "not arguments)")


#: Megatron-LM's ``--norm-epsilon`` default (megatron/training/arguments.py: "Epsilon for layer norm and RMS norm.",
#: ``default=1e-5``), ModelSpec's ``norm_eps`` default too: written where the model's differs
NORM_EPSILON = 1e-5


def _model_args(inp: ExportInput) -> list[str]:
    m = inp.model
    if m is None:
        return []
    args = ["--num-layers", str(m.layers), "--hidden-size", str(m.hidden), "--num-attention-heads", str(m.heads),
            "--ffn-hidden-size", str(m.f), "--seq-length", str(m.seq), "--max-position-embeddings", str(m.seq)]
    if m.k != m.heads and not m.mla:  # (latent attention: every head its own key and value)
        args += ["--group-query-attention", "--num-query-groups", str(m.k)]
    if m.d * m.heads != m.hidden and not m.mla:
        args += ["--kv-channels", str(m.d)]
    if m.gated_mlp and m.activation == "quick_gelu":  # gpt-oss's gate (module docstring)
        args += ["--quick-geglu"]
        if not m.moe or m.dense_layers or m.shared_expert_ffn_hidden is not None:  # a dense MLP: the unfused GLU
            args += ["--no-bias-gelu-fusion"]
        if m.glu_linear_offset != 0.0:
            args += ["--glu-linear-offset", repr(float(m.glu_linear_offset))]
        if m.glu_clamp is not None:
            args += ["--activation-func-clamp-value", repr(float(m.glu_clamp))]
    elif m.gated_mlp:
        args += ["--swiglu"]
    if m.norm == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if m.norm_eps != NORM_EPSILON:  # every norm's epsilon (Qwen, OLMo 2, DeepSeek: 1e-6), Megatron's default 1e-5
        args += ["--norm-epsilon", repr(float(m.norm_eps))]
    if m.position == "rotary":
        # (an integer argument: 1e6 as 1000000, not %g's 1e+06, which Megatron's type=int refuses; model_refusal)
        args += ["--position-embedding-type", "rope", "--rotary-base", str(int(m.rope_theta))]
        if m.rot_d < m.d:  # the first rot_d of each head rotated, half against half (module docstring)
            args += ["--rotary-percent", rotary_percent(m.rot_d, m.d)]
        if m.rope_interleaved:  # adjacent pairs turned (Llama 4's form)
            args += ["--rotary-interleaved"]
        if m.nope_layers:  # 1: a layer without rotary positions
            args += ["--no-rope-freq", no_rope_freq(m.layers, m.nope_layers)]
    if m.mla:  # MLASelfAttention: its rotary plain (YaRN by default), its latents' RMSNorms (--qk-layernorm)
        args += ["--multi-latent-attention", "--rope-type", "rope"]
        if m.q_lora_rank is not None:
            args += ["--q-lora-rank", str(m.q_lora_rank)]
        r = int(m.qk_rope_head_dim or 0)
        args += ["--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.d - r), "--qk-pos-emb-head-dim",
                 str(r), "--v-head-dim", str(m.v_d), "--qk-layernorm"]
    elif m.qk_norm:
        args += ["--qk-layernorm"]  # (with RMSNorm normalization: RMSNorm over each head's query and key)
    elif m.qk_l2_norm:  # L2Norm, no weight, on every layer (with NoPE layers: llama4_refusal)
        args += ["--qk-l2-norm"]
    if m.attention_sinks:  # a learnable offset per head in the softmax's denominator
        args += ["--softmax-type", "learnable"]
    if m.sliding_window is not None:  # (left, right) both kept: the query and the w - 1 keys before it
        args += ["--window-size", f"{m.sliding_window - 1},0"]
        if m.global_every is not None:  # 1-based layer l global where l % n == 0: ModelSpec's n-1, 2n-1, ...
            args += ["--window-attn-skip-freq", str(m.global_every)]
    if not m.tied_embeddings:
        args += ["--untie-embeddings-and-output-weights"]
    if not m.bias:
        args += ["--disable-bias-linear"] + (["--add-qkv-bias"] if m.qkv_bias else [])
    if m.moe:
        # Megatron-Core's MoE (megatron/core/transformer/moe): E experts of width f_e, top-k routing; its default
        # softmax over the k chosen scores is the renormalised top-k (Mixtral), --moe-router-pre-softmax the
        # softmax over all E (Qwen3 MoE without norm_topk_prob); the experts split over the plan's e replicas
        # (planner.expert_parallel; Megatron-Core carves its expert-parallel groups from data parallelism too)
        args += ["--num-experts", str(m.experts), "--moe-router-topk", str(m.experts_per_token),
                 "--moe-ffn-hidden-size", str(m.f_e), "--expert-model-parallel-size", str(inp.config.expert)]
        if m.shared_expert_ffn_hidden is not None:  # SharedExpertMLP beside the routed experts (its gate: sigmoid)
            args += ["--moe-shared-expert-intermediate-size", str(m.shared_expert_ffn_hidden)]
            if m.shared_expert_gate:
                args += ["--moe-shared-expert-gate"]
        if m.dense_layers:  # 1: a layer with experts, 0: the dense MLP (--ffn-hidden-size)
            args += ["--moe-layer-freq", moe_layer_freq(m.layers, m.dense_layers)]
        if inp.config.expert_tensor is not None:  # the experts whole on each rank (planner.expert_parallel)
            args += ["--expert-tensor-parallel-size", str(inp.config.expert_tensor)]
        if inp.config.expert > 1:
            args += ["--moe-token-dispatcher-type", "alltoall"]
        if m.router_score == "sigmoid":  # (renormalised over the k chosen at k > 1: model_refusal)
            args += ["--moe-router-score-function", "sigmoid"]
        elif not m.normalize_topk:
            args += ["--moe-router-pre-softmax"]
        if m.router_groups is not None:
            args += ["--moe-router-num-groups", str(m.router_groups), "--moe-router-group-topk",
                     str(m.router_group_topk)]
        if m.router_bias:
            args += ["--moe-router-enable-expert-bias"]
        if m.routed_scaling != 1.0:
            args += ["--moe-router-topk-scaling-factor", repr(float(m.routed_scaling))]
        if m.router_weights_on_input:  # each expert's input times its weight, at top 1 (llama4_refusal)
            args += ["--moe-apply-probs-on-input"]
        if inp.expert_gemm == "grouped":
            args += ["--moe-grouped-gemm"]
    return args


def launch(inp: ExportInput) -> tuple[int, int]:
    """(nodes, processes per node) for ``t D W`` processes on nodes of the cluster's GPUs
    (:func:`planner.cluster.node_layout`: 4 on 3-GPU nodes is 2 x 2); one node when the GPUs per node are not
    known."""
    p, g = inp.world_size, inp.gpus_per_node
    return node_layout(p, g) if g else (1, p)


def arguments(inp: ExportInput, notes: list[str] | None = None) -> list[str]:
    """Megatron-LM's arguments for ``inp`` (refusing schedules it lacks)."""
    notes = notes if notes is not None else []
    c = inp.config
    if inp.fsdp and c.pipeline > 1:  # before the schedule: no schedule of this pipeline would do
        raise ExportError("megatron: the plan shards the weights over the data-parallel replicas (FSDP) in a "
                          f"{c.pipeline}-stage pipeline; Megatron-LM's --use-torch-fsdp2 runs without pipeline "
                          "parallelism (plan with --shard-optimizer for its distributed optimizer, or export a D = 1 "
                          "candidate)")
    m = inp.model
    if m is not None:
        model_refusal(m)
    check(inp.spec)
    check_heads(inp, "megatron")
    if c.schedule == "interleaved" and c.pipeline == 2:
        notes.append("Megatron-LM releases before 2024 refuse a virtual pipeline with pipeline-model-parallel-size "
                     "2 (they need > 2); current ones accept > 1")
    args = ["--tensor-model-parallel-size", str(c.tensor), "--pipeline-model-parallel-size", str(c.pipeline),
            *_layer_args(inp, notes),
            "--micro-batch-size", str(c.micro_batch), "--global-batch-size", str(inp.spec.global_batch)]
    if c.pipeline > 1 and c.data > 1 and c.order == "tp-pp-dp":
        if not experts_placeable(c.order, c.pipeline, c.data, c.expert_data):
            raise ExportError(f"megatron: expert parallelism (e = {c.expert}) with the pipeline inside data "
                              "parallelism (ranks tp-pp-dp, --use-tp-pp-dp-mapping) at D > 1: Megatron-Core allows "
                              "it only with the pipeline outermost ('When not using pp-last rank ordering, the data "
                              "parallel size of the attention and moe layers must be the same'); export the same "
                              "configuration with ranks=tp-dp-pp (plan it, or predict it with that order)")
        args += ["--use-tp-pp-dp-mapping"]
    if inp.sequence_parallel and c.tensor > 1:
        args += ["--sequence-parallel"]
    if inp.fsdp:  # PyTorch FSDP2 under Megatron-LM (megatron/training/arguments.py), without a pipeline only
        args += ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--ckpt-format", "torch_dist"]
        notes.append("the plan shards the weights (FSDP): --use-torch-fsdp2 reshards after forward, as costed; "
                     "the prediction assumes torchtitan's fp32 gradient reduce-scatter")
    elif inp.shard_optimizer and c.data > 1:  # the plan's memory counts the optimizer state split over W
        args += ["--use-distributed-optimizer"]
    if inp.dropout is False:  # Megatron's defaults are 0.1; the profile's model trains without (Llama)
        args += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    if inp.dp_allreduce == "overlapped":  # the profile's runtime reduces gradient buckets during the backward
        args += ["--overlap-grad-reduce"]
    sinks = inp.model is not None and inp.model.attention_sinks
    if inp.attention == "flash":  # (with sinks TE runs no flash-attn kernel: its fused one)
        backend = "fused" if inp.attention_impl == "cudnn" or sinks else "flash"
        notes.append(f"the plan's times assume {ATTENTION_WORDS.get(inp.attention_impl or 'flash2')}: with "
                     f"Transformer Engine, --attention-backend {backend} (releases before it: --use-flash-attn "
                     "for the flash-attn package)")
    if c.recompute:
        args += RECOMPUTE
    elif inp.recompute_granularity == "selective":  # the profile's layers re-run their attention core
        args += SELECTIVE
    elif inp.recompute_granularity == "op":
        notes.append(unplanned_policy_note(OP_WORDS, "Megatron-LM has no such policy"))
    if inp.kernels == "eager":
        notes.append(f"the plan's times assume {EAGER_WORDS}; Megatron-LM runs fused ones, so expect less time than "
                     "planned")
    args += _model_args(inp)
    if inp.model is None and (c.expert > 1 or c.expert_tensor is not None):
        # the plan's layout of a mixture of experts, which the plan holds without the model: written as t and D are
        # (the model's --num-experts, --moe-router-topk and --moe-ffn-hidden-size are the user's, as its shape is)
        args += ["--expert-model-parallel-size", str(c.expert)]
        if c.expert_tensor is not None:
            args += ["--expert-tensor-parallel-size", str(c.expert_tensor)]
        if c.expert > 1:
            args += ["--moe-token-dispatcher-type", "alltoall"]
    if (gap := model_gaps_note(inp.model, "megatron", "Llama-shaped arguments (--swiglu, RMSNorm, rope)",
                               experts=True, latent=True, window=True, sinks=True, glu=True,
                               biases=True, rotary=True, llama4=True)) is not None:
        notes.append(gap)
    if inp.model is not None:
        notes += llama4_inert_notes(inp.model)
        if inp.model.rope_interleaved:
            notes.append("--rotary-interleaved runs in Transformer Engine's fused rotary kernel from TE 2.3 "
                         "(Megatron-Core refuses it with the rope fusion on older TE: 'rotary_interleaved does not "
                         "work with apply_rope_fusion'); there add --no-rope-fusion, as Megatron-Bridge's "
                         "Llama4ModelProvider does (apply_rope_fusion False), an unfused rotary slower than planned")
    if sinks:
        notes.append("--softmax-type learnable (the model's attention sinks) runs in Transformer Engine's fused "
                     "(cuDNN) attention from TE 2.8 (--attention-backend fused), never in flash-attn ('Disabling "
                     "FlashAttention for softmax_type = learnable'); before 2.8 Megatron-Bridge's GPT-OSS provider "
                     "falls back to Megatron-Core's local attention (--attention-backend local with --spec local)")
    if inp.model is not None and inp.model.mla:
        notes.append("--rope-type rope keeps Megatron-Core's multi-latent attention on the model's plain rotary (its "
                     "default there is YaRN); a release without --rope-type refuses the option")
    if inp.model is not None and inp.model.moe and c.tensor > 1 and inp.sequence_parallel is False:
        notes.append("Megatron-Core runs a mixture of experts with tensor parallelism only with --sequence-parallel; "
                     "the plan's times are without it (profile with --sequence-parallel for its times)")
    dtype = inp.dtype.lower()
    if dtype in ("bf16", "bfloat16"):
        args += ["--bf16"]
    elif dtype in ("fp16", "float16", "half"):
        args += ["--fp16"]
    return args


def export(inp: ExportInput) -> Export:
    """The launch script: ``torchrun`` on t D W processes running ``pretrain_gpt.py`` (``pretrain_bert.py``
    for an encoder) with :func:`arguments`; the user's data, tokenizer and optimizer arguments follow
    (``"$@"``)."""
    notes: list[str] = []
    args = arguments(inp, notes)
    if inp.model is None:
        notes.append("no model shape known (give --profile or --model): add --num-layers, --hidden-size, "
                     "--num-attention-heads, --seq-length yourself"
                     + (", and the mixture of experts' --num-experts, --moe-router-topk, --moe-ffn-hidden-size (its "
                        f"split over e = {inp.config.expert} is written)"
                        if inp.config.expert > 1 or inp.config.expert_tensor is not None else ""))
    nodes, per_node = launch(inp)
    if not inp.gpus_per_node and inp.world_size > 1:
        notes.append(f"no GPUs per node known (give --gpus-per-node G or --cluster): the launch line puts all "
                     f"{inp.world_size} processes on one node; with G per node use --nnodes {inp.world_size}/G "
                     "--nproc-per-node G")
    script = "pretrain_bert.py" if inp.model is not None and inp.model.encoder else "pretrain_gpt.py"
    lines = ["#!/usr/bin/env bash", *header(inp, NAME),
             f"# Megatron-LM takes data parallelism as world size / (t * D): run on exactly {inp.world_size} "
             f"processes ({nodes} node(s) x {per_node}).",
             "# Run from a Megatron-LM checkout on every node with NODE_RANK set; add your data, tokenizer and "
             "optimizer arguments after this script's name.",
             *[f"# note: {n}" for n in notes],
             "set -euo pipefail",
             'MASTER_ADDR="${MASTER_ADDR:-localhost}"', 'MASTER_PORT="${MASTER_PORT:-29500}"',
             f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --node-rank \"${{NODE_RANK:-0}}\" "
             f"--rdzv-backend c10d --rdzv-endpoint \"$MASTER_ADDR:$MASTER_PORT\" {script} \\"]
    pairs: list[str] = []
    i = 0
    while i < len(args):  # one option (with its value) per line
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            pairs.append(args[i])
            i += 1
    lines += [f"    {p} \\" for p in pairs] + ['    "$@"']
    return Export(NAME, (ExportFile("megatron_launch.sh", "\n".join(lines) + "\n", "text/x-shellscript"),),
                  tuple(notes))


def _options(tokens: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                out[tok] = tokens[i + 1]
                i += 2
                continue
            out[tok] = True
        i += 1
    return out


def parse_layout(text: str) -> list[int]:
    """Transformer layers per stage of a ``--pipeline-model-parallel-layout`` string, unrolled as Megatron-Core
    does (``PipelineParallelLayerLayout.parse_str_to_list``: commas dropped, ``(...)*n`` then ``x*n`` repeated)."""
    flat = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        flat = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), flat)
    bad = set(flat) - set("ELtm|")
    if bad:
        raise ExportError(f"megatron script: --pipeline-model-parallel-layout has unknown layer characters "
                          f"{sorted(bad)}")
    return [stage.count("t") for stage in flat.split("|")]


def parse(text: str) -> Parsed:
    """Read a :func:`export` script back: t, D, W (world size / (t D)), e, etp, the rank order, b, N, the schedule
    (interleaved with v chunks when a virtual pipeline is set, else 1F1B), recomputation, the transformer layers
    per (virtual) stage when ``--num-layers`` is given, a mixture of experts' shared expert (its width and gate),
    dense layers (``--moe-layer-freq``) and routing (the weights Megatron-Core computes: :func:`_parse_routing`),
    multi-head latent attention's sizes, the attention's window and sinks (:func:`_parse_window`), the MLP's gate
    and the linear layers' biases (:func:`_parse_mlp`), and each head's rotated part, its rotary form, the layers
    without rotary positions and the query/key norms (:func:`_parse_heads`)."""
    logical = text.replace("\\\n", " ")
    line = next((ln for ln in logical.splitlines() if ln.lstrip().startswith("torchrun")), None)
    if line is None:
        raise ExportError("megatron script: no torchrun line")
    tokens = shlex.split(line, comments=False)
    try:
        split = next(i for i, tok in enumerate(tokens) if tok.endswith(".py"))
    except StopIteration:
        raise ExportError("megatron script: no training script on the torchrun line") from None
    run, args = _options(tokens[1:split]), _options(tokens[split + 1:])

    def num(opts: dict[str, str | bool], key: str, default: int | None = None) -> int:
        v = opts.get(key, default)
        if v is None or isinstance(v, bool):
            raise ExportError(f"megatron script: {key} is missing")
        return int(v)

    world = num(run, "--nnodes") * num(run, "--nproc-per-node")
    t, D = num(args, "--tensor-model-parallel-size", 1), num(args, "--pipeline-model-parallel-size", 1)
    b, gb = num(args, "--micro-batch-size"), num(args, "--global-batch-size")
    if world % (t * D):
        raise ExportError(f"megatron script: world size {world} is not a multiple of t*D = {t * D}")
    W = world // (t * D)
    if gb % (W * b):
        raise ExportError(f"megatron script: global batch {gb} is not a multiple of W*b = {W * b}")
    L = num(args, "--num-layers") if "--num-layers" in args else None
    staged = args.get("--pipeline-model-parallel-layout")
    layout_counts = parse_layout(staged) if isinstance(staged, str) else None
    if layout_counts is not None:
        if len(layout_counts) % D:
            raise ExportError(f"megatron script: --pipeline-model-parallel-layout has {len(layout_counts)} stages, "
                              f"not a multiple of --pipeline-model-parallel-size {D}")
        v = len(layout_counts) // D
    elif "--num-layers-per-virtual-pipeline-stage" in args:
        if L is None:
            raise ExportError("megatron script: --num-layers-per-virtual-pipeline-stage needs --num-layers")
        v = L // D // num(args, "--num-layers-per-virtual-pipeline-stage")
    else:
        v = num(args, "--num-virtual-stages-per-pipeline-rank", 1)
    recompute = args.get("--recompute-granularity") == "full"
    if recompute and (args.get("--recompute-method"), args.get("--recompute-num-layers")) != ("uniform", "1"):
        raise ExportError("megatron script: only per-layer full recomputation (uniform, 1 layer) is ours")
    # the rank order: --use-tp-pp-dp-mapping, else Megatron's default with the pipeline outermost (the orders are the
    # same ranks at D = 1 or W = 1: the default Config's then)
    order = "tp-pp-dp" if args.get("--use-tp-pp-dp-mapping") or D == 1 or W == 1 else "tp-dp-pp"
    e = num(args, "--expert-model-parallel-size", 1)
    etp = num(args, "--expert-tensor-parallel-size", t)
    if etp not in (1, t):
        raise ExportError(f"megatron script: --expert-tensor-parallel-size {etp}: pipeplan plans 1 or t ({t})")
    expert_tensor = 1 if etp != t else None
    if (W * (t if expert_tensor else 1)) % e:
        raise ExportError(f"megatron script: --expert-model-parallel-size {e} does not divide "
                          + (f"t W = {t * W}" if expert_tensor else f"W = {W}"))
    try:
        config = Config(tensor=t, pipeline=D, data=W, micro_batch=b, recompute=recompute, expert=e,
                        expert_tensor=expert_tensor, order=order, schedule="interleaved" if v > 1 else "1f1b",
                        chunks=v if v > 1 else None)
    except ValueError as err:
        raise ExportError(f"megatron script: {err}") from None
    counts = layout_counts
    if L is not None and counts is None:
        if "--decoder-first-pipeline-num-layers" in args:
            first = num(args, "--decoder-first-pipeline-num-layers")
            last = num(args, "--decoder-last-pipeline-num-layers")
            mid = (L - first - last) // (D - 2) if D > 2 else 0
            counts = [first, *[mid] * (D - 2), last]
        else:
            counts = [L // (D * v)] * (D * v)
    shared = num(args, "--moe-shared-expert-intermediate-size") if "--moe-shared-expert-intermediate-size" in args \
        else None
    if args.get("--moe-shared-expert-gate") and shared is None:
        raise ExportError("megatron script: --moe-shared-expert-gate without --moe-shared-expert-intermediate-size")
    freq = args.get("--moe-layer-freq")
    if isinstance(freq, bool):
        raise ExportError("megatron script: --moe-layer-freq is missing its value")
    dense = parse_moe_layer_freq(freq, L) if freq is not None else ()
    return Parsed(config=config, microbatches=gb // (W * b), layer_counts=counts, shared_expert_ffn_hidden=shared,
                  shared_expert_gate=bool(args.get("--moe-shared-expert-gate")), dense_layers=dense,
                  **_parse_routing(args), **_parse_latent(args), **_parse_window(args, L), **_parse_mlp(args),
                  **_parse_heads(args, L), norm_eps=_parse_norm_eps(args))


def _parse_norm_eps(args: dict[str, str | bool]) -> float | None:
    """``--norm-epsilon`` (every norm's epsilon), None where the script leaves Megatron's default."""
    eps = _value(args, "--norm-epsilon", float)
    if eps is not None and not 0 < eps < 1:
        raise ExportError(f"megatron script: --norm-epsilon {eps!r}: a number between 0 and 1")
    return eps


def _value(args: dict[str, str | bool], key: str, kind: type = int) -> Any:
    v = args.get(key)
    if v is None:
        return None
    if isinstance(v, bool):
        raise ExportError(f"megatron script: {key} is missing its value")
    try:
        return kind(v)
    except ValueError:
        raise ExportError(f"megatron script: {key} {v!r}: not a{'n integer' if kind is int else ' number'}") from None


def _parse_routing(args: dict[str, str | bool]) -> dict[str, Any]:
    """The routing Megatron-Core computes from a script's router arguments, as ModelSpec's fields (module
    docstring); its defaults without ``--num-experts``."""
    if "--num-experts" not in args:
        return {}
    score = args.get("--moe-router-score-function", "softmax")
    if score not in ("softmax", "sigmoid"):
        raise ExportError(f"megatron script: --moe-router-score-function {score!r}: softmax or sigmoid")
    k = _value(args, "--moe-router-topk") or 2  # (Megatron's default)
    groups, group_topk = _value(args, "--moe-router-num-groups"), _value(args, "--moe-router-group-topk")
    if group_topk is not None and groups is None:  # (as Megatron-Core refuses it)
        raise ExportError("megatron script: --moe-router-group-topk without --moe-router-num-groups")
    bias = bool(args.get("--moe-router-enable-expert-bias"))
    if bias and score != "sigmoid":
        raise ExportError("megatron script: --moe-router-enable-expert-bias needs --moe-router-score-function sigmoid")
    scaling = _value(args, "--moe-router-topk-scaling-factor", float)
    # sigmoid: renormalised at k > 1 whatever --moe-router-pre-softmax says; softmax: unless pre-softmax
    normalize = k > 1 if score == "sigmoid" else not args.get("--moe-router-pre-softmax")
    on_input = bool(args.get("--moe-apply-probs-on-input"))
    if on_input and k != 1:  # (as Megatron-Core's expert MLPs assert)
        raise ExportError(f"megatron script: --moe-apply-probs-on-input with --moe-router-topk {k}: Megatron-Core "
                          "applies it with moe_router_topk 1 only")
    return {"normalize_topk": normalize, "router_score": score,
            "router_groups": groups if group_topk is not None else None, "router_group_topk": group_topk,
            "router_bias": bias, "routed_scaling": scaling or 1.0, "router_weights_on_input": on_input}


def _parse_latent(args: dict[str, str | bool]) -> dict[str, Any]:
    """Multi-head latent attention's sizes from ``--multi-latent-attention`` and its arguments (Megatron's defaults
    where one is absent: kv_lora_rank 32, qk-head-dim 128, qk-pos-emb-head-dim 64, v-head-dim 128)."""
    if not args.get("--multi-latent-attention"):
        return {}
    nope = _value(args, "--qk-head-dim")
    rope = _value(args, "--qk-pos-emb-head-dim")
    rope = 64 if rope is None else rope
    kv = _value(args, "--kv-lora-rank")
    v = _value(args, "--v-head-dim")
    return {"kv_lora_rank": 32 if kv is None else kv, "q_lora_rank": _value(args, "--q-lora-rank"),
            "qk_rope_head_dim": rope, "v_head_dim": 128 if v is None else v,
            "head_dim": (128 if nope is None else nope) + rope}


def _parse_window(args: dict[str, str | bool], layers: int | None) -> dict[str, Any]:
    """ModelSpec's ``sliding_window`` and ``global_every`` from ``--window-size left,right`` (the query and the
    ``left`` keys before it: ``left + 1``; Megatron's -1 is no limit) and ``--window-attn-skip-freq`` (n: the 1-based
    layers ``l % n == 0`` global; a list: 1 windowed, 0 global, read where it is that period), as
    ``is_layer_window_attention`` applies them (module docstring); {} without a window in effect."""
    size = args.get("--window-size")
    if size is None:
        return {}  # (Megatron ignores --window-attn-skip-freq without a window)
    if isinstance(size, bool):
        raise ExportError("megatron script: --window-size is missing its value")
    try:
        left, right = (int(x) for x in size.strip("()").split(","))
    except ValueError:
        raise ExportError(f"megatron script: --window-size {size!r}: two integers, left,right") from None
    if right != 0:
        raise ExportError(f"megatron script: --window-size {size}: each query also attends to the {right} tokens "
                          "after it; the models planned here attend to none (right 0)")
    if left == -1:
        return {}  # (no limit)
    if left < 0:
        raise ExportError(f"megatron script: --window-size {size}: left is -1 (no limit) or 0 and more")
    freq = args.get("--window-attn-skip-freq")
    if freq is None:
        return {"sliding_window": left + 1}
    if isinstance(freq, bool):
        raise ExportError("megatron script: --window-attn-skip-freq is missing its value")
    if re.fullmatch(r"\s*\d+\s*", freq):
        n = int(freq)
        if n < 1:
            raise ExportError(f"megatron script: --window-attn-skip-freq {freq}: a frequency of 1 or more")
        if n == 1:
            return {}  # (every layer global)
        return {"sliding_window": left + 1, "global_every": n}
    bits = bit_list(freq, "--window-attn-skip-freq", layers)
    if all(bits):
        return {"sliding_window": left + 1}
    if not any(bits):
        return {}
    every = next((n for n in range(2, len(bits) + 1) if bits == [int((i + 1) % n != 0) for i in range(len(bits))]),
                 None)
    if every is None:
        raise ExportError(f"megatron script: --window-attn-skip-freq {freq}: global layers that are not every n-th "
                          "(ModelSpec's global_every)")
    return {"sliding_window": left + 1, "global_every": every}


def _parse_heads(args: dict[str, str | bool], layers: int | None) -> dict[str, Any]:
    """ModelSpec's ``rotary_dim`` as Megatron-Core computes it from ``--rotary-percent`` p (module docstring): with
    ``--position-embedding-type rope`` and p below 1, ``int(kv_channels * p)`` (``--kv-channels``, else Megatron's
    default ``hidden_size // num_attention_heads``), None at 1 or more (every dimension rotated); refused: a p that is
    not finite, an odd or empty rotated part, p below 1 with latent attention (its own rotated part is all of
    ``qk_pos_emb_head_dim``). With rope, ``rope_interleaved``: ``--rotary-interleaved`` (adjacent pairs turned; refused
    with latent attention, as Megatron-Core does), and ``nope_layers``: ``--no-rope-freq`` (:func:`parse_no_rope_freq`).
    With the model's arguments (``--num-layers``), ``qk_norm``: ``--qk-layernorm`` without latent attention (with it,
    the latents' norms) and without ``--qk-l2-norm`` (whose L2Norm Megatron-Core's layer spec takes in its stead), and
    ``qk_l2_norm``: ``--qk-l2-norm``, refused with latent attention (Megatron-Core asserts 'qk_l2_norm is not supported
    with MLA') and beside layers without rotary positions (it norms theirs too; ModelSpec's ``qk_l2_norm`` is on the
    rotary layers only)."""
    out: dict[str, Any] = {}
    latent = bool(args.get("--multi-latent-attention"))
    l2 = bool(args.get("--qk-l2-norm"))
    if l2 and latent:
        raise ExportError("megatron script: --qk-l2-norm with --multi-latent-attention: Megatron-Core refuses it "
                          "('qk_l2_norm is not supported with MLA')")
    if "--num-layers" in args:
        out["qk_norm"] = bool(args.get("--qk-layernorm")) and not latent and not l2
        out["qk_l2_norm"] = l2
    if args.get("--position-embedding-type") != "rope":
        return out  # (Megatron's rotary arguments act on rope only)
    if args.get("--rotary-interleaved"):
        if latent:
            raise ExportError("megatron script: --rotary-interleaved with --multi-latent-attention: Megatron-Core "
                              "refuses it ('rotary_interleaved does not work with multi_latent_attention')")
        out["rope_interleaved"] = True
    freq = args.get("--no-rope-freq")
    if isinstance(freq, bool):
        raise ExportError("megatron script: --no-rope-freq is missing its value")
    if freq is not None and (nope := parse_no_rope_freq(freq, layers)):
        if l2:
            raise ExportError(f"megatron script: --qk-l2-norm with --no-rope-freq {freq}: Megatron-Core norms the "
                              f"queries and keys of every layer, those without rotary positions ({layer_ranges(nope)}) "
                              "included; the models planned here norm their rotary layers' only (qk_l2_norm)")
        out["nope_layers"] = nope
    percent = _value(args, "--rotary-percent", float)
    if percent is None:
        return out
    if not math.isfinite(percent):
        raise ExportError(f"megatron script: --rotary-percent {percent}: a finite share of each head")
    if percent >= 1.0:  # (RotaryEmbedding applies a percent below 1 only)
        return out
    if latent:
        raise ExportError(f"megatron script: --rotary-percent {percent!r} with --multi-latent-attention: Megatron-Core "
                          "would rotate part of qk_pos_emb_head_dim; the latent attention planned here rotates all of "
                          "qk_rope_head_dim (ModelSpec refuses rotary_dim with kv_lora_rank)")
    kv = _value(args, "--kv-channels")
    if kv is None:
        hidden, heads = _value(args, "--hidden-size"), _value(args, "--num-attention-heads")
        if not hidden or not heads:
            raise ExportError("megatron script: --rotary-percent needs --kv-channels, or --hidden-size and "
                              "--num-attention-heads (Megatron's kv_channels default, hidden_size // heads)")
        kv = hidden // heads
    dim = int(kv * percent)
    if dim < 2 or dim % 2:
        raise ExportError(f"megatron script: --rotary-percent {percent!r} of kv_channels {kv}: Megatron-Core "
                          f"rotates int({kv} x {percent!r}) = {dim} dimensions of each head; rotary positions turn an "
                          "even number of them, 2 or more")
    return out | {"rotary_dim": dim}


def _parse_mlp(args: dict[str, str | bool]) -> dict[str, Any]:
    """The attention's sinks (``--softmax-type learnable``), the gated MLP's activation (``--swiglu``: silu,
    ``--quick-geglu``: quick_gelu) with ``--glu-linear-offset`` and ``--activation-func-clamp-value`` (read with
    ``--quick-geglu`` only, where Megatron applies them: module docstring), and, with the model's arguments
    (``--num-layers``), the linear layers' biases (``--disable-bias-linear``, ``--add-qkv-bias``)."""
    softmax = args.get("--softmax-type", "vanilla")
    if softmax not in ("vanilla", "learnable"):
        raise ExportError(f"megatron script: --softmax-type {softmax!r}: vanilla or learnable (off-by-one's fixed "
                          "sink of logit 0 is no model's here)")
    swiglu, quick = bool(args.get("--swiglu")), bool(args.get("--quick-geglu"))
    if swiglu and quick:  # (core_transformer_config_from_args asserts not both)
        raise ExportError("megatron script: --swiglu and --quick-geglu: Megatron takes one gated activation")
    offset = _value(args, "--glu-linear-offset", float)
    clamp = _value(args, "--activation-func-clamp-value", float)
    for flag, v in (("--glu-linear-offset", offset), ("--activation-func-clamp-value", clamp)):
        if v is not None and not quick:
            raise ExportError(f"megatron script: {flag} without --quick-geglu: Megatron applies it to quick_gelu's "
                              "gate only (the fused SwiGLU takes none)")
    if clamp is not None and not (clamp > 0 and math.isfinite(clamp)):
        raise ExportError(f"megatron script: --activation-func-clamp-value {clamp}: a clamp above 0")
    if offset is not None and not math.isfinite(offset):
        raise ExportError(f"megatron script: --glu-linear-offset {offset}: a finite number")
    out: dict[str, Any] = {"attention_sinks": softmax == "learnable",
                           "activation": "quick_gelu" if quick else "silu" if swiglu else None,
                           "glu_linear_offset": offset or 0.0, "glu_clamp": clamp}
    if "--num-layers" in args:  # (Megatron's default: every linear layer's bias)
        out |= {"bias": not args.get("--disable-bias-linear"), "qkv_bias": bool(args.get("--add-qkv-bias"))}
    return out
