"""Run a command with a hard time bound, never through a shell.

``subprocess.run(timeout=...)`` waits for the killed child after a timeout,
which blocks forever when ``nvidia-smi`` hangs in uninterruptible sleep
(NVIDIA/gpu-monitoring-tools#46). Here a child that does not die within a
grace period is *abandoned* and handed back so the caller can refuse to
start another one while it lives.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

KILL_GRACE_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcResult:
    """Outcome of :func:`run_bounded`.

    Attributes:
        stdout: captured stdout; ``None`` when the command timed out or did not start.
        stderr: captured stderr (may be empty).
        exit_code: the exit status; ``None`` when it timed out or did not start.
        error: why there is no normal result ("timed out after 10s", "not found").
    """

    stdout: str | None
    stderr: str
    exit_code: int | None
    error: str | None = None


def run_bounded(
    argv: Sequence[str], timeout_s: float
) -> tuple[ProcResult, subprocess.Popen[str] | None]:
    """Run ``argv`` (a list, no shell) for at most ``timeout_s`` seconds.

    Args:
        argv: program and arguments.
        timeout_s: wall-clock bound in seconds.

    Returns:
        The result, and the child process if it had to be abandoned still
        running after a kill (``None`` otherwise).
    """
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv list, never a shell
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return ProcResult(
            stdout=None, stderr="", exit_code=None, error=f"cannot run {argv[0]}: {exc}"
        ), None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            return (
                ProcResult(
                    stdout=None,
                    stderr="",
                    exit_code=None,
                    error=f"timed out after {timeout_s:g}s and did not die (pid {proc.pid})",
                ),
                proc,
            )
        return ProcResult(
            stdout=None, stderr="", exit_code=None, error=f"timed out after {timeout_s:g}s"
        ), None
    return ProcResult(stdout=out, stderr=err, exit_code=proc.returncode), None


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            proc.kill()
