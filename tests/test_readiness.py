"""api.readiness.wait_healthy: the one "wait until the service is healthy" of benchmarks and tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from api.readiness import wait_healthy


def _server(status: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def serve() -> Iterator[list[ThreadingHTTPServer]]:
    started: list[ThreadingHTTPServer] = []
    yield started
    for s in started:
        s.shutdown()
        s.server_close()


def _url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_healthy_server_is_seen(serve: list[ThreadingHTTPServer]) -> None:
    serve.append(_server(200))
    assert wait_healthy(_url(serve[0]), 10)
    assert wait_healthy(_url(serve[0]) + "/", 10)  # a base URL with its slash


def test_unhealthy_answer_is_not_health(serve: list[ThreadingHTTPServer]) -> None:
    serve.append(_server(503))  # /health's answer when the database cannot be reached
    assert not wait_healthy(_url(serve[0]), 0.5, every=0.05)


def test_a_dead_server_process_ends_the_wait() -> None:
    calls: list[int] = []

    def alive() -> bool:
        calls.append(1)
        return False

    assert not wait_healthy("http://127.0.0.1:9", 60, alive=alive)
    assert calls == [1]  # asked before the first poll: no minute spent on a process that exited
