"""Per-region prices, commitment rules and compliance declarations in the catalog schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan.catalog.loader import check_catalog, load_catalog, parse_catalog_file

ROW = """
offerings:
  - provider: example
    instance_type: ex.a10
    regions: [r-east, r-west, r-asia]
    gpu: A10
    gpu_count: 1
    intra_node: none
    prices:
{prices}
    source: https://example.com/pricing
    as_of: 2026-11-01
"""
OLD_STYLE = "      - {mode: on-demand, per_hour: 2.0, currency: USD}\n"
PER_REGION = (
    "      - {mode: on-demand, per_hour: 2.0, currency: USD, regions: [r-east, r-west]}\n"
    "      - {mode: on-demand, per_hour: 15.0, currency: CNY, regions: [r-asia]}\n"
    "      - {mode: monthly, per_month: 900, currency: USD, regions: [r-east]}\n"
)


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "over.yaml"
    path.write_text(text)
    return load_catalog(path, use_user=False)


def test_price_without_regions_applies_everywhere(tmp_path: Path) -> None:
    cat = _load(tmp_path, ROW.format(prices=OLD_STYLE))
    off = cat.offering("example", "ex.a10")  # type: ignore[attr-defined]
    assert [r for r, _ in off.region_prices("on-demand")] == ["r-east", "r-west", "r-asia"]
    assert off.price("on-demand", "r-asia").per_hour == 2.0


def test_prices_per_region_keep_their_currency(tmp_path: Path) -> None:
    cat = _load(tmp_path, ROW.format(prices=PER_REGION))
    off = cat.offering("example", "ex.a10")  # type: ignore[attr-defined]
    asia = off.price("on-demand", "r-asia")
    assert (asia.per_hour, asia.currency) == (15.0, "CNY")
    assert off.price("on-demand", "r-west").currency == "USD"
    assert off.price("monthly", "r-west") is None
    assert off.price("monthly", "r-east").hourly_equivalent == pytest.approx(900 / 730)
    # the region filter compares the price of the matching region
    # (15 CNY is about 2.2 USD at the shipped rate)
    assert cat.filter_offerings(providers=["example"], region="r-asia", max_price_per_hour=2.3)  # type: ignore[attr-defined]
    assert not cat.filter_offerings(providers=["example"], region="r-asia", max_price_per_hour=2.1)  # type: ignore[attr-defined]
    assert cat.filter_offerings(providers=["example"], region="r-east", max_price_per_hour=2.1)  # type: ignore[attr-defined]


def test_a_region_priced_twice_is_a_problem() -> None:
    text = ROW.format(
        prices=OLD_STYLE
        + "      - {mode: on-demand, per_hour: 3.0, currency: USD, regions: [r-west]}\n"
    )
    cat = parse_catalog_file(text, origin="t")
    from gpuplan.catalog.loader import _builtin_parsed, _merge

    merged = _merge([*_builtin_parsed(), ("t", cat)])
    problems = check_catalog(merged)
    assert any("two on-demand prices for region r-west" in p for p in problems)


def test_price_region_must_belong_to_the_offering() -> None:
    text = ROW.format(
        prices="      - {mode: spot, per_hour: 1.0, currency: USD, regions: [mars]}\n"
    )
    from gpuplan.catalog.loader import _builtin_parsed, _merge

    merged = _merge([*_builtin_parsed(), ("t", parse_catalog_file(text, origin="t"))])
    assert any("mars is not one of the offering's regions" in p for p in check_catalog(merged))


def test_per_year_amount() -> None:
    text = ROW.format(prices="      - {mode: reserved-1y, per_year: 8760, currency: USD}\n")
    off = parse_catalog_file(text, origin="t").offerings[0]
    assert off.price("reserved-1y").hourly_equivalent == pytest.approx(1.0)


def test_two_amounts_rejected() -> None:
    from gpuplan.errors import CatalogError

    text = ROW.format(prices="      - {mode: monthly, per_month: 1, per_year: 12, currency: USD}\n")
    with pytest.raises(CatalogError, match="exactly one of per_hour, per_month or per_year"):
        parse_catalog_file(text, origin="t")


RULE = """
commitment_rules:
  - provider: example
    mode: reserved-1y
    discount: 0.25
    instance_types: ["EX.*"]
    source: https://example.com/reservations
    source_kind: official
    as_of: 2026-10-01
"""


def test_commitment_rule_derives_a_price_per_region(tmp_path: Path) -> None:
    cat = _load(tmp_path, ROW.format(prices=PER_REGION) + RULE)
    off = cat.offering("example", "ex.a10")  # type: ignore[attr-defined]
    east = off.price("reserved-1y", "r-east")
    asia = off.price("reserved-1y", "r-asia")
    assert east.per_hour == pytest.approx(1.5) and east.currency == "USD"
    assert asia.per_hour == pytest.approx(11.25) and asia.currency == "CNY"
    assert "25% off on-demand" in (east.derived or "")
    assert east.source == "https://example.com/reservations"


def test_listed_commitment_price_wins_over_rule(tmp_path: Path) -> None:
    listed = (
        PER_REGION
        + "      - {mode: reserved-1y, per_year: 10000, currency: USD, regions: [r-east]}\n"
    )
    cat = _load(tmp_path, ROW.format(prices=listed) + RULE)
    off = cat.offering("example", "ex.a10")  # type: ignore[attr-defined]
    assert off.price("reserved-1y", "r-east").derived is None
    assert off.price("reserved-1y", "r-west").derived is not None


DECLARE = """
compliance_declarations:
  - provider: example
    tag: mlps-3
    reference: "MLPS L3 filing 11010899000-00001"
    regions: [r-asia]
    as_of: 2026-03-15
"""


def test_compliance_declaration_tags_matching_offerings(tmp_path: Path) -> None:
    cat = _load(tmp_path, ROW.format(prices=OLD_STYLE) + DECLARE)
    off = cat.offering("example", "ex.a10")  # type: ignore[attr-defined]
    assert "mlps-3" in off.compliance
    assert "11010899000-00001" in off.compliance_references["mlps-3"]


def test_no_builtin_row_is_tagged_mlps3() -> None:
    cat = load_catalog(use_user=False)
    assert not [o for o in cat.offerings if "mlps-3" in o.compliance]


BILL_ROW = """
billing:
  - {provider: example, granularity_s: 1, minimum_s: 0, source: test rule, as_of: 2026-01-01}
offerings:
  - provider: example
    instance_type: ex.h100
    regions: [r-cheap, r-dear]
    gpu: H100-SXM
    gpu_count: 1
    intra_node: none
    prices:
      - {mode: on-demand, per_hour: 1.0, currency: USD, regions: [r-cheap]}
      - {mode: on-demand, per_hour: 2.0, currency: USD, regions: [r-dear]}
      - {mode: monthly, per_month: 438.0, currency: USD, regions: [r-cheap]}
      - {mode: reserved-1y, per_year: 7008.0, currency: USD, regions: [r-dear]}
    source: test price page
    as_of: 2026-01-01
"""


def _usage(regions: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    from gpuplan.cost.usage import parse_usage_yaml

    text = "gpu: H100-SXM\nproviders: [example]\ngpus: 1\nhours_per_day: 12\ndays_per_week: 7\n"
    if regions:
        text += f"regions: [{', '.join(regions)}]\n"
    return parse_usage_yaml(text, origin="t")


def test_bill_costs_the_cheapest_region_with_break_even(tmp_path: Path) -> None:
    from gpuplan.cost.mix import bill

    cat = _load(tmp_path, BILL_ROW)
    off = bill(_usage(), catalog=cat, currency="USD").offerings[0]  # type: ignore[arg-type]
    assert off.region == "r-cheap"
    (quote,) = off.commitments
    assert quote.mode == "monthly"
    assert quote.break_even == pytest.approx(438.0 / 730 / 1.0)  # 60%


def test_bill_in_a_chosen_region_uses_its_prices(tmp_path: Path) -> None:
    from gpuplan.cost.mix import bill

    cat = _load(tmp_path, BILL_ROW)
    off = bill(_usage(("r-dear",)), catalog=cat, currency="USD").offerings[0]  # type: ignore[arg-type]
    assert off.region == "r-dear"
    (quote,) = off.commitments
    assert quote.mode == "reserved-1y"
    assert quote.per_month == pytest.approx(7008.0 / 12)
    assert quote.break_even == pytest.approx(7008.0 / 8760 / 2.0)  # 40%


def test_bill_table_prints_break_even(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    over = tmp_path / "over.yaml"
    over.write_text(BILL_ROW)
    usage = tmp_path / "usage.yaml"
    usage.write_text(
        "gpu: H100-SXM\nproviders: [example]\ngpus: 1\nhours_per_day: 12\ndays_per_week: 7\n"
    )
    out = cli("bill", str(usage), "--catalog", str(over))
    assert out.exit_code == 0, out.output
    assert "break-even" in out.stdout and "monthly 60%" in out.stdout


def test_offerings_table_lists_alibaba_per_region_in_cny(cli) -> None:  # type: ignore[no-untyped-def]
    out = cli("catalog", "offerings", "--provider", "alibaba", "--gpu", "A10")
    assert out.exit_code == 0, out.output
    assert "CNY" in out.stdout and "USD" not in out.stdout.split("\n", 2)[2]
    assert "cn-beijing" in out.stdout and "ap-southeast-1" in out.stdout
    assert "1/12 vGPU 2GiB" in out.stdout
    # each offering's region groups are listed cheapest first
    lines = out.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if "ecs.gn7i-c8g1.2xlarge" in ln)
    prices = []
    for ln in lines[start:]:
        cells = [c.strip() for c in ln.split("│")]
        if len(prices) and cells[2]:  # the next offering
            break
        prices.append(float(cells[9]))
    assert len(prices) > 3 and prices == sorted(prices)


def test_offerings_json_region_prices(cli) -> None:  # type: ignore[no-untyped-def]
    rows = json.loads(
        cli("catalog", "offerings", "--json", "--provider", "aws", "--gpu", "H100").stdout
    )
    p5 = next(r for r in rows if r["instance_type"] == "p5.48xlarge")
    spot = {r["region"]: r for r in p5["region_prices"] if r["mode"] == "spot"}
    assert {"us-east-1", "us-west-2"} <= set(spot)
    assert p5["hourly"]["spot"] == min(r["hourly_converted"] for r in spot.values())
