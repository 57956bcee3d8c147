"""The Prometheus path against a real Prometheus server (Debian package ``prometheus``)
scraping loopback exporters that serve recorded dcgm-exporter pages with scripted values."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from watch_helpers import DATA, SAMPLES, free_port, serve

from gpuplan.monitor.actions import (
    ActionContext,
    ActionPlan,
    ActionResult,
    CommandAction,
    PreStopHook,
)
from gpuplan.monitor.clock import SystemClock
from gpuplan.monitor.fleet import FleetConfig, FleetPolicy
from gpuplan.monitor.fleet_agent import FleetAgent
from gpuplan.monitor.fleet_sampler import PrometheusFleetSampler
from gpuplan.monitor.prometheus import PrometheusClient, PrometheusSampler

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus binary not installed"
)

GROUP = "gpu-pool"
MIG_PAGE = SAMPLES / "dcgm-exporter" / "dcgm-exporter-317_a30-mig_gr-engine-active_excerpt1.prom"


def page_for(values: list[float]) -> str:
    """data/dcgm_two_gpus.prom with scripted utilization values for its first GPUs."""
    lines = []
    k = 0
    for line in (DATA / "dcgm_two_gpus.prom").read_text().splitlines():
        if line.startswith("DCGM_FI_DEV_GPU_UTIL{"):
            line = line.rsplit(" ", 1)[0] + f" {values[k]:g}"
            k += 1
        if line.startswith("DCGM_FI_DEV_POWER_USAGE{") and 'gpu="2"' in line:
            continue  # only two GPUs on these nodes
        lines.append(line)
    return "\n".join(lines) + "\n"


class Exporter:
    """A scripted dcgm-exporter on 127.0.0.1 (its page can change between scrapes)."""

    def __init__(self, body: str) -> None:
        self.body = body

        def factory(_: object) -> type[BaseHTTPRequestHandler]:
            exporter = self

            class Handler(BaseHTTPRequestHandler):
                def do_GET(self) -> None:  # noqa: N802
                    data = exporter.body.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

                def log_message(self, *args: Any) -> None:
                    pass

            return Handler

        self.server, _ = serve(factory)  # type: ignore[arg-type]
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        return list(json.loads(resp.read())["data"]["result"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("prom")
    exporters = {
        "i-0000000000000000a": Exporter(page_for([60, 70])),
        "i-0000000000000000b": Exporter(page_for([50, 40])),
        "i-0000000000000000c": Exporter(page_for([90, 80])),
        # A MIG node: GR_ENGINE_ACTIVE per instance, no DCGM_FI_DEV_GPU_UTIL -> unknown.
        "i-0000000000000000d": Exporter(
            MIG_PAGE.read_text()
            if MIG_PAGE.exists()
            else page_for([0, 0]).replace("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
        ),
    }
    targets = "\n".join(
        f"      - targets: ['{e.address}']\n        labels: {{group: '{GROUP}', instance_id: '{name}'}}"
        for name, e in exporters.items()
    )
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: dcgm\n    static_configs:\n{targets}\n"
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(  # noqa: S603
        [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if (
                    len(query(base, f'up{{group="{GROUP}"}} == 1')) == 4
                    and len(query(base, f'DCGM_FI_DEV_GPU_UTIL{{group="{GROUP}"}}')) == 6
                ):
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail(
                "prometheus did not scrape the exporters: "
                + (tmp / "prometheus.log").read_text()[-2000:]
            )
        yield {"base": base, "exporters": exporters, "tmp": tmp}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        for e in exporters.values():
            e.stop()


def wait_for(base: str, promql: str, predicate: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate(query(base, promql)):
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {promql}")


def test_fleet_sampler_reads_every_instance(fleet: dict[str, Any]) -> None:
    sampler = PrometheusFleetSampler(
        PrometheusClient(fleet["base"]), group=GROUP, instance_label="instance_id"
    )
    obs = sampler.poll(0.0)
    assert obs.error is None
    by_name = {i.name: i for i in obs.instances}
    assert sorted(by_name) == sorted(fleet["exporters"])
    assert [g.utilization_pct for g in by_name["i-0000000000000000a"].gpus] == [60.0, 70.0]
    mig = by_name["i-0000000000000000d"]
    assert mig.gpus and all(g.utilization_pct is None for g in mig.gpus)


def test_single_host_sampler(fleet: dict[str, Any]) -> None:
    sampler = PrometheusSampler(
        PrometheusClient(fleet["base"]), 'instance_id="i-0000000000000000b"'
    )
    sample = sampler.sample()
    assert sample.error is None and [g.utilization_pct for g in sample.gpus] == [50.0, 40.0]
    gr = PrometheusSampler(
        PrometheusClient(fleet["base"]),
        'instance_id="i-0000000000000000d"',
        metric="DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    )
    if MIG_PAGE.exists():
        assert [g.utilization_pct for g in gr.sample().gpus] == [0.0] * 5
    down = PrometheusSampler(
        PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout_s=1), 'x="y"'
    )
    assert down.sample().error is not None


class Recording:
    name = "remove"

    def __init__(self) -> None:
        self.targets: list[str] = []

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        assert ctx.target is not None
        self.targets.append(ctx.target)
        return ActionResult(
            action=self.name, executed=execute, ok=True, detail=f"removed {ctx.target}"
        )


def test_fleet_scales_in_by_one_after_the_mean_drops(fleet: dict[str, Any]) -> None:
    base, exporters, tmp = fleet["base"], fleet["exporters"], fleet["tmp"]
    sampler = PrometheusFleetSampler(
        PrometheusClient(base), group=GROUP, instance_label="instance_id"
    )
    drained = tmp / "drained"
    remover = Recording()
    plan = ActionPlan(
        pre_stop=PreStopHook(
            ["sh", "-c", f"echo {{instance}} >> {drained}"], timeout_s=5, name="drain-hook"
        ),
        main=remover,
    )
    cfg = FleetConfig(
        scale_in_below_pct=30, window_s=1.5, interval_s=0.25, cooldown_s=60, min_size=2, warmup_s=0
    )
    agent = FleetAgent(
        poll=sampler.poll, policy=FleetPolicy(cfg), plan=plan, clock=SystemClock(), execute=True
    )
    agent.run(max_steps=8)  # ~2 s with the mean at 65 %: nothing happens
    assert remover.targets == []
    exporters["i-0000000000000000a"].body = page_for([5, 3])
    exporters["i-0000000000000000b"].body = page_for([1, 0])
    exporters["i-0000000000000000c"].body = page_for([40, 50])
    wait_for(
        base,
        f'DCGM_FI_DEV_GPU_UTIL{{group="{GROUP}",instance_id="i-0000000000000000c"}}',
        lambda r: r and float(r[0]["value"][1]) <= 50,
    )
    agent.run(max_steps=14)  # ~3.5 s with the mean at 16.5 %: exactly one removal
    assert remover.targets == ["i-0000000000000000b"]  # least utilized; d (MIG, unknown) never
    assert drained.read_text().split() == ["i-0000000000000000b"]
    decision, results = agent.actions[0]
    assert decision.mean_pct is not None and decision.mean_pct < 30
    assert [r.action for r in results] == ["drain-hook", "remove"]


def test_scrape_failure_makes_an_instance_unknown(fleet: dict[str, Any]) -> None:
    base, exporters = fleet["base"], fleet["exporters"]
    exporters["i-0000000000000000c"].stop()
    wait_for(
        base, f'up{{group="{GROUP}",instance_id="i-0000000000000000c"}} == 0', lambda r: len(r) == 1
    )
    sampler = PrometheusFleetSampler(
        PrometheusClient(base), group=GROUP, instance_label="instance_id"
    )
    by_name = {i.name: i for i in sampler.poll(0.0).instances}
    assert (
        by_name["i-0000000000000000c"].error is not None
        and "up=0" in by_name["i-0000000000000000c"].error
    )


def test_command_removal_substitutes_the_instance() -> None:
    result = CommandAction(["echo", "remove", "{instance}"]).run(
        ActionContext(reason="r", target="i-1"), execute=True
    )
    assert result.ok and "remove i-1" in result.detail
