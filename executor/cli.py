"""``pipeplan run``: execute a plan (or a schedule given directly) on one process per device
(:mod:`executor.launch`).

Forms::

    pipeplan run --plan plan.json [--candidate 0] [--model gpt-tiny] [--iterations 10] [--backend gloo|nccl]
                 [--p2p prefetch|grouped] [--trace trace.json] [--out result.json] [--check]
                 [--emulate profile.json [--cluster c.json]]
    pipeplan run --schedule chimera --devices 4 --microbatches 8 (--model gpt-tiny | --hf-config cfg.json |
                 --module pkg.mod:build) [-W 2]
                 [--tensor 2] [--expert 2] [--order tp-pp-dp|tp-dp-pp] [--micro-batch 1]
                 [--chunks/--waves/--pipelines/--concat/--replication] [--recompute] [--check]
    # several nodes: the same command on every node, with its --node-rank
    pipeplan run ... --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500 [--rdzv-id job7] [--nproc-per-node 4]

``--p2p`` picks the point-to-point posting policy (:mod:`executor.p2p_order`): ``prefetch`` by default on
gloo, ``grouped`` on NCCL; with ``--backend nccl`` the plan is first checked for a deadlock under NCCL's
semantics and refused (exit 2, naming the ranks) when the policy could deadlock. The result records the
policy (``p2p``). ``--order`` is the rank order (:mod:`planner.placement`, :class:`executor.groups.Layout`):
``tp-pp-dp`` (the default) or ``tp-dp-pp``, the pipeline outermost (Megatron-LM's default); a plan's candidate
runs in its own (its ``run_spec``'s ``order``), and an ``--order`` other than it is refused.
``--nproc-per-node`` defaults to the world size (D*W*t) over ``--nnodes`` and must divide it; the result and
trace are written on the node where global rank 0 ran (the others say so).

A bad plan is refused before anything is launched (exit 2, ``error: ...``); a failing rank makes the run
fail with the rank and its error named (exit 1); ``--check`` trains the same global batch in one process
and exits 1 naming the first differing parameter. Result and trace files are written atomically, and only
when the run succeeded. Torch is imported only when the command runs (``pipeplan --help`` stays light).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from planner.schedules import SCHEDULE_PARAMETERS


def _other_model(plan: str, candidate: int, model: str, module: str | None) -> str | None:
    """The name of the profile the plan file was made from (:func:`executor.plan.planned_profile`) where it is
    not the model this run builds (``model``; a ``--module``'s file name without ``.py``), else None. A new user
    ran a gpt-tiny plan with ``--model bert-tiny`` and read 'measured/predicted 1.309'; a GPT-3 plan with the
    default model was refused with gpt-tiny's heads ('t=8 must divide heads (4)') and nothing more."""
    from executor.plan import planned_profile

    planned = planned_profile(plan, candidate)
    built = Path(module.partition(":")[0]).stem if module is not None else model
    return planned if planned is not None and planned != built else None


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def attach_plan_prediction(result: dict[str, Any], plan_path: str, candidate: int) -> None:
    """A real run of a plan's candidate: the planner's prediction for it (``predicted.iteration_time``,
    ``predicted.source``) and ``ratio`` = measured / predicted beside the measured figures, as the job page
    shows them. Nothing when the candidate carries no prediction."""
    from executor.plan import planned_iteration_time

    pred = planned_iteration_time(plan_path, candidate)
    if pred is None:
        return
    result["predicted"] = {"iteration_time": pred, "source": f"plan {plan_path} candidate {candidate}"}
    result["ratio"] = result["measured"]["iteration_time"] / pred


def planned_note(result: dict[str, Any], plan_path: str, candidate: int, cluster: str | None) -> str:
    """An emulated run of a plan's candidate is compared with the simulator on its own costs (the profile and
    ``--cluster``, or this machine); where the plan's own prediction differs, say both and why (a new user saw
    12.56 ms against the plan's 24.03 ms with nothing saying they came from different clusters)."""
    from executor.plan import planned_iteration_time

    planned = planned_iteration_time(plan_path, candidate)
    own = result["predicted"]["iteration_time"]
    if planned is None or abs(planned - own) <= 0.01 * planned:
        return "the plan predicted the same for this candidate" if planned is not None else \
            "the plan file carries no prediction for this candidate"
    where = (f"the links of --cluster {cluster}" if cluster else
             "this machine's links (no --cluster given: the plan's cluster file emulates its links)")
    return (f"note: the plan predicted {planned * 1e3:.2f} ms for this candidate; this emulated run is compared "
            f"with {own * 1e3:.2f} ms, the simulator on its own terms: {where}, and emulated compute waits instead "
            "of sharing the cores (a CPU plan's prediction counts processes sharing them)")


def prediction_line(result: dict[str, Any]) -> str:
    """``measured X ms, predicted Y ms (source), measured/predicted R``."""
    pred = result["predicted"]
    src = pred.get("source") or ("simulator, the run's own costs" if result.get("emulated") else "")
    return (f"measured {result['measured']['iteration_time'] * 1e3:.2f} ms, predicted "
            f"{pred['iteration_time'] * 1e3:.2f} ms" + (f" ({src})" if src else "")
            + f", measured/predicted {result['ratio']:.3f}")


#: the order :func:`where_time_went` lists the kinds in (then any other kind)
KIND_ORDER = ("F", "B", "I", "W", "RECV", "POST", "SEND", "ALLREDUCE", "STEP", "OPT", "other")


def where_time_went(by_kind: dict[str, float]) -> str:
    """One line from ``measured.time_by_kind`` (:func:`executor.trace.time_by_kind`): ms per rank and
    iteration per action kind."""
    names = {"RECV": "RECV (waiting)", "STEP": "STEP (waits)", "OPT": "optimizer"}
    order = [k for k in KIND_ORDER if k in by_kind] + sorted(k for k in by_kind if k not in KIND_ORDER)
    return "where the time went, ms per rank and iteration: " + ", ".join(
        f"{names.get(k, k)} {by_kind[k] * 1e3:.2f}" for k in order)


def run(
    plan: Annotated[str | None, typer.Option(help="plan JSON: `pipeplan plan --json` output or one candidate")] = None,
    candidate: Annotated[int, typer.Option(help="candidate index in the plan")] = 0,
    schedule: Annotated[str | None, typer.Option("--schedule", "-s", help="direct form: the schedule")] = None,
    devices: Annotated[int | None, typer.Option("--devices", "-D", help="pipeline devices")] = None,
    microbatches: Annotated[int | None, typer.Option("--microbatches", "-N", help="micro-batches")] = None,
    data_parallel: Annotated[int, typer.Option("--data-parallel", "-W", help="data-parallel copies")] = 1,
    tensor: Annotated[int, typer.Option("--tensor", "-t", help="tensor-parallel degree")] = 1,
    expert: Annotated[int, typer.Option(
        "--expert", help="expert-parallel size e: a mixture of experts' experts split over e of the W data-parallel "
                         "copies (e divides W and the experts), tokens exchanged all-to-all")] = 1,
    order: Annotated[str | None, typer.Option(
        "--order", help="rank order, tensor innermost: tp-pp-dp (default; the pipeline inside data parallelism) "
                        "or tp-dp-pp (the pipeline outermost, Megatron-LM's default); with --plan, the candidate's own"
    )] = None,
    micro_batch: Annotated[int, typer.Option("--micro-batch", "-b", help="samples per micro-batch")] = 1,
    chunks: Annotated[int | None, typer.Option(help=SCHEDULE_PARAMETERS["chunks"].help)] = None,
    waves: Annotated[int | None, typer.Option(help=SCHEDULE_PARAMETERS["waves"].help)] = None,
    pipelines: Annotated[int | None, typer.Option(help=SCHEDULE_PARAMETERS["pipelines"].help)] = None,
    concat: Annotated[str | None, typer.Option(help=SCHEDULE_PARAMETERS["concat"].help)] = None,
    replication: Annotated[str | None, typer.Option(help=SCHEDULE_PARAMETERS["replication"].help)] = None,
    recompute: Annotated[bool, typer.Option("--recompute", help="activation recomputation")] = False,
    model: Annotated[str | None, typer.Option(help="model of the zoo (preset name; default gpt-tiny)")] = None,
    hf_config: Annotated[str | None, typer.Option(
        "--hf-config",
        help="a Hugging Face config.json (Llama, Mistral, Qwen2/3, Phi-3, Gemma 1-3, GPT-2) instead of "
             "--model")] = None,
    seq: Annotated[int | None, typer.Option(help="sequence length (default: the model's)")] = None,
    module: Annotated[str | None, typer.Option(
        "--module", help="your model: pkg.module:build or file.py:build returning (layers, sample, loss)")] = None,
    iterations: Annotated[int, typer.Option(help="measured iterations")] = 3,
    warmup: Annotated[int, typer.Option(help="warm-up iterations (not measured)")] = 1,
    backend: Annotated[str, typer.Option(help="gloo or nccl")] = "gloo",
    p2p: Annotated[str | None, typer.Option(
        "--p2p", help="point-to-point posting: prefetch (gloo default) or grouped (nccl default)")] = None,
    nnodes: Annotated[int, typer.Option(help="nodes (one `pipeplan run` per node)")] = 1,
    node_rank: Annotated[int, typer.Option(help="this node's rank, 0..nnodes-1")] = 0,
    nproc_per_node: Annotated[int | None, typer.Option(help="processes on this node (default world/nnodes)")] = None,
    rdzv_endpoint: Annotated[str | None, typer.Option(
        help="host:port of the rendezvous, on node rank 0's host (nnodes > 1)")] = None,
    rdzv_id: Annotated[str, typer.Option(help="rendezvous id, the same on every node")] = "pipeplan",
    dtype: Annotated[str | None, typer.Option(help="float32 or float64 (default: float64 with --check)")] = None,
    check: Annotated[bool, typer.Option("--check", help="compare with single-process training")] = False,
    emulate: Annotated[str | None, typer.Option(help="profile JSON: emulated compute, real communication")] = None,
    cluster: Annotated[str | None, typer.Option(help="cluster JSON for --emulate durations")] = None,
    trace: Annotated[str | None, typer.Option(help="write a Chrome trace (Perfetto) here")] = None,
    out: Annotated[str | None, typer.Option(help="write the result JSON here")] = None,
    timeout: Annotated[float, typer.Option(help="seconds for process-group operations")] = 120.0,
    seed: Annotated[int, typer.Option(help="model and data seed")] = 0,
) -> None:
    """Run a plan with one process per device (D*W*t) on this machine or on --nnodes machines, measure it,
    optionally --check it."""
    from executor.launch import RunFailed, launch
    from executor.plan import DEFAULT_MODEL, PlanError, RunPlan, load_plan_file
    from planner.outpath import out_problem
    from planner.placement import DEFAULT_ORDER

    for path, option in ((out, "--out"), (trace, "--trace")):
        if problem := out_problem(path, option):
            _fail(problem)
    if not timeout > 0:  # (torch's process groups take no timeout of 0 or less; NaN is not > 0 either)
        _fail(f"--timeout: seconds for process-group operations, above 0, got {timeout:g}")
    if seq is not None and seq < 1:
        _fail(f"--seq: the sequence length, at least 1, got {seq}")
    if order is not None:
        from planner.placement import order_error

        if (why := order_error(order)) is not None:
            _fail(f"--{why}")
    if emulate is not None or cluster is not None:  # read here, before any process starts: each rank reads them
        from pipeplan.options import load_input  # (the command line's file reading, its words for bad files)
        from planner.cluster import load_cluster
        from planner.profile import load_profile

        if emulate is not None:
            load_input("--emulate", emulate, load_profile, "profile")
        if cluster is not None:
            if emulate is None:
                _fail("--cluster gives the durations of an emulated run: it needs --emulate profile.json")
            load_input("--cluster", cluster, load_cluster, "cluster")
    from executor.trace import write_json_atomic

    model_spec = None
    default_model = model is None and hf_config is None and module is None
    model = model or DEFAULT_MODEL
    if module is not None and hf_config is not None:
        _fail("give --hf-config or --module, not both")
    if hf_config is not None:
        from pipeplan.options import warn_option
        from profiler.hf_config import HFConfigError, read_hf_config

        try:
            spec = read_hf_config(hf_config, seq=seq, warn=warn_option)
        except HFConfigError as e:
            _fail(f"--hf-config {hf_config}: {e}")
            return
        model, model_spec = spec.name, spec.model_dump()
    if module is not None:
        model = module.partition(":")[0].rsplit("/", 1)[-1]
    overrides = {"seq": seq} if seq is not None and model_spec is None else {}
    common: dict[str, Any] = {"model": model, "model_spec": model_spec, "model_overrides": overrides, "module": module,
                              "iterations": iterations, "warmup": warmup, "seed": seed,
                              "dtype": dtype or ("float64" if check else "float32"), "emulate": emulate,
                              "cluster": cluster}
    other_model = None  # the plan's profile, where this run builds another model
    try:
        if plan is not None:
            if schedule is not None:
                _fail("give either --plan or --schedule, not both")
            run_plan = load_plan_file(plan, candidate, **common)
            if order is not None and order != run_plan.spec.config.order:
                _fail(f"--order {order}: candidate {candidate} of {plan} runs its ranks in order "
                      f"{run_plan.spec.config.order} (its run_spec's order, which its prediction assumes): leave "
                      "--order out or give the same")
            other_model = None if emulate else _other_model(plan, candidate, model, module)
        else:
            if schedule is None or devices is None or microbatches is None:
                _fail("give --plan, or --schedule with --devices and --microbatches")
            assert schedule is not None and devices is not None and microbatches is not None
            run_plan = RunPlan.direct(schedule, devices, microbatches, data=data_parallel, tensor=tensor,
                                      expert=expert, order=order or DEFAULT_ORDER, micro_batch=micro_batch,
                                      recompute=recompute, chunks=chunks, waves=waves, pipelines=pipelines,
                                      concat=concat, replication=replication, **common)
        run_plan.validate()
    except PlanError as e:
        if other_model is not None and default_model:
            _fail(f"{e} -- the plan was made from profile {other_model!r}, and this run builds {model} (the default "
                  "--model): give the plan's model (--model, --hf-config or --module), or run it emulated (--emulate "
                  "profile.json)")
        _fail(str(e))
        return
    if other_model is not None:
        typer.echo(f"note: the plan was made from profile {other_model!r}; this run builds {model}"
                   + (" (the default --model)" if default_model else "")
                   + ": its time is compared with another model's prediction")
    if backend not in ("gloo", "nccl"):
        _fail(f"--backend must be gloo or nccl, got {backend!r}")
    world = run_plan.world_size
    if nnodes < 1:
        _fail(f"--nnodes must be >= 1, got {nnodes}")
    nproc = nproc_per_node if nproc_per_node is not None else world // nnodes
    if world % nnodes or nproc * nnodes != world:
        _fail(f"the plan needs D*W*t = {world} processes, which {nnodes} node(s) x {nproc} process(es) per node "
              f"do not make: --nnodes must divide {world} and --nproc-per-node be {world}/--nnodes")
    if backend == "gloo":
        _check_host_memory(nproc)
    if nnodes > 1 and not 0 <= node_rank < nnodes:
        _fail(f"--node-rank must be in 0..{nnodes - 1}, got {node_rank}")
    if nnodes > 1 and (not rdzv_endpoint or ":" not in rdzv_endpoint):
        _fail("--nnodes > 1 needs --rdzv-endpoint host:port (the same on every node)")
    try:
        runs = launch([run_plan], nproc, check=check, backend=backend, trace=trace is not None, timeout=timeout,
                      capture=False, p2p=p2p, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                      rdzv_id=rdzv_id)
    except PlanError as e:
        _fail(str(e))
        return
    except RunFailed as e:
        _fail(str(e), 1)
        return
    if runs is None:
        typer.echo(f"node {node_rank}: done; global rank 0 ran on another node, which writes the result")
        return
    result = runs["runs"][0]
    chrome = result.pop("trace", None)
    m = result["measured"]
    tag = " (emulated compute)" if result["emulated"] else ""
    c = run_plan.spec.config
    ep = f" e={c.expert}" if c.expert > 1 else ""
    ranks = f" ranks={c.order}" if c.order != DEFAULT_ORDER else ""
    typer.echo(f"{c.schedule}: D={c.pipeline} W={c.data} t={c.tensor}{ep}{ranks} "
               f"N={run_plan.spec.microbatches} b={c.micro_batch}{tag}: iteration {m['iteration_time'] * 1e3:.2f} ms"
               f", bubble ratio {m['bubble_ratio']:.3f}")
    if m.get("time_by_kind"):
        typer.echo(where_time_went(m["time_by_kind"]))
    if plan is not None and "predicted" not in result:
        attach_plan_prediction(result, plan, candidate)
    if "predicted" in result:
        typer.echo(prediction_line(result))
        if plan is not None and result.get("emulated"):
            typer.echo(planned_note(result, plan, candidate, cluster))
        if plan is not None:
            from executor.plan import planned_sharding

            sharded = planned_sharding(plan, candidate)
            if sharded:
                typer.echo(f"note: {sharded}; the comparison above is of the run as it ran")
    if result.get("overhead_costed") is False:
        typer.echo("note: the cluster has no measured executor overhead (`executor`), so the prediction leaves "
                   "out the executor's own time per action; measure it with `pipeplan profile-links --local-procs 2 "
                   "--executor-overhead` and put `executor_overhead` into the cluster file as `executor`")
    if out:
        write_json_atomic(out, result)
    if trace and chrome is not None:
        write_json_atomic(trace, chrome)
    if check:
        c = result["check"]
        typer.echo(f"check: {c['message']}")
        if c["ok"] is False:
            raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``run`` to the ``pipeplan`` app."""
    app.command("run")(run)



def host_memory_available() -> int | None:
    """Bytes this machine can still give processes (``MemAvailable`` of /proc/meminfo); None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_host_memory(nproc: int) -> None:
    """Refuse, before starting any, ``nproc`` gloo processes that this machine's memory cannot hold: each takes
    about :data:`planner.reserve.CPU_RESERVE_BYTES` before any model (torch and its process group, measured by
    ``profiler.local_cluster.measure_reserve``). An emulated GPT-3 candidate of 1024 processes dispatched to a
    CPU agent would otherwise start 1024 of them on one machine."""
    from planner.reserve import CPU_RESERVE_BYTES

    avail = host_memory_available()
    need = nproc * CPU_RESERVE_BYTES
    if avail is not None and need > avail:
        _fail(f"the plan needs {nproc} processes on this machine, about {need / 2**30:.1f} GiB at "
              f"{CPU_RESERVE_BYTES / 2**20:.0f} MiB each before any model (planner.reserve), but "
              f"{avail / 2**30:.1f} GiB is available: choose a candidate with fewer processes (t*D*W), or spread it "
              f"over nodes (--nnodes; in the API, a job's gpus_per_node)")
