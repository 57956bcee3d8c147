"""Validation against published measurements: predicted vs measured, per row.

Tables live in the repository's ``validation/`` folder (one CSV per
estimator, a source per row). Each row names a job spec (a YAML flow mapping),
the hardware, what was measured and how; rows the estimator cannot represent
stay in the table with ``status=excluded`` and the reason, so the denominator
is honest.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuplan.errors import GpuPlanError, SpecError

if TYPE_CHECKING:  # the estimators load lazily: `validate` alone pays for them
    from gpuplan.catalog.schema import GpuSpec
    from gpuplan.estimate.speed import TimeEstimate
    from gpuplan.spec import JobSpec

UNIT_BYTES = {"B": 1, "MiB": 2**20, "GiB": 2**30, "MB": 10**6, "GB": 10**9}
UNIT_SCALE = {
    **UNIT_BYTES,
    "s": 1,
    "min": 60,
    "h": 3600,
    "days": 86400,
    "tokens/s/gpu": 1,
    "samples/s": 1,
    "gpu_hours": 1,
    "fraction": 1,
    "percent": 0.01,
    "TFLOP/s": 1,
}


def default_table(name: str) -> Path:
    """``validation/<name>.csv`` of the source checkout this package runs from."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "validation" / f"{name}.csv"
        if candidate.is_file():
            return candidate
    raise SpecError(
        f"--table: validation/{name}.csv not found next to this installation",
        hint="run from a source checkout, or pass --table PATH",
    )


TIME_METRICS = frozenset({"step_time_s", "time_to_train_s", "gpu_hours"})
"""Training metrics that measure time: a value below the measurement is a plan that runs over."""
RATE_METRICS = frozenset({"tokens_per_s_per_gpu", "samples_per_s", "mfu", "model_tflops_per_gpu"})
"""Training metrics that measure speed: a value below the measurement is a pessimistic plan; the
run's time is short-predicted when the value is above it."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RowResult:
    """One validation row: prediction, measurement and signed error."""

    id: str
    metric: str
    predicted: float
    measured: float
    error: float | None
    note: str = ""
    multi_node: bool = False
    source: str = ""
    """The row's source group (:func:`source_of`), for leave-one-source-out figures."""

    @property
    def abs_error(self) -> float | None:
        """Absolute relative error, or None if the row failed."""
        return None if self.error is None else abs(self.error)

    @property
    def time_error(self) -> float | None:
        """Signed relative error of the run's time, whatever the metric: predicted over measured
        time, less 1 (a speed metric is inverted). Negative: the run takes longer than planned.
        None for memory rows and rows that failed."""
        if self.error is None:
            return None
        if self.metric in TIME_METRICS:
            return self.error
        if self.metric in RATE_METRICS and self.predicted > 0:
            return self.measured / self.predicted - 1.0
        return None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """A whole table's results and summary statistics."""

    table: str
    rows: tuple[RowResult, ...]
    excluded: tuple[tuple[str, str], ...]

    @property
    def errors(self) -> list[float]:
        """Absolute relative errors of the rows that ran."""
        return [r.abs_error for r in self.rows if r.abs_error is not None]

    @property
    def median_abs_error(self) -> float:
        """Median absolute relative error (0.1 = 10%)."""
        return statistics.median(self.errors) if self.errors else float("nan")

    @property
    def worst(self) -> RowResult | None:
        """The row with the largest absolute error."""
        done = [r for r in self.rows if r.abs_error is not None]
        return max(done, key=lambda r: r.abs_error or 0.0) if done else None

    @property
    def under_predicted(self) -> int:
        """Rows predicted more than 10% below the measurement: for memory a dangerous 'fits';
        for training it depends on the metric (a low speed is a pessimistic plan, a low time an
        optimistic one), so training also counts :attr:`time_under_predicted`."""
        return sum(1 for r in self.rows if r.error is not None and r.error < -0.10)

    @property
    def time_under_predicted(self) -> int | None:
        """Rows whose run time is predicted more than 10% short (a plan that runs over its
        deadline and budget), whatever the metric; None for a table without time or speed."""
        errs = [r.time_error for r in self.rows if r.time_error is not None]
        if not errs and not any(r.metric in TIME_METRICS | RATE_METRICS for r in self.rows):
            return None
        return sum(1 for e in errs if e < -0.10)

    def _median_of(self, multi: bool) -> float | None:
        errs = [r.abs_error for r in self.rows if r.abs_error is not None and r.multi_node == multi]
        return statistics.median(errs) if errs else None

    def gate_failures(
        self,
        *,
        max_median: float | None = None,
        max_under: float | None = None,
        max_over_50: int | None = None,
        max_time_under: float | None = None,
    ) -> list[str]:
        """Why this report fails the CI gates (empty when it passes or no gate is set)."""
        s = self.summary()
        out = []
        gated = (max_median, max_under, max_over_50, max_time_under) != (None,) * 4
        if gated and not self.errors:
            out.append(f"none of the {len(self.rows)} rows could be predicted: nothing was gated")
        if max_median is not None and not self.median_abs_error <= max_median:
            out.append(
                f"median |error| {self.median_abs_error:.1%} exceeds --max-median {max_median:.1%}"
            )
        if max_under is not None and self.under_predicted / max(1, s["rows"]) > max_under:
            out.append(
                f"{self.under_predicted} of {s['rows']} rows predicted >10% below the "
                f"measurement, more than --max-under {max_under:.0%}"
            )
        short = self.time_under_predicted
        if max_time_under is not None and (short or 0) / max(1, s["rows"]) > max_time_under:
            out.append(
                f"{short} of {s['rows']} rows have their run time predicted >10% short, more "
                f"than --max-time-under {max_time_under:.0%}"
            )
        if max_over_50 is not None and s["rows_over_50pct"] > max_over_50:
            out.append(
                f"{s['rows_over_50pct']} rows off by more than 50%, more than --max-over-50 "
                f"{max_over_50}"
            )
        return out

    def by_source(self) -> list[dict[str, Any]]:
        """Each source's rows that ran and their median |error|, the largest source first.

        The unseen measurements a user brings come from many sources, each with its own engine
        and blind spots, so the spread over sources says more than a median over rows that one
        large source dominates."""
        groups: dict[str, list[float]] = {}
        for r in self.rows:
            if r.abs_error is not None:
                groups.setdefault(r.source, []).append(r.abs_error)
        return [
            {"source": src, "rows": len(errs), "median_abs_error": statistics.median(errs)}
            for src, errs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        ]

    def summary(self) -> dict[str, Any]:
        """Plain summary for JSON output."""
        worst = self.worst
        return {
            "median_abs_error_single_node": self._median_of(False),
            "median_abs_error_multi_node": self._median_of(True),
            "rows_over_50pct": sum(
                1 for r in self.rows if r.abs_error is not None and r.abs_error > 0.5
            ),
            "table": self.table,
            "rows": len(self.rows),
            "excluded": len(self.excluded),
            "median_abs_error": self.median_abs_error,
            "worst_abs_error": worst.abs_error if worst else None,
            "worst_id": worst.id if worst else None,
            "under_predicted_over_10pct": self.under_predicted,
            "time_under_predicted_over_10pct": self.time_under_predicted,
            "median_of_source_medians": _median_of_sources(self.by_source()),
        }


def _median_of_sources(groups: list[dict[str, Any]]) -> float | None:
    """The median over sources of each source's median |error| (each source weighs 1)."""
    return statistics.median(g["median_abs_error"] for g in groups) if groups else None


SOURCE_ALIASES = {"huggingface.co/mosaicml": "github.com/mosaicml/llm-foundry"}
"""Sources that are one source: MosaicML's MPT-7B model card reports a run of llm-foundry."""


def source_of(row: dict[str, str]) -> str:
    """The source group of a row, the unit that leave-one-source-out holds out together.

    A source is the publication or repository a number comes from, as that is what shares
    an engine, a measurement method and its blind spots: ``github.com/<owner>/<repo>``
    (all documents and tables of one repository together), for MLPerf the submitter
    (``mlcommons:<submitter>``, across rounds: one organisation's code and systems), an
    arXiv paper by its number (when named before any repository), a Hugging Face model card by its owner (with the aliases in
    ``SOURCE_ALIASES``), else the source text up to its first parenthesis.
    """
    text = row.get("source", "")
    mlperf = re.search(r"mlcommons/training_results_v[\d.]+ \(commit \w+\) : ([\w.-]+)/", text)
    if mlperf:
        return f"mlcommons:{mlperf.group(1)}"
    github = re.search(r"github\.com/([\w.-]+)/([\w.-]+)", text)
    arxiv = re.search(r"arXiv:\s*(\d{4}\.\d{4,5})", text)
    # the publication named first is the source (a paper whose run scripts live on GitHub)
    if arxiv and (not github or arxiv.start() < github.start()):
        return f"arXiv:{arxiv.group(1)}"
    if github:
        return f"github.com/{github.group(1)}/{github.group(2)}"
    hub = re.search(r"huggingface\.co/([\w.-]+)", text)
    if hub:
        key = f"huggingface.co/{hub.group(1)}"
        return SOURCE_ALIASES.get(key, key)
    return text.split("(")[0].strip() or "unknown"


@functools.lru_cache(maxsize=1)
def _catalog() -> Any:
    from gpuplan.catalog.loader import load_catalog

    return load_catalog(use_user=False)


@functools.lru_cache(maxsize=1024)
def row_spec(text: str, row_id: str, repo_root: Path) -> Any:
    """The parsed spec of a row (cached: the fitting scripts predict each row many times)."""
    from gpuplan.spec import parse_spec

    return parse_spec(parse_row_spec(text, repo_root), origin=f"validation row {row_id}")


#: Columns every validation table has (others are optional per estimator).
REQUIRED_COLUMNS = ("id", "spec", "gpu", "count", "metric", "measured")


def read_table(path: Path) -> list[dict[str, str]]:
    """Rows of a validation CSV (see :mod:`gpuplan.userfile` for what is refused)."""
    from gpuplan.userfile import read_csv

    header, rows = read_csv(path, what="--table", error=SpecError)
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise SpecError(
            f"--table: {path}: missing column(s) {', '.join(missing)}; "
            f"a validation table has {', '.join(REQUIRED_COLUMNS)} (and status, unit, ...)"
        )
    return rows


def _number(row: dict[str, str], key: str, where: str, *, integer: bool = False) -> float:
    raw = row.get(key, "").strip()
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise SpecError(f"{where}: {key}: expected {kind} > 0, got {raw!r}") from None
    if not (0 < value < float("inf")):
        raise SpecError(f"{where}: {key}: expected a number > 0, got {raw!r}")
    return value


def _check_row(row: dict[str, str], where: str) -> float:
    """Validate the numeric cells of an ``ok`` row; return the measurement in base units."""
    if not row["id"].strip():
        raise SpecError(f"{where}: id: empty")
    for key in ("count", "gpus_per_node"):
        if key == "count" or row.get(key, "").strip():
            _number(row, key, where, integer=True)
    for key in ("inter_node_gbps", "cuda_context_mib"):
        if row.get(key, "").strip():
            _number(row, key, where)
    if row.get("memory_total_mib", "").strip():
        _number(row, "memory_total_mib", where, integer=True)
    unit = row.get("unit", "").strip()
    if unit and unit not in UNIT_SCALE:
        raise SpecError(f"{where}: unit: unknown {unit!r}; allowed: {', '.join(UNIT_SCALE)}")
    return _number(row, "measured", where) * UNIT_SCALE.get(unit, 1)


def parse_row_spec(text: str, repo_root: Path) -> dict[str, Any]:
    """The spec mapping of a row; model paths are relative to the repo root."""
    from gpuplan.userfile import parse_yaml

    data = parse_yaml(text, what="spec", path=None, error=SpecError)
    if not isinstance(data, dict):
        raise SpecError(f"spec: expected a mapping, got {text!r}")
    model = data.get("model")
    if isinstance(model, str) and model.endswith(".json"):
        data["model"] = str(repo_root / model)
    return data


def run_table(path: Path, predict: Callable[[dict[str, str], Path], tuple[float, str]]) -> Report:
    """Run ``predict(row, repo_root) -> (bytes or value, note)`` on every ``ok`` row."""
    repo_root = path.resolve().parent.parent
    results: list[RowResult] = []
    excluded: list[tuple[str, str]] = []
    table = read_table(path)
    for n, row in enumerate(table, start=1):
        if row.get("status", "ok") != "ok":
            excluded.append((row["id"], row.get("notes", "")))
            continue
        measured = _check_row(row, f"--table: {path}: row {n} ({row['id'][:40]})")
        try:
            predicted, note = predict(row, repo_root)
        except GpuPlanError as exc:
            results.append(
                RowResult(
                    id=row["id"],
                    metric=row["metric"],
                    predicted=float("nan"),
                    measured=measured,
                    error=None,
                    note=exc.one_line(),
                    source=source_of(row),
                )
            )
            continue
        results.append(
            RowResult(
                id=row["id"],
                metric=row["metric"],
                predicted=predicted,
                measured=measured,
                error=(predicted - measured) / measured,
                note=note,
                multi_node=int(row.get("count") or 1) > int(row.get("gpus_per_node") or 8),
                source=source_of(row),
            )
        )
    if not results:
        why = f"all {len(excluded)} rows are excluded" if excluded else "it has no rows"
        raise SpecError(
            f"--table: {path}: nothing to validate: {why}; a gate over no rows would pass vacuously"
        )
    return Report(table=str(path), rows=tuple(results), excluded=tuple(excluded))


def predict_memory(row: dict[str, str], repo_root: Path) -> tuple[float, str]:
    """Predicted bytes of a memory row, in the row's metric."""
    return _predict_memory(row, repo_root, traced=False)


def predict_memory_traced(row: dict[str, str], repo_root: Path) -> tuple[float, str]:
    """The same, from the traced estimate (``fit --trace``: the real model on the meta device,
    PyTorch's caching allocator replayed); a row the tracer cannot run raises its reason."""
    return _predict_memory(row, repo_root, traced=True)


_TRACED: dict[tuple[str, ...], Any] = {}
"""Traced results by (repository, spec, GPU, count, context, memory size): a row's three
metrics share one trace (seconds each)."""


def _traced_result(row: dict[str, str], repo_root: Path) -> Any:
    fields = ("spec", "gpu", "count", "cuda_context_mib", "memory_total_mib")
    key = (str(repo_root), *(row.get(k, "") for k in fields))
    if key not in _TRACED:
        _TRACED[key] = _memory_result(row, repo_root, traced=True)
    return _TRACED[key]


def _predict_memory(row: dict[str, str], repo_root: Path, *, traced: bool) -> tuple[float, str]:
    result = (
        _traced_result(row, repo_root) if traced else _memory_result(row, repo_root, traced=False)
    )
    m = result.memory
    value = {
        "allocated": m.peak_allocated_bytes,
        "reserved": m.peak_reserved_bytes,
        "device_used": m.device_used_bytes,
    }.get(row["metric"])
    if value is None:
        raise SpecError(f"metric: {row['metric']!r} is not allocated, reserved or device_used")
    return value, result.strategy.label()


def _memory_result(row: dict[str, str], repo_root: Path, *, traced: bool) -> Any:
    from gpuplan.estimate.fit import fit

    spec = row_spec(row["spec"], row["id"], repo_root)
    cat = _catalog()
    context = float(row["cuda_context_mib"]) * 2**20 if row.get("cuda_context_mib") else None
    gpu = cat.gpu(row["gpu"])
    if row.get("memory_total_mib", "").strip():
        # a variant of the catalog GPU with another memory size (the row's notes say which):
        # its capacity as the driver reports it, everything else the catalog GPU's
        mib = int(row["memory_total_mib"])
        gpu = gpu.model_copy(
            update={
                "memory_total_mib": mib,
                "memory_bytes": mib * 2**20,
                "memory_total_source": f"validation row {row['id']} (memory_total_mib)",
            }
        )
    if traced:  # as fit --trace: the tracer runs Transformers' code, whatever the layout
        from gpuplan.estimate.fit import pinned_framework

        spec = pinned_framework(spec)
    result = fit(spec, gpu, int(row["count"]), cuda_context_bytes=context)
    if traced:
        from gpuplan.trace import trace_fit

        result = trace_fit(spec, result)
    return result


def format_rows(rows: Sequence[RowResult], scale: float, unit: str) -> list[list[str]]:
    """Table cells for a report (predicted and measured in ``unit``)."""
    out = []
    for r in rows:
        err = "failed" if r.error is None else f"{r.error:+.1%}"
        out.append(
            [
                r.id[:60],
                r.metric,
                f"{r.predicted / scale:.4g}",
                f"{r.measured / scale:.4g}",
                err,
                r.note[:60],
            ]
        )
    return out


_TOPOLOGY_COLUMNS = ("gpu", "count", "gpus_per_node", "intra_node", "inter_node_gbps", "fabric")


@functools.lru_cache(maxsize=1024)
def _training_layout(spec_text: str, row_id: str, repo_root: Path, hw: tuple[str, ...]) -> Any:
    """What a training row times, resolved once: an explicit layout does not depend on the
    efficiencies, so the fitting scripts only re-run the time estimate."""
    from gpuplan.estimate.configure import default_topology
    from gpuplan.estimate.fit import check_precision, explicit_strategy, memory_job, spec_shape
    from gpuplan.spec import ParallelismSpec

    gpu_id, count_s, gpn_s, intra, inter, fabric = hw
    spec = row_spec(spec_text, row_id, repo_root)
    gpu = _catalog().gpu(gpu_id)
    count = int(count_s)
    topo = default_topology(
        gpu,
        count,
        gpus_per_node=int(gpn_s) if gpn_s else None,
        intra_node=intra or None,
        inter_node_gbps=float(inter) if inter else None,
        fabric=fabric or None,
    )
    if not isinstance(spec.parallelism, ParallelismSpec):
        return spec, gpu, count, topo, None
    check_precision(spec, gpu)
    shape = spec_shape(spec)
    st = explicit_strategy(spec, count, shape)
    return spec, gpu, count, topo, (shape, memory_job(spec, shape), st)


def training_time(row: dict[str, str], repo_root: Path) -> tuple[TimeEstimate, str]:
    """The time estimate of a training row's layout, and the layout's label."""
    t, label, _, _ = _timed(row, repo_root)
    return t, label


def _timed(row: dict[str, str], repo_root: Path) -> tuple[TimeEstimate, str, JobSpec, GpuSpec]:
    from gpuplan.estimate.configure import configure
    from gpuplan.estimate.speed import estimate_time

    hw = tuple(row.get(c) or "" for c in _TOPOLOGY_COLUMNS)
    spec, gpu, count, topo, explicit = _training_layout(row["spec"], row["id"], repo_root, hw)
    if explicit is not None:
        # the layout ran for real: time it even where our (conservative) memory model disagrees
        shape, job, st = explicit
        t = estimate_time(shape, job, st, gpu, topo, work=spec.work, image_size=spec.image_size)
        return t, st.label(), spec, gpu
    conf = configure(spec, gpu, count, topo, with_scaling=False, require_fit=False)
    return conf.time, conf.strategy.label(), spec, gpu


def predict_training(row: dict[str, str], repo_root: Path) -> tuple[float, str]:
    """Predicted value of a training row, in its metric (seconds, tokens/s/GPU, ...)."""
    t, label, spec, gpu = _timed(row, repo_root)
    from gpuplan.estimate.compute import peak_flops

    dtype = {"fp32": "fp32", "tf32": "tf32"}.get(spec.precision, spec.precision.split("-")[0])
    peak = peak_flops(gpu, dtype)
    metric = row["metric"]
    value = {
        "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
        "samples_per_s": t.samples_per_s,
        "step_time_s": t.step_time_s,
        "time_to_train_s": t.time_to_train_s,
        "gpu_hours": t.gpu_hours,
        "mfu": t.mfu,
        "model_tflops_per_gpu": t.mfu * peak / 1e12,
    }.get(metric)
    if value is None:
        raise SpecError(
            f"metric: cannot predict {metric!r} for row {row['id']} (missing work or not a text model)"
        )
    return float(value), label


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A training row whose layout ran as published but which the memory model refuses."""

    id: str
    strategy: str
    device_used_bytes: float
    capacity_bytes: float

    def as_json(self) -> dict[str, Any]:
        """Plain mapping for ``validate --json``."""
        return dataclasses.asdict(self)


def refused_rows(table: Path) -> list[Refusal]:
    """Training rows with a stated layout that the memory estimate says does not fit.

    Each ran as published, so every one is a false "does not fit": the planner would have
    sent the user to a dearer configuration.
    """
    from gpuplan.estimate.memory import estimate_memory

    root = table.resolve().parent.parent
    out = []
    for row in read_table(table):
        if row.get("status", "ok") != "ok":
            continue
        hw = tuple(row.get(c) or "" for c in _TOPOLOGY_COLUMNS)
        try:
            spec, gpu, _, topo, explicit = _training_layout(row["spec"], row["id"], root, hw)
        except GpuPlanError:
            continue
        if explicit is None:
            continue
        shape, job, st = explicit
        # as `fit` sees the layout: the pipeline stage that peaks higher
        mem = estimate_memory(
            shape,
            job,
            st,
            gpu,
            image_size=spec.image_size,
            intra_node=topo.intra_node,
            gpus_per_node=topo.gpus_per_node,
        )
        if not mem.fits:
            out.append(
                Refusal(
                    id=row["id"],
                    strategy=st.label(),
                    device_used_bytes=mem.device_used_bytes,
                    capacity_bytes=mem.capacity_bytes,
                )
            )
    return out
