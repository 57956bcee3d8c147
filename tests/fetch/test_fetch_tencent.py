"""Tencent fetcher: the real CVM SDK (tencentcloud-sdk-python-cvm) against a fake endpoint."""

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
from fetch_helpers import REPO, check_loads_and_plans, fetched, prices_of, written

pytest.importorskip("tencentcloud.cvm")

T4 = "GN7.2XLARGE32"


@pytest.fixture
def tc_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDtest")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "secret-not-logged")


def _respond(call: Call) -> tuple[int, str, bytes]:
    data = fixture_json("tencent_cvm.json")
    action = call.headers["x-tc-action"]
    assert call.headers["x-tc-version"] == "2017-03-12"
    assert call.headers["x-tc-region"] == "ap-guangzhou"
    body = call.json
    if action == "DescribeZoneInstanceConfigInfos":
        filters = {f["Name"]: f["Values"] for f in body["Filters"]}
        assert "GN7" in filters["instance-family"]
        return json_reply(data[action])
    assert action == "InquiryPriceRunInstances"
    assert body["Placement"]["Zone"] == "ap-guangzhou-3"
    assert body["ImageId"]
    months = (body.get("InstanceChargePrepaid") or {}).get("Period", 0)
    by_type = data[action].get(body["InstanceType"], {})
    answer = by_type.get(f"{body['InstanceChargeType']}-{months}")
    if answer is None:
        return json_reply(
            {"Response": {"Error": {"Code": "InvalidParameterValue", "Message": "not sold"},
             "RequestId": "x"}}
        )  # fmt: skip
    return json_reply(answer)


def test_fetch_tencent_postpaid_and_prepaid(  # type: ignore[no-untyped-def]
    cli, fake_api: FakeApi, tmp_path: Path, tc_env: None
) -> None:
    fake_api.respond_with(_respond)
    out = tmp_path / "tencent.yaml"
    result = cli(
        "catalog", "fetch", "tencent", "--region", "ap-guangzhou", "--gpu", "T4",
        "--endpoint", fake_api.url, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    actions = [c.headers["x-tc-action"] for c in fake_api.calls]
    assert actions.count("DescribeZoneInstanceConfigInfos") == 1
    # two types sold (the sold-out GN7.5XLARGE80 is never priced), four terms each
    assert actions.count("InquiryPriceRunInstances") == 8
    assert "secret-not-logged" not in out.read_text()
    data = written(out)
    assert sorted(o["instance_type"] for o in data["offerings"]) == ["GN7.2XLARGE32", "GN7.LARGE20"]
    prices = prices_of(data, T4)
    od = fetched(prices, "on-demand", "ap-guangzhou")
    assert (od["per_hour"], od["currency"]) == (8.68, "CNY")
    assert od["source"] == "api:tencent:InquiryPriceRunInstances"
    assert fetched(prices, "monthly", "ap-guangzhou")["per_month"] == 2500.0
    assert fetched(prices, "reserved-1y", "ap-guangzhou")["per_year"] == 25500.0
    assert fetched(prices, "reserved-3y", "ap-guangzhou")["per_year"] == 15000.0
    # the china-mainland group keeps the catalog's official prices
    assert fetched(prices, "on-demand", "china-mainland")["source_kind"] == "official"
    check_loads_and_plans(
        cli, out, provider="tencent", region="ap-guangzhou", instance_type="GN7.LARGE20",
        mode="on-demand", amount=2.76, currency="CNY", spec=REPO / "examples/bert-base-finetune.yaml",
    )  # fmt: skip


def test_fetch_tencent_throttled_always(  # type: ignore[no-untyped-def]
    cli, fake_api: FakeApi, tmp_path: Path, tc_env: None
) -> None:
    fake_api.respond_with(
        lambda call: json_reply(
            {"Response": {"Error": {"Code": "RequestLimitExceeded", "Message": "too many"},
             "RequestId": "x"}}
        )
    )  # fmt: skip
    result = cli(
        "catalog", "fetch", "tencent", "--region", "ap-guangzhou", "--gpu", "T4", "--retries", "1",
        "--endpoint", fake_api.url, "--out", str(tmp_path / "t.yaml"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "throttled by the provider after 2 tries" in result.stderr


def test_fetch_tencent_missing_credentials(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tencentcloud.common import credential

    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID", raising=False)
    monkeypatch.delenv("TENCENTCLOUD_SECRET_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    # keep the chain off the CVM metadata service and the TKE OIDC provider (not on a CVM here)
    monkeypatch.setattr(credential.CVMRoleCredential, "get_credential", lambda self: None)
    monkeypatch.setattr(
        credential.DefaultTkeOIDCRoleArnProvider, "get_credential", lambda self: None
    )
    result = cli(
        "catalog", "fetch", "tencent", "--region", "ap-guangzhou", "--gpu", "T4",
        "--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path / "t.yaml"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "tencent: no credentials found" in result.stderr
    assert result.stderr.count("\n") == 1
