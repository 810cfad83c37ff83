"""Documents as JSON has them: JSON has no infinity or NaN, so a figure that is not finite (a configuration
that was not simulated: ``iteration_time`` inf) is ``null``. One rule for the CLI's ``--json`` output and the
database's stored documents (:class:`db.models.JSONText`). Pure Python."""

from __future__ import annotations

import math
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
