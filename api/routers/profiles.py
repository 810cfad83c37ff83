"""/profiles: model profiles as the profiler writes them, versioned by content hash."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from api import crud
from api.deps import DB, Admin, Read
from api.errors import stored
from api.jsonbody import UniqueKeysRoute
from api.routers.common import Filter, IdPath, Limit, Offset, profile_out
from api.schemas import MAX_ID, HFProfileOut, Message, Name, ProfileDetail, ProfileOut, ProfileUpload, plain_text
from planner.cluster import Cluster
from planner.device import ATTENTION_IMPLS, DeviceSpec

router = APIRouter(prefix="/profiles", tags=["profiles"], route_class=UniqueKeysRoute)


class HFConfigUpload(BaseModel):
    """A Hugging Face ``config.json`` and where it runs: the device of a stored cluster or a shipped device."""

    model_config = ConfigDict(extra="forbid")

    # counts are JSON integers and switches JSON booleans (not "4096", not "yes"), as in POST /plans; the name is
    # held to POST /profiles' rule (schemas.Name)
    config: dict[str, Any] = Field(
        description="the contents of config.json (Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3 MoE, Phi-3, Gemma 1-3, "
                    "GPT-2)")
    cluster_id: StrictInt | None = Field(default=None, ge=1, le=MAX_ID,
                                    description="profile for this stored cluster's device")
    device: str | None = Field(default=None, max_length=100, description="or a shipped device (planner/devices)")
    seq: StrictInt | None = Field(default=None, ge=1, le=1_048_576, description="sequence trained with "
                                                                          "(default: max_position_embeddings)")
    name: Name | None = Field(default=None,
                             description="the profile's name; default: the config's _name_or_path, else its "
                                         "model_type and size (e.g. qwen3-8.2b)")
    dtype: str | None = Field(default=None, max_length=8,
                              description="training dtype (default: bf16 where the device has a bf16/fp16 GEMM "
                                          "curve, else its first of fp32, tf32; e.g. fp32 on the CPU)")
    attention: Literal["unfused", "flash"] = Field(
        default="unfused", description="the attention core: unfused (scores, softmax, dropout and the product "
                                       "apart, as pipeplan's executor and Megatron-LM 2021 run it) or flash (one "
                                       "fused kernel, causal for a decoder; planner.operators)")
    attention_impl: Literal[ATTENTION_IMPLS] = Field(  # type: ignore[valid-type]
        default="flash2", description="the flash kernel, timed at its published rate on the device: flash2 "
                                      "(FlashAttention-2), flash3 (FlashAttention-3, Hopper) or cudnn (cuDNN's "
                                      "fused attention, Transformer Engine's on Hopper); only with attention = "
                                      "flash")
    sequence_parallel: StrictBool = Field(default=False, description="Megatron sequence parallelism (Korthikanti et "
                                                               "al. 2022) where tensor parallelism is used")
    recompute_granularity: Literal["none", "selective", "op"] = Field(
        default="none", description="selective: Megatron's --recompute-granularity selective (Korthikanti et al. "
                                    "2022): the attention core is re-run in the backward instead of stashed where a "
                                    "plan does not recompute fully; op: torchtitan's selective op checkpointing "
                                    "(every other GEMM's output and the attention kernel's kept, the rest re-run; "
                                    "planner.operators)")
    kernels: Literal["fused", "eager"] = Field(
        default="fused", description="how the memory-bound operators run: fused (Megatron-LM / Transformer "
                                     "Engine kernels) or eager (PyTorch without torch.compile, as torchtitan and "
                                     "Hugging Face code run: norms, rotary embeddings, activations and residual "
                                     "adds as separate ops; planner.operators)")
    expert_gemm: Literal["grouped", "sequential"] = Field(
        default="grouped", description="a mixture of experts' expert GEMMs: grouped (one grouped GEMM over the "
                                       "experts: Megatron-Core's --moe-grouped-gemm, torchtitan) or sequential (one "
                                       "expert at a time: Hugging Face's eager experts; planner.moe); ignored for a "
                                       "dense model")
    p2p: Literal["overlapped", "blocking"] = Field(
        default="overlapped", description="how the training runtime posts its pipeline sends: overlapped "
                                          "(pipeplan's executor) or blocking (Megatron-LM 2021-22, Megatron-Core's "
                                          "batched sends; planner.analytic.P2P_RUNTIMES)")
    dp_allreduce: Literal["after-backward", "overlapped"] = Field(
        default="after-backward", description="when it all-reduces the data-parallel gradients: after-backward "
                                              "(pipeplan's executor) or overlapped with the last backward of a "
                                              "one-stage pipeline (PyTorch DDP; planner.analytic."
                                              "DP_ALLREDUCE_RUNTIMES)")
    p2p_scatter_gather: StrictBool = Field(
        default=False, description="whether the runtime sends each pipeline boundary tensor by Megatron-LM's "
                                   "scatter/gather (2021-22): 1/t of it per tensor-parallel rank, then gathered; "
                                   "otherwise every rank sends it whole (pipeplan's executor, Megatron-Core), or "
                                   "its 1/t of the sequence under sequence parallelism (planner.cost)")


def default_dtype(dev: DeviceSpec) -> str:
    """bf16 (mixed precision, as the A100/H100 presets train) where the device has a half-precision GEMM curve;
    otherwise the device's own: fp32 on the CPU (``planner/devices/cpu.json``), as the executor runs there."""
    have = set(dev.gemm_efficiency)
    if have & {"bf16", "fp16"}:
        return "bf16"
    return next((d for d in ("fp32", "tf32") if d in have), sorted(have)[0])


@router.post("", response_model=ProfileOut, status_code=201, dependencies=[Admin],
             responses={200: {"model": ProfileOut, "description": "the same profile was stored before"},
                        422: {"model": Message}})
def upload_profile(profile: ProfileUpload, db: DB, response: Response):  # noqa: ANN201
    """Store a profile (validated as ``planner.profile.ModelProfile``,
    with the bounds of :class:`api.schemas.ProfileUpload`). Uploading the same content again
    returns the stored one with 200."""
    row, created = crud.stored_once(db, lambda: crud.add_profile(db, profile))
    if not created:
        response.status_code = status.HTTP_200_OK
    return profile_out(row)


@router.post("/hf-config", response_model=HFProfileOut, status_code=201, dependencies=[Admin],
             responses={200: {"model": HFProfileOut, "description": "the same profile was stored before"},
                        422: {"model": Message}})
def upload_hf_config(body: HFConfigUpload, db: DB, response: Response):  # noqa: ANN201
    """Make and store the analytical profile of a Hugging Face model configuration on a cluster's (or a named)
    device. A config that cannot be read is a 422 naming its field (``config.<field>: ...``)."""
    from planner.analytic import analytic_profile
    from planner.device import device_for_cluster, shipped_device, shipped_devices
    from planner.operators import OperatorOptions
    from profiler.hf_config import HFConfigError, SeqError, default_name, spec_from_hf_dict, trains_with_dropout

    if (body.cluster_id is None) == (body.device is None):
        raise crud.InputError("cluster_id, device: give exactly one")
    if body.cluster_id is not None:
        try:
            row = crud.get_cluster(db, body.cluster_id)
        except crud.NotFound as e:  # a body's reference, as POST /plans names it: 422 naming the field
            raise crud.InputError(f"cluster_id: {e}") from None
        dev = device_for_cluster(stored(Cluster, row.body, f"cluster_id: cluster {body.cluster_id}",
                                        "name a device instead"))
    else:
        dev = shipped_device(body.device or "")
        if dev is None:
            raise crud.InputError(f"device: unknown {body.device!r}; shipped: "
                                  + ", ".join(d.name for d in shipped_devices()))
    if "attention_impl" in body.model_fields_set and body.attention != "flash":
        raise crud.InputError("attention_impl: only with attention = flash (the unfused core has no fused kernel)")
    given = body.config.get("_name_or_path")
    if body.name is None and given is not None and not isinstance(given, str):
        raise crud.InputError(f"config._name_or_path: a string (the model's name), got {type(given).__name__} "
                              "(give a name)")
    name = body.name or str(given or "")
    if body.name is None and name:  # the config's own name is stored as the profile's: POST /profiles' rule
        try:
            plain_text(name)
        except ValueError as e:
            raise crud.InputError(f"config._name_or_path: {e} (give a name)") from None
    try:
        caveats: list[str] = []  # what the model's reading leaves out, kept in the profile's notes
        spec = spec_from_hf_dict(body.config, name=name[:200] or "hf-model", seq=body.seq,
                                 source="uploaded Hugging Face config", warn=caveats.append)
        if not name:  # a bare config.json: its model_type and size (the CLI names it after its folder)
            spec = spec.model_copy(update={"name": default_name(body.config, spec.total_params())})
        options = OperatorOptions(dropout=trains_with_dropout(body.config), recompute=body.recompute_granularity,
                                  attention=body.attention, attention_impl=body.attention_impl,
                                  sequence_parallel=body.sequence_parallel, kernels=body.kernels,
                                  expert_gemm=body.expert_gemm)
        dtype = body.dtype or default_dtype(dev)
        profile = analytic_profile(spec, dev, dtype=dtype, name=spec.name, options=options, p2p=body.p2p,
                                   dp_allreduce=body.dp_allreduce, p2p_scatter_gather=body.p2p_scatter_gather,
                                   caveats=caveats)
    except SeqError as e:  # the body's seq, not a field of the file
        raise crud.InputError(str(e)) from None
    except HFConfigError as e:
        # a field of the file as config.<field>; the file as a whole (transformers refusing it) as config
        raise crud.InputError(f"{'config' if e.field == 'config' else 'config.' + e.field}: {e.message}") from None
    except ValueError as e:
        raise crud.InputError(str(e)) from None
    row, created = crud.stored_once(db, lambda: crud.add_profile(db, profile))
    if not created:
        response.status_code = status.HTTP_200_OK
    return {**profile_out(row), "caveats": [c.removeprefix("hf-config: ") for c in caveats]}


@router.get("", response_model=list[ProfileOut], dependencies=[Read])
def list_profiles(db: DB, name: Filter = None, device: Filter = None, limit: Limit = 100, offset: Offset = 0):  # noqa: ANN201
    return [profile_out(r) for r in crud.list_profiles(db, name, device, limit, offset)]


@router.get("/{profile_id}", response_model=ProfileDetail, dependencies=[Read],
            responses={404: {"model": Message}})
def get_profile(profile_id: IdPath, db: DB):  # noqa: ANN201
    return profile_out(crud.get_profile(db, profile_id), detail=True)


class ProfileAssumes(BaseModel):
    id: int
    assumes: list[str] = Field(description="what the profile's times assume of the kernels and the training "
                                           "runtime, in words (planner.profile.runtime_words)")


@router.get("/{profile_id}/assumes", response_model=ProfileAssumes, dependencies=[Read],
            responses={404: {"model": Message}})
def get_profile_assumes(profile_id: IdPath, db: DB,  # noqa: ANN201
                        sharded_weights: Annotated[bool, Query(description="for a plan that shards its weights "
                                                                           "(FSDP): no data-parallel all-reduce "
                                                                           "to name")] = False):
    """Only :func:`get_profile`'s ``assumes``: what the new-plan and plan pages show, without the document (a
    GPT-3 175B analytical profile is about 1 MB)."""
    out = profile_out(crud.get_profile(db, profile_id), detail=True, sharded_weights=sharded_weights)
    return {"id": out["id"], "assumes": out["assumes"]}


@router.delete("/{profile_id}", status_code=204, dependencies=[Admin],
               responses={404: {"model": Message}, 409: {"model": Message}})
def delete_profile(profile_id: IdPath, db: DB) -> Response:
    crud.delete_profile(db, profile_id)
    return Response(status_code=204)
