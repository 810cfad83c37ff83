"""GET /whoami: which role a bearer token has (the UI's token box says it; a mistyped token is refused at once
instead of on the first page that reads). Roles: :mod:`api.deps`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import Registrar

router = APIRouter(tags=["auth"])

_WORDS = {"admin": "admin token: reads and every write",
          "registrar": "registration token: reads and registering workers",
          "worker": "a worker's own credential: reads and its claims, leases and results"}


@router.get("/whoami", responses={401: {"description": "no token, or one the server does not know"}})
def whoami(who: Registrar) -> dict[str, Any]:
    """The token's role (``admin``, ``registrar`` or ``worker``), the worker it belongs to, and what it may do."""
    return {"role": who.role, "worker_id": who.worker_id, "may": _WORDS[who.role]}
