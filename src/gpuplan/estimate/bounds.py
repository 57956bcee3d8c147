"""Calibrated 80% bounds of the estimates, per job class, and the memory verdict.

An estimate's interval comes from the leave-one-source-out residuals
(``log(measured / predicted)``, :mod:`gpuplan.holdout`) of the validation rows in the
same job class: its 10th and 90th percentiles scale the point estimate. The numbers
live in ``bounds.yaml`` beside this module, written by ``scripts/fit_bounds.py``
(re-run it after changing a model or a table; ``--check`` in CI fails when it is out of
date); a class with too few rows, or rows from a single source, uses the pooled residuals
of its table, as the file states. A class's rows come from a few sources, and the pooled
band is what every source together says of an unseen engine, so a class's upper edge is at
least the pooled one and its lower edge is its own shrunk toward the pooled one by its
sources (``gpuplan.holdout.class_bounds``). Every interval contains its point estimate.

The memory verdict compares against capacity: ``fits`` when the upper bound of the
device-used memory fits, ``tight`` when the point estimate fits and the upper bound does
not, ``no`` otherwise. This replaces the fixed 5% safety margin of earlier versions: the
point estimate is compared with the capacity itself, and the bounds say how sure that is.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from importlib import resources
from typing import Any, Literal

import yaml

JOB_CLASSES = (
    "single-gpu-full",
    "lora",
    "qlora",
    "data-parallel",
    "zero-fsdp",
    "tp-pp",
    "multi-node",
    "cnn",
)
"""Job classes. A convolutional network (model family ``cnn``) is ``cnn`` whatever its layout:
its step is priced by another path (:func:`gpuplan.estimate.compute.cnn_step`'s
convolutions and eager passes, not a transformer's GEMMs and attention), and its residuals
scatter about twice as far below the estimate as a single-GPU transformer job's
(``bounds.yaml``). Any other job on several nodes is
``multi-node``, else with tensor or pipeline parallelism ``tp-pp``, else by method
(``qlora``, ``lora``), else on several GPUs of one node ``zero-fsdp`` when the state is sharded
(ZeRO, FSDP, HSDP: gathers and reduce-scatters) and ``data-parallel`` when it is replicated
(DDP: one all-reduce), else ``single-gpu-full``. The issue that asked for the bounds named
ZeRO/FSDP as a class of its own; until 2026-12-04 it shared ``data-parallel``."""
POOLED = "pooled"
Kind = Literal["memory", "time"]
Verdict = Literal["fits", "tight", "no"]


def job_class(
    *, family: str, method: str, count: int, tp: int, pp: int, gpus_per_node: int, sharded: bool
) -> str:
    """The job class whose residuals size this job's bounds (``family``: the model's,
    :attr:`gpuplan.models.config.ModelConfig.family`; ``sharded``: ZeRO, FSDP or HSDP)."""
    if family == "cnn":
        return "cnn"
    if count > max(1, gpus_per_node):
        return "multi-node"
    if tp * pp > 1:
        return "tp-pp"
    if method in ("qlora", "lora"):
        return method
    if count > 1:
        return "zero-fsdp" if sharded else "data-parallel"
    return "single-gpu-full"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClassBounds:
    """The 10th/90th percentile of ``log(measured / predicted)`` in one job class."""

    kind: str
    job_class: str
    lo: float
    hi: float
    rows: int
    pooled: bool
    """True when the class had too few rows (or sources) and the table's pooled residuals are
    used."""
    widened: bool = False
    """True when the class's own upper edge was below the pooled one, and the pooled edge is
    used there (the lower edge is always shrunk toward the pooled one)."""

    def around(self, value: float) -> list[float]:
        """``[lo, hi]`` of a quantity that scales with the estimate (bytes, seconds)."""
        return [value * math.exp(self.lo), value * math.exp(self.hi)]

    def around_inverse(self, value: float) -> list[float]:
        """``[lo, hi]`` of a rate (tokens/s), which falls as the time estimate rises."""
        return [value * math.exp(-self.hi), value * math.exp(-self.lo)]

    def describe(self) -> str:
        """One line for the estimate's assumptions."""
        basis = (
            f"pooled over all {self.rows} rows ({self.job_class} has too few rows or sources)"
            if self.pooled
            else f"of {self.rows} {self.job_class} rows"
            + (", the upper edge raised to the pooled one of all rows" if self.widened else "")
            + ", the lower edge shrunk toward the pooled one"
        )
        return (
            f"80% {self.kind} bounds x{math.exp(self.lo):.2f}..x{math.exp(self.hi):.2f}: "
            f"leave-one-source-out residuals {basis} (bounds.yaml)"
        )


@functools.lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    text = resources.files("gpuplan.estimate").joinpath("bounds.yaml").read_text("utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def bounds_for(kind: Kind, cls: str) -> ClassBounds:
    """The bounds of job class ``cls`` for memory or time (pooled where it has too few rows or
    sources)."""
    table = _load()[kind]
    entry = table["classes"].get(cls) or {"rows": 0, "pooled": True}
    pooled = bool(entry.get("pooled", False))
    src = table["pooled"] if pooled else entry
    lo, hi = float(src["lo"]), float(src["hi"])
    return ClassBounds(
        kind=kind,
        job_class=cls,
        lo=lo,
        hi=hi,
        rows=int(src["rows"]),
        pooled=pooled,
        widened=not pooled and hi != float(src.get("own_hi", hi)),
    )


def verdict(point_fits: bool, upper_used: float, capacity: float) -> Verdict:
    """``fits`` (the upper bound fits the capacity), ``tight`` (only the point estimate
    fits: ``point_fits``, which also keeps any user safety margin free) or ``no``."""
    if not point_fits:
        return "no"
    return "fits" if upper_used <= capacity else "tight"


def margin_for_sure_fit(kind_hi: float) -> float:
    """The safety margin under which a point estimate that fits has its upper bound fit too."""
    return 1 - math.exp(-max(0.0, kind_hi))
