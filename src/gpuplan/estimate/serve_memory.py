"""Inference memory as serving engines account it (per GPU of a replica).

LLMs (vLLM's accounting, ``vllm/v1/worker/gpu_worker.py``): the engine may use
``gpu_memory_utilization x total``; it loads the weights, runs a profile step of
``max_num_batched_tokens`` tokens (peak activations) and a dummy sampler batch of
``max_num_seqs`` rows, notes memory outside PyTorch, captures CUDA graphs, and
what is left is the KV cache ("Available KV cache memory"). The cache holds
``kv_cache_bytes / kv_bytes_per_token`` tokens in blocks; "Maximum concurrency
for N tokens per request" is that token count over ``max_model_len``. Other
engines differ in the budget (``kv_budget`` in ``serve_efficiency.yaml``).

Weights per format (bytes per parameter of the quantized linear layers; the
embeddings, LM head and norms stay 16-bit, as vLLM, AutoAWQ/GPTQ and
bitsandbytes leave them):

=======  =================================================================
fp32     4
bf16     2 (fp16 likewise)
fp8      1 + one fp32 scale per tensor (negligible)
int8     1 + one fp16 scale per output channel (W8A8 / GPTQ-8bit)
int4     0.5 + (fp16 scale + 4-bit zero) per group of 128 = 0.5 + 2.5/128
nf4      0.5 + 8-bit absmax per block of 64 and fp32 per 256 blocks (double quant)
=======  =================================================================
"""

from __future__ import annotations

import dataclasses
import math

from gpuplan.estimate.serve_constants import EngineDefaults, Fitted
from gpuplan.estimate.serve_device import Device
from gpuplan.models.config import ModelConfig
from gpuplan.models.params import count_parameters

QUANT_BYTES_PER_PARAM: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5 + 2.5 / 128,
    "nf4": 0.5 + (1 + 4 / 256) / 64,
}
"""Bytes per parameter of the quantized (linear) layers, group scales included."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LlmMemory:
    """Per-GPU memory of one LLM replica, bytes (all GPUs of a TP group alike)."""

    weights_bytes: float
    activation_bytes: float
    overhead_bytes: float
    kv_cache_bytes: float
    kv_bytes_per_token: float
    kv_tokens: int
    capacity_bytes: float
    budget_bytes: float
    max_concurrency: float
    fits: bool
    reason: str

    @property
    def total_bytes(self) -> float:
        """Weights + KV cache + activations + overhead on each GPU."""
        return (
            self.weights_bytes + self.kv_cache_bytes + self.activation_bytes + self.overhead_bytes
        )


def weight_bytes(cfg: ModelConfig, weights: str, tp: int = 1) -> float:
    """Bytes of the weights on each of ``tp`` GPUs in format ``weights``.

    >>> from gpuplan.models import load_model
    >>> round(weight_bytes(load_model("llama-3-8b"), "bf16") / 2**30, 2)
    14.96
    """
    pc = count_parameters(cfg)
    wide = pc.embeddings + pc.lm_head + pc.norms
    quantized = pc.total - wide
    wide_bytes = 4.0 if weights == "fp32" else 2.0
    return (quantized * QUANT_BYTES_PER_PARAM[weights] + wide * wide_bytes) / tp


def kv_bytes_per_token(cfg: ModelConfig, kv_dtype_bytes: float, tp: int = 1) -> float:
    """KV-cache bytes per token on each GPU: layers x kv_heads x head_dim x 2 (K, V) x bytes.

    KV heads are split across tensor-parallel GPUs, and replicated when there
    are fewer heads than GPUs (as vLLM does).

    >>> from gpuplan.models import load_model
    >>> kv_bytes_per_token(load_model("llama-3-8b"), 2)
    131072.0
    """
    heads = max(1, cfg.num_kv_heads // tp) if cfg.num_kv_heads >= tp else 1
    return float(cfg.num_layers * heads * cfg.head_dim * 2 * kv_dtype_bytes)


def activation_bytes(
    cfg: ModelConfig, *, tokens: int, seqs: int, act_bytes: float, tp: int, fit: Fitted
) -> float:
    """Peak activations of the engine's profile step, bytes per GPU.

    ``tokens`` rows through the widest layer (hidden + q + k + v + the gated MLP's
    three intermediate widths, split by TP) times a fitted factor, plus the
    sampler's dummy batch of ``seqs`` fp32 logits rows.
    """
    inter = cfg.intermediate_size
    if cfg.num_experts > 1:
        inter = cfg.moe_intermediate_size * cfg.num_experts_per_token
    q = cfg.num_attention_heads * cfg.head_dim
    kv = 2 * cfg.num_kv_heads * cfg.head_dim
    mlp_widths = 3 * inter if cfg.mlp == "gated" else 2 * inter
    per_token = cfg.hidden_size + (q + kv + mlp_widths) / tp
    sampler = seqs * cfg.vocab_size / tp * 4
    return fit.activation_factor * tokens * per_token * act_bytes + sampler


def llm_memory(
    cfg: ModelConfig,
    device: Device,
    *,
    weights: str,
    kv_cache_dtype: str,
    max_model_len: int,
    utilization: float,
    engine: EngineDefaults,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    fit: Fitted,
    graphs_in_budget: bool = True,
) -> LlmMemory:
    """Per-GPU memory of an LLM replica and the KV cache that is left.

    ``graphs_in_budget``: CUDA-graph memory is taken out of the KV budget (vLLM
    since 0.21); otherwise the graphs live in the ``1 - utilization`` margin.
    """
    tp = device.count
    act_dtype_bytes = 4.0 if weights == "fp32" else 2.0
    kv_dtype = 1.0 if kv_cache_dtype == "fp8" else act_dtype_bytes
    w = weight_bytes(cfg, weights, tp)
    per_token = kv_bytes_per_token(cfg, kv_dtype, tp)
    act = activation_bytes(
        cfg,
        tokens=min(max_num_batched_tokens, max(max_model_len, 1)),
        seqs=max_num_seqs,
        act_bytes=act_dtype_bytes,
        tp=tp,
        fit=fit,
    )
    non_torch = fit.non_torch_bytes * (1.5 if tp > 1 else 1.0)
    graphs = fit.cuda_graph_bytes if engine.cuda_graphs else 0.0
    overhead = non_torch + graphs
    budgeted = overhead if graphs_in_budget else non_torch
    cap = float(device.memory_bytes)
    budget = utilization * cap
    if engine.kv_budget == "total":
        kv = budget - w - act - budgeted
    elif engine.kv_budget == "static":
        kv = budget - w
    elif engine.kv_budget == "free":
        kv = utilization * (cap - w - act - budgeted)
    else:  # dynamic: whatever the requests need, up to what is free
        kv = cap - w - act - overhead
    kv = max(0.0, kv)
    blocks = math.floor(kv / (per_token * engine.block_tokens)) if per_token else 0
    tokens = blocks * engine.block_tokens
    concurrency = tokens / max_model_len
    if w + act + budgeted > (cap if engine.kv_budget != "total" else budget):
        fits, reason = False, "weights, activations and overhead exceed the memory budget"
    elif tokens < max_model_len:
        fits = False
        reason = (
            f"KV cache holds {tokens:,} tokens, fewer than max_model_len {max_model_len:,} "
            "(the engine refuses to start)"
        )
    else:
        fits, reason = True, ""
    return LlmMemory(
        weights_bytes=w,
        activation_bytes=act,
        overhead_bytes=overhead,
        kv_cache_bytes=kv,
        kv_bytes_per_token=per_token,
        kv_tokens=tokens,
        capacity_bytes=cap,
        budget_bytes=budget,
        max_concurrency=concurrency,
        fits=fits,
        reason=reason,
    )
