"""The service spec (issue 13): validation, one-line errors, presets and sharing facts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpuplan.catalog.loader import load_catalog
from gpuplan.catalog.sharing import cuda_capacity_bytes, interference, mig_profile, mig_profiles
from gpuplan.cli.app import app
from gpuplan.errors import SpecError, UnknownNameError
from gpuplan.models.diffusion import load_diffusion
from gpuplan.serve.spec import load_serve_spec, parse_serve_spec

CHAT = {"name": "chat", "model": "llama-3-8b", "load": {"qps": 2}}


def test_minimal_spec_and_defaults() -> None:
    spec = parse_serve_spec({"services": [CHAT]})
    svc = spec.service(None)
    assert svc.load.kind == "qps"
    assert svc.kv_cache_dtype == "auto"
    assert spec.constraints_of(svc).sharing[0] == "whole"


def test_slo_durations_parse() -> None:
    svc = parse_serve_spec(
        {"services": [{**CHAT, "slo": {"ttft_p99": "2s", "tpot_p99": "80ms"}}]}
    ).services[0]
    assert svc.slo.ttft_p99 == 2.0
    assert svc.slo.tpot_p99 == pytest.approx(0.08)


@pytest.mark.parametrize(
    ("service", "needle"),
    [
        ({**CHAT, "load": {}}, "services[chat].load: give exactly one"),
        ({**CHAT, "load": {"qps": 1, "concurrency": 2}}, "exactly one"),
        ({**CHAT, "weights": "int3"}, "services[chat].weights"),
        ({**CHAT, "engine": "triton"}, "services[chat].engine"),
        ({**CHAT, "name": "Chat_1"}, "name"),
        ({**CHAT, "gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({**CHAT, "bogus": 1}, "unknown field"),
        ({**CHAT, "max_model_len": 100, "input_tokens": 512}, "max_model_len"),
        ({**CHAT, "constraints": {"sharing": ["slices"]}}, "sharing"),
    ],
)
def test_bad_specs_give_one_line_errors(service: dict[str, object], needle: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_serve_spec({"services": [service]})
    text = info.value.one_line()
    assert needle in text
    assert "\n" not in text


def test_duplicate_names_and_service_lookup() -> None:
    with pytest.raises(SpecError, match="used twice"):
        parse_serve_spec({"services": [CHAT, CHAT]})
    spec = parse_serve_spec({"services": [CHAT, {**CHAT, "name": "chat2"}]})
    with pytest.raises(SpecError, match="name one"):
        spec.service(None)
    with pytest.raises(UnknownNameError, match="did you mean chat"):
        spec.service("chta")


def test_cli_schema_and_bad_file(tmp_path: object) -> None:
    from pathlib import Path

    runner = CliRunner()
    result = runner.invoke(app, ["serve", "schema"])
    assert result.exit_code == 0
    assert "services" in json.loads(result.output)["properties"]
    bad = Path(str(tmp_path)) / "bad.yaml"
    bad.write_text("services: [{name: x, model: bert-base}]\n")
    with pytest.raises(SpecError, match="load"):
        load_serve_spec(bad)


def test_diffusion_presets_are_sourced() -> None:
    sd = load_diffusion("sd-1.5")
    xl = load_diffusion("SDXL")
    assert 1.0e9 < sd.params < 1.1e9  # 860M UNet + 123M text encoder + VAE
    assert xl.params > 3 * sd.params
    # 50 steps at 512 px: ~91 TFLOP, dominated by the UNet (2 x 444 GMAC per step with CFG)
    assert sd.request_flops(image_size=512, steps=50) == pytest.approx(91.46e12, rel=0.01)
    assert sd.source.startswith("https://") and xl.source.startswith("https://")
    with pytest.raises(UnknownNameError):
        load_diffusion("sd-3")


def test_sharing_facts() -> None:
    cat = load_catalog(use_user=False)
    assert cuda_capacity_bytes(cat.gpu("H100-SXM")) / 2**30 == pytest.approx(79.19, abs=0.01)
    assert cuda_capacity_bytes(cat.gpu("T4")) / 2**30 == pytest.approx(14.75, abs=0.01)
    prof = mig_profile("H100-SXM", "1g.10gb")
    assert prof.compute_slices == 1 and prof.k8s_resource == "nvidia.com/mig-1g.10gb"
    assert mig_profiles("A10") == ()
    with pytest.raises(UnknownNameError):
        mig_profile("A10", "1g.10gb")
    assert interference("time-slicing").latency_p99_factor > 1
    for gpu in {g.id for g in cat.gpus}:
        for p in mig_profiles(gpu):
            assert p.source.startswith("https://")
