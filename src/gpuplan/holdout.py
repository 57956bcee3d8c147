"""Leave-one-source-out (LOSO) error: each source's rows predicted without that source.

The in-sample error of ``gpuplan validate`` is measured on the rows the fitted constants
were chosen on, so it flatters the estimators. Here every fitted constant is re-fitted
without one source's rows (a source is a publication or repository,
:func:`gpuplan.validation.source_of`), the held-out rows are predicted with those
values, and that is repeated for every source. The spread of these residuals is what
a user with a job from an unseen codebase can expect, and it sizes the estimates'
bounds (``scripts/fit_bounds.py``).

* **memory**: the one fitted constant is the caching-allocator reserve fraction
  (:data:`gpuplan.estimate.overheads.ALLOCATOR_RESERVE_FRACTION`), chosen on a grid over
  the rows it moves (reserved and device-used): the lowest median error among the
  fractions that leave at most 1 row in 10 predicted more than 10% low. It is re-fitted here, per held-out
  source, at run time (about a second).
* **training**: the speed model's efficiencies (``efficiency.yaml``) take minutes to
  fit, so ``scripts/fit_efficiency.py --write`` stores each held-out source's re-fitted
  values in ``validation/loso_efficiency.yaml``, and ``--check`` (in CI) fails when that
  file is out of date.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuplan.errors import GpuPlanError
from gpuplan.estimate import calibration
from gpuplan.estimate import overheads as ovh
from gpuplan.validation import (
    UNIT_SCALE,
    Report,
    RowResult,
    predict_memory,
    predict_training,
    read_table,
    source_of,
)

LOSO_EFFICIENCY_FILE = "loso_efficiency.yaml"
RESERVE_GRID = tuple(round(0.01 * i, 2) for i in range(26))
"""Allocator reserve fractions tried (0 to 0.25, as when the constant was chosen)."""
RESERVE_PRIOR = 0.0
"""The reserve fraction without a fit: only the allocator's 256 MiB minimum."""
THROUGHPUT_METRICS = frozenset(
    {"tokens_per_s_per_gpu", "samples_per_s", "mfu", "model_tflops_per_gpu"}
)
"""Training metrics that grow as the step gets faster (the rest are times)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FittedConstant:
    """One fitted constant, the rows it was fitted on, and whether it earns its place."""

    name: str
    value: float
    rows: tuple[str, ...]
    loso_median_fitted: float | None = None
    """LOSO median |error| of the rows it applies to, with the constant re-fitted per fold."""
    loso_median_prior: float | None = None
    """The same with the constant at its unfitted prior (other constants as fitted)."""
    refit_value: float | None = None
    """What the fitting rule gives on all rows now (differs from ``value`` when stale)."""

    @property
    def helps(self) -> bool | None:
        """Whether fitting it lowers the leave-one-source-out error of its rows."""
        if self.loso_median_fitted is None or self.loso_median_prior is None:
            return None
        return self.loso_median_fitted <= self.loso_median_prior

    def as_json(self) -> dict[str, Any]:
        """Plain mapping for ``validate --json``."""
        return {
            "name": self.name,
            "value": self.value,
            "fitted_on_rows": len(self.rows),
            "rows": list(self.rows),
            "loso_median_fitted": self.loso_median_fitted,
            "loso_median_prior": self.loso_median_prior,
            "lowers_loso_error": self.helps,
            "refit_value": self.refit_value,
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LosoReport:
    """Leave-one-source-out predictions of one table, and the constants re-fitted per fold."""

    report: Report
    """The rows, each predicted by the constants fitted without its source."""
    fold_params: dict[str, dict[str, float]]
    """Per held-out source, the constants fitted without it."""
    constants: tuple[FittedConstant, ...]
    stale: str = ""
    """Why the stored folds do not match the table (empty when they do)."""


def log_ratio(row: RowResult) -> float | None:
    """``log(measured / predicted)`` of a row (None if it failed)."""
    if row.error is None or row.predicted <= 0 or row.measured <= 0:
        return None
    return math.log(row.measured / row.predicted)


def time_log_ratio(row: RowResult) -> float | None:
    """``log(measured time / predicted time)`` of a training row, whatever its metric."""
    r = log_ratio(row)
    if r is None:
        return None
    return -r if row.metric in THROUGHPUT_METRICS else r


@contextlib.contextmanager
def reserve_fraction(value: float) -> Iterator[None]:
    """Predict with another allocator reserve fraction for the duration."""
    old = ovh.ALLOCATOR_RESERVE_FRACTION
    ovh.ALLOCATOR_RESERVE_FRACTION = value
    try:
        yield
    finally:
        ovh.ALLOCATOR_RESERVE_FRACTION = old


def _ok_rows(table: Path) -> list[dict[str, str]]:
    return [r for r in read_table(table) if r.get("status", "ok") == "ok"]


def _result(row: dict[str, str], predicted: float | None, note: str) -> RowResult:
    measured = float(row["measured"]) * UNIT_SCALE.get(row.get("unit", ""), 1)
    ok = predicted is not None and math.isfinite(predicted)
    return RowResult(
        id=row["id"],
        metric=row["metric"],
        predicted=predicted if ok and predicted is not None else float("nan"),
        measured=measured,
        error=(predicted - measured) / measured if ok and predicted is not None else None,
        note=note,
        multi_node=int(row.get("count") or 1) > int(row.get("gpus_per_node") or 8),
        source=source_of(row),
    )


def _predict(predict: Any, row: dict[str, str], root: Path) -> tuple[float | None, str]:
    try:
        value, note = predict(row, root)
    except GpuPlanError as exc:
        return None, exc.one_line()
    return float(value), str(note)


MAX_UNDER_SHARE = 0.10
"""The memory fit's constraint: at most this share of its rows predicted >10% low (a false
"fits" costs a failed run), then the lowest median error."""


def _under_share(pairs: list[tuple[float | None, float]]) -> float:
    done = [(p, m) for p, m in pairs if p is not None]
    return sum(1 for p, m in done if p < 0.9 * m) / max(1, len(done))


def _median_abs_log(pairs: list[tuple[float | None, float]]) -> float:
    errs = [abs(math.log(p / m)) for p, m in pairs if p is not None and p > 0 and m > 0]
    return statistics.median(errs) if errs else math.inf


def _median_abs(rows: list[RowResult]) -> float | None:
    errs = [r.abs_error for r in rows if r.abs_error is not None]
    return statistics.median(errs) if errs else None


def memory_loso(table: Path) -> LosoReport:
    """LOSO predictions of a memory table, re-fitting the allocator reserve per source."""
    root = table.resolve().parent.parent
    rows = _ok_rows(table)
    grid: dict[float, list[tuple[float | None, str]]] = {}
    for f in (*RESERVE_GRID, RESERVE_PRIOR):
        with reserve_fraction(f):
            grid[f] = [_predict(predict_memory, r, root) for r in rows]
    measured = [float(r["measured"]) * UNIT_SCALE.get(r.get("unit", ""), 1) for r in rows]
    sources = [source_of(r) for r in rows]
    results: list[RowResult | None] = [None] * len(rows)
    prior_results: list[RowResult | None] = [None] * len(rows)
    fold_params: dict[str, dict[str, float]] = {}

    def best_fraction(held: str | None) -> float:
        # the reserve only moves reserved and device-used figures: fit it on those rows
        train = [i for i, s in enumerate(sources) if s != held and rows[i]["metric"] != "allocated"]
        return min(
            RESERVE_GRID,
            key=lambda f: (
                _under_share([(grid[f][i][0], measured[i]) for i in train]) > MAX_UNDER_SHARE,
                _median_abs_log([(grid[f][i][0], measured[i]) for i in train]),
                f,
            ),
        )

    for held in sorted(set(sources)):
        best = best_fraction(held)
        fold_params[held] = {"overheads.ALLOCATOR_RESERVE_FRACTION": best}
        for i, s in enumerate(sources):
            if s == held:
                results[i] = _result(rows[i], *grid[best][i])
                prior_results[i] = _result(rows[i], *grid[RESERVE_PRIOR][i])
    done = [r for r in results if r is not None]
    prior = [r for r in prior_results if r is not None]
    affected = {r.id for r in done if r.metric != "allocated"}
    constant = FittedConstant(
        name="overheads.ALLOCATOR_RESERVE_FRACTION",
        value=ovh.ALLOCATOR_RESERVE_FRACTION,
        rows=tuple(r["id"] for r in rows if r["metric"] != "allocated"),
        refit_value=best_fraction(None),
        loso_median_fitted=_median_abs([r for r in done if r.id in affected]),
        loso_median_prior=_median_abs([r for r in prior if r.id in affected]),
    )
    report = Report(table=str(table), rows=tuple(done), excluded=())
    return LosoReport(report=report, fold_params=fold_params, constants=(constant,))


def efficiencies_with(
    base: calibration.Efficiencies, params: Mapping[str, float]
) -> calibration.Efficiencies:
    """``base`` with flattened parameters set: ``<architecture>.<key>``, ``overlap.<key>``, or a
    code path's ``cnn.<key>`` / ``compiled.<key>``.

    Each value is a share of peak or of traffic hidden, so one outside [0, 1] (a fold written by
    a broken fit) is an error, as it is in efficiency.yaml."""
    archs = dict(base.archs)
    overlap = dict(base.overlap)
    paths = {path: dict(getattr(base, path)) for path in calibration.CODE_PATHS}
    for name, value in params.items():
        if not 0.0 <= value <= 1.0:
            raise GpuPlanError(
                f"{name} = {value:g}: a fitted efficiency or overlap must lie in [0, 1]"
            )
        head, key = name.rsplit(".", 1)
        if head == "overlap":
            overlap[key] = value
        elif head in paths:
            paths[head][key] = value
        else:
            change: dict[str, Any] = {key: value}
            archs[head] = dataclasses.replace(archs[head], **change)
    return dataclasses.replace(
        base, archs=archs, overlap=overlap, cnn=paths["cnn"], compiled=paths["compiled"]
    )


def param_value(effs: calibration.Efficiencies, name: str) -> float:
    """The value of a flattened parameter name in ``effs``."""
    head, key = name.rsplit(".", 1)
    if head == "overlap":
        return effs.overlap[key]
    if head in calibration.CODE_PATHS:
        return float(getattr(effs, head)[key])
    return float(getattr(effs.archs[head], key))


def loso_file(table: Path) -> Path:
    """Where the stored training folds of ``table`` live (beside it)."""
    return table.resolve().parent / LOSO_EFFICIENCY_FILE


def training_loso(table: Path) -> LosoReport | None:
    """LOSO predictions of a training table from the stored folds (None if none are stored)."""
    path = loso_file(table)
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    folds: dict[str, dict[str, Any]] = data.get("sources") or {}
    root = table.resolve().parent.parent
    rows = _ok_rows(table)
    base = calibration.efficiencies()
    results: list[RowResult] = []
    missing = sorted({source_of(r) for r in rows} - set(folds))
    stored_rows = {rid for fold in folds.values() for rid in fold.get("held_out", [])}
    stale = ""
    if missing or stored_rows != {r["id"] for r in rows}:
        stale = (
            f"{path.name} does not match the table (sources without folds: "
            f"{', '.join(missing) or 'none'}); run scripts/fit_efficiency.py --write"
        )
    for row in rows:
        fold = folds.get(source_of(row))
        if fold is None:
            results.append(_result(row, None, "no stored fold for this source"))
            continue
        calibration.use_efficiencies(efficiencies_with(base, fold["params"]))
        try:
            results.append(_result(row, *_predict(predict_training, row, root)))
        finally:
            calibration.use_efficiencies(None)
    constants = tuple(
        FittedConstant(
            name=name,
            value=float(c["value"]),
            rows=tuple(c.get("rows", [])),
            loso_median_fitted=c.get("loso_median_fitted"),
            loso_median_prior=c.get("loso_median_prior"),
        )
        for name, c in (data.get("fitted") or {}).items()
    )
    return LosoReport(
        report=Report(table=str(table), rows=tuple(results), excluded=()),
        fold_params={k: dict(v["params"]) for k, v in folds.items()},
        constants=constants,
        stale=stale,
    )


QUANTILES = (0.1, 0.9)
"""The bounds are the 10th and 90th percentiles: an 80% interval.

Linear-interpolated (:func:`quantile`), as numpy's default. Until 2026-12-05 the ranks were
rounded outward to observed rows, so that a dozen rows kept at least 80% inside; a class
leans on the pooled band now (:func:`class_bounds`), which is what keeps a small class
wide, and the outward ranks on top of it held more than the nominal share: the bounds held
89% of the memory rows (81% held out) and 86% of the training rows (85% held out).
Interpolated: 86% (79%) and 83% (85%), the median widths the same (docs/accuracy.md)."""
MIN_CLASS_ROWS = 5
"""A job class with fewer rows uses its table's pooled residuals."""
MIN_CLASS_SOURCES = 2
"""A job class whose rows come from fewer sources uses its table's pooled residuals too: one
source's spread says how far that source's rows scatter, not how far the next source's will
(Megatron-LM's six functional-test rows of one 7B model agree within 2.2%, which is no 80%
interval for every TP/PP job)."""


def row_job_class(row: dict[str, str], repo_root: Path) -> str:
    """The job class of a validation row (:func:`gpuplan.estimate.bounds.job_class`)."""
    from gpuplan.estimate.fit import strategy_class
    from gpuplan.estimate.strategy import Strategy
    from gpuplan.spec import ParallelismSpec
    from gpuplan.validation import row_spec

    spec = row_spec(row["spec"], row["id"], repo_root)
    par = spec.parallelism if isinstance(spec.parallelism, ParallelismSpec) else None
    count = int(row.get("count") or 1)
    layout = Strategy(tp=par.tp, pp=par.pp, sharding=par.sharding) if par else Strategy()
    return strategy_class(spec, layout, count, int(row.get("gpus_per_node") or min(count, 8)))


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of ``values`` (as numpy's default)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


BOUND_DECIMALS = 4
"""Decimals of the stored bounds (log ratios), rounded outward."""


def _down(value: float) -> float:
    """``value`` rounded down to :data:`BOUND_DECIMALS` (a lower edge, rounded outward)."""
    scale = 10**BOUND_DECIMALS
    return float(math.floor(value * scale + 1e-6) / scale)


LOWER_EDGE_PRIOR_SOURCES = MIN_CLASS_SOURCES
"""How many sources' worth of weight the pooled lower edge has against a class's own.

A class's lower edge is ``(s * own + k * pooled) / (s + k)`` over its ``s`` sources: a
class at the fewest sources that make it a class (:data:`MIN_CLASS_SOURCES`) is half its
own and half the pooled edge, one with eleven sources mostly its own (docs/accuracy.md,
"The lower edge shrunk, the upper one floored")."""


def _band(values: list[float]) -> dict[str, Any]:
    lo, hi = (quantile(values, q) for q in QUANTILES)
    # the interval always contains the point estimate; rounded outward, so that a row that
    # sits on an edge (a quantile that falls on a rank) stays inside (rounded to nearest, a
    # lower edge of -0.08034 became -0.0803 and left its own row out: 4 of the 73 memory rows)
    scale = 10**BOUND_DECIMALS
    return {
        "lo": _down(min(0.0, lo)),
        "hi": math.ceil(max(0.0, hi) * scale - 1e-6) / scale,
        "rows": len(values),
    }


def class_bounds(residuals: list[tuple[str, str, float]]) -> dict[str, Any]:
    """Per-class bounds of ``(job class, source, log ratio)`` residuals, as ``bounds.yaml``
    holds them: a class with fewer than :data:`MIN_CLASS_ROWS` rows or
    :data:`MIN_CLASS_SOURCES` sources is pooled.

    A class's own edges are kept as ``own_lo`` / ``own_hi``. Its rows come from a few sources
    (2 to 11), so its own percentiles say little about how far the next engine's job lands:

    - the **upper edge** (more memory than estimated: the run goes out of memory; more time:
      it runs over) is at least the pooled one, and the class adds its own tail
      (data-parallel's slow DeepSpeedExamples runs, say). ``fits`` reads it.
    - the **lower edge** is the class's own shrunk toward the pooled one by its sources
      (:data:`LOWER_EDGE_PRIOR_SOURCES`). Floored too, as until 2026-12-05, it left 5.6% of
      the memory rows and 7.8% of the training rows below their held-out bands where 10% is
      the nominal share, and the 80% bounds held 87% of the memory rows.

    Measured on the source-held-out coverage (:func:`coverage`): flooring both edges
    (2026-12-04) took training 70.5% -> 82% and memory 75% -> 78%; shrinking the lower one
    (2026-12-05) 84.7% -> 82.3% and 84.2% -> 81.4%, the share above the upper edge unchanged.
    """
    from gpuplan.estimate.bounds import JOB_CLASSES

    pooled = {**_band([r for _, _, r in residuals]), "sources": len({s for _, s, _ in residuals})}
    classes: dict[str, Any] = {}
    for cls in JOB_CLASSES:
        values = [r for c, _, r in residuals if c == cls]
        sources = len({s for c, s, _ in residuals if c == cls})
        if len(values) < MIN_CLASS_ROWS or sources < MIN_CLASS_SOURCES:
            classes[cls] = {"pooled": True, "rows": len(values), "sources": sources}
            continue
        own = _band(values)
        k = LOWER_EDGE_PRIOR_SOURCES
        classes[cls] = {
            "lo": _down((sources * own["lo"] + k * pooled["lo"]) / (sources + k)),
            "hi": max(own["hi"], pooled["hi"]),
            "own_lo": own["lo"],
            "own_hi": own["hi"],
            "rows": own["rows"],
            "sources": sources,
        }
    return {"pooled": pooled, "classes": classes}


def band_of(table: dict[str, Any], cls: str) -> tuple[float, float]:
    """(lo, hi) of a class in a :func:`class_bounds` table."""
    entry = table["classes"].get(cls) or {"pooled": True}
    src = table["pooled"] if entry.get("pooled") else entry
    return float(src["lo"]), float(src["hi"])


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Coverage:
    """How often the measured value falls inside its 80% bounds."""

    rows: int
    inside: float
    """Share of rows inside the shipped bounds (``bounds.yaml``) around their LOSO prediction."""
    inside_held_out: float
    """The same with each source's bounds recomputed without it (bounds out of sample too)."""
    median_half_width: float
    """Median of ``(hi - lo) / 2`` relative to the point estimate (0.2 = +/-20%)."""

    def as_json(self) -> dict[str, Any]:
        """Plain mapping for ``validate --json``."""
        return dataclasses.asdict(self)


def residuals(loso: LosoReport, table: Path, kind: str) -> list[tuple[str, str, str, float]]:
    """``(row id, source, job class, log ratio)`` of each LOSO row; time-directed for training."""
    root = table.resolve().parent.parent
    rows = {r["id"]: r for r in _ok_rows(table)}
    out = []
    for row in loso.report.rows:
        r = time_log_ratio(row) if kind == "time" else log_ratio(row)
        if r is not None:
            # only predicted rows: a row whose model does not resolve has no class either
            out.append((row.id, row.source, row_job_class(rows[row.id], root), r))
    return out


def coverage(loso: LosoReport, table: Path, kind: str) -> Coverage | None:
    """Coverage of the shipped bounds and of source-held-out bounds on the LOSO rows."""
    from gpuplan.estimate.bounds import Kind, bounds_for

    res = residuals(loso, table, kind)
    if not res:
        return None
    k: Kind = "time" if kind == "time" else "memory"
    inside = inside_held = 0
    widths = []
    for _, source, cls, r in res:
        b = bounds_for(k, cls)
        inside += b.lo <= r <= b.hi
        widths.append((math.exp(b.hi) - math.exp(b.lo)) / 2)
        others = [(c, s, x) for _, s, c, x in res if s != source]
        lo, hi = band_of(class_bounds(others), cls) if others else (0.0, 0.0)
        inside_held += lo <= r <= hi
    return Coverage(
        rows=len(res),
        inside=inside / len(res),
        inside_held_out=inside_held / len(res),
        median_half_width=statistics.median(widths),
    )
