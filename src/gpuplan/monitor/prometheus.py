"""dcgm-exporter metrics, from a Prometheus server or from a ``/metrics`` page.

Only the standard library is used for HTTP (``urllib``); ``prometheus-client``
is needed only to parse exposition text (:func:`sample_from_exposition`).

GPU keys come from the ``UUID`` label (``uuid`` with ``--use-old-namespace``),
plus ``/GI<GPU_I_ID>`` for a MIG instance; metric names match case-insensitively
(old namespace names are lower case). A GPU that appears in *any* DCGM series
but lacks the utilization metric is unknown, never idle: e.g.
``DCGM_FI_DEV_GPU_UTIL`` does not exist per MIG instance (use
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` there).
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuplan.errors import MonitorError, UnknownNameError
from gpuplan.monitor.readings import GpuReading, GpuSample

# Percent per unit of each supported metric (ratios are 0..1, GPU_UTIL is 0..100).
METRIC_SCALES: dict[str, float] = {
    "DCGM_FI_DEV_GPU_UTIL": 1.0,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 100.0,
    "DCGM_FI_PROF_SM_ACTIVE": 100.0,
}
_LABEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_METRIC_RE = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")


@dataclass(frozen=True, slots=True)
class Series:
    """One instant-vector element.

    Attributes:
        labels: the series labels (``__name__`` included when known).
        value: the value, ``None`` when it is NaN or not a number.
        at: the query's evaluation time (Unix seconds), when known.
    """

    labels: Mapping[str, str]
    value: float | None
    at: float | None = None


def metric_scale(metric: str, scale: float | None = None) -> float:
    """Percent per unit for ``metric``; unknown metrics need an explicit ``scale``.

    Raises:
        UnknownNameError: the metric is not known and no scale was given.
    """
    if not _METRIC_RE.match(metric):
        raise MonitorError(f"--metric: {metric!r} is not a Prometheus metric name")
    if scale is not None:
        if not (math.isfinite(scale) and scale > 0):
            raise MonitorError(f"--metric-scale: must be > 0, got {scale:g}")
        return scale
    known = {k.lower(): v for k, v in METRIC_SCALES.items()}
    if metric.lower() not in known:
        raise UnknownNameError("utilization metric", metric, METRIC_SCALES, field="--metric")
    return known[metric.lower()]


def label_matcher(label: str, value: str) -> str:
    """A PromQL equality matcher with the value escaped.

    >>> label_matcher("group", 'a"b')
    'group="a\\\\"b"'
    """
    if not _LABEL_RE.match(label):
        raise MonitorError(f"label name {label!r} is not a valid Prometheus label")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{label}="{escaped}"'


def gpu_key(labels: Mapping[str, str]) -> str | None:
    """The GPU key of a DCGM series: UUID, plus ``/GI<id>`` for a MIG instance."""
    uuid = labels.get("UUID") or labels.get("uuid")
    if not uuid:
        return None
    gi = labels.get("GPU_I_ID")
    return f"{uuid}/GI{gi}" if gi else uuid


def _num(text: object) -> float | None:
    try:
        value = float(str(text))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def readings_from_series(
    util: Iterable[Series], inventory: Iterable[Mapping[str, str]], scale: float
) -> tuple[GpuReading, ...]:
    """Per-GPU readings from utilization series plus the label sets of all DCGM series.

    A whole GPU that has MIG instances in the inventory is represented by its
    instances only. Processes are ``None``: DCGM gives no process list.
    """
    values: dict[str, float | None] = {}
    duplicated: set[str] = set()
    for s in util:
        key = gpu_key(s.labels)
        if key is None:
            continue
        if key in values:
            duplicated.add(key)
        values[key] = None if s.value is None else s.value * scale
    keys = {k for k in (gpu_key(lbl) for lbl in inventory) if k is not None} | set(values)
    mig_parents = {k.split("/GI", 1)[0] for k in keys if "/GI" in k}
    keys = {k for k in keys if "/GI" in k or k not in mig_parents}
    readings = []
    for key in sorted(keys):
        raw = values.get(key)
        problem = None
        if key not in values:
            problem = "utilization metric missing for this GPU"
        elif key in duplicated:
            problem, raw = "several utilization series for this GPU", None
        elif raw is None or not 0.0 <= raw <= 100.0:
            problem, raw = f"utilization value {raw!r} is not a percentage", None
        readings.append(GpuReading(uuid=key, utilization_pct=raw, processes=None, problem=problem))
    return tuple(readings)


def sample_from_exposition(text: str, metric: str, scale: float | None = None) -> GpuSample:
    """Readings from a dcgm-exporter ``/metrics`` page (Prometheus text format).

    Args:
        text: the page.
        metric: the utilization metric (``DCGM_FI_DEV_GPU_UTIL``...).
        scale: percent per unit when ``metric`` is not in :data:`METRIC_SCALES`.

    Returns:
        A sample; ``error`` is set when the page does not parse or lists no GPU.
    """
    factor = metric_scale(metric, scale)
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:  # pragma: no cover - dev and monitor extras have it
        raise MonitorError(
            "parsing /metrics pages needs prometheus-client",
            hint="pip install 'gpuplan[monitor]'",
        ) from exc
    util: list[Series] = []
    inventory: list[dict[str, str]] = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = dict(s.labels)
                if s.name.lower().startswith("dcgm_fi_"):
                    inventory.append(labels)
                if s.name.lower() == metric.lower():
                    util.append(Series(labels, _num(s.value)))
    except ValueError as exc:
        return GpuSample(source="dcgm-exporter", gpus=(), error=f"not a metrics page: {exc}")
    gpus = readings_from_series(util, inventory, factor)
    if not gpus:
        return GpuSample(source="dcgm-exporter", gpus=(), error="no DCGM GPU series on the page")
    return GpuSample(source="dcgm-exporter", gpus=gpus)


class PrometheusClient:
    """Minimal client for the Prometheus HTTP query API (``/api/v1/query``).

    Args:
        base_url: e.g. ``http://127.0.0.1:9090``.
        timeout_s: HTTP timeout in seconds.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 5.0) -> None:
        parsed = urllib.parse.urlparse(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise MonitorError(f"--prometheus: expected an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def query(self, promql: str) -> list[Series]:
        """Run an instant query and return its vector.

        Raises:
            MonitorError: on HTTP, network, JSON or API errors.
        """
        url = f"{self.base_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:  # noqa: S310 - http(s) checked
                body = json.loads(resp.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise MonitorError(f"Prometheus query failed ({promql}): {exc}") from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else body
            raise MonitorError(f"Prometheus query failed ({promql}): {error}")
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise MonitorError(f"Prometheus query {promql!r} did not return a vector")
        out = []
        for item in data.get("result") or []:
            value = item.get("value") or [None, None]
            out.append(Series(dict(item.get("metric") or {}), _num(value[1]), _num(value[0])))
        return out

    def active_targets(self) -> list[dict[str, object]]:
        """The active scrape targets (``/api/v1/targets?state=active``).

        Raises:
            MonitorError: on HTTP, network, JSON or API errors.
        """
        url = f"{self.base_url}/api/v1/targets?state=active"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:  # noqa: S310 - http(s) checked
                body = json.loads(resp.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise MonitorError(f"Prometheus targets query failed: {exc}") from exc
        data = body.get("data") if isinstance(body, dict) else None
        targets = data.get("activeTargets") if isinstance(data, dict) else None
        if not isinstance(targets, list):
            raise MonitorError("Prometheus targets query failed: no activeTargets list")
        return [t for t in targets if isinstance(t, dict)]


_PROM_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_PROM_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
    "y": 31536000.0,
}


def prometheus_duration_s(text: object) -> float | None:
    """Seconds in a Prometheus duration (``15s``, ``1m30s``); ``None`` if it is not one.

    >>> prometheus_duration_s("1m30s")
    90.0
    """
    if not isinstance(text, str) or not text:
        return None
    parts = _PROM_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _PROM_UNITS[u] for n, u in parts)


def name_matcher(metric: str) -> str:
    """A case-insensitive ``__name__`` matcher (old-namespace names are lower case)."""
    return f'__name__=~"(?i){re.escape(metric)}"'


class PrometheusSampler:
    """Sample this machine's GPUs from Prometheus (dcgm-exporter metrics).

    Queries ``{__name__=~"(?i)<metric>", <selector>}`` and, for the GPU
    inventory, ``group by (UUID, uuid, GPU_I_ID) ({__name__=~"(?i)dcgm_fi_.+", <selector>})``.
    DCGM has no process list, so processes are unknown (use ``--ignore-processes``).

    Args:
        client: the Prometheus client.
        selector: label matchers for this machine, e.g. ``Hostname="gpu-1"``.
        metric: utilization metric name.
        scale: percent per unit for metrics outside :data:`METRIC_SCALES`.
    """

    def __init__(
        self,
        client: PrometheusClient,
        selector: str,
        *,
        metric: str = "DCGM_FI_DEV_GPU_UTIL",
        scale: float | None = None,
    ) -> None:
        if not selector.strip():
            raise MonitorError(
                '--selector: needed to pick this machine\'s series, e.g. Hostname="gpu-1"'
            )
        self.client = client
        self.selector = selector.strip().strip("{}")
        self.metric = metric
        self.scale = metric_scale(metric, scale)

    def sample(self) -> GpuSample:
        """One sample; query failures come back as an unknown sample."""
        try:
            util = self.client.query(f"{{{name_matcher(self.metric)},{self.selector}}}")
            inv = self.client.query(
                f'group by (UUID, uuid, GPU_I_ID) ({{__name__=~"(?i)dcgm_fi_.+",{self.selector}}})'
            )
        except MonitorError as exc:
            return GpuSample(source="prometheus", gpus=(), error=exc.message)
        gpus = readings_from_series(util, [s.labels for s in inv], self.scale)
        if not gpus:
            return GpuSample(
                source="prometheus", gpus=(), error="no DCGM series match the selector"
            )
        return GpuSample(source="prometheus", gpus=gpus)
