"""The access log of ``pipeplan serve`` without the agents' polling.

An idle agent claims every 2 s and heartbeats every 10 s (``executor/agent.py``); with uvicorn's access log
that is a line every 2 s in ``make serve``'s terminal, burying the requests a person made. Successful polls
(claim, heartbeat, lease renewals: 2xx) are dropped; their failures, and every other request, are kept.
"""

from __future__ import annotations

import logging
import re

#: the paths an agent polls: ``/workers/{id}/claim|heartbeat``, ``/jobs/{id}/lease``,
#: ``/jobs/{id}/slots/{rank}/lease``
POLL_PATH = re.compile(r"^/(workers/\d+/(claim|heartbeat)|jobs/\d+/(slots/\d+/)?lease)/?(\?.*)?$")


class QuietPolls(logging.Filter):
    """Drops uvicorn access records (args: client, method, path, HTTP version, status) of successful polls."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        _, method, path, _, status = args
        ok = isinstance(status, int) and 200 <= status < 300
        return not (ok and method == "POST" and isinstance(path, str) and POLL_PATH.match(path))


def quiet_polls(logger_name: str = "uvicorn.access") -> None:
    """Install :class:`QuietPolls` on uvicorn's access logger (idempotent)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, QuietPolls) for f in logger.filters):
        logger.addFilter(QuietPolls())
