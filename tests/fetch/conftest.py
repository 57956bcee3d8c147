"""Fixtures of the fetcher tests: a fake price API on 127.0.0.1 (see ``fakeapi.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.fetch.fakeapi import FakeApi, serve


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    """A threaded HTTP server on 127.0.0.1 (port 0) answering with the test's responder."""
    yield from serve()
