"""Cluster versions as a reader names them (issue 13): "dgx-a100-80gb v2, calibrated from 3 jobs".

A calibration (:mod:`api.calibration`) stores a new :class:`db.models.ClusterRow` with its own id, ``base_id`` the
uploaded cluster and ``version`` one past the largest its lineage has handed out (a deleted version's number is not
given again); a plan requested on any version afterwards is made on the newest. An id alone ("#7") does not say
that #7 is version 2 of cluster #1, nor from how many jobs it was fitted: :func:`describe` gives every cluster
answer (``ClusterOut``) its ``label``, the jobs its calibration was fitted to (``Calibration.jobs``,
:mod:`planner.cluster`) and the newest version of its lineage, so a page that names a cluster can say which version
it is and whether a newer one exists. The jobs count is the row's ``calibration_jobs`` column (set when the row is
made, filled for older rows by migration 0005), so a list answer loads no cluster documents.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from db.models import ClusterRow
from planner.cluster import Cluster, calibrated_from


def lineage_id(row: ClusterRow) -> int:
    """The uploaded cluster (version 1) that ``row`` is a version of (itself when uploaded)."""
    return row.base_id if row.base_id is not None else row.id


def newest_versions(db: Session, rows: Iterable[ClusterRow]) -> dict[int, ClusterRow]:
    """The newest version of each lineage of ``rows``, by lineage id (one query for all of them)."""
    bases = {lineage_id(r) for r in rows}
    if not bases:
        return {}
    found = db.scalars(select(ClusterRow).options(defer(ClusterRow.body))
                       .where(ClusterRow.id.in_(bases) | ClusterRow.base_id.in_(bases)))
    newest: dict[int, ClusterRow] = {}
    for r in found:
        key = lineage_id(r)
        best = newest.get(key)
        if best is None or (r.version, r.id) > (best.version, best.id):
            newest[key] = r
    return newest


def calibration_jobs_of(cluster: Cluster) -> int | None:
    """The finished jobs ``cluster``'s calibration was fitted to (0 when not known); None without one. Stored
    as the row's ``calibration_jobs`` when the row is made (:mod:`api.crud`, :mod:`api.calibration`)."""
    return None if cluster.calibration is None else cluster.calibration.jobs


def label(row: ClusterRow, newest: ClusterRow | None = None) -> str:
    """``name``, then ``vN`` when the lineage has more than one version, then what calibrated it:
    "dgx-a100-80gb", "dgx-a100-80gb v1 (uncalibrated)", "dgx-a100-80gb v2, calibrated from 3 jobs"."""
    several = row.version > 1 or (newest is not None and newest.id != row.id)
    text = row.name + (f" v{row.version}" if several else "")
    jobs = row.calibration_jobs
    if jobs is not None:
        text += ", " + calibrated_from(jobs)
    elif several:
        text += " (uncalibrated)"
    return text


def describe(row: ClusterRow, newest: ClusterRow | None) -> dict[str, Any]:
    """The version fields of a cluster answer (``api.schemas.ClusterOut``)."""
    newest = newest or row
    return {"label": label(row, newest), "calibration_jobs": row.calibration_jobs,
            "newest_id": newest.id, "newest_version": newest.version, "newest_label": label(newest, newest)}
