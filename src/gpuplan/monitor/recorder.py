"""``--record``: append every nvidia-smi sample as a ``--replay`` line.

The file is opened in append mode when the agent starts (an unwritable path
is a :class:`MonitorError` naming ``--record``) and each line is flushed at
once, so a crash loses at most the sample being written.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TextIO

from gpuplan.errors import MonitorError
from gpuplan.monitor.readings import Observation
from gpuplan.monitor.samplers import Sampler, SmiSampler

log = logging.getLogger("gpuplan.watch")


class ReplayRecorder:
    """Write the raw nvidia-smi outputs behind each observation as replay lines.

    Args:
        path: the JSONL file (appended to).
        sampler: the agent's sampler; only :class:`SmiSampler` has raw outputs.

    Raises:
        MonitorError: the file cannot be opened, or the sampler is not nvidia-smi.
    """

    def __init__(self, path: Path, sampler: Sampler) -> None:
        if not isinstance(sampler, SmiSampler):
            raise MonitorError(
                "--record: only the nvidia-smi sampler can record replay lines (--sampler smi)"
            )
        self.sampler = sampler
        self.path = path
        try:
            self._fh: TextIO | None = path.open("a", encoding="utf-8")
        except OSError as exc:
            raise MonitorError(f"--record: cannot open {path}: {exc}") from exc
        self._failing = False

    def __call__(self, obs: Observation) -> None:
        """Append the line for ``obs`` (the sampler's last raw outputs)."""
        raw = self.sampler.last_raw
        if self._fh is None or raw is None:
            return
        line = {
            "t": obs.t_s,
            "gpu": raw.gpu,
            "gpu_exit": raw.gpu_exit,
            "apps": raw.apps,
            "apps_exit": raw.apps_exit,
        }
        try:
            self._fh.write(json.dumps(line) + "\n")
            self._fh.flush()
        except OSError as exc:  # a full disk must not end the watch
            if not self._failing:
                log.warning("--record: cannot append to %s: %s", self.path, exc)
            self._failing = True
        else:
            self._failing = False

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
