"""Analytic per-GPU peak memory of one training step.

The step is modelled in two phases, and the peak is the larger:

* **forward/backward**: weights + optimizer state + autocast weight copies +
  saved activations + the loss/logits gradients at the start of backward,
  plus gradients (already there when micro-batches accumulate, or when
  ``zero_grad`` zeroes them instead of freeing them; otherwise they
  grow while activations are freed, so the phase peaks at
  ``max(activations, gradients)``);
* **optimizer step**: weights + optimizer state + gradients + the optimizer's
  temporaries (foreach AdamW materialises one parameter-sized buffer).

Peak = params + optimizer state + max(gradients + optimizer intermediates,
activations), as the PyTorch memory-visualisation guide observes
(huggingface/blog#2560). Sharding divides what ZeRO/FSDP shard; tensor
parallelism (with sequence parallelism) divides weights and activations;
the first pipeline stage keeps ``min(pp, micro-batches)`` micro-batches in
flight (1F1B). Totals are reported three ways, as measurements are:
``peak_allocated_bytes`` (``torch.cuda.max_memory_allocated``),
``peak_reserved_bytes`` (caching allocator) and ``device_used_bytes``
(nvidia-smi: reserved + CUDA context + NCCL buffers).
"""

from __future__ import annotations

import dataclasses
import math

from gpuplan.catalog.schema import GpuSpec
from gpuplan.estimate import overheads as ovh
from gpuplan.estimate.activations import (
    Item,
    Numerics,
    Trainable,
    backward_transient_per_token,
    boundary_items,
    head_items_cached,
    layer_items_cached,
    op_sac_items,
)
from gpuplan.estimate.frameworks import FRAMEWORKS
from gpuplan.estimate.lora import adapter_params_per_layer
from gpuplan.estimate.numerics import (
    NF4_BYTES,
    NF4_BYTES_DQ,
    PRECISIONS,
    optimizer_state_bytes,
    optimizer_temp_bytes,
)
from gpuplan.estimate.shape import Shape
from gpuplan.estimate.strategy import Strategy

DEFAULT_SAFETY_MARGIN = 0.0
"""Fraction of capacity kept free on top of the estimate. None by default: the point
estimate is compared with the capacity, and the calibrated bounds
(:mod:`gpuplan.estimate.bounds`) say how sure that is (the ``fits``/``tight``/``no``
verdict), instead of a fixed 5% for every job."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MemoryJob:
    """The parts of a job spec that decide memory (besides the strategy)."""

    method: str
    precision: str
    optimizer: str
    seq_len: int
    lora_roles: frozenset[str] = frozenset()
    lora_rank: int = 0
    lora_dropout: float = 0.0
    double_quant: bool = True
    fused_attention: bool = True
    cudnn_attention: bool = False
    attention_auto: bool = False
    framework: str = "hf"
    compiled: bool = False
    optimizer_impl: str = "foreach"
    grads_kept: bool = False
    loss_chunks: int | None = None
    cuda_context_bytes: float | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Per-GPU memory of one training step, with its breakdown and assumptions.

    ``breakdown`` (weights, gradients, optimizer, activations, overhead) sums to
    ``device_used_bytes``; ``details`` itemises each part.
    """

    peak_allocated_bytes: float
    peak_reserved_bytes: float
    device_used_bytes: float
    capacity_bytes: float
    safety_margin: float
    fits: bool
    headroom_bytes: float
    peak_phase: str
    breakdown: dict[str, float]
    details: dict[str, float]
    activation_items: tuple[Item, ...]
    assumptions: tuple[str, ...]
    basis: str = "analytic"


def _stage_params(shape: Shape, st: Strategy) -> tuple[float, float, float]:
    """(layer params, non-layer params, layers) held by the worst pipeline stage, per TP rank."""
    layers = math.ceil(shape.layers / st.pp)
    head = 0 if shape.tied_embeddings else shape.params_head
    if st.pp == 1:
        other = shape.params_embedding + head + shape.params_final_norm
    else:
        other = max(shape.params_embedding, head + shape.params_final_norm)
    return layers * shape.params_per_layer / st.tp, other / st.tp, layers


def _activations(
    shape: Shape, job: MemoryJob, st: Strategy, tr: Trainable, act_bytes: int, autocast: bool
) -> tuple[float, float, list[Item]]:
    """(saved activation bytes, backward transient bytes, per-layer items) on the worst stage."""
    fw = FRAMEWORKS[job.framework]
    chunks = job.loss_chunks or fw.loss_chunks
    num = Numerics(
        act_bytes=act_bytes,
        autocast=autocast,
        python_gelu=fw.python_gelu,
        compiled=job.compiled,
        loss_chunks=chunks,
        logits_upcast_in_model=chunks == 1 and fw.upcast_unchunked_logits,
    )
    seq = shape.fixed_tokens or job.seq_len
    tokens = st.micro_batch_size * seq
    layers = math.ceil(shape.layers / st.pp)
    items = list(layer_items_cached(shape, num, tr, seq, job.fused_attention))
    per_layer = sum(i.bytes_per_token for i in items) / st.tp
    if st.activation_checkpointing == "full":
        kept = sum(i.bytes_per_token for i in boundary_items(shape, num)) / st.tp
        act_tok = layers * kept + per_layer  # one layer recomputed at a time in backward
    elif st.activation_checkpointing == "selective-op":
        kept = sum(i.bytes_per_token for i in op_sac_items(shape, num)) / st.tp
        act_tok = layers * kept + per_layer  # one layer recomputed at a time in backward
    elif st.activation_checkpointing == "selective":
        core = (
            sum(
                i.bytes_per_token
                for i in items
                if i.name.startswith("attn")
                and ("SDPA" in i.name or "s^2" in i.name or "matmul inputs" in i.name)
            )
            / st.tp
        )
        act_tok = layers * (per_layer - core) + core
    else:
        act_tok = layers * per_layer
    in_flight = min(st.pp, st.grad_accum) if st.pp > 1 else 1
    saved = act_tok * tokens * in_flight
    saved += sum(i.bytes_per_token for i in head_items_cached(shape, num, tr)) / st.tp * tokens
    transient = backward_transient_per_token(shape, num) / st.tp * tokens
    return saved, transient, items


def _cnn_activations(shape: Shape, st: Strategy, act_bytes: int, image_size: int | None) -> float:
    """Saved bytes of a CNN step.

    BatchNorm keeps its input (the conv output); the in-place ReLU and the next
    conv keep the normalised map; max-pool keeps int64 indices.
    """
    ref = shape.image_size or 224
    scale = ((image_size or ref) / ref) ** 2
    per_sample = 0.0
    for layer in shape.cnn_layers:
        if layer.kind in ("conv", "batchnorm"):
            per_sample += layer.output_elements * act_bytes
        elif layer.kind == "maxpool":
            per_sample += layer.output_elements * 8
    per_sample *= scale
    return per_sample * st.micro_batch_size


def estimate_memory(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    gpu: GpuSpec | None,
    *,
    capacity_bytes: float | None = None,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    image_size: int | None = None,
) -> MemoryEstimate:
    """Estimate per-GPU memory of one training step of ``shape`` under ``st``."""
    pb = PRECISIONS[job.precision]
    assumptions: list[str] = []
    layer_p, other_p, layers = _stage_params(shape, st)
    stage_p = layer_p + other_p
    zero3 = st.sharding in ("zero3", "fsdp") and st.dp > 1
    shard_p = st.dp if zero3 else 1
    shard_g = st.dp if st.sharding in ("zero2", "zero3", "fsdp") and st.dp > 1 else 1
    shard_o = st.dp if st.sharding != "none" and st.dp > 1 else 1
    d: dict[str, float] = {}

    if job.method == "full":
        trainable = stage_p
        tr = Trainable(full=True)
        d["weights: parameters"] = stage_p * pb.param / shard_p
        if pb.compute_copy:
            copies = (2 * shape.params_per_layer / st.tp) if zero3 else stage_p
            d["weights: low-precision compute copies"] = copies * pb.compute_copy
        state_b, grad_b, master_b = pb.state, pb.grad, pb.master
    else:
        adapters = adapter_params_per_layer(shape, job.lora_roles, job.lora_rank) * layers / st.tp
        trainable = adapters
        # PEFT (framework hf) upcasts adapters to fp32 (autocast_adapter_dtype=True, the
        # default); litgpt and torchtune keep them in the model dtype
        adapter_b = (
            4
            if job.framework == "hf"
            or job.precision.endswith("-mixed")
            or job.precision in ("fp32", "tf32")
            else 2
        )
        tr = Trainable(
            full=False,
            lora_roles=job.lora_roles,
            lora_rank=job.lora_rank,
            lora_dropout=job.lora_dropout,
            quantized_base=job.method == "qlora",
            adapter_bytes=adapter_b,
        )
        base_b = 4 if job.precision in ("fp32", "tf32") else 2
        if job.method == "qlora":
            nf4 = NF4_BYTES_DQ if job.double_quant else NF4_BYTES
            linear_p = shape.params_linear_per_layer * layers / st.tp
            largest = max(lin.params for lin in shape.linears)
            head_q = (
                FRAMEWORKS[job.framework].qlora_quantizes_head
                and shape.family == "decoder"
                and not shape.tied_embeddings
                and st.pp == 1
            )
            if head_q:
                linear_p += shape.params_head / st.tp
                largest = max(largest, shape.params_head)
            d["weights: NF4 base linears" + (" and LM head" if head_q else "")] = (
                linear_p * nf4 / shard_p
            )
            d["weights: 16-bit embeddings, norms" + ("" if head_q else ", head")] = (
                (stage_p - linear_p) * 2 / shard_p
            )
            d["weights: dequantized layer (transient)"] = 2 * largest / st.tp
            assumptions.append(
                f"QLoRA NF4 base weights, {'double' if job.double_quant else 'single'} "
                "quantization of absmax (QLoRA paper)"
            )
        else:
            d["weights: frozen base"] = stage_p * base_b / shard_p
        d["weights: LoRA adapters"] = adapters * adapter_b
        state_b = grad_b = adapter_b
        master_b = 0
        assumptions.append(
            f"LoRA r={job.lora_rank} on {sorted(job.lora_roles)}; adapters in "
            f"{'fp32' if adapter_b == 4 else '16-bit'}"
        )

    # gradients and optimizer state
    grads = trainable * grad_b / shard_g
    d["gradients"] = grads
    fw = FRAMEWORKS[job.framework]
    if zero3 and job.method != "full" and fw.fsdp_mixed_units:
        unsharded = fw.fsdp_unsharded_accumulation and st.grad_accum > 1
        d["gradients: FSDP units mixing frozen and LoRA params"] = (
            stage_p * grad_b / (1 if unsharded else st.dp) - grads
        )
        assumptions.append(
            f"{job.framework}: FSDP units mix frozen and LoRA parameters, so gradients are allocated "
            "for all of them" + (", unsharded while accumulating (no_sync)" if unsharded else "")
        )
    if st.sharding == "none" and st.dp > 1 and job.method == "full":
        d["gradients: DDP bucket copies"] = trainable * grad_b
        assumptions.append(
            "DDP with gradient_as_bucket_view=False (the default) keeps a bucket copy of the grads"
        )
    if job.optimizer == "adafactor" and job.method == "full":
        rows_cols = sum(lin.count * (lin.in_features + lin.out_features) for lin in shape.linears)
        factored = layers * rows_cols / st.tp + (shape.vocab + shape.hidden)
        vectors = (
            stage_p
            - layers * shape.params_linear_per_layer / st.tp
            - shape.vocab * shape.hidden / st.tp
        )
        opt_state = (factored + max(vectors, 0)) * 4
    else:
        opt_state = trainable * optimizer_state_bytes(job.optimizer, state_b)
    opt_state += trainable * master_b
    opt_tmp = trainable * optimizer_temp_bytes(job.optimizer, state_b)
    if job.optimizer_impl == "fused":
        opt_tmp = 0.0
    elif job.optimizer_impl == "for-loop":  # one parameter tensor at a time: the largest one
        largest = max(
            [lin.in_features * lin.out_features for lin in shape.linears]
            + [shape.vocab * shape.hidden]
        )
        opt_tmp = min(opt_tmp, largest / st.tp * state_b) if opt_tmp else 0.0
    if st.offload != "none":
        assumptions.append("optimizer state and step on the CPU (offload)")
        opt_state, opt_tmp = 0.0, 0.0
        if st.offload == "optimizer+params":
            for key in [
                k for k in d if k.startswith("weights: parameters") or k == "weights: frozen base"
            ]:
                d[key] = 2 * shape.params_per_layer / st.tp * pb.param
    d["optimizer: state"] = opt_state / shard_o
    d["optimizer: step temporaries"] = opt_tmp / shard_o
    if zero3:
        # two layers gathered at a time (current + prefetched), in the dtype they are stored in
        if job.method == "qlora":
            nf4 = NF4_BYTES_DQ if job.double_quant else NF4_BYTES
            linear = shape.params_linear_per_layer
            layer_bytes = linear * nf4 + (shape.params_per_layer - linear) * 2
        elif job.method == "lora":
            layer_bytes = shape.params_per_layer * (4 if job.precision in ("fp32", "tf32") else 2)
        else:
            layer_bytes = shape.params_per_layer * (pb.compute_copy or pb.param)
        d["weights: unsharded layers in flight (all-gather)"] = 2 * layer_bytes / st.tp

    # activations
    act_items: list[Item] = []
    if shape.family == "cnn":
        saved = _cnn_activations(shape, st, pb.act, image_size)
        transient = 0.0
    else:
        saved, transient, act_items = _activations(shape, job, st, tr, pb.act, pb.autocast)
    d["activations: saved for backward"] = saved
    d["activations: loss/logits gradients (start of backward)"] = transient
    if job.fused_attention:
        assumptions.append("fused attention (flash / memory-efficient SDPA): no s^2 buffers")
    else:
        assumptions.append(
            "eager attention: softmax probabilities (s^2 per head) kept for backward"
        )

    weights = sum(v for k, v in d.items() if k.startswith("weights"))
    copies = d.get("weights: low-precision compute copies", 0.0) + d.get(
        "weights: dequantized layer (transient)", 0.0
    )
    persistent_w = weights - copies
    grads_all = sum(v for k, v in d.items() if k.startswith("gradients"))
    acts = saved + transient
    # gradients are there through forward/backward when micro-batches accumulate, or
    # when zero_grad zeroes them in place instead of freeing them
    accumulating = st.grad_accum > 1 or job.grads_kept
    fwd_bwd = (
        persistent_w
        + copies
        + d["optimizer: state"]
        + (acts + grads_all if accumulating else max(acts, grads_all))
    )
    step = persistent_w + d["optimizer: state"] + grads_all + d["optimizer: step temporaries"]
    cublas = ovh.cublas_workspace_bytes(gpu)
    if fwd_bwd >= step:
        phase = "forward/backward"
        bd_w, bd_g = (
            persistent_w + copies,
            (grads_all if accumulating else max(0.0, grads_all - acts)),
        )
        bd_o, bd_a = d["optimizer: state"], acts
    else:
        phase = "optimizer step"
        bd_w, bd_g = persistent_w, grads_all
        bd_o, bd_a = d["optimizer: state"] + d["optimizer: step temporaries"], 0.0
    allocated = max(fwd_bwd, step) + cublas
    reserve = ovh.allocator_reserve_bytes(allocated)
    reserved = allocated + reserve
    comms = sum(1 for deg in (st.dp, st.tp, st.pp) if deg > 1)
    nccl = ovh.nccl_bytes(comms)
    context = (
        job.cuda_context_bytes if job.cuda_context_bytes is not None else ovh.CUDA_CONTEXT_BYTES
    )
    used = reserved + context + nccl
    d["overhead: cuBLAS workspaces"] = cublas
    d["overhead: caching-allocator reserve"] = reserve
    d["overhead: CUDA context"] = context
    d["overhead: NCCL buffers"] = nccl
    breakdown = {
        "weights": bd_w,
        "gradients": bd_g,
        "optimizer": bd_o,
        "activations": bd_a,
        "overhead": used - (bd_w + bd_g + bd_o + bd_a),
    }
    cap = capacity_bytes if capacity_bytes is not None else (gpu.memory_bytes if gpu else math.inf)
    usable = cap * (1 - safety_margin)
    assumptions += [
        f"precision {job.precision}: params {pb.param} B, grads {pb.grad} B, optimizer state {pb.state} B/elem",
        f"optimizer {job.optimizer} ({job.optimizer_impl} implementation); framework {job.framework}"
        + (" with torch.compile" if job.compiled else ""),
        f"CUDA context {context / 2**20:.0f} MiB; allocator reserve "
        f"{ovh.ALLOCATOR_RESERVE_FRACTION:.0%} of allocated (min 256 MiB)",
        f"fits when device_used <= capacity x (1 - {safety_margin:.0%})",
    ]
    return MemoryEstimate(
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        device_used_bytes=used,
        capacity_bytes=cap,
        safety_margin=safety_margin,
        fits=used <= usable,
        headroom_bytes=usable - used,
        peak_phase=phase,
        breakdown=breakdown,
        details=d,
        activation_items=tuple(act_items),
        assumptions=tuple(assumptions),
    )
