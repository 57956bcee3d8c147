"""The estimators' in-process memo tables, emptied before each timed run.

The memory estimate (and its GPU-independent steps), the transformer and CNN compute steps and
the activation items are pure functions cached with ``functools.lru_cache``, so a second call
with the same arguments is a dictionary lookup. A fresh ``gpuplan`` process starts with them
empty; every timed run here does too, so a benchmark times the estimate, not the cache.
"""

from __future__ import annotations

from gpuplan.estimate import activations, compute, memory

ESTIMATE_CACHES = (
    compute.transformer_step,
    compute.cnn_step,
    activations.layer_items_cached,
    activations.head_items_cached,
)


def clear_estimate_caches() -> None:
    """Empty every memo table: the memory estimate's and :data:`ESTIMATE_CACHES`."""
    memory.clear_caches()
    for cache in ESTIMATE_CACHES:
        cache.cache_clear()
