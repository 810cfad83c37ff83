"""FastAPI dependencies: database session per request, bearer-token roles."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from api.settings import Settings

bearer = HTTPBearer(auto_error=False, description="admin token (all writes) or worker token (worker endpoints)")

Role = Literal["admin", "worker"]


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_db(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as db:
        try:
            yield db
            db.commit()
        except BaseException:
            db.rollback()
            raise


def _role(creds: HTTPAuthorizationCredentials | None, settings: Settings) -> Role | None:
    if creds is None:
        return None
    token = creds.credentials
    if settings.admin_token and secrets.compare_digest(token.encode(), settings.admin_token.encode()):
        return "admin"
    if settings.worker_token and secrets.compare_digest(token.encode(), settings.worker_token.encode()):
        return "worker"
    raise HTTPException(401, "invalid bearer token", headers={"WWW-Authenticate": "Bearer"})


def _missing() -> HTTPException:
    return HTTPException(401, "missing bearer token: send 'Authorization: Bearer <token>'",
                         headers={"WWW-Authenticate": "Bearer"})


Creds = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def require_admin(creds: Creds, settings: SettingsDep) -> Role:
    role = _role(creds, settings)
    if role is None:
        raise _missing()
    if role != "admin":
        raise HTTPException(403, "this endpoint needs the admin token; a worker token cannot do admin writes")
    return role


def require_worker(creds: Creds, settings: SettingsDep) -> Role:
    role = _role(creds, settings)
    if role is None:
        raise _missing()
    return role


def require_read(creds: Creds, settings: SettingsDep) -> Role | None:
    role = _role(creds, settings)
    if role is None and not settings.open_reads:
        raise _missing()
    return role


#: committed before the response is sent (``scope="function"``): a client that got a 2xx can read what it
#: wrote at once, and a failed commit is an error response, never a success (FastAPI's default scope
#: for yield dependencies commits after the response: a race, seen in CI on PostgreSQL)
DB = Annotated[Session, Depends(get_db, scope="function")]
Admin = Depends(require_admin)
WorkerAuth = Depends(require_worker)
Read = Depends(require_read)
