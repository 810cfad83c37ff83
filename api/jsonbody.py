"""What FastAPI lets through, held to rules a user can read (:class:`UniqueKeysRoute`, the class of every API
router's routes):

* a key given twice in one JSON object is refused (422 naming the key), as the command line refuses it in files
  (:func:`planner.jsondoc.unique_keys`): JSON (RFC 8259 section 4) leaves such an object's meaning undefined and
  Python's reader keeps the last value, so an upload's first value was dropped without a word;
* a body that is not UTF-8 or nests past the reader's depth, or has a number past Python's 4300 digits, is a 400
  saying so; a string that is not text (a lone UTF-16 surrogate escape, ``"\\ud800"``) is a 422 naming where;
* a body sent with a content type other than JSON's is a 415 naming it (FastAPI read it as bytes and answered
  "Input should be a valid dictionary");
* a query parameter the endpoint does not take, or a single-valued one given twice, is a 422
  (:func:`query_problem`), and so is a body sent to an endpoint that takes none (its options are query
  parameters: ``POST /clusters/1/calibrate`` with ``{"include_emulated": true}`` calibrated without them)."""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from planner.jsondoc import DuplicateKey, lone_surrogate, may_hold_surrogate, unique_keys


class UniqueKeysRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body, object_pairs_hook=unique_keys)
            except DuplicateKey as e:  # FastAPI passes an HTTPException on as it is (else: 400, no reason)
                raise HTTPException(422, f"body: {e}") from None
            except UnicodeDecodeError as e:  # (FastAPI's answer: 400 "There was an error parsing the body")
                raise HTTPException(400, f"body: not UTF-8 text: byte 0x{e.object[e.start]:02x} at position "
                                         f"{e.start} (a JSON body is UTF-8, RFC 8259 section 8.1)") from None
            except RecursionError:
                raise HTTPException(400, "body: nested deeper than the JSON reader follows (about 1000 levels of "
                                         "arrays or objects); no pipeplan document nests more than a few") from None
            except ValueError as e:
                if isinstance(e, json.JSONDecodeError):
                    raise  # (FastAPI's own answer: 422 naming the position)
                # a number past Python's integer-string limit (4300 digits; FastAPI's answer: 400, no reason)
                raise HTTPException(400, f"body: {str(e)[:200]}") from None
            if may_hold_surrogate(body) and (where := lone_surrogate(self._json)) is not None:
                raise HTTPException(422, f"{where}: a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without "
                                         "its pair) is not text, and could not be stored or read back as UTF-8 "
                                         "(RFC 8259 section 8.2)")
        return self._json


def _dependants(dependant: Any) -> Iterator[Any]:
    """A route's dependant and those of its dependencies, all the way down (what FastAPI reads parameters from)."""
    todo = [dependant]
    while todo:
        d = todo.pop()
        yield d
        todo.extend(d.dependencies)


def _query_names(dependant: Any) -> dict[str, bool]:
    """The query parameters a route takes, its dependencies' too: name -> whether it takes several values."""
    many = (list, set, tuple)
    return {f.alias: typing.get_origin(f.field_info.annotation) in many
            or any(typing.get_origin(a) in many for a in typing.get_args(f.field_info.annotation))
            for d in _dependants(dependant) for f in d.query_params}


def _has_body(dependant: Any) -> bool:
    return any(d.body_params for d in _dependants(dependant))


def query_problem(query: list[tuple[str, str]], takes: dict[str, bool], where: str) -> str | None:
    """Why a query string is refused, or None: a parameter the endpoint does not take (``GET /jobs?cluster_id=1``
    listed every job, as if it filtered), or one value of a single-valued parameter given twice
    (``?state=queued&state=running`` kept the last)."""
    seen: set[str] = set()
    for name, _ in query:
        if name not in takes:
            have = ", ".join(sorted(takes)) or "none"
            return f"query: {where} takes no parameter {name!r} (it takes: {have})"
        if name in seen and not takes[name]:
            return f"query: {name!r} is given twice; {where} takes one value of it"
        seen.add(name)
    return None


class UniqueKeysRoute(APIRoute):
    """A route whose handler reads its JSON body with :class:`UniqueKeysRequest` and refuses (422) a query
    parameter it does not take or a single-valued one given twice (:func:`query_problem`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes = _query_names(self.dependant)
        bodiless = not _has_body(self.dependant)

        async def strict(request: Request) -> Response:
            where = f"{request.method} {self.path}"
            query = request.query_params.multi_items()
            if query and (problem := query_problem(query, takes, where)):
                return JSONResponse(status_code=422, content={"detail": problem})
            req = UniqueKeysRequest(request.scope, request.receive)
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if (not bodiless and kind and not (kind == "application/json" or kind.endswith("+json"))
                    and (await req.body()).strip()):
                # (FastAPI passes such a body on as bytes: "body: Input should be a valid dictionary")
                return JSONResponse(status_code=415, content={
                    "detail": f"body: sent as {kind[:60]!r}; {where} takes JSON, sent with content-type "
                              "application/json"})
            if bodiless and request.method in ("POST", "PUT", "PATCH"):
                body = (await req.body()).strip()  # (kept on req: the handler reads it again from there)
                if body not in (b"", b"{}", b"null"):
                    opts = ", ".join(sorted(takes))
                    more = f"; its options are query parameters: {opts}" if opts else ""
                    return JSONResponse(status_code=422, content={"detail": f"body: {where} takes no body{more}"})
            return await handler(req)

        return strict
