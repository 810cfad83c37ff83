"""The errors the data layer raises; ``api.main`` maps each to its HTTP status."""

from __future__ import annotations


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
