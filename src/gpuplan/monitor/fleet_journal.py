"""The fleet controller's journal of removals (SQLite), so a restart forgets nothing.

Before a removal runs, a row is written (``started``); it ends ``done``,
``failed``, ``aborted`` or ``dry-run``. After a restart the controller reads
back, for its group, the instances it removed for real (``started`` or
``done``: a crash mid-removal counts as removed, the safe side) so they are
never counted in the group's size nor chosen again, and the time of the last
removal, so the cooldown survives the restart. Rows older than
:data:`REMEMBER_S` are forgotten (instance names can be reused, e.g. IPs).
"""

from __future__ import annotations

from pathlib import Path

from gpuplan.monitor.state import open_state_db

REMEMBER_S = 24 * 3600.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS removals (
    id INTEGER PRIMARY KEY AUTOINCREMENT, grp TEXT NOT NULL, instance TEXT NOT NULL,
    wall REAL NOT NULL, execute INTEGER NOT NULL, status TEXT NOT NULL
);
"""


class FleetJournal:
    """Removals per group, in a small SQLite file.

    Args:
        path: the database (its directory is created).
        group: the group this controller manages.
        timeout_s: how long a write waits for a lock held by another program.
    """

    def __init__(self, path: Path, group: str, *, timeout_s: float = 5.0) -> None:
        self.path = path
        self.group = group
        self.db = open_state_db(path, _SCHEMA, timeout_s=timeout_s)

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    def begin(self, instance: str, wall: float, *, execute: bool) -> int:
        """Write the removal row before anything runs; return its id (raises on failure)."""
        cur = self.db.execute(
            "INSERT INTO removals (grp, instance, wall, execute, status) "
            "VALUES (?, ?, ?, ?, 'started')",
            (self.group, instance, wall, int(execute)),
        )
        return int(cur.lastrowid or 0)

    def finish(self, row_id: int, status: str) -> None:
        """Record how the removal ended."""
        self.db.execute("UPDATE removals SET status = ? WHERE id = ?", (status, row_id))

    def removed(self, now_wall: float) -> frozenset[str]:
        """Instances of this group removed for real within :data:`REMEMBER_S`."""
        rows = self.db.execute(
            "SELECT instance FROM removals WHERE grp = ? AND execute = 1 "
            "AND status IN ('started', 'done') AND wall >= ?",
            (self.group, now_wall - REMEMBER_S),
        ).fetchall()
        return frozenset(str(r[0]) for r in rows)

    def last_removal_wall(self) -> float | None:
        """Wall time of the newest removal attempt (dry runs included: same decisions)."""
        row = self.db.execute(
            "SELECT MAX(wall) FROM removals WHERE grp = ? AND status != 'aborted'", (self.group,)
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])
