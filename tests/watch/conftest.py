"""Fixtures for the watch tests: loopback servers only (moto, fake IMDS, webhooks)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from watch_helpers import Recorder, free_port, serve


@pytest.fixture
def webhook_server() -> Iterator[tuple[str, Recorder]]:
    """A webhook receiver on 127.0.0.1 that records JSON bodies."""

    def factory(rec: Recorder) -> type[BaseHTTPRequestHandler]:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers["Content-Length"]))
                rec.requests.append({"path": self.path, "body": json.loads(body)})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    server, rec = serve(factory)
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", rec
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A real moto server (EC2 + Auto Scaling) on 127.0.0.1."""
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def aws(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Fake credentials, no IMDS credential lookups, and a reset moto backend."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    req = urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(req, timeout=10).close()  # noqa: S310 - loopback
    return moto_endpoint


@pytest.fixture
def imds() -> Iterator[Callable[[str, str], str]]:
    """Start fake IMDSv2 servers: ``imds(instance_id, region) -> base_url``."""
    servers: list[ThreadingHTTPServer] = []

    def start(instance_id: str, region: str) -> str:
        def factory(rec: Recorder) -> type[BaseHTTPRequestHandler]:
            class Handler(BaseHTTPRequestHandler):
                def do_PUT(self) -> None:  # noqa: N802
                    assert self.path == "/latest/api/token"
                    assert self.headers["X-aws-ec2-metadata-token-ttl-seconds"]
                    self._reply(b"tok")

                def do_GET(self) -> None:  # noqa: N802
                    if self.headers.get("X-aws-ec2-metadata-token") != "tok":
                        self.send_response(401)
                        self.end_headers()
                        return
                    pages = {
                        "/latest/meta-data/instance-id": instance_id,
                        "/latest/meta-data/placement/region": region,
                    }
                    self._reply(pages[self.path].encode())

                def _reply(self, body: bytes) -> None:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, *args: Any) -> None:
                    pass

            return Handler

        server, _ = serve(factory)
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
