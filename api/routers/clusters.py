"""/clusters: cluster descriptions, versioned by content hash."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from api import crud
from api.deps import DB, Admin, Read, SettingsDep
from api.routers.common import Filter, IdPath, Limit, Offset, cluster_out
from api.schemas import ClusterDetail, ClusterOut, ClusterUpload, Message

router = APIRouter(prefix="/clusters", tags=["clusters"])


@router.post("", response_model=ClusterOut, status_code=201, dependencies=[Admin],
             responses={200: {"model": ClusterOut, "description": "the same cluster was stored before"},
                        422: {"model": Message}})
def upload_cluster(cluster: ClusterUpload, db: DB, response: Response, settings: SettingsDep):  # noqa: ANN201
    row, created = crud.add_cluster(db, cluster, settings.max_cluster_gpus)
    if not created:
        response.status_code = status.HTTP_200_OK
    return cluster_out(row)


@router.get("", response_model=list[ClusterOut], dependencies=[Read])
def list_clusters(db: DB, name: Filter = None, device: Filter = None, limit: Limit = 100, offset: Offset = 0):  # noqa: ANN201
    return [cluster_out(r) for r in crud.list_clusters(db, name, device, limit, offset)]


@router.get("/{cluster_id}", response_model=ClusterDetail, dependencies=[Read], responses={404: {"model": Message}})
def get_cluster(cluster_id: IdPath, db: DB):  # noqa: ANN201
    return cluster_out(crud.get_cluster(db, cluster_id), detail=True)


@router.delete("/{cluster_id}", status_code=204, dependencies=[Admin],
               responses={404: {"model": Message}, 409: {"model": Message}})
def delete_cluster(cluster_id: IdPath, db: DB) -> Response:
    crud.delete_cluster(db, cluster_id)
    return Response(status_code=204)
