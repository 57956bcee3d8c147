"""Azure fetcher against a fake Retail Prices API (the stdlib client, as in production)."""

from __future__ import annotations

from pathlib import Path

from fetch_fakeapi import (
    Call,
    FakeApi,
    fake_api_fixture,  # noqa: F401 - the fake_api fixture
    fixture_json,
    json_reply,
)
from fetch_helpers import check_loads_and_plans, fetched, prices_of, written

A100 = "Standard_NC24ads_A100_v4"


def _pages(call: Call) -> tuple[int, str, bytes]:
    assert call.path == "/api/retail/prices"
    if call.query.get("$skip") == "100":
        return json_reply(fixture_json("azure_page2.json"))
    return json_reply(fixture_json("azure_page1.json"))


def test_fetch_azure_writes_prices_per_mode(cli, fake_api: FakeApi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake_api.respond_with(_pages)
    out = tmp_path / "azure.yaml"
    result = cli(
        "catalog", "fetch", "azure", "--region", "eastus", "--gpu", "A100-80GB-PCIE",
        "--gpu", "H100-SXM", "--endpoint", fake_api.url, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    # one query per region, then the NextPageLink (rebased onto --endpoint)
    assert len(fake_api.calls) == 2
    flt = fake_api.calls[0].query["$filter"]
    assert "armRegionName eq 'eastus'" in flt
    assert "serviceName eq 'Virtual Machines'" in flt
    assert f"armSkuName eq '{A100}'" in flt
    assert fake_api.calls[1].query["$skip"] == "100"

    data = written(out)
    prices = prices_of(data, A100)
    od = fetched(prices, "on-demand", "eastus")
    assert od["per_hour"] == 3.2
    assert od["source"] == "api:azure:RetailPrices"
    assert od["source_kind"] == "api"
    assert fetched(prices, "spot", "eastus")["per_hour"] == 0.95  # not Low Priority
    assert fetched(prices, "reserved-1y", "eastus")["per_year"] == 17500.0
    assert fetched(prices, "reserved-3y", "eastus")["per_year"] == 12000.0  # 36000 over 3 years
    # the other regions keep the catalog's prices, with their own source
    other = [p for p in prices if "eastus" not in p["regions"]]
    assert other
    assert all(p["source"] != "api:azure:RetailPrices" for p in other)
    assert (
        fetched(prices_of(data, "Standard_ND96isr_H100_v5"), "on-demand", "eastus")["per_hour"]
        == 98.32
    )
    check_loads_and_plans(
        cli, out, provider="azure", region="eastus", instance_type=A100, mode="on-demand",
        amount=3.2, currency="USD",
    )  # fmt: skip


def test_fetch_azure_region_selling_nothing(cli, fake_api: FakeApi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake_api.respond_with(lambda call: json_reply({"Items": [], "NextPageLink": None}))
    out = tmp_path / "azure.yaml"
    result = cli(
        "catalog", "fetch", "azure", "--region", "westindia", "--gpu", "H100-SXM",
        "--endpoint", fake_api.url, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "westindia sold none" in result.stderr or "sells none" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not out.exists()


def test_fetch_azure_unknown_region_suggests(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("catalog", "fetch", "azure", "--region", "eastuss", "--out", str(tmp_path / "x"))
    assert result.exit_code == 2
    assert "did you mean eastus" in result.stderr


def test_fetch_throttled_then_success(cli, fake_api: FakeApi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    answers = [json_reply({"Error": "TooManyRequests"}, status=429)]

    def respond(call: Call) -> tuple[int, str, bytes]:
        return answers.pop() if answers else _pages(call)

    fake_api.respond_with(respond)
    out = tmp_path / "azure.yaml"
    result = cli(
        "catalog", "fetch", "azure", "--region", "eastus", "--gpu", "A100-80GB-PCIE",
        "--endpoint", fake_api.url, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert len(fake_api.calls) == 3  # throttled, retried, next page
    assert fetched(prices_of(written(out), A100), "on-demand", "eastus")["per_hour"] == 3.2


def test_fetch_throttled_always_fails_in_one_line(cli, fake_api: FakeApi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake_api.respond_with(lambda call: json_reply({"Error": "TooManyRequests"}, status=429))
    out = tmp_path / "azure.yaml"
    out.write_text("previous: file\n")
    result = cli(
        "catalog", "fetch", "azure", "--region", "eastus", "--retries", "1",
        "--endpoint", fake_api.url, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "throttled by the provider after 2 tries" in result.stderr
    assert len(fake_api.calls) == 2
    assert out.read_text() == "previous: file\n"  # nothing half-written
