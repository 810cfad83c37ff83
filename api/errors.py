"""The errors the data layer raises (``api.main`` maps each to its HTTP status), the one-line message of a
validation error, and the check of a document read back from the database (:func:`stored`)."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from fastapi.encoders import jsonable_encoder
from pydantic import BaseModel, ValidationError

from db.models import finite

Model = TypeVar("Model", bound=BaseModel)


class InputError(ValueError):
    """Bad input found past schema validation: the API answers 422 with this message."""


class Conflict(RuntimeError):
    """The request does not fit the current state: the API answers 409."""


class NotFound(LookupError):
    """The API answers 404."""


class Busy(RuntimeError):
    """The server is at a limit it sets itself (the plan queue is full): 429 with ``Retry-After``."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _loc(loc: Any) -> str:
    parts = [str(p) for p in loc if p not in ("body",)] if isinstance(loc, list | tuple) else [str(loc)]
    return ".".join(parts) or "body"


# a message that names its field itself, as a model validator's do ("schedules: unknown schedule 'foo'")
_NAMES_FIELD = re.compile(r"^[A-Za-z_][\w.]*: ")


def _msg(e: dict[str, Any]) -> str:
    """One error of :func:`clean_errors` (pydantic's 'Value error, ' taken off there) as 'field.path: message',
    without 'body: ' before a message of the whole body that names its field."""
    msg = str(e.get("msg", "invalid"))
    if e.get("type") == "json_invalid":  # loc ("body", <character offset>): say what the number is
        where = [p for p in e.get("loc", ()) if p != "body"]
        return f"body: not valid JSON{f' at character {where[0]}' if where else ''}"
    loc = _loc(e.get("loc", ()))
    return msg if loc == "body" and _NAMES_FIELD.match(msg) else f"{loc}: {msg}"


def validation_message(errors: list[dict[str, Any]]) -> str:
    """'field.path: message; ...' for the first few errors (as :func:`clean_errors` leaves them)."""
    msgs = [_msg(e) for e in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(msgs) + more


def clean_errors(errors: Any) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        e = {k: v for k, v in dict(e).items() if k in ("type", "loc", "msg")}
        if isinstance(e.get("msg"), str):
            e["msg"] = e["msg"].removeprefix("Value error, ")
        out.append(finite(jsonable_encoder(e)))
    return out


def stored(model: type[Model], body: Any, what: str, again: str) -> Model:
    """``body``, a document read back from the database, as ``model``; :class:`InputError` (422) when it no
    longer meets the model's rules. Profiles and clusters are checked when they are stored, but a later
    version of pipeplan may hold them to more rules (a known dtype, a calibration factor in its range, ...):
    such a row is kept as it is (nothing stored is rewritten), and what uses it says which rule it breaks and
    what to do (``again``), in one line, in place of a pydantic report or a failed plan."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise InputError(f"{what} was stored under earlier rules and no longer meets them: "
                         f"{validation_message(clean_errors(e.errors()))}; {again}") from None
