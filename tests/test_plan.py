"""Plan: contract, determinism, feasibility, Pareto front, monotonicity, infeasible specs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplan.catalog.loader import load_catalog
from gpuplan.errors import InfeasibleError
from gpuplan.planner import PlanSettings, plan
from gpuplan.spec import load_spec, parse_spec

EX = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def cat():  # type: ignore[no-untyped-def]
    return load_catalog(use_user=False)


@pytest.fixture(scope="module")
def lora_plan(cat):  # type: ignore[no-untyped-def]
    return plan(load_spec(EX / "llama3-8b-lora.yaml"), cat, PlanSettings(top=40))


def test_options_fit_and_meet_constraints(lora_plan) -> None:  # type: ignore[no-untyped-def]
    spec = load_spec(EX / "llama3-8b-lora.yaml")
    assert lora_plan.options
    for o in lora_plan.options:
        assert o.configuration.fit.memory.fits
        assert spec.constraints.deadline is not None
        assert o.time_s <= spec.constraints.deadline
        assert o.cost_total > 0
        assert o.gpus <= 64
        assert o.why


def test_ranked_cheapest_first(lora_plan) -> None:  # type: ignore[no-untyped-def]
    costs = [o.cost_total for o in lora_plan.options]
    assert costs == sorted(costs)


def test_pareto_front_has_no_dominated_option(lora_plan) -> None:  # type: ignore[no-untyped-def]
    front = lora_plan.pareto
    assert front
    for a in front:
        for b in front:
            if a is b:
                continue
            dominated = (
                b.time_s <= a.time_s
                and b.cost_total <= a.cost_total
                and (b.time_s < a.time_s or b.cost_total < a.cost_total)
            )
            assert not dominated


def test_deterministic(cat) -> None:  # type: ignore[no-untyped-def]
    spec = load_spec(EX / "llama3-8b-lora.yaml")
    a = plan(spec, cat)
    b = plan(spec, cat)
    assert [o.as_dict() for o in a.options] == [o.as_dict() for o in b.options]
    assert [r.as_dict() for r in a.rejected] == [r.as_dict() for r in b.rejected]


def test_constraints_filter_providers_and_billing(cat) -> None:  # type: ignore[no-untyped-def]
    spec = load_spec(
        EX / "llama3-8b-lora.yaml",
        ["constraints.providers=[aws, gcp]", "constraints.billing=[on-demand]"],
    )
    p = plan(spec, cat)
    assert {o.provider for o in p.options} <= {"aws", "gcp"}
    assert {o.billing_mode for o in p.options} == {"on-demand"}
    assert any("constraints.providers" in r.reason for r in p.rejected)


def test_infeasible_spec_names_closest_options(cat) -> None:  # type: ignore[no-untyped-def]
    spec = parse_spec(
        {
            "model": "llama-3-70b",
            "seq_len": 4096,
            "work": {"tokens": 10**12},
            "constraints": {"deadline": "1m"},
        }
    )
    with pytest.raises(InfeasibleError) as info:
        plan(spec, cat, PlanSettings(max_gpus=16))
    assert info.value.closest
    assert "deadline" in info.value.one_line()


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(discount=st.floats(0.1, 0.99))
def test_a_cheaper_offering_never_worsens_the_best_cost(
    discount: float, cat, tmp_path_factory
) -> None:  # type: ignore[no-untyped-def]
    spec = load_spec(EX / "llama3-8b-lora.yaml", ["constraints.billing=[on-demand]"])
    base = plan(spec, cat, PlanSettings(top=1))
    best = base.options[0]
    off = cat.offering(best.provider, best.instance_type)
    price = off.price("on-demand")
    assert price is not None and price.per_hour is not None
    clone = off.model_copy(
        update={
            "provider": "example",
            "instance_type": "cheaper-clone",
            "prices": (price.model_copy(update={"per_hour": price.per_hour * discount}),),
        }
    )
    cat2 = dataclasses.replace(cat, offerings=(*cat.offerings, clone))
    after = plan(spec, cat2, PlanSettings(top=1))
    assert after.options[0].cost_total <= best.cost_total + 1e-9


def test_plan_json_contract(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("plan", str(EX / "llama3-8b-lora.yaml"), "--json", "--top", "5")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["options"]
    for o in data["options"]:
        for key in (
            "provider",
            "instance_type",
            "region",
            "billing_mode",
            "nodes",
            "gpus",
            "strategy",
            "time_s",
            "cost_total",
            "cost_breakdown",
            "currency",
            "why",
        ):
            assert key in o, key
        assert o["currency"] == "USD"
    for r in data["rejected"]:
        assert {"provider", "instance_type", "reason"} <= set(r)
    assert data["provenance"]["price_as_of"]
    # the efficiencies the times rest on, the fitted step overhead among them
    ampere = data["provenance"]["efficiency"]["Ampere"]
    assert {"gemm", "gemm_fp8", "hbm", "step_overhead", "basis"} <= set(ampere)


def test_plan_currency_cny(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "plan", str(EX / "llama3-8b-lora.yaml"), "--json", "--top", "3", "--currency", "CNY"
    )
    assert result.exit_code == 0, result.output
    assert {o["currency"] for o in json.loads(result.stdout)["options"]} == {"CNY"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--objective", "cheapest"], "--objective"),
        (["--currency", "XYZ"], "currency"),
        (["--set", "constraints.deadline=1m", "--set", "work.tokens=1000000000000"], "no option"),
    ],
)
def test_plan_bad_input_one_line(cli, args, needle) -> None:  # type: ignore[no-untyped-def]
    result = cli("plan", str(EX / "llama3-8b-lora.yaml"), *args)
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1
    assert needle in lines[0]
