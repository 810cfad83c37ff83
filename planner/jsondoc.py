"""Documents as JSON has them: JSON has no infinity or NaN, so a figure that is not finite (a configuration
that was not simulated: ``iteration_time`` inf) is ``null``. One rule for the CLI's ``--json`` output and the
database's stored documents (:class:`db.models.JSONText`). Pure Python."""

from __future__ import annotations

import json
import math
import re
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with non-finite floats replaced by None (JSON has no inf/NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def number(value: Any) -> float | None:
    """A figure read from a stored document as a finite float, or None where it is not one: not a number (a
    bool is not), or a JSON integer no float holds (``float(10**400)`` raises), or not finite. For documents
    stored as their writer sent them (a worker's trace and result)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        x = float(value)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def integer(value: Any) -> int | None:
    """A count read from a document as a JSON integer, or None where it is not one (a bool is not, nor a
    string of digits, nor a float)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def flag(doc: dict[str, Any], key: str) -> bool:
    """A true/false field of a document (a candidate's ``shard_optimizer``): absent or null is false, a JSON
    boolean is itself, anything else a ValueError naming the field (a hand-edited ``"false"`` is a non-empty
    string, which Python's ``bool`` reads as true)."""
    value = doc.get(key)
    if value is None or isinstance(value, bool):
        return bool(value)
    raise ValueError(f"{key}: true or false, got {str(value)[:40]!r}")


class DuplicateKey(ValueError):
    """An object of a JSON document holds a key twice."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook`` that refuses a key given twice in one object: JSON (RFC 8259
    section 4) leaves such an object's meaning undefined; Python's and pydantic's readers keep the last, so a
    hand-edited file's first value would be dropped without a word."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(f"key {key[:40]!r} appears twice in one object (which one is meant?)")
        seen[key] = value
    return seen


def refuse_duplicate_keys(text: str) -> None:
    """:class:`DuplicateKey` when the JSON document ``text`` has an object with a key twice. Text that is not
    JSON (or nests past Python's recursion) passes: the model's own reader says what is wrong with it, in its
    words. Used by the file loaders (profiles, clusters, devices) before pydantic reads the text."""
    try:
        json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey:
        raise
    except (ValueError, RecursionError):
        return


#: a ``\uD800``-``\uDFFF`` escape in JSON text (``json.loads`` reads an unpaired one as a lone surrogate)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def lone_surrogate(value: Any) -> str | None:
    """Where a document read by ``json.loads`` holds a string that is not text -- a lone UTF-16 surrogate
    (``"\\ud800"`` unpaired, which JSON's escapes allow and Python's reader keeps) -- as a path in the API's
    words (``raw.s``, ``devices[0].note``; ``body`` for the document itself), or None. Such a string cannot be
    written as UTF-8, so a document that stored it could not be read back (RFC 8259 section 8.2: such strings'
    behaviour is unpredictable)."""
    todo: list[tuple[Any, str]] = [(value, "")]
    while todo:
        v, path = todo.pop()
        if isinstance(v, str):
            if not _is_text(v):
                return path or "body"
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str) and not _is_text(k):
                    return f"{path or 'body'} (a key)"
                todo.append((x, f"{path}.{k}" if path else str(k)))
        elif isinstance(v, list):
            todo.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
    return None


def may_hold_surrogate(raw: bytes) -> bool:
    """Whether JSON text ``raw`` has a surrogate escape at all (a cheap test before :func:`lone_surrogate`)."""
    return _SURROGATE_ESCAPE.search(raw) is not None


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text(s: str) -> str:
    """``s`` as text that UTF-8 can write: a lone surrogate (read from a document stored as its writer sent it)
    becomes U+FFFD, a surrogate pair the character it encodes."""
    return s if _is_text(s) else s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
