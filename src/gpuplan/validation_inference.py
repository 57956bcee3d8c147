"""``gpuplan validate inference``: serving estimates against published measurements.

``validation/inference.csv`` holds one measurement per row: a service (a YAML
flow mapping of the service spec), the device, the metric and its source.
Metrics fall in three groups, each with its own target:

- memory: ``weights_bytes``, ``kv_cache_bytes``, ``max_concurrency``
- throughput: ``output_tokens_per_s``, ``samples_per_s``
- latency: ``ttft_s``, ``tpot_s``, ``latency_s``

Besides the in-sample error with the shipped constants, the report gives the
leave-one-source-out (LOSO) error: for each source, the speed efficiencies are
refitted on the other sources' rows (coordinate descent over a grid, minimizing
the median |log(predicted / measured)|) and the held-out rows are predicted with
them. Memory rows have no fitted speed constant, so their LOSO error is their
in-sample error. ``bounds`` coverage is the share of rows whose measurement
lies inside the estimate's reported bounds.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuplan.errors import GpuPlanError, SpecError

GROUPS: dict[str, str] = {
    "weights_bytes": "memory",
    "kv_cache_bytes": "memory",
    "max_concurrency": "memory",
    "output_tokens_per_s": "throughput",
    "samples_per_s": "throughput",
    "ttft_s": "latency",
    "tpot_s": "latency",
    "latency_s": "latency",
}
UNITS = {"GiB": 2**30, "MiB": 2**20, "GB": 1e9, "B": 1, "ms": 1e-3, "s": 1, "x": 1}
FITTED_SPEED = (
    "prefill_efficiency",
    "decode_bandwidth_efficiency",
    "decode_compute_efficiency",
    "step_overhead_s",
    "tp_overhead_per_gpu",
    "diffusion_compute_efficiency",
    "nonllm_compute_efficiency",
)
_GRID = (0.5, 0.62, 0.75, 0.87, 1.0, 1.15, 1.3, 1.5, 1.75, 2.0)
PRIOR: dict[str, float] = {
    "prefill_efficiency": 0.5,
    "decode_bandwidth_efficiency": 0.7,
    "decode_compute_efficiency": 0.5,
    "step_overhead_s": 0.004,
    "tp_overhead_per_gpu": 0.5,
    "diffusion_compute_efficiency": 0.25,
    "nonllm_compute_efficiency": 0.35,
}
"""Round starting values of the LOSO refits, so a held-out source never leaks through the
shipped (all-rows) fit."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InferenceRow:
    """One validation row that runs."""

    id: str
    source_key: str
    metric: str
    measured: float
    service: Any
    gpu: str
    count: int
    slice: str | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InferenceResult:
    """Prediction vs measurement for one row."""

    id: str
    source_key: str
    metric: str
    group: str
    predicted: float
    measured: float
    error: float
    loso_error: float
    in_bounds: bool | None


def default_table() -> Path:
    """``validation/inference.csv`` of the source checkout this package runs from."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "validation" / "inference.csv"
        if candidate.is_file():
            return candidate
    raise SpecError(
        "--table: validation/inference.csv not found next to this installation",
        hint="run from a source checkout, or pass --table PATH",
    )


def read_rows(path: Path) -> tuple[list[InferenceRow], list[tuple[str, str]]]:
    """The ``ok`` rows (parsed) and the excluded rows (id, reason)."""
    from gpuplan.serve.spec import ServiceSpec

    ok: list[InferenceRow] = []
    excluded: list[tuple[str, str]] = []
    with path.open(encoding="utf-8", newline="") as fh:
        for raw in csv.DictReader(fh):
            if raw["status"] != "ok":
                excluded.append((raw["id"], raw["notes"]))
                continue
            data = yaml.safe_load(raw["service"])
            data.setdefault("name", "v")
            try:
                svc = ServiceSpec.model_validate(data)
            except ValueError as exc:
                raise SpecError(f"{path}: row {raw['id']}: {exc}") from exc
            if raw["metric"] not in GROUPS:
                raise SpecError(f"{path}: row {raw['id']}: unknown metric {raw['metric']!r}")
            ok.append(
                InferenceRow(
                    id=raw["id"],
                    source_key=raw["source_key"],
                    metric=raw["metric"],
                    measured=float(raw["measured"]) * UNITS.get(raw["unit"], 1.0),
                    service=svc,
                    gpu=raw["gpu"],
                    count=int(raw["count"] or 1),
                    slice=raw["slice"] or None,
                )
            )
    return ok, excluded


def _predict(row: InferenceRow, fit: Any, cat: Any) -> tuple[float, list[float] | None]:
    from gpuplan.estimate.serve import estimate_service
    from gpuplan.estimate.serve_device import resolve_device

    device = resolve_device(cat, row.gpu, count=row.count, slice=row.slice)
    est = estimate_service(row.service, device, fit=fit)
    section = {**est.memory, **est.throughput, **est.latency}
    value = section.get(row.metric)
    if value is None:
        raise SpecError(f"row {row.id}: the estimate has no {row.metric}")
    return float(value), est.bounds.get(row.metric)


def _log_errors(rows: Sequence[InferenceRow], fit: Any, cat: Any) -> list[float]:
    out = []
    for row in rows:
        try:
            pred, _ = _predict(row, fit, cat)
        except GpuPlanError:
            out.append(5.0)
            continue
        out.append(abs(math.log(max(pred, 1e-12) / row.measured)))
    return out


def refit(rows: Sequence[InferenceRow], fit: Any, cat: Any, *, rounds: int = 2) -> Any:
    """Coordinate descent of the speed constants on ``rows`` (median |log error|)."""
    speed = [r for r in rows if GROUPS[r.metric] != "memory"]
    if not speed:
        return fit
    best = statistics.median(_log_errors(speed, fit, cat))
    for _ in range(rounds):
        for name in FITTED_SPEED:
            base = getattr(fit, name)
            for mult in _GRID:
                value = base * mult
                if name.endswith("efficiency"):
                    value = min(value, 0.98)
                trial = fit.replace(**{name: value})
                score = statistics.median(_log_errors(speed, trial, cat))
                if score < best - 1e-9:
                    best, fit = score, trial
    return fit


def run(path: Path | None = None, *, loso: bool = True) -> dict[str, Any]:
    """Per-row and summary errors of the inference table (in-sample and LOSO)."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.estimate.serve_constants import fitted

    table = path or default_table()
    rows, excluded = read_rows(table)
    cat = load_catalog(use_user=False)
    fit = fitted()
    loso_fit: dict[str, Any] = {}
    if loso:
        start = fit.replace(**PRIOR)
        for key in sorted({r.source_key for r in rows}):
            rest = [r for r in rows if r.source_key != key]
            loso_fit[key] = refit(rest, start, cat, rounds=2)
    results = []
    for row in rows:
        group = GROUPS[row.metric]
        pred, bounds = _predict(row, fit, cat)
        lpred = pred
        if loso and group != "memory":
            lpred, _ = _predict(row, loso_fit[row.source_key], cat)
        inside = None if bounds is None else bounds[0] <= row.measured <= bounds[1]
        results.append(
            InferenceResult(
                id=row.id,
                source_key=row.source_key,
                metric=row.metric,
                group=group,
                predicted=pred,
                measured=row.measured,
                error=(pred - row.measured) / row.measured,
                loso_error=(lpred - row.measured) / row.measured,
                in_bounds=inside,
            )
        )
    return {
        "table": str(table),
        "rows": results,
        "excluded": excluded,
        "summary": summarize(results),
    }


def summarize(results: Sequence[InferenceResult]) -> dict[str, Any]:
    """Median, worst, LOSO median and bounds coverage per metric group."""
    out: dict[str, Any] = {}
    for group in ("memory", "throughput", "latency"):
        rs = [r for r in results if r.group == group]
        if not rs:
            continue
        worst = max(rs, key=lambda r: abs(r.error))
        covered = [r.in_bounds for r in rs if r.in_bounds is not None]
        out[group] = {
            "rows": len(rs),
            "sources": len({r.source_key for r in rs}),
            "median_abs_error": statistics.median(abs(r.error) for r in rs),
            "loso_median_abs_error": statistics.median(abs(r.loso_error) for r in rs),
            "worst_abs_error": abs(worst.error),
            "worst_id": worst.id,
            "loso_worst_abs_error": max(abs(r.loso_error) for r in rs),
            "bounds_coverage": sum(covered) / len(covered) if covered else None,
        }
    return out
