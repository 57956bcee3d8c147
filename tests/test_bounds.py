"""Calibrated bounds: job classes, the fits/tight/no verdict, the JSON contract, planner risk."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate import bounds as bnd
from gpuplan.estimate.fit import fit
from gpuplan.planner import PlanSettings, plan
from gpuplan.planner.search import _sort_key
from gpuplan.spec import load_spec, parse_spec

EX = Path(__file__).resolve().parents[1] / "examples"
SPEC = {
    "model": "gpt2",
    "method": "full",
    "precision": "bf16-mixed",
    "micro_batch_size": 2,
    "seq_len": 512,
}


@pytest.mark.parametrize(
    ("kw", "cls"),
    [
        ({"method": "full", "count": 1, "tp": 1, "pp": 1, "gpus_per_node": 1}, "single-gpu-full"),
        ({"method": "lora", "count": 1, "tp": 1, "pp": 1, "gpus_per_node": 1}, "lora"),
        ({"method": "qlora", "count": 2, "tp": 1, "pp": 1, "gpus_per_node": 8}, "qlora"),
        ({"method": "full", "count": 8, "tp": 1, "pp": 1, "gpus_per_node": 8}, "data-parallel"),
        (
            {"method": "full", "count": 8, "tp": 1, "pp": 1, "gpus_per_node": 8, "sharded": True},
            "zero-fsdp",
        ),
        (
            {"method": "full", "count": 1, "tp": 1, "pp": 1, "gpus_per_node": 8, "sharded": True},
            "single-gpu-full",
        ),
        ({"method": "lora", "count": 8, "tp": 2, "pp": 1, "gpus_per_node": 8}, "tp-pp"),
        ({"method": "full", "count": 16, "tp": 8, "pp": 2, "gpus_per_node": 8}, "multi-node"),
        (
            {
                "family": "encoder",
                "method": "full",
                "count": 1,
                "tp": 1,
                "pp": 1,
                "gpus_per_node": 1,
            },
            "single-gpu-full",
        ),
        (
            {"family": "vit", "method": "full", "count": 8, "tp": 1, "pp": 1, "gpus_per_node": 8},
            "data-parallel",
        ),
        (
            {"family": "cnn", "method": "full", "count": 1, "tp": 1, "pp": 1, "gpus_per_node": 1},
            "cnn",
        ),
        (
            {"family": "cnn", "method": "full", "count": 64, "tp": 1, "pp": 1, "gpus_per_node": 8},
            "cnn",
        ),
    ],
)
def test_job_class(kw: dict[str, object], cls: str) -> None:
    assert bnd.job_class(**{"family": "decoder", "sharded": False, **kw}) == cls  # type: ignore[arg-type]


def test_a_cnn_fit_takes_the_cnn_bounds() -> None:
    """A ResNet's estimate carries the cnn class's bounds, whatever its layout; a transformer
    on the same GPU keeps its own class."""
    gpu = load_catalog().gpu("A100-80GB")
    cnn = parse_spec({"model": "resnet-50", "image_size": 224, "micro_batch_size": 64})
    assert fit(cnn, gpu, 1).job_class == "cnn"
    assert fit(cnn, gpu, 8).job_class == "cnn"
    assert fit(parse_spec(SPEC), gpu, 1).job_class == "single-gpu-full"


def test_every_class_has_bounds_containing_the_estimate() -> None:
    for kind in ("memory", "time"):
        for cls in (*bnd.JOB_CLASSES, "unknown-class"):
            b = bnd.bounds_for(kind, cls)  # type: ignore[arg-type]
            assert b.lo <= 0 <= b.hi
            lo, hi = b.around(100.0)
            assert lo <= 100.0 <= hi
            lo, hi = b.around_inverse(100.0)
            assert lo <= 100.0 <= hi
            assert "leave-one-source-out" in b.describe()


def test_verdict_rules() -> None:
    assert bnd.verdict(True, 90.0, 100.0) == "fits"
    assert bnd.verdict(True, 110.0, 100.0) == "tight"
    assert bnd.verdict(False, 90.0, 100.0) == "no"


@pytest.fixture(scope="module")
def cat():  # type: ignore[no-untyped-def]
    return load_catalog(use_user=False)


def test_fit_verdict_follows_the_upper_bound(cat) -> None:  # type: ignore[no-untyped-def]
    spec = parse_spec(SPEC)
    gpu = cat.gpu("A100-80GB")
    point = fit(spec, gpu, 1).memory.device_used_bytes
    upper = fit(spec, gpu, 1).bounds()["device_used_bytes"][1]
    assert upper > point
    assert fit(spec, gpu, 1, capacity=upper * 1.001).verdict == "fits"
    tight = fit(spec, gpu, 1, capacity=(point + upper) / 2)
    assert tight.verdict == "tight"
    assert tight.memory.fits  # the point verdict is unchanged
    # below the point estimate the allocator first frees its cache (a squeezed reserve, still
    # "tight"); below what the step allocates nothing fits
    allocated = fit(spec, gpu, 1).memory.peak_allocated_bytes
    assert fit(spec, gpu, 1, capacity=allocated * 0.99).verdict == "no"


def test_estimate_json_has_bounds_and_verdict(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("estimate", str(EX / "llama3-8b-lora.yaml"), "--gpu", "H100-SXM", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    mem, t = data["memory"], data["time"]
    assert mem["verdict"] in ("fits", "tight", "no")
    assert isinstance(mem["fits"], bool)
    assert set(mem["bounds"]) == {
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "device_used_bytes",
    }
    for key, (lo, hi) in mem["bounds"].items():
        assert lo <= mem[key] <= hi
    assert set(t["bounds"]) == {
        "step_time_s",
        "tokens_per_s_per_gpu",
        "samples_per_s",
        "time_to_train_s",
    }
    for key, (lo, hi) in t["bounds"].items():
        assert lo <= t[key] <= hi, key


def test_fit_table_and_breakdown_show_the_verdict(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("fit", str(EX / "llama3-8b-lora.yaml"), "--gpu", "H100-SXM")
    assert r.exit_code == 0, r.output
    assert "80% range" in r.stdout
    rows = json.loads(cli("fit", str(EX / "llama3-8b-lora.yaml"), "--json").stdout)
    assert {row["verdict"] for row in rows} <= {"fits", "tight", "no"}
    assert all(row["verdict"] == "no" for row in rows if not row["fits"])


def _opt(cost: float, verdict: str, time_s: float = 1.0) -> object:
    fit_ = types.SimpleNamespace(verdict=verdict)
    return types.SimpleNamespace(
        cost_total=cost,
        time_s=time_s,
        provider="p",
        instance_type="i",
        region="r",
        billing_mode="spot",
        nodes=1,
        configuration=types.SimpleNamespace(fit=fit_),
    )


def test_tight_ranks_after_sure_at_equal_cost() -> None:
    tight, sure, dearer = _opt(1.0, "tight", 0.5), _opt(1.0, "fits", 2.0), _opt(2.0, "fits")
    ranked = sorted([dearer, tight, sure], key=lambda o: _sort_key("cost", o, "medium"))  # type: ignore[arg-type]
    assert ranked == [sure, tight, dearer]
    high = sorted([dearer, tight, sure], key=lambda o: _sort_key("cost", o, "high"))  # type: ignore[arg-type]
    assert high == [tight, sure, dearer]


def test_risk_low_keeps_only_sure_fits(cat) -> None:  # type: ignore[no-untyped-def]
    spec = load_spec(EX / "llama3-8b-lora.yaml")
    low = plan(spec, cat, PlanSettings(top=40, risk="low"))
    assert low.options
    assert {o.configuration.fit.verdict for o in low.options} == {"fits"}
    medium = plan(spec, cat, PlanSettings(top=40))
    for o in medium.options:
        if o.configuration.fit.verdict == "tight":
            assert "tight" in o.why and "ranked after sure options" in o.why
            assert any("tight" in w for w in o.warnings)


def test_plan_rejects_unknown_risk(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("plan", str(EX / "llama3-8b-lora.yaml"), "--risk", "yolo")
    assert r.exit_code == 2
    assert "--risk" in r.stderr


def test_plan_json_and_html_show_the_verdict(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    html = tmp_path / "plan.html"
    r = cli("plan", str(EX / "llama3-8b-lora.yaml"), "--json", "--top", "3", "--html", str(html))
    assert r.exit_code == 0, r.output
    for o in json.loads(r.stdout)["options"]:
        assert o["verdict"] in ("fits", "tight")
        lo, hi = o["device_used_bounds_bytes"]
        assert lo <= o["device_used_bytes"] <= hi
    assert "<th>memory</th>" in html.read_text()


def test_the_layout_search_prefers_a_micro_batch_whose_upper_bound_fits() -> None:
    """Where a smaller micro-batch fits surely, parallelism auto does not take a larger one that
    fits only by the point estimate (`tight`): the README's LoRA job on one B200 runs at micro-batch
    32 with 13 GiB left by the estimate, inside its bounds' reach, or 16 with 87 GiB, 1% slower."""
    from gpuplan.estimate.configure import configure, default_topology

    gpu = load_catalog(use_user=False).gpu("B200")
    spec = load_spec(Path(__file__).resolve().parents[1] / "examples" / "llama3-8b-lora.yaml")
    conf = configure(spec, gpu, 1, default_topology(gpu, 1))
    assert conf.fit.verdict == "fits"
    tight = fit(spec.model_copy(update={"micro_batch_size": 32}), gpu, 1)
    assert tight.memory.fits and tight.verdict == "tight"
    assert conf.fit.strategy.micro_batch_size < 32


def test_risk_medium_keeps_a_tight_micro_batch_where_only_it_meets_the_deadline(cat) -> None:  # type: ignore[no-untyped-def]
    """The sure micro-batch is preferred, but where it misses the deadline and the tight one
    meets it, --risk medium still offers the option (as tight): no option is lost to the
    preference. --risk high takes the fastest micro-batch the estimate fits throughout."""
    repo = Path(__file__).resolve().parents[1]
    bert = load_spec(repo / "examples" / "bert-base-finetune.yaml")
    medium = plan(bert, cat, PlanSettings(risk="medium", top=2000))
    high = plan(bert, cat, PlanSettings(risk="high", top=2000))

    def keys(p):  # type: ignore[no-untyped-def]
        return {(o.provider, o.instance_type, o.billing_mode, o.nodes) for o in p.options}

    assert keys(medium) == keys(high)
    tight = [o for o in medium.options if o.configuration.fit.verdict == "tight"]
    assert tight and all(o.time_s <= 6 * 3600 for o in tight)
    lora = load_spec(repo / "examples" / "llama3-8b-lora.yaml")

    def b200(risk: str) -> str:
        p = plan(lora, cat, PlanSettings(risk=risk, top=2000))
        one = next(o for o in p.options if o.gpu == "B200" and o.gpus == 1)
        return one.configuration.fit.verdict

    assert (b200("medium"), b200("high")) == ("fits", "tight")
