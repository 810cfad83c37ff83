"""``pipeplan calibrate``: fit a cluster's correction factors to finished runs (:mod:`planner.calibrate`).

Against the service (the cluster's finished jobs, stored as a new version of the cluster)::

    pipeplan calibrate --api http://127.0.0.1:8000 --cluster-id 3 --token dev-admin-token

Offline, from runs listed in a JSON file (each entry: ``profile`` path, ``candidate`` as ``pipeplan plan
--json`` prints it -- its ``run_spec`` or its configuration fields, PipeDream's ``replication`` among them, and
``global_batch`` -- and ``measured`` seconds per iteration, e.g. from ``pipeplan run --out result.json``). Each
run is predicted as pipeplan's executor runs it, as the service's calibration does: whole weights and optimizer
state, whatever the candidate shards (:func:`planner.mismatch.unsharded_run_note`)::

    pipeplan calibrate --cluster cluster.json --runs runs.json --out calibrated.json

A factor the fit left at a bound of its physical range (``compute_scale`` or ``link_scale`` at 1/4 or 4,
``action_overhead`` at 0 or at a job's whole time per action) is printed as a ``note:`` line: the model and
the measurements disagree for a reason the factors do not describe (:mod:`planner.calibrate`). Offline, a
``warning:`` line (stderr; the fit is still made) names a run's profile timed on another device than the
cluster's (:func:`planner.mismatch.device_mismatch`, plan's rule: the factors would absorb the difference between
the devices) and a run measured more than :data:`planner.calibrate.FAR_OFF` (4) times its uncalibrated prediction
or less than a quarter of it (:func:`planner.calibrate.far_off_warnings`).

No torch: this command only plans.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median
from typing import Annotated, Any

import typer

from pipeplan.options import fail, load_input, read_json, validation_summary
from planner.limits import MAX_CALIBRATION_RUNS

#: the table's columns: heading, least width (every column right-aligned but the configuration); "given" and its
#: error only where the cluster had a calibration (:class:`planner.calibrate.JobError`)
_COLUMNS = (("job", 5), ("configuration", 43), ("measured", 11), ("before", 11), ("err", 8), ("given", 11),
            ("err", 8), ("after", 11), ("err", 8))


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}ms"


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def columns_line(given: str | None) -> str:
    """What the table's prediction columns are. "before" is the uncalibrated model, where every fit starts (the
    factors are absolute, their prior at (1, 1, 0): a fit replaces a cluster's calibration, it does not refine it);
    ``given`` names the cluster as given where it had a calibration, whose predictions are then a column of their
    own. A QA walkthrough calibrated an already calibrated cluster and read its "before" as that cluster's
    prediction (22.16 ms, where ``pipeplan predict`` on it said 25.05 ms): the calibration looked unapplied."""
    mid = f"given: {given}, with its calibration (replaced by this fit); " if given else ""
    return f"before: the uncalibrated model, where the fit starts; {mid}after: the fitted factors"


def _table(jobs: list[dict[str, Any]], cal: dict[str, Any], warnings: list[str] | None = None,
           given: str | None = None) -> None:
    """The factors, each job's error before, on the cluster as given (where it had a calibration: ``given`` names
    it) and after, and a note per factor at a bound of its range. A column is as wide as its widest cell (a 100 s
    run against a 20 ms prediction ran its cells together at fixed widths)."""
    typer.echo(f"compute_scale {cal['compute_scale']:.4f}  link_scale {cal['link_scale']:.4f}  "
               f"action_overhead {cal['action_overhead'] * 1e6:.1f} us  (fitted: {', '.join(cal['fitted']) or 'none'})")
    with_given = given is not None and any(j.get("predicted_given") is not None for j in jobs)
    keep = [k for k in range(len(_COLUMNS)) if with_given or k not in (5, 6)]
    def cell(j: dict[str, Any], key: str, fmt: Any) -> str:  # (an emulated run has no prediction before or after)
        return fmt(j[key]) if j.get(key) is not None else "-"

    rows = [[str(j["job_id"]) if j["job_id"] is not None else "-", j["label"][:43], _ms(j["measured"]),
             cell(j, "predicted_before", _ms), cell(j, "relative_error_before", _pct),
             cell(j, "predicted_given", _ms), cell(j, "relative_error_given", _pct),
             cell(j, "predicted_after", _ms), cell(j, "relative_error_after", _pct)] for j in jobs]
    rows = [[r[k] for k in keep] for r in rows]
    cols = [_COLUMNS[k] for k in keep]
    widths = [max(least, *(len(r[k]) + (k > 1) for r in rows)) for k, (_, least) in enumerate(cols)]

    def line(cells: list[str]) -> str:  # the job, two spaces, the configuration left-aligned, the rest right
        return (f"{cells[0]:>{widths[0]}}  {cells[1]:<{widths[1] + 1}}"
                + "".join(f"{c:>{w}}" for c, w in zip(cells[2:], widths[2:], strict=True)))

    typer.echo(columns_line(given if with_given else None))
    typer.echo(line([h for h, _ in cols]))
    for r in rows:
        typer.echo(line(r))
    mid = ""
    if with_given:
        errs = [abs(j["relative_error_given"]) for j in jobs if j.get("relative_error_given") is not None]
        mid = f", given {median(errs) * 100:.1f}%"
    typer.echo(f"median |error|: before {cal['error_before'] * 100:.1f}%{mid}, after {cal['error_after'] * 100:.1f}%")
    for w in warnings or []:
        typer.echo(f"note: {w}")
    for j in jobs:  # an emulated run (--include-emulated): why it is not fitted, and what it is compared with
        if j.get("note"):
            typer.echo(f"note: job {j['job_id']} ({j['label']}): {j['note']}")


def _layer_mismatch(cand: dict[str, Any], layers: int, profile: str) -> str | None:
    """Why the candidate's partition (its ``run_spec``'s, or a flat ``partition``) is none of a model of
    ``layers`` layers, profile ``profile``'s (:func:`planner.runspec.partition_error`, the executor's rule), or
    None (no partition given: nothing to check). Checked before predicting: a GPT-3 profile (98 layers) with a
    6-layer gpt-tiny candidate was answered "weights, gradients and optimizer state do not fit", the run's model
    mismatch reported as memory."""
    from pydantic import TypeAdapter, ValidationError

    from planner.runspec import LayerIndex, partition_error

    spec = cand.get("run_spec")
    raw = spec.get("partition") if isinstance(spec, dict) else cand.get("partition")
    if not raw:
        return None
    try:
        bounds = TypeAdapter(list[tuple[LayerIndex, LayerIndex]]).validate_python(raw)
    except ValidationError:
        return f"partition: a list of [start, end) layer ranges, got {json.dumps(raw)[:60]}"
    why = partition_error(bounds, len(bounds), None)  # ranges in order, each non-empty, from 0
    if why is None and bounds[-1][1] != layers:  # (partition_error's rule for the end, said as the two counts)
        why = f"its partition covers {bounds[-1][1]} layers, profile {profile} has {layers}"
    return why


def _offline(cluster_path: str, runs_path: str, out: str | None) -> None:
    from pydantic import ValidationError

    from planner.calibrate import Observation, ObservationError, far_off_warnings, fit
    from planner.cluster import calibrated_from, load_cluster, save_cluster
    from planner.jsondoc import number
    from planner.limits import MAX_SECONDS
    from planner.mismatch import device_mismatch
    from planner.outpath import out_problem
    from planner.profile import load_profile
    from planner.request import TrainingRequest
    from planner.runspec import RunSpec, config_of

    problem = out_problem(out)
    if problem:
        fail(problem)
    cluster = load_input("--cluster", cluster_path, load_cluster)
    try:
        entries = read_json("--runs", runs_path)
    except ValueError as e:
        fail(str(e))
    if not isinstance(entries, list):
        fail(f"--runs {runs_path}: expected a JSON list of {{profile, candidate, measured}}")
    if len(entries) > MAX_CALIBRATION_RUNS:
        fail(f"--runs {runs_path}: {len(entries)} runs, at most {MAX_CALIBRATION_RUNS} (the API fits a cluster's "
             f"newest {MAX_CALIBRATION_RUNS} jobs; give the newest)")
    profiles: dict[str, Any] = {}
    obs = []
    for i, e in enumerate(entries):
        where = f"--runs {runs_path}: runs[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("candidate", {}), dict):
            fail(f"{where}: expected an object {{profile, candidate: {{...}}, measured}}, got {json.dumps(e)[:80]}")
        for key in ("profile", "candidate", "measured"):
            if key not in e:
                fail(f"{where}: missing field {key!r}")
        if not isinstance(e["profile"], str):
            fail(f"{where}.profile: a path to the run's profile JSON, got {json.dumps(e['profile'])[:40]}")
        path = str(Path(runs_path).parent / e["profile"])
        if path not in profiles:
            profiles[path] = load_input(f"{where}.profile", path, load_profile, "profile")
        cand = e["candidate"]
        measured = number(e["measured"])
        if measured is None or not 0 < measured <= MAX_SECONDS:
            fail(f"{where}.measured: seconds per iteration, a number above 0 and at most {MAX_SECONDS:g}, got "
                 f"{json.dumps(e['measured'])[:40]}")
        try:
            config = config_of(cand)  # (with PipeDream's replication, where it has one)
            request = TrainingRequest(global_batch=cand.get("global_batch"))
        except ValidationError as err:
            inner = ".run_spec.config" if "run_spec" in cand and err.title == "Config" else ""
            fail(f"{where}.candidate{inner}: {validation_summary(err)}")
        except ValueError as err:  # config_of's own check of run_spec
            fail(f"{where}.candidate.{err}")
        why = _layer_mismatch(cand, len(profiles[path].layers), e["profile"])
        if why is not None:
            fail(f"{where}.candidate: {why}: is it a run of this profile's model?")
        if "run_spec" in cand:  # what a hand-edited candidate may get wrong (its D against its partition)
            try:
                RunSpec.from_document(cand).check(len(profiles[path].layers), profiles[path].attention_heads)
            except ValidationError as err:
                fail(f"{where}.candidate.run_spec: {validation_summary(err)}")
            except ValueError as err:
                fail(f"{where}.candidate.run_spec: {err}")
        obs.append(Observation(profiles[path], request, config, measured, i))
    try:
        res = fit(cluster, obs)
    except ObservationError as err:  # a run's (its job_id is its index): named as the runs file has it
        fail(f"--runs {runs_path}: runs[{err.job_id}]: {err.problem}")
    except ValueError as err:  # the fit's own checks (no runs, a reserve larger than the device)
        fail(str(err))
    d = res.to_dict()
    _table(d["jobs"], d["calibration"], res.warnings, cluster_path)  # type: ignore[arg-type]
    inputs: list[str] = []
    for prof in profiles.values():  # (a profile of another device: its runs calibrate that device's times)
        mismatch = device_mismatch(prof, cluster)
        if mismatch is not None:
            which = [str(o.job_id) for o in obs if o.profile is prof]
            whose = f"all {len(obs)} runs" if len(which) == len(obs) else f"runs[{', '.join(which)}]"
            inputs.append(f"{whose}: {mismatch}: the factors fitted to them absorb the difference "
                          f"between the devices, not the model's error on {cluster.device} (calibrate with runs on "
                          f"the cluster's devices, planned with a profile of {cluster.device})")
    for w in [*inputs, *far_off_warnings(res.jobs, "runs")]:
        typer.echo(f"warning: {w}", err=True)
    new = cluster.model_copy(update={"calibration": res.calibration})
    label = f"{new.name}, {calibrated_from(res.calibration.jobs)}"
    if out:
        try:
            save_cluster(new, out)
        except OSError as err:  # a full disk, a device that takes no file
            fail(f"--out {out}: cannot write it ({err.strerror or err})")
        typer.echo(f"calibrated version: {label} (content hash {new.content_hash()[:12]}), written to {out}")
        same = Path(out).resolve() == Path(cluster_path).resolve()  # written over the cluster it calibrated
        typer.echo(f"plans made from now on with --cluster {out} use it; "
                   + (f"it replaced the {'calibrated' if cluster.calibration else 'uncalibrated'} {cluster_path}"
                      if same else f"{cluster_path} is unchanged"))
    else:
        typer.echo(f"calibrated version: {label} (content hash {new.content_hash()[:12]}), not written: "
                   f"give --out FILE to keep it and plan with --cluster FILE ({cluster_path} is unchanged)")


def _remote(api: str, cluster_id: int, token: str | None, include_emulated: bool) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.post(f"{api.rstrip('/')}/clusters/{cluster_id}/calibrate", headers=headers,
                       params={"include_emulated": str(include_emulated).lower()}, timeout=600)
    except httpx.HTTPError as e:
        fail(f"could not reach {api}: {e}")
        raise  # unreachable
    if r.status_code in (401, 403):
        fail(f"HTTP {r.status_code}: {r.text[:300]}; calibrating needs the admin token: --token TOKEN or "
             f"$PIPEPLAN_ADMIN_TOKEN" + ("" if token else " (none was given)"))
    if r.status_code not in (200, 201):  # 200: no new finished job, the newest version as it is ("unchanged")
        fail(f"HTTP {r.status_code}: {r.text[:500]}")
    d = r.json()
    _table(d["jobs"], d["calibration"], d.get("warnings"), d.get("given_label"))
    typer.echo(_stored(d, cluster_id))


def _stored(d: dict[str, Any], asked: int) -> str:
    """What POST /clusters/{id}/calibrate stored (``d``, its answer) and which plans use it: the service plans
    a request on any version of a cluster on the newest one (api/calibration.py)."""
    new, base = d["cluster_id"], d["base_id"]
    if d.get("unchanged"):
        text = (f"no new finished job since {d.get('label') or d['version']} (cluster id {new}, version "
                f"{d['version']} of cluster {base}): the fit is the same, nothing stored\n")
    else:
        text = (f"calibrated version: {d.get('label') or d['version']}: cluster id {new} "
                f"(version {d['version']} of cluster {base})\n")
    ids = ", ".join(str(i) for i in dict.fromkeys((asked, base, new)))
    newest = d.get("newest_id", new)
    if newest == new:
        return text + (f"plans made from now on with cluster id {ids} (any version of cluster {base}) use it; "
                       f"plans made before keep the version they used")
    return text + (f"a newer version exists, {d.get('newest_label')}: cluster id {newest}; plans made from now "
                   f"on with cluster id {ids} (any version of cluster {base}) use that one")


TokenOpt = Annotated[str | None, typer.Option(envvar="PIPEPLAN_ADMIN_TOKEN", help="with --api: admin token")]


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate_cmd(
        cluster: Annotated[str | None, typer.Option(help="offline: the cluster JSON to calibrate")] = None,
        runs: Annotated[str | None, typer.Option(help="offline: JSON list of {profile, candidate, measured}")] = None,
        out: Annotated[str | None, typer.Option(help="offline: write the calibrated cluster here")] = None,
        api: Annotated[str | None, typer.Option(help="service URL: calibrate a stored cluster from its jobs")] = None,
        cluster_id: Annotated[int | None, typer.Option(help="with --api: the cluster's id (any version)")] = None,
        token: TokenOpt = None,
        include_emulated: Annotated[bool, typer.Option(
            "--include-emulated", help="with --api: list emulated runs too (never fitted)")] = False,
    ) -> None:
        """Fit compute scale, link scale and per-action overhead to finished runs; store them with the cluster.

        Least squares over the simulator's predictions with a prior toward the uncalibrated model, within
        physical ranges (scales in [1/4, 4]); a factor left at a bound is printed as a note (planner.calibrate)."""
        if api is not None:
            if cluster_id is None:
                fail("--api needs --cluster-id")
            _remote(api, cluster_id, token, include_emulated)  # type: ignore[arg-type]
        elif cluster is not None and runs is not None:
            _offline(cluster, runs, out)
        else:
            fail("give --api URL --cluster-id ID, or --cluster FILE --runs FILE [--out FILE]")
