"""Benchmark `serve estimate` and `serve plan` against their targets (issue 13).

Targets: one service estimate < 20 ms; planning 10 services over the whole built-in
catalog < 2 s (warm: catalog loaded and scipy imported once, as in a long-running
process; the one-time scipy import is reported separately). Exits 1 if a target is missed.
Run: ``python benchmarks/bench_serve.py``.
"""

from __future__ import annotations

import statistics
import sys
import time

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate.serve import estimate_service
from gpuplan.estimate.serve_device import resolve_device
from gpuplan.planner.serve_plan import plan_services
from gpuplan.serve.spec import parse_serve_spec

TEN_SERVICES = [
    {
        "name": "chat-8b",
        "model": "llama-3.1-8b",
        "max_model_len": 8192,
        "load": {"qps": 5},
        "slo": {"ttft_p99": "1s", "tpot_p99": "60ms"},
    },
    {
        "name": "chat-small",
        "model": "qwen2.5-7b",
        "weights": "int4",
        "max_model_len": 4096,
        "load": {"qps": 0.5},
        "slo": {"ttft_p99": "2s", "tpot_p99": "100ms"},
    },
    {"name": "chat-1b", "model": "llama-3.2-1b", "max_model_len": 4096, "load": {"qps": 2}},
    {
        "name": "chat-70b",
        "model": "llama-3.1-70b",
        "weights": "fp8",
        "max_model_len": 8192,
        "load": {"qps": 1},
        "slo": {"ttft_p99": "2s"},
    },
    {
        "name": "sd",
        "model": "sd-1.5",
        "steps": 25,
        "load": {"qps": 0.1},
        "slo": {"latency_p99": "15s"},
    },
    {"name": "sdxl", "model": "sdxl", "steps": 30, "load": {"qps": 0.02}},
    {
        "name": "bert-a",
        "model": "bert-base",
        "seq_len": 128,
        "load": {"qps": 20},
        "slo": {"latency_p99": "100ms"},
    },
    {"name": "bert-b", "model": "bert-large", "seq_len": 256, "load": {"qps": 10}},
    {"name": "resnet", "model": "resnet-50", "load": {"qps": 50}, "slo": {"latency_p99": "50ms"}},
    {"name": "vit", "model": "vit-b-16", "load": {"qps": 30}},
]


def _median(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ok = True
    cat = load_catalog(use_user=False)
    spec = parse_serve_spec({"services": TEN_SERVICES})
    svc = spec.services[0]
    device = resolve_device(cat, "H100-SXM")
    estimate_service(svc, device)
    t = _median(lambda: estimate_service(svc, resolve_device(cat, "H100-SXM")), 50)
    print(f"serve estimate (Llama 3.1 8B, qps + SLO, H100): {t * 1e3:.2f} ms (target < 20 ms)")
    ok &= t < 0.020
    t0 = time.perf_counter()
    import scipy.optimize  # noqa: F401

    print(f"one-time scipy.optimize import: {time.perf_counter() - t0:.2f} s (not counted)")
    t = _median(lambda: plan_services(spec, cat), 3)
    result = plan_services(spec, cat)
    print(
        f"serve plan, 10 services x whole catalog: {t:.2f} s (target < 2 s); "
        f"{result.candidates_considered} placements, {result.method}"
    )
    ok &= t < 2.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
