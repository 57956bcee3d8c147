"""AWS fetcher: boto3's real pricing and ec2 clients against a fake endpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fetch_fakeapi import (
    DATA,
    Call,
    FakeApi,
    fake_api_fixture,  # noqa: F401 - the fake_api fixture
    fixture_json,
    json_reply,
)
from fetch_helpers import check_loads_and_plans, fetched, prices_of, written

pytest.importorskip("boto3")


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-not-logged")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _respond(call: Call) -> tuple[int, str, bytes]:
    target = call.headers.get("x-amz-target", "")
    if target == "AWSPriceListService.GetProducts":
        body = call.json
        fields = {f["Field"]: f["Value"] for f in body["Filters"]}
        assert body["ServiceCode"] == "AmazonEC2"
        assert fields["operatingSystem"] == "Linux"
        assert fields["tenancy"] == "Shared"
        assert fields["regionCode"] == "us-east-1"
        listed = []
        if fields["instanceType"] == "p5.48xlarge":
            listed = [json.dumps(fixture_json("aws_product_p5.json"))]
        return json_reply({"FormatVersion": "aws_v1", "PriceList": listed})
    form = call.form
    assert form["Action"] == "DescribeSpotPriceHistory"
    assert form["ProductDescription.1"] == "Linux/UNIX"
    assert "p5.48xlarge" in [v for k, v in form.items() if k.startswith("InstanceType.")]
    return 200, "text/xml", (DATA / "aws_spot_history.xml").read_bytes()


def test_fetch_aws_on_demand_reserved_and_spot(  # type: ignore[no-untyped-def]
    cli, fake_api: FakeApi, tmp_path: Path, aws_env: None
) -> None:
    fake_api.respond_with(_respond)
    out = tmp_path / "aws.yaml"
    result = cli(
        "catalog", "fetch", "aws", "--region", "us-east-1", "--gpu", "H100",
        "--endpoint", fake_api.url, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    targets = [c.headers.get("x-amz-target") for c in fake_api.calls]
    assert targets.count("AWSPriceListService.GetProducts") == 2  # p5.4xlarge, p5.48xlarge
    assert "secret-not-logged" not in out.read_text()

    prices = prices_of(written(out), "p5.48xlarge")
    od = fetched(prices, "on-demand", "us-east-1")
    assert (od["per_hour"], od["source"]) == (55.04, "api:aws:GetProducts")
    assert (
        fetched(prices, "reserved-1y", "us-east-1")["per_hour"] == 38.53
    )  # standard, not convertible
    assert fetched(prices, "reserved-3y", "us-east-1")["per_year"] == pytest.approx(631000 / 3)
    spot = fetched(prices, "spot", "us-east-1")
    assert (spot["per_hour"], spot["source"]) == (17.63, "api:aws:DescribeSpotPriceHistory")
    # us-west-2 keeps the catalog's prices
    assert fetched(prices, "on-demand", "us-west-2")["source_kind"] == "catalog"
    check_loads_and_plans(
        cli, out, provider="aws", region="us-east-1", instance_type="p5.48xlarge",
        mode="on-demand", amount=55.04, currency="USD",
    )  # fmt: skip


def test_fetch_aws_missing_credentials(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aws_env: None
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    result = cli("catalog", "fetch", "aws", "--region", "us-east-1", "--out", str(tmp_path / "a"))
    assert result.exit_code == 2
    assert "aws: no credentials found" in result.stderr
    assert "pricing:GetProducts" in result.stderr


def test_fetch_aws_throttled_always(  # type: ignore[no-untyped-def]
    cli, fake_api: FakeApi, tmp_path: Path, aws_env: None
) -> None:
    fake_api.respond_with(
        lambda call: json_reply(
            {"__type": "ThrottlingException", "message": "Rate exceeded"}, status=400
        )
    )
    result = cli(
        "catalog", "fetch", "aws", "--region", "us-east-1", "--gpu", "H100", "--retries", "1",
        "--endpoint", fake_api.url, "--out", str(tmp_path / "a"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "throttled by the provider after 2 tries" in result.stderr
    assert len(fake_api.calls) == 2
