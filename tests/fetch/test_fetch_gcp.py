"""GCP fetcher against a fake Cloud Billing Catalog API (stdlib client, API key)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fetch_fakeapi import (
    Call,
    FakeApi,
    fake_api_fixture,  # noqa: F401 - the fake_api fixture
    fixture_json,
    json_reply,
)
from fetch_helpers import check_loads_and_plans, fetched, prices_of, written

A3 = "a3-highgpu-8g"
# 8 GPUs x 9.79655057 + 208 vCPUs x 0.02292442 + 1872 GiB x 0.00307202 (on-demand, us-central1)
A3_ON_DEMAND = 88.891505


def _pages(call: Call) -> tuple[int, str, bytes]:
    assert call.path == "/v1/services/6F81-5844-456A/skus"
    assert call.query["key"] == "test-key"
    if call.query.get("pageToken") == "page-2":
        return json_reply(fixture_json("gcp_skus_page2.json"))
    return json_reply(fixture_json("gcp_skus_page1.json"))


def test_fetch_gcp_prices_machines_from_components(cli, fake_api: FakeApi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake_api.respond_with(_pages)
    out = tmp_path / "gcp.yaml"
    result = cli(
        "catalog", "fetch", "gcp", "--region", "us-central1", "--gpu", "H100-SXM",
        "--api-key", "test-key", "--endpoint", fake_api.url, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    assert len(fake_api.calls) == 2
    assert "test-key" not in out.read_text()
    prices = prices_of(written(out), A3)
    od = fetched(prices, "on-demand", "us-central1")
    assert (od["per_hour"], od["source"]) == (A3_ON_DEMAND, "api:gcp:services.skus.list")
    assert fetched(prices, "spot", "us-central1")["per_hour"] == pytest.approx(20.52928)
    assert fetched(prices, "reserved-1y", "us-central1")["per_hour"] == pytest.approx(
        62.224045, abs=1e-6
    )
    assert not [p for p in prices if p["mode"] == "reserved-3y" and "us-central1" in p["regions"]]
    check_loads_and_plans(
        cli, out, provider="gcp", region="us-central1", instance_type=A3, mode="on-demand",
        amount=A3_ON_DEMAND, currency="USD",
    )  # fmt: skip


def test_fetch_gcp_missing_credentials(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("GPUPLAN_GCP_API_KEY", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    result = cli("catalog", "fetch", "gcp", "--region", "us-central1", "--out", str(tmp_path / "g"))
    assert result.exit_code == 2
    assert "gcp: no credentials found" in result.stderr
    assert result.stderr.count("\n") == 1


def test_component_names() -> None:
    from gpuplan.catalog.fetch.gcp import component_name, machine_parts

    assert component_name("Spot Preemptible A2 Instance Core running in Americas") == (
        "a2 instance core"
    )
    assert component_name("Commitment v1: Nvidia L4 GPU in Iowa for 3 Years") == "nvidia l4 gpu"
    parts = machine_parts("n1-highmem-8+T4:2")
    assert parts is not None
    assert "nvidia tesla t4 gpu" in parts["gpu"]
    assert machine_parts("c3-standard-4") is None
