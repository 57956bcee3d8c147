"""Alibaba fetcher: the real ECS SDK (alibabacloud-ecs20140526) against a fake endpoint."""

from __future__ import annotations

import json
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

pytest.importorskip("alibabacloud_ecs20140526")

A10 = "ecs.gn7i-c8g1.2xlarge"


@pytest.fixture
def ali_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAItest")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "secret-not-logged")
    monkeypatch.delenv("ALIBABA_CLOUD_SECURITY_TOKEN", raising=False)


def _respond(call: Call) -> tuple[int, str, bytes]:
    data = fixture_json("alibaba_ecs.json")
    action = call.headers["x-acs-action"]
    assert call.headers["x-acs-version"] == "2014-05-26"
    assert "secret-not-logged" not in json.dumps(call.headers)
    q = call.query
    assert q["RegionId"] == "cn-hangzhou"
    if action == "DescribeAvailableResource":
        assert (q["DestinationResource"], q["InstanceChargeType"]) == ("InstanceType", "PostPaid")
        return json_reply(data[action])
    assert q["InstanceType"] == A10  # the sold-out and non-GPU types are never priced
    if action == "DescribePrice":
        assert q["ResourceType"] == "instance"
        return json_reply(data[action][f"{q['PriceUnit']}-{q['Period']}"])
    assert action == "DescribeSpotPriceHistory"
    assert (q["NetworkType"], q["OSType"]) == ("vpc", "linux")
    return json_reply(data[action])


def test_fetch_alibaba_payg_subscriptions_and_spot(  # type: ignore[no-untyped-def]
    cli, fake_api: FakeApi, tmp_path: Path, ali_env: None
) -> None:
    fake_api.respond_with(_respond)
    out = tmp_path / "alibaba.yaml"
    result = cli(
        "catalog", "fetch", "alibaba", "--region", "cn-hangzhou", "--gpu", "A10",
        "--endpoint", fake_api.url, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    actions = [c.headers["x-acs-action"] for c in fake_api.calls]
    assert actions == ["DescribeAvailableResource"] + ["DescribePrice"] * 4 + [
        "DescribeSpotPriceHistory"
    ]
    text = out.read_text()
    assert "secret-not-logged" not in text and "LTAItest" not in text
    data = written(out)
    assert [o["instance_type"] for o in data["offerings"]] == [A10]
    prices = prices_of(data, A10)
    od = fetched(prices, "on-demand", "cn-hangzhou")
    assert (od["per_hour"], od["currency"], od["source"]) == (
        11.74,
        "CNY",
        "api:alibaba:DescribePrice",
    )
    assert fetched(prices, "monthly", "cn-hangzhou")["per_month"] == 5280.0
    assert fetched(prices, "reserved-1y", "cn-hangzhou")["per_year"] == 53856.0  # TradePrice
    assert fetched(prices, "reserved-3y", "cn-hangzhou")["per_year"] == 31680.0
    spot = fetched(prices, "spot", "cn-hangzhou")
    assert spot["per_hour"] == 2.35  # latest per zone (2.35, 2.41), lowest zone
    assert spot["source"] == "api:alibaba:DescribeSpotPriceHistory"
    # regions not asked keep the catalog's api-dump prices
    assert fetched(prices, "on-demand", "cn-beijing")["source_kind"] == "api-dump"
    check_loads_and_plans(
        cli, out, provider="alibaba", region="cn-hangzhou", instance_type=A10,
        mode="on-demand", amount=11.74, currency="CNY",
    )  # fmt: skip


def test_fetch_alibaba_region_selling_nothing(  # type: ignore[no-untyped-def]
    cli, fake_api: FakeApi, tmp_path: Path, ali_env: None
) -> None:
    fake_api.respond_with(lambda call: json_reply({"RequestId": "x", "AvailableZones": {}}))
    result = cli(
        "catalog", "fetch", "alibaba", "--region", "cn-hangzhou", "--gpu", "H20",
        "--endpoint", fake_api.url, "--out", str(tmp_path / "a.yaml"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "cn-hangzhou sold none" in result.stderr or "cn-hangzhou sells none" in result.stderr


def test_fetch_alibaba_throttled_then_success(  # type: ignore[no-untyped-def]
    cli, fake_api: FakeApi, tmp_path: Path, ali_env: None
) -> None:
    throttled = [
        json_reply(
            {"RequestId": "x", "Code": "Throttling.User", "Message": "Request was denied due to "
             "user flow control."}, status=400,
        )
    ]  # fmt: skip
    fake_api.respond_with(lambda call: throttled.pop() if throttled else _respond(call))
    out = tmp_path / "a.yaml"
    result = cli(
        "catalog", "fetch", "alibaba", "--region", "cn-hangzhou", "--gpu", "A10",
        "--endpoint", fake_api.url, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert len(fake_api.calls) == 7
    assert out.exists()


def test_fetch_alibaba_missing_credentials(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alibabacloud_credentials.utils import auth_util

    for name in ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    # the SDK snapshots its environment at import: keep its chain off the ECS metadata service
    monkeypatch.setattr(auth_util, "environment_ecs_metadata_disabled", "true")
    monkeypatch.setattr(auth_util, "environment_access_key_id", None)
    monkeypatch.setattr(auth_util, "environment_access_key_secret", None)
    monkeypatch.setattr(auth_util, "environment_credentials_file", None)
    result = cli(
        "catalog", "fetch", "alibaba", "--region", "cn-hangzhou", "--gpu", "A10",
        "--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path / "a.yaml"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "alibaba: no credentials found" in result.stderr
    assert result.stderr.count("\n") == 1
