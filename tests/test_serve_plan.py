"""Serve plans (issue 13): placements, exact packing, rejections, HTML and Kubernetes export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpuplan.catalog.loader import load_catalog
from gpuplan.cli.app import app
from gpuplan.errors import InfeasibleError
from gpuplan.planner.serve_candidates import BinType, Demand, Price, monthly_price
from gpuplan.planner.serve_k8s import manifests
from gpuplan.planner.serve_pack import _first_fit, pack
from gpuplan.planner.serve_plan import plan_services
from gpuplan.report.serve_report import render_html
from gpuplan.serve.spec import load_serve_spec, parse_serve_spec

ROOT = Path(__file__).resolve().parent.parent
CAT = load_catalog(use_user=False)
SEED = load_serve_spec(ROOT / "examples" / "serve-seed.yaml")


@pytest.fixture(scope="module")
def seed_plan():  # type: ignore[no-untyped-def]
    return plan_services(SEED, CAT)


def test_seed_packs_services_and_beats_dedicated(seed_plan) -> None:  # type: ignore[no-untyped-def]
    p = seed_plan
    assert {s.service for s in p.services} == {s.name for s in SEED.services}
    assert p.shared_gpus, "light services should share a GPU"
    assert p.cost_per_month < p.dedicated_cost_per_month
    assert all("china" in s.region for s in p.services)
    assert p.currency == "CNY"
    for g in p.shared_gpus:
        assert 0 <= g.compute_used <= 1 + 1e-9
        assert g.memory_headroom_bytes is None or g.memory_headroom_bytes >= 0
    total = sum(s.cost_per_month for s in p.services)
    assert total == pytest.approx(p.cost_per_month, rel=1e-6)
    json.dumps(p.as_dict())


def test_latency_objective_never_shares() -> None:
    p = plan_services(SEED, CAT, objective="latency")
    assert not p.shared_gpus
    assert all(s.kind in ("whole", "vgpu") for s in p.services)


def test_infeasible_service_lists_rejections() -> None:
    spec = parse_serve_spec(
        {
            "constraints": {"regions": ["china"]},
            "services": [
                {
                    "name": "big",
                    "model": "llama-3.1-405b",
                    "max_model_len": 4096,
                    "load": {"qps": 1},
                }
            ],
        }
    )
    with pytest.raises(InfeasibleError) as info:
        plan_services(spec, CAT)
    assert info.value.closest


def _bt(price: float, cap: tuple[float, ...] = (1.0, 100.0)) -> BinType:
    off = CAT.offerings[0]
    return BinType(
        offering=off,
        gpu=CAT.gpu(off.gpu),
        mode="time-slicing",
        price=Price(per_month=price, mode="on-demand", currency="USD"),
        capacity=cap,
    )


def _d(name: str, share: float, mem: float) -> Demand:
    return Demand(service=name, use=(share, mem), device=None, estimate=None, share=share)  # type: ignore[arg-type]


def test_milp_is_exact_where_first_fit_is_not() -> None:
    # Shares 0.6, 0.5, 0.5, 0.4: two bins suffice ({0.6, 0.4}, {0.5, 0.5});
    # first-fit in dedicated-cost order opens three.
    names = ["a", "b", "c", "d"]
    shares = {"a": 0.6, "b": 0.5, "c": 0.5, "d": 0.4}
    cost = {"a": 400.0, "b": 300.0, "c": 200.0, "d": 100.0}
    types = [_bt(100.0)]
    demands = {(n, 0): _d(n, shares[n], 1.0) for n in names}
    exact = pack(names, cost, types, demands)
    assert exact.optimal and len(exact.bins) == 2 and exact.cost_per_month == pytest.approx(200.0)
    greedy = _first_fit(names, cost, types, demands, "first-fit")
    assert greedy.cost_per_month >= exact.cost_per_month


def test_pack_keeps_dedicated_when_sharing_saves_nothing() -> None:
    types = [_bt(100.0)]
    demands = {("a", 0): _d("a", 0.9, 1.0)}
    res = pack(["a"], {"a": 100.0}, types, demands)
    assert res.dedicated == ("a",) and not res.bins


def test_monthly_price_converts_currency() -> None:
    off = next(o for o in CAT.offerings if o.provider == "tencent" and o.prices)
    usd = monthly_price(CAT, off, "USD")
    cny = monthly_price(CAT, off, "CNY")
    assert usd is not None and cny is not None
    assert cny.per_month > usd.per_month


def _deserialize(api: object, doc: dict[str, object], model: str) -> object:
    """The client's own deserializer (its signature changed in kubernetes 37)."""
    import inspect

    fn = api.deserialize  # type: ignore[attr-defined]
    text = json.dumps(doc)
    if "content_type" in inspect.signature(fn).parameters:
        return fn(text, model, "application/json")

    class _Response:
        data = text

    return fn(_Response(), model)


def test_k8s_manifests_validate_against_the_kubernetes_models(seed_plan) -> None:  # type: ignore[no-untyped-def]
    kubernetes = pytest.importorskip("kubernetes")
    api = kubernetes.client.ApiClient()

    for hami in (False, True):
        docs = manifests(seed_plan, SEED, hami=hami)
        kinds = [d["kind"] for d in docs]
        assert kinds.count("Deployment") == len(SEED.services)
        for doc in docs:
            model = "V1Deployment" if doc["kind"] == "Deployment" else "V1ConfigMap"
            obj = _deserialize(api, doc, model)
            assert obj.metadata.name
            # every key is a field of the model: nothing is dropped on the round trip
            assert api.sanitize_for_serialization(obj) == doc
            if doc["kind"] == "Deployment":
                limits = obj.spec.template.spec.containers[0].resources.limits
                assert any(k.startswith("nvidia.com/") for k in limits)
                if hami and obj.metadata.labels["gpuplan.dev/placement"] in ("mps", "time-slicing"):
                    assert "nvidia.com/gpumem" in limits and "nvidia.com/gpucores" in limits
            else:
                cfg = yaml.safe_load(next(iter(obj.data.values())))
                assert cfg["version"] == "v1" and "sharing" in cfg


def test_mig_placements_request_mig_resources() -> None:
    spec = parse_serve_spec(
        {
            "constraints": {
                "providers": ["aws", "gcp", "azure", "lambda", "runpod", "vast"],
                "sharing": ["whole", "mig"],
            },
            "services": [
                {
                    "name": f"bert-{i}",
                    "model": "bert-base",
                    "seq_len": 128,
                    "load": {"qps": 5},
                    "slo": {"latency_p99": "100ms"},
                }
                for i in range(3)
            ],
        }
    )
    p = plan_services(spec, CAT)
    for sp in p.services:
        if sp.kind == "mig":
            assert sp.k8s_resource.startswith("nvidia.com/mig-")
    docs = manifests(p, spec)
    assert all(d["kind"] == "Deployment" for d in docs)


def test_cli_plan_json_html_export(tmp_path: Path) -> None:
    runner = CliRunner()
    f = str(ROOT / "examples" / "serve-llama-8b.yaml")
    res = runner.invoke(app, ["serve", "plan", f, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["services"][0]["service"] == "chat"
    html = tmp_path / "p.html"
    res = runner.invoke(app, ["serve", "plan", f, "--html", str(html)])
    assert res.exit_code == 0 and "<table>" in html.read_text()
    res = runner.invoke(app, ["serve", "plan", f, "--export", "k8s"])
    assert res.exit_code == 0 and "kind: Deployment" in res.output
    res = runner.invoke(app, ["serve", "plan", f, "--objective", "fastest"])
    assert res.exit_code == 2


def test_html_is_deterministic(seed_plan) -> None:  # type: ignore[no-untyped-def]
    assert render_html(seed_plan) == render_html(seed_plan)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.05, 1.0), st.floats(1.0, 100.0), st.floats(10.0, 500.0)),
        min_size=1,
        max_size=6,
    )
)
def test_packing_partitions_services_and_never_costs_more(
    items: list[tuple[float, float, float]],
) -> None:
    names = [f"s{i}" for i in range(len(items))]
    types = [_bt(150.0, (1.0, 100.0)), _bt(90.0, (1.0, 60.0))]
    demands = {
        (n, t): _d(n, share, mem)
        for n, (share, mem, _) in zip(names, items, strict=True)
        for t in range(2)
        if mem <= types[t].capacity[1]
    }
    cost = {n: c for n, (_, _, c) in zip(names, items, strict=True)}
    res = pack(names, cost, types, demands)
    placed = list(res.dedicated) + [s for b in res.bins for s in b.services]
    assert sorted(placed) == sorted(names)
    assert res.cost_per_month <= sum(cost.values()) + 1e-6
    for b in res.bins:
        assert all(u <= c + 1e-9 for u, c in zip(b.used, b.type.capacity, strict=True))
    greedy = _first_fit(names, cost, types, demands, "first-fit")
    assert res.cost_per_month <= greedy.cost_per_month + 1e-6
