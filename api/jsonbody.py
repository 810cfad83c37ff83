"""Request bodies read as JSON with one rule more than FastAPI's: a key given twice in one object is refused
(422 naming the key), as the command line refuses it in files (:func:`planner.jsondoc.unique_keys`). JSON
(RFC 8259 section 4) leaves such an object's meaning undefined and Python's reader keeps the last value, so an
upload's first value was dropped without a word. Every API router is built with :class:`UniqueKeysRoute`."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute

from planner.jsondoc import DuplicateKey, unique_keys


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
        return self._json


class UniqueKeysRoute(APIRoute):
    """A route whose handler reads its JSON body with :class:`UniqueKeysRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(UniqueKeysRequest(request.scope, request.receive))

        return strict
