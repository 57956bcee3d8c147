"""A fake price API: a threaded HTTP server on 127.0.0.1 that records what it receives.

Test modules import the ``fake_api`` fixture from here (no conftest in this folder, so
that ``from conftest import ...`` in the other tests keeps meaning ``tests/conftest.py``).

Each test gives a ``respond(call) -> (status, content_type, body)`` function; the
real client library is pointed at the server's URL, so the requests checked here
are the ones the SDK really sends (action names, parameters).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"


@dataclasses.dataclass
class Call:
    """One request the fake API received."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    @property
    def form(self) -> dict[str, str]:
        """Query parameters and a form-encoded body together."""
        out = dict(self.query)
        if self.body and b"=" in self.body and not self.body.lstrip().startswith(b"{"):
            out.update(dict(urllib.parse.parse_qsl(self.body.decode())))
        return out

    @property
    def json(self) -> Any:
        return json.loads(self.body or b"{}")


Responder = Callable[[Call], tuple[int, str, bytes]]


@dataclasses.dataclass
class FakeApi:
    url: str
    calls: list[Call]
    responder: list[Responder]

    def respond_with(self, fn: Responder) -> None:
        self.responder[0] = fn


def fixture_json(name: str) -> Any:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def json_reply(obj: Any, status: int = 200) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(obj).encode()


@pytest.fixture(name="fake_api")
def fake_api_fixture() -> Iterator[FakeApi]:
    """A threaded HTTP server on 127.0.0.1 (port 0) answering with the test's responder."""
    calls: list[Call] = []
    responder: list[Responder] = [lambda call: json_reply({})]

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            call = Call(
                method=self.command,
                path=parts.path,
                query=dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)),
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
            calls.append(call)
            status, ctype, payload = responder[0](call)
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (the timeout test)

        do_GET = _handle
        do_POST = _handle

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakeApi(
            url=f"http://127.0.0.1:{server.server_port}", calls=calls, responder=responder
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
