"""Poll a GPU group's instances from Prometheus (dcgm-exporter series) for fleet mode."""

from __future__ import annotations

from gpuplan.errors import MonitorError
from gpuplan.monitor.fleet import FleetObservation, InstanceReading
from gpuplan.monitor.prometheus import (
    PrometheusClient,
    Series,
    label_matcher,
    metric_scale,
    name_matcher,
    prometheus_duration_s,
    readings_from_series,
)


class PrometheusFleetSampler:
    """Poll a group's instances and GPUs from Prometheus.

    Queries ``up{<group>}`` (membership) and its ``timestamp()`` (freshness),
    ``{__name__=~"(?i)<metric>", <group>}`` (utilization) and its
    ``timestamp()``, and ``group by (<instance>, UUID, uuid, GPU_I_ID)`` over
    all DCGM series (GPU inventory), where ``<group>`` is
    ``<group_label>="<group>"``. A sample older than two scrape intervals is
    unknown: the scrape interval is ``scrape_interval_s``, or each target's own
    ``scrapeInterval`` from ``/api/v1/targets`` when it is ``None``.

    Args:
        client: the Prometheus client.
        group: the group name (label value).
        group_label: the label that holds the group name on every series.
        instance_label: the label that names the instance.
        metric: utilization metric.
        scale: percent per unit for metrics outside the known list.
        scrape_interval_s: the scrape interval; ``None`` = ask Prometheus per target.
    """

    def __init__(
        self,
        client: PrometheusClient,
        *,
        group: str,
        group_label: str = "group",
        instance_label: str = "instance",
        metric: str = "DCGM_FI_DEV_GPU_UTIL",
        scale: float | None = None,
        scrape_interval_s: float | None = None,
    ) -> None:
        self.client = client
        self.group = group
        self.group_label = group_label
        self.selector = label_matcher(group_label, group)
        label_matcher(instance_label, "")  # validates the label name
        self.instance_label = instance_label
        self.metric = metric
        self.scale = metric_scale(metric, scale)
        self.scrape_interval_s = scrape_interval_s

    def _intervals(self) -> dict[str, float]:
        """Scrape interval per instance, from the active targets."""
        out: dict[str, float] = {}
        for target in self.client.active_targets():
            labels = target.get("labels")
            if not isinstance(labels, dict) or labels.get(self.group_label) != self.group:
                continue
            seconds = prometheus_duration_s(target.get("scrapeInterval"))
            name = labels.get(self.instance_label)
            if seconds is not None and isinstance(name, str):
                out[name] = seconds
        return out

    def poll(self, t_s: float) -> FleetObservation:
        """One poll; a failed query makes the whole observation unknown."""
        sel, key = self.selector, self.instance_label
        util_sel = f"{{{name_matcher(self.metric)},{sel}}}"
        try:
            up = self.client.query(f"up{{{sel}}}")
            up_ts = self.client.query(f"timestamp(up{{{sel}}})")
            util = self.client.query(util_sel)
            util_ts = self.client.query(f"timestamp({util_sel})")
            inv = self.client.query(
                f'group by ({key}, UUID, uuid, GPU_I_ID) ({{__name__=~"(?i)dcgm_fi_.+",{sel}}})'
            )
            intervals = {} if self.scrape_interval_s is not None else self._intervals()
        except MonitorError as exc:
            return FleetObservation(t_s=t_s, instances=(), error=exc.message)
        up_by = {s.labels.get(key, ""): s.value for s in up}
        names = sorted((set(up_by) | {s.labels.get(key, "") for s in util}) - {""})
        if not names:
            return FleetObservation(t_s=t_s, instances=(), error=f"no targets with {sel}")
        out = []
        for name in names:
            gpus = readings_from_series(
                [s for s in util if s.labels.get(key) == name],
                [s.labels for s in inv if s.labels.get(key) == name],
                self.scale,
            )
            interval = self.scrape_interval_s or intervals.get(name)
            error = None
            if name not in up_by:
                error = "no up series (not a scrape target of the group)"
            elif up_by[name] != 1.0:
                error = f"scrape failing (up={up_by[name]})"
            elif interval is None:
                error = "scrape interval unknown (pass --scrape-interval)"
            else:
                error = _staleness(
                    [s for s in up_ts if s.labels.get(key) == name], interval, "scrape"
                ) or _staleness(
                    [s for s in util_ts if s.labels.get(key) == name],
                    interval,
                    "utilization sample",
                )
            in_service = error is None
            if error is None and not gpus:
                error = "no DCGM series"
            out.append(InstanceReading(name=name, gpus=gpus, error=error, in_service=in_service))
        return FleetObservation(t_s=t_s, instances=tuple(out))


def _staleness(stamps: list[Series], interval_s: float, what: str) -> str | None:
    """Why the newest of these samples is too old (> 2 scrape intervals), else ``None``."""
    worst = None
    for s in stamps:
        if s.value is None or s.at is None:
            return f"{what} time unknown"
        age = s.at - s.value
        worst = age if worst is None else max(worst, age)
    if worst is not None and worst > 2 * interval_s:
        return f"last {what} {worst:.0f}s old > 2 x scrape interval {interval_s:g}s"
    return None
