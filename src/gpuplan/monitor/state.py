"""Local SQLite store for the watch agent: restart-safe, tied to the boot id.

Tables: ``policy`` (the policy state per boot id, rewritten every step),
``steps`` (every decision with the readings behind it, pruned to
``keep_steps`` rows) and ``actions`` (every action attempt; written *before*
the action runs, so a crash mid-action can never cause a second one).

The policy clock counts seconds since boot, so a stored state is meaningful
only in the boot that wrote it: :meth:`StateStore.load_policy` returns
``None`` for any other boot id and a rebooted machine starts fresh.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan.errors import MonitorError
from gpuplan.monitor.policy import IdleTimer, PolicyState

_SCHEMA = """
CREATE TABLE IF NOT EXISTS policy (
    boot_id TEXT PRIMARY KEY, state TEXT NOT NULL, config TEXT NOT NULL, updated_wall REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT, boot_id TEXT NOT NULL, t_s REAL NOT NULL,
    wall REAL NOT NULL, state TEXT NOT NULL, idle_for_s REAL NOT NULL, action TEXT,
    reason TEXT NOT NULL, record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, boot_id TEXT NOT NULL, t_s REAL NOT NULL,
    wall REAL NOT NULL, action TEXT NOT NULL, execute INTEGER NOT NULL, status TEXT NOT NULL,
    reason TEXT NOT NULL, results TEXT NOT NULL, record TEXT NOT NULL
);
"""


def policy_state_to_json(state: PolicyState) -> str:
    """Serialize a policy state."""
    t = state.timer
    return json.dumps(
        {
            "timer": {
                "run_start_s": t.run_start_s,
                "last_t_s": t.last_t_s,
                "idle_for_s": t.idle_for_s,
                "unknown_since_s": t.unknown_since_s,
            },
            "last_action_s": state.last_action_s,
            "known_gpus": sorted(state.known_gpus),
        }
    )


def policy_state_from_json(text: str) -> PolicyState:
    """Deserialize a policy state written by :func:`policy_state_to_json`."""
    data = json.loads(text)
    return PolicyState(
        timer=IdleTimer(**data["timer"]),
        last_action_s=data["last_action_s"],
        known_gpus=frozenset(data["known_gpus"]),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredStatus:
    """What ``gpuplan watch status`` shows.

    Attributes:
        boot_id: the boot id of the newest policy row (``None`` if never ran).
        config: the policy/agent settings the daemon ran with.
        state: the policy state of that boot.
        updated_wall: wall time of the last write.
        last_step: the newest decision record.
        last_action: the newest action row.
    """

    boot_id: str | None
    config: dict[str, Any] | None
    state: PolicyState | None
    updated_wall: float | None
    last_step: dict[str, Any] | None
    last_action: dict[str, Any] | None


class StateStore:
    """The agent's SQLite file.

    Args:
        path: database file (its directory is created).
        keep_steps: newest ``steps`` rows kept (older ones are pruned).
    """

    def __init__(self, path: Path, *, keep_steps: int = 20_000) -> None:
        self.path = path
        self.keep_steps = keep_steps
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(path), timeout=10.0, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise MonitorError(
                f"--state: cannot open {path}: {exc}", hint="pass --state with a writable path"
            ) from exc
        self._writes = 0

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    def load_policy(self, boot_id: str) -> PolicyState | None:
        """The policy state saved in this boot, or ``None`` (first run, or rebooted)."""
        row = self.db.execute("SELECT state FROM policy WHERE boot_id = ?", (boot_id,)).fetchone()
        return policy_state_from_json(row[0]) if row else None

    def save_policy(
        self, boot_id: str, state: PolicyState, config: dict[str, Any], wall: float
    ) -> None:
        """Save the policy state for this boot (one row per boot id)."""
        self.db.execute(
            "INSERT INTO policy (boot_id, state, config, updated_wall) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(boot_id) DO UPDATE SET state = excluded.state, config = excluded.config, "
            "updated_wall = excluded.updated_wall",
            (boot_id, policy_state_to_json(state), json.dumps(config), wall),
        )

    def add_step(self, boot_id: str, wall: float, record: dict[str, Any]) -> None:
        """Append one decision record (with its readings)."""
        self.db.execute(
            "INSERT INTO steps (boot_id, t_s, wall, state, idle_for_s, action, reason, record) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                boot_id,
                record["t"],
                wall,
                record["state"],
                record["idle_for_s"],
                record.get("action"),
                record.get("reason", ""),
                json.dumps(record),
            ),
        )
        self._writes += 1
        if self._writes % 500 == 0:
            self.db.execute(
                "DELETE FROM steps WHERE id <= (SELECT MAX(id) FROM steps) - ?", (self.keep_steps,)
            )

    def begin_action(
        self,
        boot_id: str,
        t_s: float,
        wall: float,
        action: str,
        *,
        execute: bool,
        reason: str,
        record: dict[str, Any],
    ) -> int:
        """Write an action row with status ``started`` before running it; return its id."""
        cur = self.db.execute(
            "INSERT INTO actions "
            "(boot_id, t_s, wall, action, execute, status, reason, results, record) "
            "VALUES (?, ?, ?, ?, ?, 'started', ?, '[]', ?)",
            (boot_id, t_s, wall, action, int(execute), reason, json.dumps(record)),
        )
        return int(cur.lastrowid or 0)

    def finish_action(
        self, action_id: int, status: str, results: list[dict[str, Any]], *, note: str = ""
    ) -> None:
        """Record how an action ended (``done``, ``failed``, ``dry-run``, ``aborted``).

        ``note`` (why it was aborted) is appended to the stored reason.
        """
        self.db.execute(
            "UPDATE actions SET status = ?, results = ?, "
            "reason = reason || CASE WHEN ? = '' THEN '' ELSE '; ' || ? END WHERE id = ?",
            (status, json.dumps(results), note, note, action_id),
        )

    def status(self) -> StoredStatus:
        """The newest policy row, step and action."""
        row = self.db.execute(
            "SELECT boot_id, state, config, updated_wall FROM policy "
            "ORDER BY updated_wall DESC LIMIT 1"
        ).fetchone()
        step = self.db.execute(
            "SELECT record, wall, boot_id FROM steps ORDER BY id DESC LIMIT 1"
        ).fetchone()
        action = self.db.execute(
            "SELECT boot_id, t_s, wall, action, execute, status, reason, results FROM actions "
            "ORDER BY id DESC LIMIT 1"
        ).fetchone()
        last_step = None
        if step:
            last_step = {**json.loads(step[0]), "wall": step[1], "boot_id": step[2]}
        last_action = None
        if action:
            keys = ("boot_id", "t_s", "wall", "action", "execute", "status", "reason", "results")
            last_action = dict(zip(keys, action, strict=True))
            last_action["execute"] = bool(last_action["execute"])
            last_action["results"] = json.loads(last_action["results"])
        return StoredStatus(
            boot_id=row[0] if row else None,
            state=policy_state_from_json(row[1]) if row else None,
            config=json.loads(row[2]) if row else None,
            updated_wall=row[3] if row else None,
            last_step=last_step,
            last_action=last_action,
        )
