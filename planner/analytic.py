"""Analytical model profiles from FLOP and byte counts, for when no measured profile exists.

Per transformer layer and sample (sequence length ``s``, hidden ``h``, heads ``a``), with the GEMM
counts of Megatron-LM (Narayanan et al. SC'21, appendix "Floating-point operations"):

* forward FLOPs ``24 s h^2 (1 + s/(6h))``, backward twice that; the LM head (logits, vocabulary ``V``)
  ``2 s h V`` forward and ``4 s h V`` backward. With recomputation of every transformer layer, the four
  passes give Megatron's ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` FLOPs per iteration of batch ``B``
  (our split: forward : backward = 1 : 2, recomputation one more forward);
* stashed activations per layer and sample ``s h (34 + 5 a s / h)`` bytes at 16-bit (Korthikanti et
  al. 2022, "Reducing Activation Recomputation", eq. 1, no sequence parallelism), the layer output
  ``2 s h`` bytes (what a stage boundary sends) and its input ``2 s h`` (all a recomputed layer keeps);
* parameters ``12 h^2 + 13 h`` per layer; word embedding ``V h`` plus learned positions ``s h``; the LM
  head shares the word embedding (tied, as GPT-2/3) and carries the final layer norm ``2 h``.

Time = FLOPs / (peak FLOP/s * efficiency(b)), with ``efficiency(b) = max_efficiency * T / (T + T_half)``,
``T = b s`` tokens per micro-batch and ``T_half`` the tokens at which half of ``max_efficiency`` is
reached: GPUs run small GEMMs below peak, so time is not linear in b for small b. The defaults
(``max_efficiency = 0.5``, ``T_half = 512``) are stated in every profile's notes.
"""

from __future__ import annotations

from planner.profile import LayerProfile, ModelProfile, TransformerShape

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def transformer_profile(name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int,
                        peak_flops: float, device: str, dtype: str = "bf16",
                        max_efficiency: float = 0.5, half_tokens: float = 512.0,
                        micro_batches: tuple[int, ...] = MICRO_BATCHES,
                        encoder: bool = False) -> ModelProfile:
    """A GPT (decoder) or BERT (encoder, ``encoder=True``: same FLOPs and memory per layer) profile."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    el = DTYPE_BYTES[dtype]
    s, h, a, V = seq, hidden, heads, vocab

    def seconds(flops_per_sample: float) -> dict[int, float]:
        out = {}
        for b in micro_batches:
            tokens = b * s
            eff = max_efficiency * tokens / (tokens + half_tokens)
            out[b] = flops_per_sample * b / (peak_flops * eff)
        return out

    act_scale = el / 2  # the byte counts above are for 16-bit activations
    block_fwd = 24 * s * h * h * (1 + s / (6 * h))
    block = dict(
        kind="transformer",
        fwd_time=seconds(block_fwd), bwd_time=seconds(2 * block_fwd), recompute_time=seconds(3 * block_fwd),
        output_bytes_per_sample=int(el * s * h),
        stashed_bytes_per_sample=int(act_scale * s * h * (34 + 5 * a * s / h)),
        input_bytes_per_sample=int(el * s * h),
        params=12 * h * h + 13 * h, param_bytes=el * (12 * h * h + 13 * h),
    )
    emb_params = V * h + s * h
    # the embedding is a gather: memory-bound, modelled as moving its output at 1/100 of a FLOP per byte
    emb_time = seconds(100.0 * el * s * h)
    layers_out = [LayerProfile(
        name="embedding", kind="embedding", fwd_time=emb_time, bwd_time=emb_time,
        output_bytes_per_sample=int(el * s * h), stashed_bytes_per_sample=int(8 * s),
        input_bytes_per_sample=int(8 * s), params=emb_params, param_bytes=el * emb_params)]
    for i in range(layers):
        layers_out.append(LayerProfile(name=f"block{i}", **block))
    head_fwd = 2 * s * h * V
    layers_out.append(LayerProfile(
        name="lm_head", kind="lm_head", fwd_time=seconds(head_fwd), bwd_time=seconds(2 * head_fwd),
        recompute_time=seconds(3 * head_fwd),
        output_bytes_per_sample=4, stashed_bytes_per_sample=int(act_scale * (2 * s * h + 4 * s * V)),
        input_bytes_per_sample=int(el * s * h), params=V * h + 2 * h, param_bytes=el * (V * h + 2 * h),
        tied_params=V * h))
    return ModelProfile(
        name=name, layers=layers_out, device=device, dtype=dtype, source="analytical",
        shape=TransformerShape(hidden=h, seq=s, heads=a, vocab=V, layers=layers),
        environment={"peak_flops": f"{peak_flops:g}", "max_efficiency": f"{max_efficiency:g}",
                     "half_tokens": f"{half_tokens:g}", "family": "bert" if encoder else "gpt"},
        notes=("analytical profile (planner.analytic): Megatron-LM FLOP counts at "
               f"{max_efficiency:g} of peak for large micro-batches, half of that at {half_tokens:g} "
               "tokens; activations from Korthikanti et al. 2022; replace with a measured profile"),
    )


#: the seed papers' models: (layers, hidden, heads, seq, vocab, encoder)
PRESETS: dict[str, tuple[int, int, int, int, int, bool]] = {
    # Chimera Table 4 / section 4: Bert-48 (seq 128) and GPT-2 1.3B (seq 632)
    "bert-48": (48, 1024, 16, 128, 30522, True),
    # Chimera's table of model shapes is lost from our copy of the text; 48 layers (it runs D = 32) of
    # hidden 1536 give 1.36B parameters outside the embedding, the paper's "1.3B"
    "gpt2-1.3b": (48, 1536, 16, 632, 50257, False),
    # Megatron-LM Table 1: GPT-3 175B
    "gpt3-175b": (96, 12288, 96, 2048, 51200, False),
    "gpt2-medium": (24, 1024, 16, 1024, 50257, False),
    # Hanayo section 5: "BERT-style: 64 layers, 64 heads, hidden 2560; GPT-style: 128 layers, 16 heads,
    # hidden 1024" (sequence lengths not stated: 512 and 1024 assumed)
    "hanayo-bert": (64, 2560, 64, 512, 30522, True),
    "hanayo-gpt": (128, 1024, 16, 1024, 50257, False),
}
