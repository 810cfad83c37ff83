"""FastAPI dependencies: database session per request, bearer-token roles.

Three kinds of bearer token:

* the admin token (``PIPEPLAN_ADMIN_TOKEN``): everything except acting as a worker;
* the registration token (``PIPEPLAN_WORKER_TOKEN``): reads, and ``POST /workers`` (registering an agent);
* a worker credential, issued by ``POST /workers`` to one worker: that worker's heartbeats, claims, and
  the leases, releases, failures and results of the jobs it holds, and nothing else (the worker id is
  the credential's, never one taken from the request).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from api.settings import Settings

bearer = HTTPBearer(auto_error=False, description="admin token (all writes), registration token (POST /workers) "
                                                  "or a worker's own credential (its claims, leases, results)")

Role = Literal["admin", "registrar", "worker"]


@dataclass(frozen=True)
class Principal:
    role: Role
    worker_id: int | None = None
    token: str | None = None


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


def _same(a: str, b: str | None) -> bool:
    return bool(b) and secrets.compare_digest(a.encode(), b.encode())  # type: ignore[union-attr]


def _principal(creds: HTTPAuthorizationCredentials | None, settings: Settings, request: Request) -> Principal | None:
    if creds is None:
        return None
    token = creds.credentials
    if _same(token, settings.admin_token):
        return Principal("admin")
    if _same(token, settings.worker_token):
        return Principal("registrar")
    if token.startswith("pw_") and len(token) < 200:
        from api import crud

        with request.app.state.sessions() as db:
            row = crud.worker_by_credential(db, token)
            if row is not None:
                return Principal("worker", row.id, token)
    raise HTTPException(401, "invalid bearer token", headers={"WWW-Authenticate": "Bearer"})


def _missing() -> HTTPException:
    return HTTPException(401, "missing bearer token: send 'Authorization: Bearer <token>'",
                         headers={"WWW-Authenticate": "Bearer"})


Creds = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def require_admin(creds: Creds, settings: SettingsDep, request: Request) -> Principal:
    who = _principal(creds, settings, request)
    if who is None:
        raise _missing()
    if who.role != "admin":
        raise HTTPException(403, "this endpoint needs the admin token; a worker token cannot do admin writes")
    return who


def require_registrar(creds: Creds, settings: SettingsDep, request: Request) -> Principal:
    """Registration: the registration token, the admin token, or a worker re-registering itself."""
    who = _principal(creds, settings, request)
    if who is None:
        raise _missing()
    return who


def require_worker(creds: Creds, settings: SettingsDep, request: Request) -> Principal:
    """A worker's own credential (from ``POST /workers``)."""
    who = _principal(creds, settings, request)
    if who is None:
        raise _missing()
    if who.role != "worker":
        raise HTTPException(403, "this endpoint needs a worker's own credential (the 'token' that POST /workers "
                                 "returned at registration), not the shared registration or admin token")
    return who


def require_read(creds: Creds, settings: SettingsDep, request: Request) -> Principal | None:
    who = _principal(creds, settings, request)
    if who is None and not settings.open_reads:
        raise _missing()
    return who


def as_worker(who: Principal, worker_id: int | None) -> int:
    """The worker id a request acts as: its credential's; a different one named in the request is 403."""
    assert who.worker_id is not None
    if worker_id is not None and worker_id != who.worker_id:
        raise HTTPException(403, f"worker_id: this credential belongs to worker {who.worker_id}, not {worker_id}")
    return who.worker_id


#: committed before the response is sent (``scope="function"``): a client that got a 2xx can read what it
#: wrote at once, and a failed commit is an error response, never a success (FastAPI's default scope
#: for yield dependencies commits after the response: a race, seen in CI on PostgreSQL)
DB = Annotated[Session, Depends(get_db, scope="function")]
Admin = Depends(require_admin)
Registrar = Annotated[Principal, Depends(require_registrar)]
WorkerAuth = Annotated[Principal, Depends(require_worker)]
Read = Depends(require_read)
