"""Benchmark the fit estimators against their targets (issue: Fit).

Targets: analytic estimate < 20 ms per spec; traced Llama-3-8B (seq 2048,
batch 1) < 60 s on a 2-core machine. Prints the measurements and exits 1 if a
target is missed. Run: ``python benchmarks/bench_fit.py [--skip-trace]``.
"""

from __future__ import annotations

import statistics
import sys
import time

from _caches import clear_estimate_caches  # benchmarks/: every timed run starts cold

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate.fit import fit
from gpuplan.spec import parse_spec

SPECS = [
    {"model": "llama-3-8b", "method": "lora", "seq_len": 2048, "micro_batch_size": 4},
    {
        "model": "llama-3.1-70b",
        "method": "qlora",
        "seq_len": 4096,
        "micro_batch_size": 1,
        "activation_checkpointing": "full",
    },
    {"model": "gpt2", "precision": "fp32", "seq_len": 1024, "micro_batch_size": 8},
    {"model": "resnet-50", "precision": "bf16-mixed", "micro_batch_size": 256},
    {"model": "mixtral-8x7b", "seq_len": 4096, "parallelism": {"sharding": "zero3"}},
]


def main() -> int:
    cat = load_catalog(use_user=False)
    gpu = cat.gpu("H100-SXM")
    ok = True
    for data in SPECS:
        spec = parse_spec(data)
        count = 8 if "parallelism" in data else 1
        fit(spec, gpu, count)  # warm caches (model parse)
        times = []
        for _ in range(20):
            clear_estimate_caches()
            t0 = time.perf_counter()
            fit(spec, gpu, count)
            times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1000
        ok &= ms < 20
        print(
            f"analytic fit {data['model']:14s} median {ms:6.2f} ms (target < 20 ms, incl. max micro-batch search)"
        )
    if "--skip-trace" not in sys.argv:
        from gpuplan.trace import trace_memory

        spec = parse_spec({"model": "llama-3-8b", "precision": "bf16-true", "seq_len": 2048})
        t0 = time.perf_counter()
        result = trace_memory(spec)
        wall = time.perf_counter() - t0
        ok &= wall < 60
        print(
            f"traced llama-3-8b seq 2048 batch 1: {wall:.1f} s (target < 60 s), peak "
            f"{result.peak_bytes / 2**30:.1f} GiB"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
