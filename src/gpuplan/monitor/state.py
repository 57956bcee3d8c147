"""Local SQLite store for the watch agent: restart-safe, tied to the boot id.

Tables: ``policy`` (the policy state per boot id, rewritten every step),
``steps`` (every decision with the readings behind it, pruned to
``keep_steps`` rows) and ``actions`` (every action attempt; written *before*
the action runs, so a crash mid-action can never cause a second one).

The policy clock counts seconds since boot, so a stored state is meaningful
only in the boot that wrote it: :meth:`StateStore.load_policy` returns
``None`` for any other boot id and a rebooted machine starts fresh.

Stored text that does not decode (a hand-edited or corrupt row) counts as no
state, with a warning; it never ends the agent. Write failures (a locked
database, a full disk, a read-only file system) raise :class:`sqlite3.Error`
or :class:`OSError` to the agent, which keeps running (see ``daemon``).
:meth:`StateStore.open_read_only` is what ``watch status`` uses: it never
creates or changes a file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan.errors import MonitorError
from gpuplan.monitor.policy import IdleTimer, PolicyState

log = logging.getLogger("gpuplan.watch")

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
    """Deserialize a policy state written by :func:`policy_state_to_json`.

    Raises:
        ValueError: the text is not such a state.
    """
    try:
        data = json.loads(text)
        timer = data["timer"]
        state = PolicyState(
            timer=IdleTimer(
                run_start_s=_opt_float(timer["run_start_s"]),
                last_t_s=_opt_float(timer["last_t_s"]),
                idle_for_s=float(timer["idle_for_s"]),
                unknown_since_s=_opt_float(timer["unknown_since_s"]),
            ),
            last_action_s=_opt_float(data["last_action_s"]),
            known_gpus=frozenset(str(u) for u in data["known_gpus"]),
        )
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise ValueError(f"undecodable policy state: {type(exc).__name__}: {exc}") from exc
    return state


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _is_step_record(value: Any) -> bool:
    """Whether a decoded step record has what ``watch status`` prints."""
    if not isinstance(value, dict):
        return False
    idle = value.get("idle_for_s")
    gpus = value.get("gpus", [])
    return (
        isinstance(value.get("state"), str)
        and isinstance(idle, (int, float))
        and not isinstance(idle, bool)
        and isinstance(gpus, list)
        and all(isinstance(g, dict) for g in gpus)
    )


def _json_or(text: Any, default: Any, what: str) -> Any:
    """Decode stored JSON; an undecodable value is ``default`` with a warning."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        log.warning("state file: undecodable %s ignored: %s", what, exc)
        return default


def open_state_db(path: Path, schema: str, *, timeout_s: float) -> sqlite3.Connection:
    """Open (creating its directory) a WAL-mode SQLite file in autocommit and apply ``schema``.

    Raises:
        MonitorError: the file cannot be opened or written (names ``--state``).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(schema)
    except (OSError, sqlite3.Error) as exc:
        raise MonitorError(
            f"--state: cannot open {path}: {exc}", hint="pass --state with a writable path"
        ) from exc
    return db


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
        timeout_s: how long one write waits for a lock held by another connection.
    """

    def __init__(self, path: Path, *, keep_steps: int = 20_000, timeout_s: float = 10.0) -> None:
        self.path = path
        self.keep_steps = keep_steps
        self.db = open_state_db(path, _SCHEMA, timeout_s=timeout_s)
        self._writes = 0

    @classmethod
    def open_read_only(cls, path: Path) -> StateStore:
        """Open for reading only; never creates or changes a file (``watch status``).

        While an agent has the database open its ``-wal`` and ``-shm`` files exist
        and are shared; otherwise the file is complete and is opened immutable,
        so SQLite creates no side files either.

        Raises:
            MonitorError: the file is missing or is not a database.
        """
        if not path.is_file():
            raise MonitorError(
                f"--state: no watch state at {path}",
                hint="start the agent with 'gpuplan watch' or pass --state",
            )
        live = path.with_name(path.name + "-wal").exists()
        uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
        if not live:
            uri += "&immutable=1"
        store = cls.__new__(cls)
        store.path, store.keep_steps, store._writes = path, 0, 0
        try:
            store.db = sqlite3.connect(uri, uri=True, timeout=2.0, isolation_level=None)
            store.db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            raise MonitorError(f"--state: cannot read {path}: {exc}") from exc
        return store

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    def _has_tables(self) -> bool:
        names = {
            r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        return {"policy", "steps", "actions"} <= names

    def load_policy(self, boot_id: str) -> PolicyState | None:
        """The policy state saved in this boot, or ``None`` (first run, rebooted, undecodable).

        Raises:
            sqlite3.Error: the database cannot be read (locked, I/O error).
        """
        row = self.db.execute("SELECT state FROM policy WHERE boot_id = ?", (boot_id,)).fetchone()
        if not row:
            return None
        try:
            return policy_state_from_json(row[0])
        except ValueError as exc:
            log.warning(
                "state file %s: stored policy state ignored (%s); starting fresh", self.path, exc
            )
            return None

    def write_steps(
        self,
        boot_id: str,
        steps: list[tuple[float, dict[str, Any]]],
        state: PolicyState,
        config: dict[str, Any],
        wall: float,
    ) -> None:
        """Append step records ``(wall, record)`` and save the policy, in one transaction.

        On any failure (a lock, a full disk at COMMIT) the transaction is rolled
        back, so the next call starts clean.
        """
        if self.db.in_transaction:
            self._rollback()
        try:
            self.db.execute("BEGIN IMMEDIATE")
            for step_wall, record in steps:
                self.add_step(boot_id, step_wall, record)
            self.save_policy(boot_id, state, config, wall)
            self.db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.execute("ROLLBACK")

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
        """The newest policy row, step and action (undecodable parts are ``None``)."""
        if not self._has_tables():
            return StoredStatus(
                boot_id=None,
                config=None,
                state=None,
                updated_wall=None,
                last_step=None,
                last_action=None,
            )
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
            decoded = _json_or(step[0], None, "step record")
            if _is_step_record(decoded):
                last_step = {**decoded, "wall": step[1], "boot_id": step[2]}
            else:
                log.warning("state file: undecodable step record ignored")
        last_action = None
        if action:
            keys = ("boot_id", "t_s", "wall", "action", "execute", "status", "reason", "results")
            last_action = dict(zip(keys, action, strict=True))
            last_action["execute"] = bool(last_action["execute"])
            results = _json_or(last_action["results"], [], "action results")
            last_action["results"] = results if isinstance(results, list) else []
        state = None
        if row:
            try:
                state = policy_state_from_json(row[1])
            except ValueError as exc:
                log.warning("state file: stored policy state ignored (%s)", exc)
        config = _json_or(row[2], None, "settings") if row else None
        return StoredStatus(
            boot_id=row[0] if row else None,
            state=state,
            config=config if isinstance(config, dict) else None,
            updated_wall=row[3] if row else None,
            last_step=last_step,
            last_action=last_action,
        )
