"""Serving estimates (issue 13): the JSON contract, memory accounting, devices, queueing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuplan.catalog.loader import load_catalog
from gpuplan.cli.app import app
from gpuplan.errors import SpecError, UnknownNameError
from gpuplan.estimate.serve import estimate_service
from gpuplan.estimate.serve_device import resolve_device, shared_device
from gpuplan.estimate.serve_memory import kv_bytes_per_token, weight_bytes
from gpuplan.estimate.serve_speed import md1_queue
from gpuplan.models import load_model
from gpuplan.serve.spec import ServiceSpec

CAT = load_catalog(use_user=False)
CONTRACT = {
    "service",
    "gpu",
    "count",
    "slice",
    "memory",
    "throughput",
    "latency",
    "max_qps_within_slo",
    "bounds",
    "assumptions",
}
MEMORY_KEYS = {
    "weights_bytes",
    "kv_cache_bytes",
    "kv_bytes_per_token",
    "activation_bytes",
    "overhead_bytes",
    "total_bytes",
    "capacity_bytes",
    "max_concurrency",
    "fits",
}


def svc(**kw: object) -> ServiceSpec:
    data: dict[str, object] = {
        "name": "s",
        "model": "llama-3.1-8b",
        "max_model_len": 8192,
        "load": {"qps": 2},
    }
    data.update(kw)
    return ServiceSpec.model_validate(data)


def test_contract_keys_llm() -> None:
    out = estimate_service(svc(), resolve_device(CAT, "H100-SXM")).as_contract()
    assert set(out) >= CONTRACT
    assert set(out["memory"]) >= MEMORY_KEYS
    assert {"output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "samples_per_s"} <= set(
        out["throughput"]
    )
    assert {"ttft_s", "tpot_s", "ttft_p99_s", "tpot_p99_s"} <= set(out["latency"])
    json.dumps(out)  # serialisable
    assert out["assumptions"] and out["bounds"]


def test_vllm_memory_matches_a_published_log() -> None:
    # vllm#10517: RTX 3090, Llama 3.1 8B, util 0.9, max_model_len 20000 (V0): weights 14.99 GiB,
    # KV 3.81 GiB, "Maximum concurrency for 20000 tokens per request: 1.56x".
    s = svc(
        max_model_len=20000,
        gpu_memory_utilization=0.9,
        engine_version="0.6.4",
        load={"offline": True},
    )
    out = estimate_service(s, resolve_device(CAT, "RTX-3090")).as_contract()["memory"]
    assert out["weights_bytes"] / 2**30 == pytest.approx(14.99, rel=0.01)
    assert out["kv_cache_bytes"] / 2**30 == pytest.approx(3.81, rel=0.10)
    assert out["max_concurrency"] == pytest.approx(1.56, rel=0.10)


def test_weights_per_format_and_kv_per_token() -> None:
    cfg = load_model("llama-3-8b")
    bf16 = weight_bytes(cfg, "bf16")
    assert weight_bytes(cfg, "fp32") == pytest.approx(2 * bf16)
    int4 = weight_bytes(cfg, "int4")
    assert 0.25 * bf16 < int4 < 0.40 * bf16  # 4-bit body + group scales + 16-bit embeddings
    assert weight_bytes(cfg, "nf4") > int4 * 0.95
    assert weight_bytes(cfg, "bf16", tp=2) == pytest.approx(bf16 / 2)
    assert kv_bytes_per_token(cfg, 2) == 32 * 8 * 128 * 2 * 2
    assert kv_bytes_per_token(cfg, 1, tp=16) == 32 * 1 * 128 * 2  # fewer kv heads than GPUs


def test_fp8_kv_doubles_concurrency_and_tp_adds_memory() -> None:
    d = resolve_device(CAT, "L40S")
    auto = estimate_service(svc(), d).memory
    fp8 = estimate_service(svc(kv_cache_dtype="fp8"), d).memory
    assert fp8["max_concurrency"] == pytest.approx(2 * auto["max_concurrency"], rel=0.01)
    tp2 = estimate_service(svc(), resolve_device(CAT, "L40S", count=2)).memory
    assert tp2["kv_cache_tokens"] > 2 * auto["kv_cache_tokens"]


def test_does_not_fit_says_why() -> None:
    est = estimate_service(svc(model="llama-3.1-70b"), resolve_device(CAT, "A10"))
    assert not est.fits and "exceed" in est.reason
    long = estimate_service(svc(max_model_len=None), resolve_device(CAT, "A10"))
    assert not long.fits and "max_model_len" in long.reason


def test_mig_and_vgpu_slices_shrink_the_device() -> None:
    whole = resolve_device(CAT, "A100-80GB")
    mig = resolve_device(CAT, "A100-80GB", slice="3g.40gb")
    assert mig.kind == "mig" and mig.k8s_resource == "nvidia.com/mig-3g.40gb"
    assert mig.memory_bytes < whole.memory_bytes / 1.9
    assert mig.compute_fraction == pytest.approx(3 / 7, rel=0.01)
    fast = estimate_service(svc(), whole).throughput["output_tokens_per_s"]
    slow = estimate_service(svc(), mig).throughput["output_tokens_per_s"]
    assert slow < fast
    vgpu = resolve_device(CAT, "T4", slice="GN7.LARGE20")
    assert vgpu.kind == "vgpu" and vgpu.compute_fraction == 0.25
    with pytest.raises(SpecError, match="slice of T4"):
        resolve_device(CAT, "A10", slice="GN7.LARGE20")
    with pytest.raises(UnknownNameError):
        resolve_device(CAT, "A10", slice="3g.40gb")


def test_shared_gpu_pays_interference() -> None:
    s = svc(model="bert-base", seq_len=128, load={"qps": 50})
    alone = estimate_service(s, shared_device(CAT.gpu("A10"), "time-slicing", 1.0))
    assert alone.capacity_rps < estimate_service(s, resolve_device(CAT, "A10")).capacity_rps
    assert any("interference" in a for a in alone.assumptions)


def test_non_llms_and_diffusion() -> None:
    d = resolve_device(CAT, "A10")
    bert = estimate_service(svc(model="bert-base", seq_len=128, load={"qps": 10}), d)
    assert bert.kind == "encoder" and bert.throughput["samples_per_s"] > 100
    resnet = estimate_service(svc(model="resnet-50", load={"qps": 10}), d)
    assert resnet.kind == "vision" and resnet.fits
    sd = estimate_service(svc(model="sd-1.5", steps=30, load={"qps": 0.1}), d)
    assert sd.kind == "diffusion" and 0.5 < sd.latency["latency_s"] < 20
    xl_small = estimate_service(
        svc(model="sdxl", load={"qps": 0.01}), resolve_device(CAT, "T4", slice="GN7.LARGE20")
    )
    assert not xl_small.fits


def test_slo_capacity_is_below_raw_capacity() -> None:
    tight = estimate_service(svc(slo={"tpot_p99": "30ms"}), resolve_device(CAT, "A10"))
    loose = estimate_service(svc(), resolve_device(CAT, "A10"))
    assert tight.max_qps_within_slo <= loose.capacity_rps
    assert md1_queue(1.0, 2.0)[1] == pytest.approx(0.25)
    assert not md1_queue(3.0, 2.0)[3]


def test_cli_estimate(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(
        "services: [{name: chat, model: llama-3.1-8b, max_model_len: 4096, load: {qps: 1}}]\n"
    )
    runner = CliRunner()
    res = runner.invoke(app, ["serve", "estimate", str(f), "--gpu", "L4", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["gpu"] == "L4"
    res = runner.invoke(app, ["serve", "estimate", str(f), "--gpu", "L4"])
    assert "max concurrency" in res.output
    res = runner.invoke(app, ["serve", "estimate", str(f), "--gpu", "L4", "--slice", "1g.10gb"])
    assert res.exit_code == 2


def test_validation_table_runs_and_meets_targets() -> None:
    from gpuplan.validation_inference import run

    report = run(loso=False)
    s = report["summary"]
    assert s["memory"]["median_abs_error"] <= 0.10
    assert s["throughput"]["median_abs_error"] <= 0.15
    assert s["latency"]["median_abs_error"] <= 0.25
    assert report["excluded"]  # honest denominator: excluded rows keep their reasons


def test_engine_kv_budgets_differ_as_documented() -> None:
    d = resolve_device(CAT, "H100-SXM")
    kv = {
        e: estimate_service(svc(engine=e), d).memory["kv_cache_bytes"]
        for e in ("vllm", "sglang", "tensorrt-llm", "hf")
    }
    # SGLang's static fraction leaves activations outside it; transformers grows into all memory
    assert kv["sglang"] > kv["vllm"]
    assert kv["hf"] > kv["vllm"]
    assert kv["tensorrt-llm"] < kv["hf"]
    old = estimate_service(svc(engine_version="0.10.2"), d).memory["kv_cache_bytes"]
    assert old > kv["vllm"]  # CUDA graphs outside the KV budget before vLLM 0.21
