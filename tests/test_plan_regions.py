"""Plan: prices per region (the cheapest allowed region, named), currencies, compliance hints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.errors import InfeasibleError
from gpuplan.planner import PlanSettings, plan
from gpuplan.spec import load_spec

EX = Path(__file__).resolve().parents[1] / "examples"
LORA = EX / "llama3-8b-lora.yaml"


@pytest.fixture(scope="module")
def cat():  # type: ignore[no-untyped-def]
    return load_catalog(use_user=False)


def _p5_spot(cat, *extra: str):  # type: ignore[no-untyped-def]
    spec = load_spec(
        LORA,
        [
            "constraints.providers=[aws]",
            "constraints.billing=[spot]",
            "constraints.deadline=null",
            *extra,
        ],
    )
    result = plan(spec, cat, PlanSettings(top=500, max_gpus=8))
    return [o for o in result.options if o.instance_type == "p5.48xlarge" and o.nodes == 1]


def test_the_cheapest_region_is_used_and_named(cat) -> None:  # type: ignore[no-untyped-def]
    off = cat.offering("aws", "p5.48xlarge")
    cheapest = min(off.region_prices("spot"), key=lambda rp: rp[1].per_hour)
    (o,) = _p5_spot(cat)
    assert o.region == cheapest[0]
    assert o.price_amount["amount"] == cheapest[1].per_hour
    assert o.cost.price_per_hour == pytest.approx(cheapest[1].per_hour)
    assert o.priced_regions == len(off.region_prices("spot"))


def test_constraints_regions_pick_that_regions_price(cat) -> None:  # type: ignore[no-untyped-def]
    off = cat.offering("aws", "p5.48xlarge")
    for region in ("us-east-1", "us-west-2"):
        (o,) = _p5_spot(cat, f"constraints.regions=[{region}]")
        assert o.region == region
        assert o.cost.price_per_hour == pytest.approx(off.price("spot", region).per_hour)


def test_one_option_per_offering_and_mode_not_per_region(cat) -> None:  # type: ignore[no-untyped-def]
    spec = load_spec(LORA, ["constraints.providers=[alibaba]", "constraints.currency=CNY"])
    result = plan(spec, cat, PlanSettings(top=500))
    keys = [(o.instance_type, o.nodes, o.billing_mode) for o in result.options]
    assert len(keys) == len(set(keys))
    assert any(o.gpu == "A10" for o in result.options)
    for o in result.options:
        assert o.cost.currency == "CNY"
        assert o.price_amount["currency"] == "CNY"  # as published, never converted
        assert o.region in o.price_regions


def test_prices_in_their_own_currency_converted_with_dated_fx(cat) -> None:  # type: ignore[no-untyped-def]
    spec = load_spec(LORA, ["constraints.providers=[alibaba]", "constraints.currency=USD"])
    o = plan(spec, cat, PlanSettings(top=1)).options[0]
    assert o.price_amount["currency"] == "CNY"
    assert o.cost.fx and o.cost.fx[0].from_currency == "CNY"
    assert o.cost.price_per_hour == pytest.approx(o.price_amount["amount"] / cat.fx.per_usd["CNY"])


def test_mlps3_rejection_says_how_to_declare_it(cat) -> None:  # type: ignore[no-untyped-def]
    spec = load_spec(LORA, ["constraints.providers=[alibaba]", "constraints.compliance=[mlps-3]"])
    with pytest.raises(InfeasibleError) as err:
        plan(spec, cat)
    assert "compliance_declarations" in err.value.one_line()
    assert "\n" not in err.value.one_line()


def test_declared_mlps3_is_accepted(tmp_path: Path) -> None:
    over = tmp_path / "over.yaml"
    over.write_text(
        "compliance_declarations:\n"
        "  - {provider: alibaba, tag: mlps-3, reference: 'MLPS L3 filing 1101-0001', "
        "instance_types: ['ecs.gn7i-*'], as_of: 2026-03-15}\n"
    )
    cat = load_catalog(over, use_user=False)
    spec = load_spec(LORA, ["constraints.providers=[alibaba]", "constraints.compliance=[mlps-3]"])
    result = plan(spec, cat)
    assert result.options
    assert all(o.instance_type.startswith("ecs.gn7i-") for o in result.options)


def test_plan_json_names_the_region_and_price(cli) -> None:  # type: ignore[no-untyped-def]
    out = cli(
        "plan",
        str(LORA),
        "--json",
        "--top",
        "3",
        "--set",
        "constraints.providers=[alibaba]",
        "--set",
        "constraints.currency=CNY",
    )
    assert out.exit_code == 0, out.output
    o = json.loads(out.stdout)["options"][0]
    assert o["region"] in o["price_regions"] and o["region"] in o["regions"]
    assert o["price"]["currency"] == "CNY" and o["price"]["unit"] == "per_hour"
    assert o["other_regions_priced"] >= 0
