"""/profiles: model profiles as the profiler writes them, versioned by content hash."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from api import crud
from api.deps import DB, Admin, Read
from api.routers.common import Filter, IdPath, Limit, Offset, profile_out
from api.schemas import Message, ProfileDetail, ProfileOut, ProfileUpload

router = APIRouter(prefix="/profiles", tags=["profiles"])


@router.post("", response_model=ProfileOut, status_code=201, dependencies=[Admin],
             responses={200: {"model": ProfileOut, "description": "the same profile was stored before"},
                        422: {"model": Message}})
def upload_profile(profile: ProfileUpload, db: DB, response: Response):  # noqa: ANN201
    """Store a profile (validated as ``planner.profile.ModelProfile``,
    with the bounds of :class:`api.schemas.ProfileUpload`). Uploading the same content again
    returns the stored one with 200."""
    row, created = crud.add_profile(db, profile)
    if not created:
        response.status_code = status.HTTP_200_OK
    return profile_out(row)


@router.get("", response_model=list[ProfileOut], dependencies=[Read])
def list_profiles(db: DB, name: Filter = None, device: Filter = None, limit: Limit = 100, offset: Offset = 0):  # noqa: ANN201
    return [profile_out(r) for r in crud.list_profiles(db, name, device, limit, offset)]


@router.get("/{profile_id}", response_model=ProfileDetail, dependencies=[Read],
            responses={404: {"model": Message}})
def get_profile(profile_id: IdPath, db: DB):  # noqa: ANN201
    return profile_out(crud.get_profile(db, profile_id), detail=True)


@router.delete("/{profile_id}", status_code=204, dependencies=[Admin],
               responses={404: {"model": Message}, 409: {"model": Message}})
def delete_profile(profile_id: IdPath, db: DB) -> Response:
    crud.delete_profile(db, profile_id)
    return Response(status_code=204)
