"""/clusters: cluster descriptions, versioned by content hash."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, Field

from api import calibration, crud
from api.deps import DB, Admin, Read, SettingsDep
from api.jsonbody import UniqueKeysRoute
from api.routers.common import Filter, IdPath, Limit, Offset, clusters_out
from api.schemas import ClusterDetail, ClusterOut, ClusterUpload, Message

router = APIRouter(prefix="/clusters", tags=["clusters"], route_class=UniqueKeysRoute)


@router.post("", response_model=ClusterOut, status_code=201, dependencies=[Admin],
             responses={200: {"model": ClusterOut, "description": "the same cluster was stored before"},
                        422: {"model": Message}})
def upload_cluster(cluster: ClusterUpload, db: DB, response: Response, settings: SettingsDep):  # noqa: ANN201
    row, created = crud.stored_once(db, lambda: crud.add_cluster(db, cluster, settings.max_cluster_gpus))
    if not created:
        response.status_code = status.HTTP_200_OK
    return clusters_out(db, [row])[0]


@router.get("", response_model=list[ClusterOut], dependencies=[Read])
def list_clusters(db: DB, name: Filter = None, device: Filter = None, limit: Limit = 100, offset: Offset = 0):  # noqa: ANN201
    return clusters_out(db, crud.list_clusters(db, name, device, limit, offset))


@router.get("/{cluster_id}", response_model=ClusterDetail, dependencies=[Read], responses={404: {"model": Message}})
def get_cluster(cluster_id: IdPath, db: DB):  # noqa: ANN201
    return clusters_out(db, [crud.get_cluster(db, cluster_id)], detail=True)[0]


@router.delete("/{cluster_id}", status_code=204, dependencies=[Admin],
               responses={404: {"model": Message}, 409: {"model": Message}})
def delete_cluster(cluster_id: IdPath, db: DB) -> Response:
    crud.delete_cluster(db, cluster_id)
    return Response(status_code=204)


IncludeEmulated = Annotated[bool, Query(description="list jobs whose compute was emulated too (default: real only): "
                                                   "against their own prediction, never fitted")]


class JobErrorOut(BaseModel):
    job_id: int | None
    label: str
    measured: float
    predicted_before: float | None = Field(description="the uncalibrated model's prediction: where every fit starts "
                                                       "(a fit replaces a calibration, it does not refine it)")
    predicted_after: float | None = Field(description="the prediction with the fitted (POST) or newest (GET) "
                                                      "calibration; None for an emulated run, as predicted_before")
    relative_error_before: float | None
    relative_error_after: float | None
    predicted_given: float | None = Field(default=None, description="POST: the prediction on the newest version as "
                                          "it was, with its calibration (given_label); None when it had none")
    relative_error_given: float | None = None
    emulated: bool = Field(default=False, description="an emulated run (include_emulated): never fitted, nor in the "
                                                      "medians; scored against predicted_emulation, see note")
    predicted_emulation: float | None = Field(default=None, description="what an emulated run's comparison "
                                              "(GET /jobs/{id}/comparison) uses: the simulator on its own terms")
    relative_error_emulation: float | None = None
    note: str | None = None


class CalibrationOut(BaseModel):
    cluster_id: int
    base_id: int
    version: int
    label: str = Field(default="", description="the new version as GET /clusters names it, e.g. "
                                               "'dgx-a100-80gb v2, calibrated from 3 jobs'")
    newest_id: int | None = Field(default=None, description="the lineage's newest version: plans requested from "
                                                            "now on with any version's id are made on it")
    newest_version: int | None = None
    newest_label: str | None = None
    calibration: dict[str, Any]
    unchanged: bool = Field(default=False, description="true when the fit equals the newest version's (no new "
                                                         "finished job since): nothing was stored, status 200")
    warnings: list[str] = Field(default_factory=list, description="a line for each factor the fit left at a "
                                "bound of its physical range (calibration.at_bound): the model and the measurements "
                                "disagree for a reason the factors do not describe")
    rounds: int
    given_label: str | None = Field(default=None, description="the calibrated version the jobs' predicted_given are "
                                                             "of (the newest before this fit); None when uncalibrated")
    jobs: list[JobErrorOut]


class CalibrationErrors(BaseModel):
    cluster_id: int
    base_id: int
    newest_id: int
    newest_version: int
    versions: list[dict[str, int]]
    calibration: dict[str, Any] | None
    warnings: list[str] = Field(default_factory=list, description="the newest calibration's factors at a bound "
                                                                  "of their physical range, a line each")
    median_abs_error_before: float | None
    median_abs_error_after: float | None
    jobs: list[JobErrorOut]


@router.post("/{cluster_id}/calibrate", response_model=CalibrationOut, status_code=201, dependencies=[Admin],
             responses={404: {"model": Message}, 409: {"model": Message}, 422: {"model": Message}})
def calibrate_cluster(cluster_id: IdPath, db: DB, response: Response,  # noqa: ANN201
                      include_emulated: IncludeEmulated = False):
    """Fit compute scale, link scale and per-action overhead to the cluster's finished jobs (every version)
    and store them as a new version of the cluster: later plans on any version use it, earlier plans keep
    theirs. 409 when no job has a measured result yet; 200 with ``unchanged`` true and the newest version
    when the fit is the newest version's (no new finished job): nothing is stored."""
    out = calibration.calibrate(db, cluster_id, include_emulated)
    if out["unchanged"]:
        response.status_code = 200
    return out


@router.get("/{cluster_id}/calibration", response_model=CalibrationErrors, dependencies=[Read],
            responses={404: {"model": Message}, 422: {"model": Message}})
def calibration_errors(cluster_id: IdPath, db: DB, include_emulated: IncludeEmulated = False):  # noqa: ANN201
    """Prediction error of the cluster's finished jobs before calibration and with its newest version."""
    return calibration.errors(db, cluster_id, include_emulated)
