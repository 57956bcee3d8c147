"""Shareable plan runs in SQLite: spec, options, result JSON, catalog version and time.

Nothing else is stored: no accounts, no request logs. Ids are
``secrets.token_urlsafe(16)`` (128 random bits), so a link cannot be guessed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import secrets
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    id TEXT PRIMARY KEY,
    created_utc TEXT NOT NULL,
    spec_yaml TEXT NOT NULL,
    options_json TEXT NOT NULL,
    result_json TEXT NOT NULL,
    catalog_version TEXT NOT NULL
)
"""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StoredPlan:
    """One stored plan run."""

    id: str
    created_utc: str
    spec_yaml: str
    options: dict[str, Any]
    result: dict[str, Any]
    catalog_version: str


class PlanStore:
    """The plan table of one SQLite file (one short connection per call, thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10)
        db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, no fsync per run
        try:
            with db:
                yield db
        finally:
            db.close()

    def save(
        self,
        *,
        spec_yaml: str,
        options: Mapping[str, Any],
        result_json: str,
        catalog_version: str,
    ) -> str:
        """Store a run (``result_json``: the API's answer text); return its new unguessable id."""
        plan_id = secrets.token_urlsafe(16)
        created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        with self._db() as db:
            db.execute(
                "INSERT INTO plans VALUES (?, ?, ?, ?, ?, ?)",
                (
                    plan_id,
                    created,
                    spec_yaml,
                    json.dumps(dict(options)),
                    result_json,
                    catalog_version,
                ),
            )
        return plan_id

    def get(self, plan_id: str) -> StoredPlan | None:
        """The stored run, or None for an unknown id."""
        with self._db() as db:
            row = db.execute(
                "SELECT id, created_utc, spec_yaml, options_json, result_json, catalog_version "
                "FROM plans WHERE id = ?",
                (plan_id,),
            ).fetchone()
        if row is None:
            return None
        return StoredPlan(
            id=row[0],
            created_utc=row[1],
            spec_yaml=row[2],
            options=json.loads(row[3]),
            result=json.loads(row[4]),
            catalog_version=row[5],
        )
