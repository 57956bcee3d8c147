"""Estimate one inference service on one device: memory, throughput, latency, capacity.

:func:`estimate_service` returns a :class:`ServeEstimate` whose
:meth:`~ServeEstimate.as_contract` is the JSON of ``gpuplan serve estimate``
(issue 13; extend, never rename). Memory is per GPU of a replica, as engines
log it; throughput is the replica's capacity (its largest batch); latency is
at the service's load. Every number carries its assumptions.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from gpuplan.errors import SpecError
from gpuplan.estimate.serve_constants import Fitted, engine_defaults, fitted
from gpuplan.estimate.serve_device import Device
from gpuplan.estimate.serve_memory import llm_memory
from gpuplan.estimate.serve_nonllm import (
    Workload,
    diffusion_workload,
    encoder_workload,
    vision_workload,
)
from gpuplan.estimate.serve_speed import (
    Z99,
    LlmRoofline,
    llm_in_flight,
    md1_queue,
)
from gpuplan.models.diffusion import is_diffusion, load_diffusion
from gpuplan.models.presets import load_model
from gpuplan.serve.spec import ServiceSpec

TARGET_UTILIZATION = 0.85
"""Without latency targets, a replica is loaded to this share of its capacity."""
QUEUE_MODEL = (
    "queue: M/D/1 (Poisson arrivals, one server of the replica's capacity at its largest "
    "batch); p99 wait = mean x ln 100; requests in flight by Little's law"
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServeEstimate:
    """One service on one device."""

    service: str
    device: Device
    kind: str
    memory: dict[str, Any]
    throughput: dict[str, Any]
    latency: dict[str, Any]
    max_qps_within_slo: float
    capacity_rps: float
    fits: bool
    reason: str
    bounds: dict[str, list[float]]
    assumptions: tuple[str, ...]

    def as_contract(self) -> dict[str, Any]:
        """The ``serve estimate --json`` object."""
        return {
            "service": self.service,
            "gpu": self.device.gpu.id,
            "count": self.device.count,
            "slice": self.device.slice,
            "device_kind": self.device.kind,
            "memory": self.memory,
            "throughput": self.throughput,
            "latency": self.latency,
            "max_qps_within_slo": self.max_qps_within_slo,
            "fits": self.fits,
            "reason": self.reason,
            "bounds": self.bounds,
            "assumptions": list(self.assumptions),
        }


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _compute_dtype(weights: str, device: Device) -> str:
    gpu = device.gpu
    if weights == "fp32":
        return "fp32"
    if weights == "fp8" and gpu.supports("fp8"):
        return "fp8"
    if weights == "int8" and gpu.supports("int8"):
        return "int8"
    return "bf16" if gpu.supports("bf16") else "fp16"


def _bounds(values: dict[str, float | None], width: float) -> dict[str, list[float]]:
    return {
        k: [v * (1 - width), v * (1 + width)]
        for k, v in values.items()
        if v is not None and math.isfinite(v) and v > 0
    }


def _bounds_widths() -> dict[str, float]:
    from gpuplan.estimate.serve_constants import _raw

    raw = _raw().get("bounds_relative", {})
    return {k: float(v) for k, v in raw.items()}


def _max_qps(capacity: float, meets: Any) -> float:
    """Largest arrival rate below ``capacity`` at which ``meets(qps)`` holds (bisection)."""
    if capacity <= 0 or not meets(capacity * 1e-3):
        return 0.0
    lo, hi = capacity * 1e-3, capacity * 0.999
    if meets(hi):
        return hi
    while hi - lo > 1e-2 * hi:
        mid = 0.5 * (lo + hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def estimate_service(
    svc: ServiceSpec, device: Device, *, fit: Fitted | None = None
) -> ServeEstimate:
    """Memory, throughput, latency and SLO capacity of ``svc`` on ``device``.

    Raises:
        SpecError: the model cannot be served this way (e.g. an encoder with
            output tokens, a decoder without text).
        UnknownNameError: unknown model.
    """
    fit = fit or fitted()
    if is_diffusion(svc.model):
        model = load_diffusion(svc.model)
        weights = svc.weights or "fp16"
        work = diffusion_workload(
            model,
            image_size=svc.image_size or model.default_image_size,
            steps=svc.steps or model.default_steps,
            weights=weights,
        )
        return _nonllm(svc, device, work, fit, fit.diffusion_compute_efficiency)
    cfg = load_model(svc.model)
    weights = svc.weights or ("fp16" if cfg.family != "decoder" else "bf16")
    if cfg.family == "encoder":
        work = encoder_workload(cfg, seq_len=svc.seq_len or 128, weights=weights)
        return _nonllm(svc, device, work, fit, fit.nonllm_compute_efficiency)
    if cfg.is_vision:
        work = vision_workload(cfg, image_size=svc.image_size or cfg.image_size, weights=weights)
        return _nonllm(svc, device, work, fit, fit.nonllm_compute_efficiency)
    return _llm(svc, device, cfg, weights, fit)


def _llm(svc: ServiceSpec, device: Device, cfg: Any, weights: str, fit: Fitted) -> ServeEstimate:
    engine_name = svc.engine or "vllm"
    if engine_name == "onnxruntime":
        raise SpecError(f"services[{svc.name}].engine: onnxruntime does not serve decoder LLMs")
    engine = engine_defaults(engine_name)
    if weights == "bf16" and not device.gpu.supports("bf16"):
        weights = "fp16"  # engines fall back to fp16 on GPUs without bf16 (T4, V100)
    version = _version(svc.engine_version) if engine_name == "vllm" else None
    util = svc.gpu_memory_utilization or engine.gpu_memory_utilization
    max_len = svc.max_model_len or cfg.max_position_embeddings
    seqs = svc.batch or engine.max_num_seqs
    if svc.max_num_batched_tokens:
        step_tokens = svc.max_num_batched_tokens
    elif version is not None and version < (0, 8):
        step_tokens = max(max_len, 2048)  # vLLM V0 without chunked prefill
    else:
        step_tokens = engine.max_num_batched_tokens
    graphs_in_budget = not (version is not None and version < (0, 21))
    mem = llm_memory(
        cfg,
        device,
        weights=weights,
        kv_cache_dtype=svc.kv_cache_dtype,
        max_model_len=max_len,
        utilization=util,
        engine=engine,
        max_num_seqs=seqs,
        max_num_batched_tokens=step_tokens,
        fit=fit,
        graphs_in_budget=graphs_in_budget,
    )
    roof = LlmRoofline(
        cfg=cfg,
        device=device,
        weights_bytes=mem.weights_bytes,
        kv_bytes_per_token=mem.kv_bytes_per_token,
        compute_dtype=_compute_dtype(weights, device),
        fit=fit,
    )
    n_in, n_out = svc.input_tokens, svc.output_tokens
    per_request_tokens = min(n_in + n_out, max_len)
    b_max = max(1, min(seqs, mem.kv_tokens // max(per_request_tokens, 1))) if mem.fits else 0
    tau = roof.per_token_s(b_max, n_in, n_out) if b_max else math.inf
    factor = device.throughput_factor
    out_tps = b_max / tau * factor if b_max else 0.0
    capacity = out_tps / n_out
    lat_f = device.latency_p99_factor

    def latency_at(qps: float) -> dict[str, float]:
        rho, wait, wait99, stable = md1_queue(qps, capacity)
        n = llm_in_flight(roof, qps / factor, n_in, n_out, max(b_max, 1))
        tpot = roof.per_token_s(max(n, 1.0), n_in, n_out) / factor
        n99 = min(n + Z99 * math.sqrt(max(n, 1.0)), float(max(b_max, 1)))
        tpot99 = roof.per_token_s(max(n99, 1.0), n_in, n_out) / factor * lat_f
        ttft = roof.prefill_s(n_in) + roof.decode_step_s(max(n, 1.0), n_in + n_out / 2) + wait
        ttft99 = (ttft - wait + wait99) * lat_f
        return {"ttft_s": ttft, "tpot_s": tpot, "ttft_p99_s": ttft99, "tpot_p99_s": tpot99}

    def meets(qps: float) -> bool:
        if not mem.fits or qps >= capacity:
            return False
        lat = latency_at(qps)
        slo = svc.slo
        if slo.ttft_p99 is not None and lat["ttft_p99_s"] > slo.ttft_p99:
            return False
        if slo.tpot_p99 is not None and lat["tpot_p99_s"] > slo.tpot_p99:
            return False
        end_to_end = lat["ttft_p99_s"] + n_out * lat["tpot_p99_s"]
        return slo.latency_p99 is None or end_to_end <= slo.latency_p99

    has_slo = any(v is not None for v in (svc.slo.ttft_p99, svc.slo.tpot_p99, svc.slo.latency_p99))
    max_qps = _max_qps(capacity, meets) if has_slo else capacity * TARGET_UTILIZATION
    if not mem.fits:
        latency: dict[str, Any] = dict.fromkeys(("ttft_s", "tpot_s", "ttft_p99_s", "tpot_p99_s"))
    elif svc.load.qps is not None:
        latency = (
            latency_at(svc.load.qps) if svc.load.qps < capacity else latency_at(capacity * 0.999)
        )
    else:
        conc = svc.load.concurrency or b_max
        b = min(conc, b_max)
        tpot = roof.per_token_s(b, n_in, n_out) / factor
        queued = max(0, conc - b_max) / max(capacity, 1e-9)
        ttft = roof.prefill_s(n_in) * (b if svc.load.offline else 1) / max(factor, 1e-9) + queued
        latency = {
            "ttft_s": ttft,
            "tpot_s": tpot,
            "ttft_p99_s": ttft * lat_f,
            "tpot_p99_s": tpot * lat_f,
        }
    if latency.get("ttft_s") is not None:
        latency["latency_s"] = latency["ttft_s"] + n_out * latency["tpot_s"]
        latency["latency_p99_s"] = latency["ttft_p99_s"] + n_out * latency["tpot_p99_s"]
    memory = {
        "weights_bytes": round(mem.weights_bytes),
        "kv_cache_bytes": round(mem.kv_cache_bytes),
        "kv_bytes_per_token": round(mem.kv_bytes_per_token),
        "activation_bytes": round(mem.activation_bytes),
        "overhead_bytes": round(mem.overhead_bytes),
        "total_bytes": round(mem.total_bytes),
        "capacity_bytes": round(mem.capacity_bytes),
        "max_concurrency": round(mem.max_concurrency, 2),
        "fits": mem.fits,
        "kv_cache_tokens": mem.kv_tokens,
        "gpu_memory_utilization": util,
        "max_model_len": max_len,
        "per": "GPU (each of the replica's tensor-parallel GPUs)",
    }
    throughput = {
        "output_tokens_per_s": out_tps,
        "total_tokens_per_s": out_tps * (n_in + n_out) / n_out,
        "requests_per_s": capacity,
        "samples_per_s": None,
        "batch": b_max,
    }
    widths = _bounds_widths()
    bounds = {
        **_bounds(
            {"kv_cache_bytes": mem.kv_cache_bytes, "weights_bytes": mem.weights_bytes},
            widths["memory"],
        ),
        **_bounds(
            {"output_tokens_per_s": out_tps, "requests_per_s": capacity}, widths["throughput"]
        ),
        **_bounds({k: latency.get(k) for k in ("ttft_s", "tpot_s")}, widths["latency"]),
    }
    assumptions = (
        f"engine {engine_name}: gpu_memory_utilization {util} "
        f"({'given' if svc.gpu_memory_utilization else 'engine default'}; {engine.source})",
        f"weights {weights} ({mem.weights_bytes / 2**30:.2f} GiB per GPU; embeddings, LM head "
        "and norms 16-bit); KV cache "
        f"{'fp8' if svc.kv_cache_dtype == 'fp8' else 'in the activation dtype'}, "
        f"{engine.block_tokens}-token blocks",
        f"KV budget '{engine.kv_budget}': profile step of {step_tokens} tokens, sampler batch "
        f"{seqs}; CUDA graphs {'inside' if graphs_in_budget else 'outside'} the KV budget",
        f"device: {device.label} ({device.kind}; {device.compute_fraction:.0%} of SMs, "
        f"{device.bandwidth_fraction:.0%} of bandwidth; {device.basis})",
        f"roofline: prefill compute-bound at {fit.prefill_efficiency:.0%} of dense "
        f"{roof.compute_dtype} peak; decode bandwidth-bound at {fit.decode_bandwidth_efficiency:.0%} "
        f"of HBM bandwidth, +{fit.step_overhead_s * 1e3:.1f} ms per step (fitted on "
        "validation/inference.csv)",
        f"throughput is the replica's capacity at batch {b_max} "
        f"({n_in} in / {n_out} out tokens per request); latency at the service's load",
        QUEUE_MODEL,
        *_sharing_and_slo_notes(device, has_slo=has_slo),
    )
    return ServeEstimate(
        service=svc.name,
        device=device,
        kind="llm",
        memory=memory,
        throughput=throughput,
        latency=latency,
        max_qps_within_slo=max_qps,
        capacity_rps=capacity,
        fits=mem.fits,
        reason=mem.reason
        + (" (hint: set max_model_len)" if not mem.fits and svc.max_model_len is None else ""),
        bounds=bounds,
        assumptions=assumptions,
    )


def _sharing_and_slo_notes(device: Device, *, has_slo: bool) -> tuple[str, ...]:
    """The assumptions every service kind ends with: sharing interference, no latency target."""
    notes: list[str] = []
    if device.kind in ("time-slicing", "mps"):
        notes.append(
            f"sharing interference: x{device.throughput_factor} throughput, "
            f"x{device.latency_p99_factor} p99 latency ({device.basis})"
        )
    if not has_slo:
        notes.append(f"no latency target: capacity planned at {TARGET_UTILIZATION:.0%}")
    return tuple(notes)


def _nonllm(
    svc: ServiceSpec, device: Device, work: Workload, fit: Fitted, efficiency: float
) -> ServeEstimate:
    from gpuplan.estimate.compute import peak_flops

    engine_name = svc.engine or ("hf" if work.kind == "diffusion" else "onnxruntime")
    engine = engine_defaults(engine_name)
    util = svc.gpu_memory_utilization or engine.gpu_memory_utilization
    weights = svc.weights or "fp16"
    dtype = "fp32" if weights == "fp32" else ("bf16" if weights == "bf16" else "fp16")
    peak = peak_flops(device.gpu, dtype) * device.compute_fraction
    bw = device.gpu.memory_bandwidth_gb_per_s * 1e9 * device.bandwidth_fraction
    cap = float(device.memory_bytes) * device.count
    fixed = work.weights_bytes + fit.framework_overhead_bytes
    room = util * cap - fixed
    fit_batch = int(room // work.activation_bytes_per_request) if room > 0 else 0
    b_max = min(svc.batch or work.default_batch, fit_batch)
    fits = b_max >= 1
    count = device.count

    def batch_s(b: float) -> float:
        compute = b * work.flops_per_request / (peak * count * efficiency)
        read = work.weights_bytes / (bw * count * fit.decode_bandwidth_efficiency)
        return max(compute, read) + fit.step_overhead_s

    factor, lat_f = device.throughput_factor, device.latency_p99_factor
    capacity = b_max / batch_s(b_max) * factor if fits else 0.0

    def latency_at(qps: float) -> tuple[float, float]:
        rho, wait, wait99, stable = md1_queue(qps, capacity)
        b = min(float(b_max), max(1.0, qps * batch_s(1)))
        service = batch_s(b) / factor
        return service + wait, (service + wait99) * lat_f

    def meets(qps: float) -> bool:
        return svc.slo.latency_p99 is None or latency_at(qps)[1] <= svc.slo.latency_p99

    has_slo = svc.slo.latency_p99 is not None
    max_qps = _max_qps(capacity, meets) if has_slo else capacity * TARGET_UTILIZATION
    if not fits:
        lat, lat99 = math.nan, math.nan
    elif svc.load.qps is not None:
        lat, lat99 = latency_at(min(svc.load.qps, capacity * 0.999))
    else:
        b = min(svc.load.concurrency or b_max, b_max)
        lat = batch_s(b) / factor
        lat99 = lat * lat_f
    act = work.activation_bytes_per_request * max(b_max, 1)
    memory = {
        "weights_bytes": round(work.weights_bytes),
        "kv_cache_bytes": 0,
        "kv_bytes_per_token": 0,
        "activation_bytes": round(act),
        "overhead_bytes": fit.framework_overhead_bytes,
        "total_bytes": round(work.weights_bytes + act + fit.framework_overhead_bytes),
        "capacity_bytes": round(cap),
        "max_concurrency": float(max(b_max, 0)),
        "fits": fits,
        "per": "replica",
    }
    samples = capacity
    throughput = {
        "output_tokens_per_s": None,
        "total_tokens_per_s": samples * work.tokens_per_request
        if work.tokens_per_request
        else None,
        "requests_per_s": capacity,
        "samples_per_s": samples,
        "batch": b_max,
    }
    latency = {
        "ttft_s": None,
        "tpot_s": None,
        "ttft_p99_s": None,
        "tpot_p99_s": None,
        "latency_s": None if math.isnan(lat) else lat,
        "latency_p99_s": None if math.isnan(lat99) else lat99,
    }
    widths = _bounds_widths()
    bounds = {
        **_bounds({"weights_bytes": work.weights_bytes}, widths["memory"]),
        **_bounds({"samples_per_s": samples}, widths["throughput"]),
        **_bounds({"latency_s": latency["latency_s"]}, widths["latency"]),
    }
    eff_name = "diffusion" if work.kind == "diffusion" else "encoder/vision"
    assumptions = (
        f"{work.description}: {work.flops_per_request / 1e9:,.1f} GFLOP per request "
        f"({'see models/data/diffusion' if work.kind == 'diffusion' else '2 x MACs'})",
        f"engine {engine_name}; weights {weights}; batch up to {b_max} (memory allows {fit_batch})",
        f"roofline: {efficiency:.0%} of dense {dtype} peak ({eff_name} efficiency, fitted), "
        f"weights read once per batch, +{fit.step_overhead_s * 1e3:.1f} ms per batch",
        f"device: {device.label} ({device.kind}; {device.compute_fraction:.0%} of SMs; {device.basis})",
        QUEUE_MODEL.replace("largest batch", "largest batch (dynamic batching)"),
        *_sharing_and_slo_notes(device, has_slo=has_slo),
    )
    return ServeEstimate(
        service=svc.name,
        device=device,
        kind=work.kind,
        memory=memory,
        throughput=throughput,
        latency=latency,
        max_qps_within_slo=max_qps,
        capacity_rps=capacity,
        fits=fits,
        reason="" if fits else "weights and one request's activations exceed the memory",
        bounds=bounds,
        assumptions=assumptions,
    )
