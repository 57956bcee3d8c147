"""Serving speed: a prefill/decode roofline with batch, and the queue in front of it.

LLM engine iteration (continuous batching, ``B`` requests decoding together):

- decode step: ``max(bytes / (BW x e_bw), flops / (peak x e_dc)) + overhead`` with
  ``bytes = weights + B x context x kv_bytes_per_token`` (memory-bandwidth-bound at
  small B) and ``flops = 2 x active_params x B + 4 x layers x B x context x q_width``;
  tensor parallelism adds two all-reduces of ``B x hidden`` per layer and a fitted
  slowdown ``1 + k x (tp - 1)`` (synchronisation and smaller GEMMs per GPU).
- prefill of one request: ``(2 x active_params x n + 2 x layers x n^2 x q_width) /
  (peak x e_prefill)`` (compute-bound; the causal mask halves the score FLOPs), at
  least one read of the weights, plus one step's overhead.
- per output token of the batch: ``tau(B) = decode(B) + (B / output_tokens) x
  prefill`` (each step, B / output_tokens requests finish and are replaced, and
  their prefill is chunked into the steps). Output tokens/s = ``B / tau(B)``.
  Static batching (all B prefilled together, then decoded) gives the same sum.

Queueing at ``qps`` (stated model): the engine is one server of capacity
``mu`` = requests/s at the largest batch; arrivals are Poisson; service is taken
as deterministic (M/D/1, Pollaczek-Khinchine): mean wait ``rho / (2 mu (1 - rho))``;
the p99 wait is that mean times ln 100 (an exponential tail). Requests in flight
follow from Little's law, ``N = qps x (TTFT + output_tokens x TPOT(N))``, solved
by fixed-point iteration; TPOT p99 is taken at ``N + 2.33 sqrt(N)`` (Poisson
fluctuation of N).
"""

from __future__ import annotations

import dataclasses
import math

from gpuplan.estimate.compute import peak_flops
from gpuplan.estimate.serve_constants import Fitted
from gpuplan.estimate.serve_device import Device
from gpuplan.models.config import ModelConfig
from gpuplan.models.params import count_parameters

P99_WAIT_FACTOR = math.log(100.0)
"""p99 / mean of an exponential waiting time."""
Z99 = 2.326
"""One-sided 99% normal quantile."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LlmRoofline:
    """The numbers a decode/prefill roofline needs for one replica (per GPU)."""

    cfg: ModelConfig
    device: Device
    weights_bytes: float
    kv_bytes_per_token: float
    compute_dtype: str
    fit: Fitted
    active_params: float = dataclasses.field(default=0.0)
    _peak: float = dataclasses.field(default=0.0, init=False)
    _bw: float = dataclasses.field(default=0.0, init=False)
    _active_params: float = dataclasses.field(default=0.0, init=False)
    _q_width: float = dataclasses.field(default=0.0, init=False)
    _tp_factor: float = dataclasses.field(default=1.0, init=False)
    """Fitted slowdown of tensor parallelism beyond its all-reduces (per extra GPU)."""

    def __post_init__(self) -> None:
        if not self.active_params:
            total = count_parameters(self.cfg).active_per_token
            object.__setattr__(self, "active_params", float(total))
        dev = self.device
        derived = {
            "_peak": peak_flops(dev.gpu, self.compute_dtype) * dev.compute_fraction,
            "_bw": dev.gpu.memory_bandwidth_gb_per_s * 1e9 * dev.bandwidth_fraction,
            "_active_params": self.active_params / dev.count,
            "_q_width": self.cfg.num_attention_heads * self.cfg.head_dim / dev.count,
            "_tp_factor": 1.0 + self.fit.tp_overhead_per_gpu * (dev.count - 1),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def _allreduce_s(self, tokens: float) -> float:
        tp = self.device.count
        if tp == 1:
            return 0.0
        gpu = self.device.gpu
        link = (gpu.nvlink_bandwidth_gb_per_s or 64.0) / 2 * 1e9
        size = tokens * self.cfg.hidden_size * 2
        per = 2 * (tp - 1) / tp * size / link + 8e-6
        return 2 * self.cfg.num_layers * per

    def decode_step_s(self, batch: float, context: float) -> float:
        """One decode iteration of ``batch`` requests at mean ``context`` tokens."""
        fit = self.fit
        nbytes = self.weights_bytes + batch * context * self.kv_bytes_per_token
        flops = (
            2 * self._active_params * batch
            + 4 * self.cfg.num_layers * batch * context * self._q_width
        )
        t = max(
            nbytes / (self._bw * fit.decode_bandwidth_efficiency),
            flops / (self._peak * fit.decode_compute_efficiency),
        )
        return (t + self._allreduce_s(batch)) * self._tp_factor + fit.step_overhead_s

    def prefill_compute_s(self, tokens: float) -> float:
        """The prefill's GEMM and attention time alone (what chunking adds to decode steps)."""
        flops = (
            2 * self._active_params * tokens
            + 2 * self.cfg.num_layers * tokens * tokens * self._q_width
        )
        return flops / (self._peak * self.fit.prefill_efficiency) * self._tp_factor

    def prefill_s(self, tokens: float) -> float:
        """Prefill of one request of ``tokens`` tokens (compute-bound)."""
        flops = (
            2 * self._active_params * tokens
            + 2 * self.cfg.num_layers * tokens * tokens * self._q_width
        )
        compute = flops / (self._peak * self.fit.prefill_efficiency)
        weights = self.weights_bytes / (self._bw * self.fit.decode_bandwidth_efficiency)
        return (max(compute, weights) + self._allreduce_s(tokens)) * self._tp_factor + (
            self.fit.step_overhead_s
        )

    def per_token_s(
        self, batch: float, input_tokens: int, output_tokens: int, prefill: float | None = None
    ) -> float:
        """tau(B): wall time per decode iteration including the chunked-in prefills.

        ``prefill``: the prefill time of one request's prompt, when already known.
        """
        context = input_tokens + output_tokens / 2
        if prefill is None:
            prefill = self.prefill_compute_s(input_tokens)
        share = batch / output_tokens * prefill
        return self.decode_step_s(batch, context) + share


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Queue:
    """Latency of a service at an arrival rate (or a closed-loop concurrency)."""

    in_flight: float
    utilization: float
    wait_s: float
    wait_p99_s: float
    stable: bool


def md1_queue(arrival_rate: float, capacity: float) -> tuple[float, float, float, bool]:
    """(rho, mean wait, p99 wait) of an M/D/1 queue; stable is rho < 1.

    >>> round(md1_queue(1.0, 2.0)[1], 3)
    0.25
    """
    if capacity <= 0:
        return (math.inf, math.inf, math.inf, False)
    rho = arrival_rate / capacity
    if rho >= 1:
        return (rho, math.inf, math.inf, False)
    wait = rho / (2 * capacity * (1 - rho))
    return (rho, wait, wait * P99_WAIT_FACTOR, True)


def llm_in_flight(
    roof: LlmRoofline, qps: float, input_tokens: int, output_tokens: int, max_batch: int
) -> float:
    """Requests in flight at ``qps`` by Little's law (fixed point), capped at ``max_batch``."""
    prefill = roof.prefill_s(input_tokens)
    chunk = roof.prefill_compute_s(input_tokens)
    n = qps * (prefill + output_tokens * roof.decode_step_s(1, input_tokens))
    for _ in range(12):
        b = min(max(n, 1.0), float(max_batch))
        tpot = roof.per_token_s(b, input_tokens, output_tokens, chunk)
        new = qps * (prefill + tpot + output_tokens * tpot)
        if abs(new - n) < 5e-3 * max(1.0, n):
            n = new
            break
        n = 0.5 * (n + new)
    return min(n, float(max_batch))
