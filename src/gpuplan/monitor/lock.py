"""One agent per state file: an exclusive ``flock`` on ``<state>.lock``.

Two agents on one state file (a systemd unit plus a manual ``sudo gpuplan
watch``) each kept their own idle clock and cooldown, and both acted inside one
cooldown. The lock is taken before the database is opened and held for the
agent's life; the kernel drops it when the process dies (even on ``kill -9``),
so a stale lock file never blocks a restart. The holder writes its PID into the
file so the refusal can name it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gpuplan.errors import MonitorError


def lock_path(state: Path) -> Path:
    """The lock file beside the state database (``watch.db`` -> ``watch.db.lock``)."""
    return state.with_name(state.name + ".lock")


class StateLock:
    """An exclusive, non-blocking lock on a state file.

    Args:
        state: the database the lock protects.
        flag: the option named in errors (``--state``).
    """

    def __init__(self, state: Path, *, flag: str = "--state") -> None:
        self.path = lock_path(state)
        self.flag = flag
        self._fd: int | None = None

    def acquire(self) -> StateLock:
        """Take the lock or raise.

        Raises:
            MonitorError: another process holds it (the message names its PID), or
                the lock file cannot be created.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise MonitorError(
                f"{self.flag}: cannot create the lock file {self.path}: {exc}",
                hint=f"pass {self.flag} with a writable path",
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise MonitorError(
                f"{self.flag}: another gpuplan watch agent ({who}) is using "
                f"{self.path.with_suffix('')}; only one agent may run per state file",
                hint=f"stop it first, or give this one its own {self.flag}",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def note(self, text: str | None) -> None:
        """Publish (or clear) an alert in the lock file for ``watch status``; best effort.

        The file holds the PID on its first line and the alert, if any, on the
        second. It lives beside the database but is written through a file that
        is already open, so it often still works when the database cannot be.
        """
        if self._fd is None:
            return
        body = f"{os.getpid()}\n" + ("" if text is None else " ".join(text.split()) + "\n")
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, body.encode("utf-8", "replace"), 0)
        except OSError:
            pass

    def release(self) -> None:
        """Drop the lock (idempotent). The file stays: deleting it would race a new holder."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StateLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def live_note(state: Path) -> str | None:
    """The alert a *running* agent published for ``state`` (``None`` if none or no agent).

    Opens the lock file read-only and never creates it.
    """
    try:
        fd = os.open(lock_path(state), os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            lines = os.pread(fd, 4096, 0).decode("utf-8", "replace").splitlines()
            return lines[1].strip() if len(lines) > 1 and lines[1].strip() else None
        return None  # nobody holds the lock: no agent is running, any note is stale
    finally:
        os.close(fd)
