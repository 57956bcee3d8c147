"""Commitment prices in the built-in catalog: every one sourced, costed by bill and plan.

Issue 12 item 2 asks for monthly/yearly prices and published discount rules. The
rules here guard what may ship (an official source, no "up to N%" maxima) and check
that what does ship (Tencent's monthly prices) reaches ``bill`` (break-even per
offering) and ``plan`` (a job of weeks picks the commitment); offerings without a
commitment price say so, offering by offering.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuplan.catalog.loader import Catalog, load_catalog
from gpuplan.catalog.schema import HOURS_PER_MONTH

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
COMMIT_MODES = ("monthly", "reserved-1y", "reserved-3y")
NO_COMMITMENT = "commitment: no monthly or reserved price in the catalog"


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog(use_user=False)


def test_builtin_commitment_rules_are_official_rules_not_maxima(cat: Catalog) -> None:
    for rule in cat.commitment_rules:
        where = f"commitment_rules[{rule.provider}:{rule.mode}]"
        assert rule.source_kind in ("official", "api-dump"), where
        assert rule.source.startswith("https://"), where
        # a marketing maximum ("up to 72%", "最高") is not a rule and must not ship
        assert not re.search(r"\bup to\b|最高|最多", rule.notes, re.IGNORECASE), where


def test_every_builtin_commitment_price_names_its_source(cat: Catalog) -> None:
    found = 0
    for off in cat.offerings:
        for price in off.prices:
            if price.mode not in COMMIT_MODES:
                continue
            found += 1
            where = f"{off.provider}:{off.instance_type} {price.mode}"
            assert price.source or off.source, where
            assert price.source_kind or off.source_kind, where
            if price.derived is not None:  # derived from a rule: the rule's own source
                assert price.source_kind in ("official", "api-dump"), where
    assert found > 0, "no commitment price at all in the built-in catalog"


def test_tencent_monthly_break_even_from_builtin_prices(cat: Catalog) -> None:
    from gpuplan.cost.mix import bill
    from gpuplan.cost.usage import parse_usage_yaml

    usage = parse_usage_yaml(
        "gpu: A100-40GB\nproviders: [tencent]\ngpus: 1\nhours_per_day: 24\ndays_per_week: 7\n",
        origin="t",
    )
    report = bill(usage, catalog=cat, currency="CNY")
    one = next(o for o in report.offerings if o.instance_type == "GT4.4XLARGE96")
    (quote,) = one.commitments
    # 12,948 CNY a month against 28.64 CNY an hour on demand (same region group)
    assert quote.mode == "monthly"
    assert quote.break_even == pytest.approx(12948 / HOURS_PER_MONTH / 28.64)  # about 62%
    assert quote.per_month == pytest.approx(12948)
    # busy around the clock: the commitment beats on-demand
    assert one.strategies[0].kind == "commitment"


def test_offerings_without_a_commitment_price_say_so(cli: Any) -> None:
    out = cli("bill", str(EXAMPLES / "usage-team-8xh100.yaml"), "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    for off in data["offerings"]:
        if not off["commitments"]:
            assert any(NO_COMMITMENT in n for n in off["not_costed"]), off["instance_type"]


def test_a_job_of_weeks_picks_the_monthly_commitment(cat: Catalog) -> None:
    from gpuplan.planner import PlanSettings, plan
    from gpuplan.spec import load_spec

    spec = load_spec(
        EXAMPLES / "llama3-8b-lora.yaml",
        [
            "constraints.providers=[tencent]",
            "constraints.deadline=null",
            "work.tokens=30000000000",  # 30 B tokens: about 78 days on one A100-40GB
        ],
    )
    best = plan(spec, cat, PlanSettings(top=5)).options[0]
    assert best.billing_mode == "monthly"
    assert best.provider == "tencent"


USER_RULE = """
commitment_rules:
  - provider: aws
    mode: reserved-1y
    discount: 0.40
    instance_types: ["p5.*"]
    regions: [us-east-1]
    source: "AWS quote 2026-11-20, account 1234"
    source_kind: user
    as_of: 2026-11-20
"""


def test_user_quote_as_a_rule_prices_one_region(tmp_path: Path) -> None:
    # the overrides example of docs/catalog.md: a user's own quote, derived per region
    over = tmp_path / "quote.yaml"
    over.write_text(USER_RULE, encoding="utf-8")
    cat = load_catalog(over, use_user=False)
    off = cat.offering("aws", "p5.48xlarge")
    od = off.price("on-demand", "us-east-1")
    reserved = off.price("reserved-1y", "us-east-1")
    assert od is not None and reserved is not None
    assert reserved.per_hour == pytest.approx(od.hourly_equivalent * 0.6, rel=1e-6)
    assert reserved.source_kind == "user" and "40% off on-demand" in (reserved.derived or "")
    assert off.price("reserved-1y", "us-west-2") is None  # only the quoted region
