"""The shared parts of `catalog fetch`: retries, timeouts, the writer's merge, the CLI surface."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
from fetch_fakeapi import (
    Call,
    FakeApi,
    fake_api_fixture,  # noqa: F401 - the fake_api fixture
    json_reply,
)

from gpuplan.catalog.fetch.common import (
    FetchError,
    FetchOutcome,
    FetchRequest,
    Quote,
    Throttled,
    with_retries,
)
from gpuplan.catalog.fetch.writer import build_overrides
from gpuplan.catalog.schema import Offering, Price

NOW = dt.datetime(2026, 12, 1, 10, 30, tzinfo=dt.timezone.utc)


def test_retries_back_off_then_give_up() -> None:
    waits: list[float] = []
    calls = []

    def throttled() -> int:
        calls.append(1)
        raise Throttled()

    req = FetchRequest(max_retries=3, backoff_s=0.5, now=NOW)
    with pytest.raises(FetchError, match="throttled by the provider after 4 tries"):
        with_retries(throttled, what="x", req=req, sleep=waits.append)
    assert len(calls) == 4
    assert waits == [0.5, 1.0, 2.0]


def test_retries_return_the_first_success() -> None:
    answers: list[object] = [Throttled(), 7]

    def flaky() -> int:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return int(got)  # type: ignore[call-overload]

    waits: list[float] = []
    assert with_retries(flaky, what="x", req=FetchRequest(now=NOW), sleep=waits.append) == 7
    assert waits == [1.0]


def _template() -> Offering:
    return Offering(
        provider="example",
        instance_type="ex.1",
        regions=("r1", "r2", "unspecified"),
        gpu="A10",
        gpu_count=1,
        intra_node="none",
        prices=(
            Price(mode="on-demand", per_hour=2.0, currency="USD"),
            Price(mode="capacity-block", per_hour=1.5, currency="USD", regions=("r1",)),
            Price(mode="reserved-1y", per_hour=1.0, currency="USD", derived="30% off (rule)"),
        ),
        source="https://example.com/prices",
        source_kind="official",
        as_of=dt.date(2026, 1, 1),
    )


def test_writer_replaces_fetched_modes_in_asked_regions_only() -> None:
    quote = Quote(
        instance_type="EX.1", region="r1", mode="on-demand", amount=1.75, unit="per_hour",
        currency="USD", action="Price",
    )  # fmt: skip
    outcome = FetchOutcome(quotes=(quote,), regions_asked=("r1",), modes=("on-demand", "spot"))
    cat = build_overrides("example", [_template()], outcome, now=NOW)
    (off,) = cat.offerings
    assert off.regions == ("r1", "r2")  # the placeholder region is gone
    assert off.source_kind == "api" and off.as_of == NOW.date()
    assert "2026-12-01T10:30:00Z" in off.notes
    by = {(p.mode, p.regions): p for p in off.prices}
    fresh = by[("on-demand", ("r1",))]
    assert (fresh.per_hour, fresh.source, fresh.source_kind) == (1.75, "api:example:Price", "api")
    kept = by[("on-demand", ("r2",))]  # r2 was not asked: the catalog's price, its own source
    assert (kept.per_hour, kept.source, kept.as_of) == (
        2.0,
        "https://example.com/prices",
        dt.date(2026, 1, 1),
    )
    assert ("capacity-block", ("r1",)) in by  # a mode not fetched is kept in the asked region
    assert not [p for p in off.prices if p.derived]  # rule prices are re-derived at load


def test_writer_leaves_out_offerings_without_quotes() -> None:
    outcome = FetchOutcome(quotes=(), regions_asked=("r1",), modes=("on-demand",))
    assert build_overrides("example", [_template()], outcome, now=NOW).offerings == ()


def test_fetch_help_lists_the_five_providers(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("catalog", "fetch", "--help")
    assert result.exit_code == 0
    for name in ("alibaba", "tencent", "aws", "azure", "gcp", "--endpoint", "--region", "--gpu"):
        assert name in result.stdout


def test_unknown_provider_and_gpu_suggest(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("catalog", "fetch", "alibabacloud", "--out", str(tmp_path / "x"))
    assert result.exit_code == 2
    assert "did you mean alibaba" in result.stderr
    result = cli("catalog", "fetch", "azure", "--gpu", "H1000", "--out", str(tmp_path / "x"))
    assert result.exit_code == 2
    assert "--gpu: unknown GPU id 'H1000'; did you mean" in result.stderr


def test_no_offering_of_that_gpu(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("catalog", "fetch", "tencent", "--gpu", "B200", "--out", str(tmp_path / "x"))
    assert result.exit_code == 2
    assert "tencent: the catalog has no offering of B200 to price" in result.stderr


def test_per_request_timeout(cli, fake_api: FakeApi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def slow(call: Call) -> tuple[int, str, bytes]:
        time.sleep(1.0)
        return json_reply({"Items": []})

    fake_api.respond_with(slow)
    result = cli(
        "catalog", "fetch", "azure", "--region", "eastus", "--timeout", "0.2",
        "--endpoint", fake_api.url, "--out", str(tmp_path / "x"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "cannot reach the price API" in result.stderr
    assert result.stderr.count("\n") == 1


def test_writer_keeps_prices_of_a_region_asked_but_not_priced() -> None:
    quote = Quote(
        instance_type="ex.1", region="r1", mode="spot", amount=0.5, unit="per_hour",
        currency="USD", action="Price",
    )  # fmt: skip
    outcome = FetchOutcome(quotes=(quote,), regions_asked=("r1", "r2"), modes=("on-demand", "spot"))
    (off,) = build_overrides("example", [_template()], outcome, now=NOW).offerings
    modes = {(p.mode, r) for p in off.prices for r in p.regions}
    assert ("on-demand", "r2") in modes  # r2 asked, nothing priced: the catalog's price stays
    assert ("on-demand", "r1") not in modes  # r1 priced spot only: on-demand is not sold there
    assert ("spot", "r1") in modes
