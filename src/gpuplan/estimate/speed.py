"""Step time, throughput, MFU and time-to-train of one configuration, and the auto search.

step = micro-batches x compute / (1 - pipeline bubble) + exposed communication
       + optimizer step, plus a stated per-architecture overhead fraction.

The pipeline bubble is ``(p-1)/(m+p-1)`` for 1F1B with m micro-batches
(Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC21). Data-parallel gradient traffic overlaps
backward; ZeRO-3/FSDP gathers overlap compute through prefetch; tensor-parallel
collectives sit on the critical path. MFU counts model FLOPs only (no
recomputation), against the dense peak of the compute dtype (PaLM's definition):
6 per parameter and token for full training, 4 for a frozen base under LoRA and
QLoRA, which computes no weight gradient for it (counted as 6, an fp32 LoRA step
at the plain-fp32 GEMM level reported an MFU above 100%).
"""

from __future__ import annotations

import dataclasses
import math

from gpuplan.catalog.schema import GpuSpec
from gpuplan.estimate import comm
from gpuplan.estimate.activations import Numerics, Trainable, layer_items_cached
from gpuplan.estimate.adapter_time import AdapterImpl
from gpuplan.estimate.calibration import ArchEfficiency, efficiencies, for_dtype
from gpuplan.estimate.compute import (
    CNN_KERNELS,
    CUDNN_BENCHMARK_CHOICE,
    DEQUANT_BYTES_PER_WEIGHT,
    EAGER_DROPOUT_PASSES,
    EAGER_KERNELS_PER_LAYER,
    EAGER_KERNELS_PER_LAYER_AUTOCAST,
    EAGER_SCORE_PASSES,
    GEMM_ALIGN_ELEMENTS,
    KERNELS_PER_LAYER,
    MEGATRON_SOFTMAX_PASSES,
    SOFTCAP_PASSES,
    UNALIGNED_GEMM_SLOWDOWN,
    ComputeTime,
    cnn_step,
    fp8_needs_transposes,
    head_is_aligned,
    peak_flops,
    recompute_skips_last_linear,
    transformer_step,
)
from gpuplan.estimate.frameworks import (
    DS_COALESCED_GATHERS,
    FRAMEWORKS,
    deepspeed_overlap_comm,
    deepspeed_reduction,
)
from gpuplan.estimate.gathers import deepspeed_parameter_gathers
from gpuplan.estimate.grad_passes import GradPasses
from gpuplan.estimate.grad_passes import grad_passes_s as grad_passes_time
from gpuplan.estimate.lora import adapter_params_per_layer, expert_adapter_params_per_layer
from gpuplan.estimate.memory import (
    MemoryJob,
    adapter_bytes,
    engine_casts_to_16bit,
    expert_params_per_layer,
    gathered_layer_bytes,
    layout_for,
    split_over,
)
from gpuplan.estimate.numerics import PRECISIONS, PrecisionBytes
from gpuplan.estimate.optimizer_step import FORLOOP_KERNELS, forloop_step_s
from gpuplan.estimate.shape import Shape
from gpuplan.estimate.sharding import DeepSpeedOptions, StateLayout
from gpuplan.estimate.strategy import Strategy


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TimeEstimate:
    """The ``time`` part of ``gpuplan estimate --json`` plus its breakdown."""

    step_time_s: float
    samples_per_s: float
    tokens_per_s: float | None
    tokens_per_s_per_gpu: float | None
    mfu: float
    compute_s: float
    exposed_comm_s: float
    comm_fraction: float
    scaling_efficiency: float
    time_to_train_s: float | None
    gpu_hours: float | None
    bubble_s: float
    optimizer_s: float
    comm_total_s: float
    parts: dict[str, float]
    assumptions: tuple[str, ...]
    eval_s: float = 0.0
    """Forward-only evaluation over the run (``work.eval_samples``), inside ``time_to_train_s``."""

    def as_contract(self) -> dict[str, object]:
        """The JSON ``time`` object (contract keys first, then the breakdown)."""
        return {
            "step_time_s": self.step_time_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "compute_s": self.compute_s,
            "exposed_comm_s": self.exposed_comm_s,
            "comm_fraction": self.comm_fraction,
            "scaling_efficiency": self.scaling_efficiency,
            "time_to_train_s": self.time_to_train_s,
            "gpu_hours": self.gpu_hours,
            "bubble_s": self.bubble_s,
            "optimizer_s": self.optimizer_s,
            "comm_total_s": self.comm_total_s,
            "eval_s": self.eval_s,
            "parts": self.parts,
            "assumptions": list(self.assumptions),
        }


CUDNN_SDPA_DEFAULT_CC = frozenset({"9.0", "10.0", "10.3"})
"""Compute capabilities on which PyTorch's SDPA prefers the cuDNN kernel (sm90, sm100, sm103:
pytorch/pytorch#162073 and #170800, with a bundled cuDNN >= 9.15), so ``attention: auto``
means cuDNN-class attention there."""


def cudnn_attention(job: MemoryJob, gpu: GpuSpec) -> bool:
    """Whether the job's fused attention runs cuDNN-class kernels on ``gpu``."""
    if job.cudnn_attention:
        return True
    return job.attention_auto and (gpu.compute_capability or "") in CUDNN_SDPA_DEFAULT_CC


UNFUSED_PASS_RATIO = {"adamw": 20 / 7, "sgd-momentum": 11 / 5}
"""Element passes of PyTorch's unfused optimizers (foreach or per-parameter loop) over those of
the fused kernel, which reads parameter, gradient and state once and writes parameter and state
once (AdamW 7, SGD with momentum 5). ``torch/optim/adamw.py`` (``_single_tensor_adamw``, and
``_multi_tensor_adamw`` with the same ops as ``_foreach_*`` calls): weight decay ``param.mul_``
(2), ``exp_avg.lerp_`` (3), ``exp_avg_sq.mul_().addcmul_()`` (5), ``denom = sqrt / bias
correction + eps`` (6), ``param.addcdiv_`` (4): 20. ``torch/optim/sgd.py``: weight decay
``grad.add(param)`` (3), ``buf.mul_().add_()`` (5), ``param.add_(buf)`` (3): 11."""


def _exposed(total: float, window: float, overlap: float) -> float:
    """What of ``total`` seconds of communication is not hidden behind ``window`` seconds of
    compute when at most the fraction ``overlap`` of it can be."""
    return max(total - overlap * window, (1 - overlap) * total)


def _optimizer_bytes_per_param(
    optimizer: str, precision: str, full: bool, impl: str = "fused"
) -> float:
    pb = PRECISIONS[precision]
    p, g, s = (pb.param, pb.grad, pb.state) if full else (4, 4, 4)
    master = 8 if full and pb.master else 0
    states = {
        "adamw": 4 * s,
        "adamw-8bit": 4,
        "sgd": 0,
        "sgd-momentum": 2 * s,
        "lion": 2 * s,
        "adafactor": 0.1 * s,
    }[optimizer]
    fused = 2 * p + g + states + master
    if impl == "fused":
        return fused
    return fused * UNFUSED_PASS_RATIO.get(optimizer, 1.0)


def _eval_time(
    eval_samples: int | None,
    evaluations: float | None,
    st: Strategy,
    forward_s: float,
    eff: ArchEfficiency,
) -> float:
    """Seconds of forward-only evaluation over the run: ``eval_samples`` in ``evaluations``
    equal passes (one where not given), each split over the data-parallel ranks in
    training-size micro-batches, its last one rounded up, and each stage's forward in turn (a
    pipeline fills once per pass), with the same step overhead as training."""
    if not eval_samples:
        return 0.0
    passes = evaluations or 1.0
    per_pass = math.ceil(eval_samples / passes / (st.micro_batch_size * st.dp))
    return passes * (per_pass + st.pp - 1) * forward_s * (1 + eff.step_overhead)


def time_lengths(shape: Shape, job: MemoryJob) -> tuple[int, int]:
    """(tokens per sample, tokens each token attends over) that time is sized by.

    Memory is sized by ``job.seq_len``, the longest sample. Unpadded data
    (``mean_seq_len`` without packing) costs its mean length in both; packed rows are
    full (``seq_len`` tokens) and attend within each document (``mean_seq_len``).
    """
    full = shape.fixed_tokens or job.seq_len
    if shape.fixed_tokens or job.mean_seq_len is None:
        return full, full
    mean = max(1, round(job.mean_seq_len))
    return (full, mean) if job.packing else (mean, mean)


def _work_steps(work: object, global_samples: int, seq: int | None) -> float | None:
    if work is None:
        return None
    tokens: float | None = getattr(work, "tokens", None)
    samples: float | None = getattr(work, "samples", None)
    steps: float | None = getattr(work, "steps", None)
    if steps is not None:
        return float(steps)
    if tokens is not None:
        per_step = global_samples * (seq or 1)
        return float(tokens / per_step)
    if samples is not None:
        epochs = getattr(work, "epochs", None) or 1.0
        return float(samples * epochs / global_samples)
    return None


def _score_bytes(job: MemoryJob) -> int:
    """Bytes of an eager attention score: autocast runs softmax in fp32 (PyTorch's autocast
    fp32 list), an fp32 model is fp32 throughout, a model cast to 16 bits (Apex O2, DeepSpeed,
    ``*-true``) keeps 16-bit scores."""
    return 2 if PRECISIONS[job.precision].act == 2 and not _torch_autocast(job) else 4


def _torch_autocast(job: MemoryJob) -> bool:
    """Whether the step runs under torch autocast: a ``*-mixed`` precision under a PyTorch engine
    (DeepSpeed and Apex O2 cast the model instead)."""
    return PRECISIONS[job.precision].autocast and FRAMEWORKS[job.framework].engine == "pytorch"


def _grad_passes(job: MemoryJob, st: Strategy) -> GradPasses:
    """The gradient passes this job's loop runs besides the update (:mod:`grad_passes`):
    DDP's bucket copies under a PyTorch engine that does not shard gradients, across more
    than one replica; the loss scaler's unscale under fp16 with torch autocast or Megatron;
    clipping where the job clips; zeroing in place where ``zero_grad`` zeroes."""
    engine = FRAMEWORKS[job.framework].engine
    fp16 = job.precision == "fp16-mixed"
    return GradPasses(
        ddp_bucket_copies=engine == "pytorch"
        and st.sharding in ("none", "zero1")
        and st.replicas > 1,
        unscale=fp16 and (_torch_autocast(job) or engine == "megatron"),
        clip=job.gradient_clipping,
        zero_fill=job.grads_kept,
    )


EAGER_FRAMEWORKS = frozenset({"hf", "deepspeed", "litgpt", "torchtune"})
"""Engines that run the model's own eager PyTorch modules (DeepSpeed wraps a Hugging Face model)."""


def _autocast_weight_traffic_s(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    lay: StateLayout,
    layers: int,
    micro_batches: int,
    hbm: float,
) -> float:
    """Seconds a micro-batch spends moving fp32 weights in and out of torch autocast.

    Under autocast an fp32 linear weight is cast to 16 bits for each forward
    (``_to_copy``, cached within one autocast region, so once a micro-batch): 4 bytes read,
    2 written. Its 16-bit gradient flows back through that cast to fp32 (2 read, 4 written) and
    ``AccumulateGrad`` adds it to ``.grad`` in place from the second micro-batch of a step
    (4 + 4 read, 4 written; the first takes the tensor). Full checkpointing casts again:
    ``torch.utils.checkpoint`` re-enters autocast for the recompute, a new region with an empty
    cache. Only where the engine stores fp32 parameters whole (DDP, ZeRO-1 of PyTorch) and runs
    no pipeline; FSDP gathers its parameters in 16 bits (``layout_search._keeps_weights_whole``
    is the same rule on a strategy alone). The weights are the linears' (autocast's fp16 list
    casts a linear's arguments; embeddings and norms run in fp32) and the LM head's.
    """
    if not (_torch_autocast(job) and job.method == "full" and shape.family != "cnn"):
        return 0.0
    if st.pp > 1:
        # a pipeline runs on a pipeline engine (Megatron-Core, DeepSpeed's), which keeps 16-bit
        # weights; the loops that cast per micro-batch (Transformers' Trainer, Lightning, timm)
        # have no pipeline schedule
        return 0.0
    if lay.param_bytes != 4 or lay.param_ranks != 1 or lay.gather_bytes:
        return 0.0
    linears = layers * sum(lin.in_features * lin.out_features * lin.count for lin in shape.linears)
    weights = (linears + (shape.params_head or shape.vocab * shape.hidden)) / st.tp
    return weights * _cast_bytes_per_weight(micro_batches, st.activation_checkpointing) / hbm


def _cast_bytes_per_weight(micro_batches: int, checkpointing: str) -> float:
    """Bytes a weight moves a micro-batch under autocast (:func:`_autocast_weight_traffic_s`)."""
    casts = 2 if checkpointing == "full" else 1
    return 6 * casts + 6 + 12 * (micro_batches - 1) / micro_batches


def autocast_cast_ratio(micro_batches: int, checkpointing: str) -> float:
    """Autocast's weight traffic a micro-batch at ``micro_batches`` a step over that at one
    (the layout search times one micro-batch and scales this part)."""
    return _cast_bytes_per_weight(micro_batches, checkpointing) / _cast_bytes_per_weight(
        1, checkpointing
    )


def _kernels_per_layer(job: MemoryJob, shape: Shape) -> int:
    """Kernel launches of one layer's forward and backward: counted for Hugging Face's eager
    models (:data:`EAGER_KERNELS_PER_LAYER`, and :data:`EAGER_KERNELS_PER_LAYER_AUTOCAST` under
    torch autocast, whose casts are kernels too), the fused-kernel prior otherwise (and where
    the spec states ``fused_kernels``)."""
    if job.compiled or job.fused_kernels or job.framework not in EAGER_FRAMEWORKS:
        return KERNELS_PER_LAYER
    counts = EAGER_KERNELS_PER_LAYER_AUTOCAST if _torch_autocast(job) else EAGER_KERNELS_PER_LAYER
    if shape.norm == "rmsnorm" and shape.rope:
        return counts["llama"]
    return counts["bert" if shape.family == "encoder" else "gpt2"]


def _adapter_impl(job: MemoryJob, st: Strategy, pb: PrecisionBytes, adapter_b: int) -> AdapterImpl:
    """How this job's engine runs the LoRA branches: PEFT's casts under framework hf (and its
    ``Linear4bit`` for QLoRA), plain ops in the adapters' dtype elsewhere. The fp32 stream of
    PEFT's QLoRA comes from ``prepare_model_for_kbit_training``, which TRL skips for sharded
    QLoRA (FSDP, ZeRO-3: ``is_sharded_qlora`` in TRL's ``prepare_peft_model``), whose 4-bit
    weights are stored in the 16-bit dtype."""
    fw = FRAMEWORKS[job.framework]
    peft = fw.fp32_adapters
    sharded = st.sharding in ("fsdp", "hsdp", "zero3")
    return AdapterImpl(
        adapter_bytes=adapter_b,
        act_bytes=pb.act,
        autocast=_torch_autocast(job),
        dropout=job.lora_dropout > 0,
        peft=peft,
        four_bit_base=peft and job.method == "qlora",
        compiled=job.compiled,
        fused_qkv=fw.engine == "megatron",
        fp32_stream=peft and job.method == "qlora" and not sharded,
    )


def _adapter_assumption(impl: AdapterImpl) -> str:
    """One line on how the adapter branches are priced."""
    dtype = "16-bit" if impl.autocast or impl.adapter_bytes == 2 else "fp32"
    casts = (
        "; PEFT's casts to and from the adapters' fp32"
        if impl.peft and impl.adapter_bytes != impl.act_bytes and not impl.four_bit_base
        else ""
    )
    stream = (
        "; fp32 norms (PEFT's prepare_model_for_kbit_training, TRL) make an fp32 residual "
        "stream: element-wise ops in fp32 and each 4-bit linear casts its input and output"
        if impl.fp32_stream
        else ""
    )
    return (
        f"LoRA branches (A, B, scaling, add{', dropout' if impl.dropout else ''}{casts}) run as "
        f"separate eager ops: their activation traffic at the achieved bandwidth, {dtype} "
        f"adapter GEMMs (part 'LoRA adapters'){stream}"
    )


def _score_passes(job: MemoryJob, shape: Shape, st: Strategy, seq: int) -> int:
    """Reads and writes of an eager attention score per step: Megatron fuses scale, causal
    mask and softmax where its kernel takes the shape (``FusedScaleMaskSoftmax.
    is_kernel_available``: 16-bit input, 16 < sk <= 4096, sq and sk and batch x heads
    multiples of 4; 2021's code took sk <= 2048); other engines run them as separate ops."""
    heads = shape.heads // max(st.tp, 1)
    fused = (
        FRAMEWORKS[job.framework].engine == "megatron"
        and PRECISIONS[job.precision].act == 2
        and 16 < seq <= 4096
        and seq % 4 == 0
        and (st.micro_batch_size * heads) % 4 == 0
    )
    passes = MEGATRON_SOFTMAX_PASSES if fused else EAGER_SCORE_PASSES
    return passes + (SOFTCAP_PASSES if shape.attention_softcapping else 0)


TP_OVERLAP_NOTES = {
    "none": "tensor-parallel none: each collective is waited on before the GEMM that needs it",
    "backward": "tensor-parallel: the backward's input-gradient reductions {:.0%} hidden under "
    "the weight-gradient GEMMs (Megatron's async all-reduce), forward and recompute ones "
    "waited on",
    "pipelined": "tensor-parallel {:.0%} (collectives split and overlapped with the GEMMs; "
    "a prior, not fitted)",
}
"""What each ``tp_comm_overlap`` mode hides, as the assumption line says it."""


def tp_overlap_mode(stated: str, framework: str) -> str:
    """A job's tensor-parallel overlap: as stated, else its engine's (``auto``).

    PyTorch's DTensor tensor parallelism (torchtitan's plan without async TP) waits on each
    all-gather and reduce-scatter before the linear that needs it; other engines are taken to
    overlap them as Transformer Engine's userbuffers do (the efficiency file's prior).
    """
    if stated != "auto":
        return stated
    return "none" if FRAMEWORKS[framework].dtensor_tensor_parallel else "pipelined"


def tp_exposed_time(mode: str, total: float, backward: float, overlap: float) -> float:
    """Tensor-parallel communication left on the critical path, seconds a step.

    ``total`` is every collective of the step (forward, recompute and backward), ``backward``
    the backward's share; ``overlap`` the fraction of an overlapped collective that a GEMM
    hides. ``backward`` mode hides only the backward's (Megatron-LM ``layers.py``
    ``LinearWithGradAccumulationAndAsyncAllreduce.backward`` at 2e90a342, 2022: the input
    gradient's ``all_reduce(..., async_op=True)`` runs while the weight gradient is computed,
    ``handle.wait()`` after it; the forward's reductions in ``mappings.py`` are synchronous).
    """
    if mode == "none":
        return total
    if mode == "backward":
        return total - backward * overlap
    return total * (1 - overlap)


def _expert_dp_time(
    st: Strategy,
    full: bool,
    expert_held: float,
    expert_share: float,
    pb: PrecisionBytes,
    layers_stage: int,
    shape: Shape,
    job: MemoryJob,
    lay: StateLayout,
    dp_per_node: int,
    intra: comm.Link,
    inter: comm.Link | None,
) -> float:
    """Data-parallel traffic of a rank's own experts (``expert_share`` of a layer's parameters)
    over the ranks that hold the same ones (``st.expert_replicas``), as :func:`estimate_time` prices the dense part's: all-reduce
    (none), reduce-scatter and all-gather (zero1/2), or per micro-batch two all-gathers and a
    reduce-scatter (zero3/fsdp)."""
    group = st.expert_replicas
    per_node = max(1, dp_per_node // st.ep)
    grad = expert_held * (lay.grad_bytes if full else 4)  # the engine's gradient dtype
    if st.sharding in ("zero3", "fsdp", "hsdp"):
        if full:
            gather = expert_held * (pb.compute_copy or pb.param)
        else:
            layer = gathered_layer_bytes(shape, job, pb, lay) * expert_share / st.ep
            gather = layers_stage * layer / st.tp
        return st.grad_accum * (
            2 * comm.collective_time("all-gather", gather, group, per_node, intra, inter)
            + comm.collective_time("reduce-scatter", grad, group, per_node, intra, inter)
        )
    if st.sharding == "none":
        return comm.collective_time("all-reduce", grad, group, per_node, intra, inter)
    param = expert_held * max(pb.compute_copy, pb.param if not pb.compute_copy else 0)
    return comm.collective_time(
        "reduce-scatter", grad, group, per_node, intra, inter
    ) + comm.collective_time("all-gather", param or grad, group, per_node, intra, inter)


def estimate_time(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    gpu: GpuSpec,
    topo: comm.Topology,
    *,
    work: object = None,
    image_size: int | None = None,
) -> TimeEstimate:
    """Time one training step of ``shape`` under ``st`` on ``topo`` (scaling efficiency left 1.0)."""
    eff_all = efficiencies()
    pb = PRECISIONS[job.precision]
    lay = layout_for(job, st)  # the engine's per-parameter state layout
    dtype = {"fp32": "fp32", "tf32": "tf32"}.get(job.precision, job.precision.split("-")[0])
    eff = for_dtype(eff_all.arch(gpu), dtype)
    overhead_note = ""
    if shape.family == "cnn":  # its element-wise kernels are counted (compute.EAGER_PASSES)
        eff = dataclasses.replace(eff, step_overhead=eff_all.cnn["step_overhead"])
        overhead_note = (
            " (convolutional networks' own, in place of the architecture's: "
            "their kernels are priced one by one)"
        )
    elif job.compiled and eff_all.compiled["step_overhead"] <= eff.step_overhead:
        # Inductor fuses the element-wise work the architecture's overhead stands for
        eff = dataclasses.replace(eff, step_overhead=eff_all.compiled["step_overhead"])
        overhead_note = " (compiled models' own, fitted: Inductor fuses the element-wise work)"
    full = job.method == "full"
    layers_stage = -(-shape.layers // st.pp)
    if full:
        trainable_stage = (
            layers_stage * shape.params_per_layer + shape.params_embedding + shape.params_head
        ) / st.tp
        expert_stage = layers_stage * expert_params_per_layer(shape) / st.tp if st.ep > 1 else 0.0
    else:
        trainable_stage = (
            adapter_params_per_layer(shape, job.lora_roles, job.lora_rank) * layers_stage / st.tp
        )
        expert_stage = (
            expert_adapter_params_per_layer(shape, job.lora_roles, job.lora_rank)
            * layers_stage
            / st.tp
            if st.ep > 1
            else 0.0
        )
    # expert parallelism: a rank holds and reduces its own experts only (expert_stage / ep),
    # over the ranks that hold the same experts (st.expert_replicas)
    trainable_stage -= expert_stage
    expert_held = expert_stage / st.ep
    opt_shard = st.shard_degree if st.sharding != "none" and st.replicas > 1 else 1
    opt_params = split_over(trainable_stage, expert_stage, st.ep, opt_shard)
    opt_bytes = _optimizer_bytes_per_param(job.optimizer, job.precision, full, job.optimizer_impl)
    attn = ""
    cudnn = cudnn_attention(job, gpu)
    if shape.family != "cnn" and job.fused_attention:
        kind = "cuDNN class" if cudnn else "FlashAttention-2 class"
        value = eff.attention_cudnn if cudnn else eff.attention
        attn = f", fused attention ({kind}) {value:.2f} of the 16-bit peak"
    assumptions = [
        f"efficiency ({eff.architecture}): GEMM {eff.gemm:.2f} of dense peak{attn}, "
        f"HBM {eff.hbm:.2f}; {eff.basis}"
    ]
    seq, attn_seq = time_lengths(shape, job)
    if seq != (shape.fixed_tokens or job.seq_len) or attn_seq != seq:
        assumptions.append(
            f"data shape: {seq} tokens per sample for time, attention over {attn_seq} tokens"
            + (" (packed rows, attention within each document)" if job.packing else "")
            + f"; memory sized by the longest sample ({job.seq_len} tokens)"
        )
    peak = peak_flops(gpu, dtype)
    bw = gpu.memory_bandwidth_gb_per_s * 1e9
    if shape.family == "cnn":
        ref = shape.image_size or 224
        scale = ((image_size or ref) / ref) ** 2
        ct: ComputeTime = cnn_step(
            shape,
            st.micro_batch_size,
            peak=peak,
            bw=bw,
            dtype=dtype,
            act_bytes=pb.act,
            eff=eff,
            image_scale=scale,
            kernels=job.cnn_kernels,
            fp32_alternative=(peak_flops(gpu, "fp32"), for_dtype(eff, "fp32"))
            if dtype == "tf32"
            else None,
        )
        assumptions.append(CNN_KERNELS[job.cnn_kernels])
        if "convolutions on fp32 CUDA cores" in ct.parts:
            assumptions.append(CUDNN_BENCHMARK_CHOICE)
        tokens_per_sample = None
    else:
        num = Numerics(
            act_bytes=pb.act,
            autocast=pb.autocast,
            compiled=job.compiled,
            fused_kernels=bool(job.fused_kernels),
        )
        score_bytes = _score_bytes(job)
        score_passes = _score_passes(job, shape, st, max(1, seq // st.cp))
        adapter_b = adapter_bytes(job, lay)
        tr = Trainable(
            full=full,
            lora_roles=job.lora_roles,
            lora_rank=job.lora_rank,
            lora_dropout=job.lora_dropout,
            quantized_base=job.method == "qlora",
            adapter_bytes=adapter_b,
        )
        adapter = _adapter_impl(job, st, pb, adapter_b)
        # an fp32 residual stream (QLoRA through PEFT) runs the element-wise ops in fp32
        num_time = (
            dataclasses.replace(num, act_bytes=4, autocast=False) if adapter.fp32_stream else num
        )
        items = layer_items_cached(shape, num_time, tr, attn_seq, job.fused_attention)
        kernels = _kernels_per_layer(job, shape)
        if kernels != KERNELS_PER_LAYER:
            assumptions.append(
                f"kernel launches: {kernels} a layer, forward and backward (Hugging Face's eager "
                "layer, counted: scripts/count_eager_kernels.py"
                + (", with torch autocast's casts)" if _torch_autocast(job) else ")")
            )
        head_aligned = dtype not in ("bf16", "fp16", "fp8") or head_is_aligned(
            shape.vocab, st.tp, FRAMEWORKS[job.framework].pads_vocab
        )
        if shape.family == "decoder" and shape.vocab and not head_aligned:
            assumptions.append(
                f"LM head: {shape.vocab // st.tp} vocabulary rows a rank, not a multiple of "
                f"{GEMM_ALIGN_ELEMENTS}: its GEMMs take {UNALIGNED_GEMM_SLOWDOWN}x as long "
                "(measured on an H200, GPT-2's 50257 against 50304; "
                f"{job.framework} keeps the tokenizer's size)"
            )
        ct = transformer_step(
            shape,
            # what the micro-batch's compute depends on (the cache key): not dp, sharding
            Strategy(
                tp=st.tp,
                pp=st.pp,
                micro_batch_size=st.micro_batch_size,
                activation_checkpointing=st.activation_checkpointing,
                sequence_parallel=st.sequence_parallel,
            ),
            peak=peak,
            peak16=peak_flops(gpu, "bf16"),
            bw=bw,
            # context parallelism: each rank computes seq / cp queries against the whole
            # context (load-balanced causal chunks)
            seq=max(1, seq // st.cp),
            attention_seq=attn_seq,
            dtype=dtype,
            act_bytes=pb.act,
            tr=tr,
            items=items,
            eff=eff,
            fused_attention=job.fused_attention,
            cudnn_attention=cudnn,
            eff16=eff_all.arch(gpu),
            score_bytes=score_bytes,
            score_passes=score_passes,
            adapter=adapter,
            kernels_per_layer=kernels,
            fp8_transposes=fp8_needs_transposes(gpu.compute_capability),
            head_aligned=head_aligned,
            recompute_stops_early=job.recompute_stops_early,
            fused_loss=job.loss_kernel in ("fused", "fused-linear"),
            adapter_peak=peak_flops(
                gpu, "fp32" if adapter_b == 4 and not adapter.autocast else "bf16"
            ),
        )
        if not full:
            assumptions.append(_adapter_assumption(adapter))
        if (
            st.activation_checkpointing == "full"
            and job.recompute_stops_early
            and recompute_skips_last_linear(shape, tr)
        ):
            assumptions.append(
                f"recompute: {job.framework}'s non-reentrant checkpointing stops once a layer's "
                "saved tensors are back (PyTorch 2.1 on), before its last projection, whose "
                "output nothing saves: that GEMM is not run again"
            )
        if not job.fused_attention:
            assumptions.append(
                f"eager attention: every score read or written {score_passes} times a step "
                f"({score_passes + EAGER_DROPOUT_PASSES} with attention dropout), "
                f"{score_bytes} bytes each"
                + (
                    " (Megatron's fused scale-mask-softmax kernel)"
                    if score_passes == MEGATRON_SOFTMAX_PASSES
                    else ""
                )
                + "; the saved probabilities (and dropout output) are also in the element-wise "
                "term's saved activations (kept: see docs/accuracy.md, 'Eager attention's "
                "score traffic')"
            )
        if tr.quantized_base:
            uses = (
                "forward, input gradient and recompute"
                if st.activation_checkpointing in ("full", "selective-op")
                else "forward and input gradient"
            )
            assumptions.append(
                "4-bit base weights (QLoRA) dequantized to 16 bits at every use "
                f"({uses}; bitsandbytes MatMul4Bit, torchao LinearNF4): "
                f"{DEQUANT_BYTES_PER_WEIGHT} bytes a weight per use at the achieved bandwidth"
            )
        tokens_per_sample = seq
    virt = eff_all.virtualization.get(topo.hosting, 1.0) * topo.compute_fraction
    micro = (ct.layer_s + ct.head_s) / virt
    m = st.grad_accum
    casts_s = _autocast_weight_traffic_s(shape, job, st, lay, layers_stage, m, bw * eff.hbm) / virt
    micro += casts_s
    if casts_s:
        assumptions.append(
            "torch autocast: each micro-batch casts the fp32 linear weights to 16 bits"
            + (
                " (again in the checkpointed recompute)"
                if st.activation_checkpointing == "full"
                else ""
            )
            + " and their gradients back to fp32, "
            + ("added to .grad in place after the first micro-batch, " if m > 1 else "")
            + f"{casts_s * 1e3:.1f} ms a micro-batch at the achieved bandwidth"
        )
    # 1F1B: bubble = (p-1)/m of the compute; interleaving over vp virtual stages divides it by vp
    bubble_frac = (st.pp - 1) / (st.vp * m + st.pp - 1) if st.pp > 1 else 0.0
    compute = m * micro
    bubble = compute * bubble_frac / (1 - bubble_frac) if bubble_frac < 1 else math.inf
    # the optimizer step streams its state once (fused or for-each kernels, memory-bound)
    optimizer_s = opt_params * opt_bytes / (bw * eff.hbm)
    if (
        job.optimizer_impl == "for-loop"
        and opt_shard == 1
        and st.ep == 1
        and st.offload == "none"
        and shape.family != "cnn"
    ):
        # a per-parameter loop: each tensor's ops are kernels of their own (optimizer_step.py)
        loop = forloop_step_s(
            shape,
            job.optimizer,
            full=full,
            lora_roles=job.lora_roles,
            lora_rank=job.lora_rank,
            layers=layers_stage,
            tp=st.tp,
            bytes_per_param=opt_bytes,
            bw=bw * eff.hbm,
            launch=eff.kernel_overhead_s,
        )
        if loop is not None:
            vec, mat = FORLOOP_KERNELS[job.optimizer]
            per_tensor = (
                f"{mat} kernels a tensor"
                if vec == mat
                else f"kernels: {vec} a vector, {mat} a matrix"
            )
            ratio = f" ({loop / optimizer_s:.1f}x the streamed bytes alone)" if optimizer_s else ""
            assumptions.append(
                f"optimizer step: a per-parameter loop, {per_tensor}, each tensor the larger of "
                f"its bytes and its launches{ratio}"
            )
            optimizer_s = loop
    gp = _grad_passes(job, st)
    grad_passes_s = 0.0
    if gp.passes and st.offload == "none":
        held_grads = (
            trainable_stage + expert_held
            if lay.engine == "pytorch" and st.sharding in ("none", "zero1")
            else opt_params
        )
        # under torch autocast and Megatron the passes run over fp32 gradients (Megatron's
        # main grads); a 16-bit engine's (DeepSpeed) over its own
        elem = 4 if not full or lay.engine in ("pytorch", "megatron") else lay.grad_bytes
        grad_passes_s = grad_passes_time(gp, held_grads * elem, bw * eff.hbm)
        assumptions.append(
            "gradient passes outside the update: "
            + ", ".join(gp.names())
            + f"; {gp.passes} x the {held_grads * elem / 1e9:.2f} GB of gradients a rank "
            f"holds, {grad_passes_s * 1e3:.1f} ms a step at the achieved bandwidth"
        )
    if st.offload != "none":
        pcie = eff_all.pcie_gb_per_s.get(gpu.pcie_generation or 4, 31.5) * 1e9 * 0.7
        held = trainable_stage + expert_held
        optimizer_s = held * (pb.grad + pb.param) / pcie + held / 1e9
        assumptions.append(
            "offloaded optimizer: grads down and params up over PCIe, CPU Adam at 1e9 params/s"
        )

    # communication
    intra = comm.intra_link(gpu, topo, eff_all)
    inter = comm.inter_link(topo, eff_all)
    gpn = topo.gpus_per_node
    dp_per_node = max(1, gpn // (st.tp * st.pp))  # ranks of the data x context group per node
    # gradients cross the wire in the engine's gradient dtype: torch autocast's fp32, DeepSpeed's
    # and Apex O2's 16 bits, Megatron's main_grad buffer (bf16 unless grad_reduce_in_fp32)
    grad_bytes = trainable_stage * (lay.grad_bytes if full else 4)
    # a sharded optimizer all-gathers the parameters as the engine stores them: an engine that
    # casts the module to 16 bits gathers those (Megatron's fp8 only with fp8_param_gather);
    # PyTorch's sharded engines gather the compute copy
    param_bytes = trainable_stage * (
        lay.param_bytes
        if engine_casts_to_16bit(lay)
        else max(pb.compute_copy, pb.param if not pb.compute_copy else 0)
    )
    ov = eff_all.overlap
    dp_total = dp_exposed = 0.0
    replicas = st.replicas
    # of a layer's parameters, the experts' (gathered and reduced apart under expert parallelism)
    expert_share = expert_params_per_layer(shape) / shape.params_per_layer if st.ep > 1 else 0.0
    if replicas > 1:
        if st.sharding in ("zero3", "fsdp", "hsdp"):
            # the dense part of a layer (under expert parallelism the experts are gathered
            # apart, over the ranks that hold the same experts: below)
            dense_share = 1 - expert_share
            stage_params = (
                layers_stage * shape.params_per_layer * dense_share + shape.params_embedding
            ) / st.tp
            if full:
                gather_bytes = stage_params * (pb.compute_copy or pb.param)
            else:
                # a frozen base is gathered as stored: 16-bit, or QLoRA's packed 4-bit weights
                # (bitsandbytes quant_storage in the 16-bit dtype, what FSDP QLoRA shards)
                layer = gathered_layer_bytes(shape, job, pb, lay) * dense_share
                gather_bytes = (layers_stage * layer + shape.params_embedding * 2) / st.tp
            shard = st.shard_degree
            # DeepSpeed's ZeRO-3 reduces on its reduction stream only with overlap_comm (on by
            # default for stage 3): stated off, backward waits for each reduce-scatter
            ds = job.deepspeed or DeepSpeedOptions()
            ds_sync = job.framework == "deepspeed" and not deepspeed_overlap_comm(
                st.sharding, ds.overlap_comm, ds.version
            )
            if ds_sync:
                assumptions.append(
                    "DeepSpeed ZeRO-3 with overlap_comm off: the gradient reduce-scatters run on "
                    "the compute stream, exposed"
                )
            if job.zero3_parameter_gathers and st.sharding == "zero3":
                serial, tensors = deepspeed_parameter_gathers(
                    shape, st, layers_stage, gather_bytes, intra, inter, dp_per_node, eff
                )
                reduce = m * comm.collective_time(
                    "reduce-scatter", grad_bytes, shard, dp_per_node, intra, inter
                )
                dp_total = serial * m + reduce
                hidden = reduce if ds_sync else _exposed(reduce, compute, ov["fsdp"])
                dp_exposed = serial * m + hidden
                assumptions.append(
                    f"DeepSpeed before {'.'.join(map(str, DS_COALESCED_GATHERS))}: ZeRO-3 "
                    f"gathers each of {tensors} parameter tensors on its own ("
                    + (
                        "3 times a micro-batch: the checkpointed forward fetches again"
                        if st.activation_checkpointing == "full"
                        else "twice a micro-batch"
                    )
                    + f"), a device synchronize before each and one copy per rank after: "
                    f"{serial * m:.2f} s a step, none of it hidden"
                )
            else:
                gathers = (
                    m
                    * 2
                    * comm.collective_time(
                        "all-gather", gather_bytes, shard, dp_per_node, intra, inter
                    )
                )
                reduces = m * comm.collective_time(
                    "reduce-scatter", grad_bytes, shard, dp_per_node, intra, inter
                )
                if shard < replicas:  # hsdp: the sharded gradients are all-reduced across replicas
                    reduces += comm.collective_time(
                        "all-reduce", grad_bytes / shard, replicas // shard, 1, intra, inter
                    )
                dp_total = gathers + reduces
                if ds_sync or job.overlap_grad_reduce is False:
                    # the gathers still prefetch beside compute; the reductions wait
                    dp_exposed = _exposed(gathers, compute, ov["fsdp"]) + reduces
                else:
                    dp_exposed = _exposed(dp_total, compute, ov["fsdp"])
        else:
            ds = job.deepspeed or DeepSpeedOptions()
            red = (
                deepspeed_reduction(st.sharding, ds.overlap_comm, ds.version)
                if job.framework == "deepspeed"
                else None
            )
            collective = "all-reduce" if st.sharding == "none" else "reduce-scatter"
            reduce = comm.collective_time(
                red.collective if red else collective,
                grad_bytes,
                replicas,
                dp_per_node,
                intra,
                inter,
            )
            gather = (
                0.0
                if st.sharding == "none"
                else comm.collective_time(
                    "all-gather", param_bytes or grad_bytes, replicas, dp_per_node, intra, inter
                )
            )
            dp_total = reduce + gather
            backward_last = micro * 2 / 3
            if red is None and job.overlap_grad_reduce is False:
                dp_exposed = dp_total
            elif red is None:
                dp_exposed = _exposed(dp_total, backward_last, ov["data_parallel"])
            else:
                # DeepSpeed's stages 1 and 2 all-gather the updated parameters inside the
                # optimizer step (all_gather_dp_groups), where nothing runs beside them
                frac = ov["data_parallel"] if red.overlapped else 0.0
                dp_exposed = _exposed(reduce, backward_last, frac) + gather
                assumptions.append(
                    f"{red.why}: {reduce:.3f} s a step"
                    + (" (its overlap as data-parallel's)" if red.overlapped else ", exposed")
                    + (
                        f"; the parameters' all-gather in the optimizer step, {gather:.3f} s, "
                        "exposed"
                        if gather
                        else ""
                    )
                )
    if expert_held and st.expert_replicas > 1:
        # the experts' gradients (and FSDP gathers) over the ranks holding the same experts:
        # Megatron-Core's expert-data-parallel group, strided across the expert-parallel groups
        e_total = _expert_dp_time(
            st,
            full,
            expert_held,
            expert_share,
            pb,
            layers_stage,
            shape,
            job,
            lay,
            dp_per_node,
            intra,
            inter,
        )
        sharded = st.sharding in ("zero3", "fsdp", "hsdp")
        budget = ov["fsdp"] * compute if sharded else ov["data_parallel"] * micro * 2 / 3
        frac = ov["fsdp"] if sharded else ov["data_parallel"]
        hidden_before = dp_total - dp_exposed
        dp_total += e_total
        dp_exposed = max(dp_total - max(budget, hidden_before), (1 - frac) * dp_total)
    ep_total = 0.0
    if st.ep > 1 and shape.num_experts > 1:
        # each MoE layer dispatches its routed tokens to the experts' ranks and combines them
        # back, in forward and again in backward (and in a recomputed forward): Megatron-Core's
        # all-to-all token dispatcher, on the compute stream (not overlapped)
        tokens = (
            st.micro_batch_size
            * max(1, seq // st.cp)
            / (st.tp if st.tp > 1 and st.sequence_parallel else 1)
        )
        routed = tokens * shape.experts_per_token * shape.hidden * pb.act
        per_node_ep = max(1, min(st.ep, gpn // st.tp))
        passes = 6 if st.activation_checkpointing == "full" else 4
        ep_total = (
            m
            * layers_stage
            * passes
            * comm.all_to_all_time(routed, st.ep, per_node_ep, intra, inter)
        )
        assumptions.append(
            f"expert parallelism {st.ep}: {passes} all-to-alls of the routed tokens per MoE "
            f"layer and micro-batch ({ep_total:.2f} s a step), not overlapped; "
            f"{shape.num_experts // st.ep} experts per rank, expert gradients reduced over "
            f"{st.expert_replicas} ranks. Router, token permutation and grouped-GEMM costs are "
            "not modelled: Megatron-Bridge's Qwen3 MoE runs measured 1.4-2.9x slower than "
            "this estimate (docs/accuracy.md, 'Expert parallelism')"
        )
    tp_total = tp_backward = 0.0
    if st.tp > 1 and shape.family != "cnn":
        # Megatron's tensor-parallel layer reduces the hidden state twice in forward (after the
        # row-parallel out-projection and MLP down) and twice in backward (the column-parallel
        # QKV and MLP-up input gradients), ``megatron/core/tensor_parallel/mappings.py``; with
        # sequence parallelism each is an all-gather plus a reduce-scatter of the same volume.
        # A fully checkpointed layer runs its forward, and its two reductions, again.
        act = st.micro_batch_size * seq * shape.hidden * pb.act
        per_pass = 2 * comm.collective_time("all-reduce", act, st.tp, min(st.tp, gpn), intra, inter)
        forward_passes = 2 if st.activation_checkpointing == "full" else 1
        tp_backward = m * layers_stage * per_pass
        tp_total = tp_backward * (1 + forward_passes)
    pp_total = 0.0
    if st.pp > 1 and shape.family != "cnn":
        act_pp = st.micro_batch_size * seq * shape.hidden * pb.act / st.tp
        hop = inter if (inter is not None and st.tp * st.pp > gpn) else intra
        pp_total = 2 * m * st.vp * comm.p2p_time(act_pp, hop) * (1 - ov["pipeline_p2p"])
    cp_total = cp_exposed = 0.0
    if st.cp > 1 and shape.family != "cnn":
        # ring attention (Transformer Engine): each layer passes every rank's K/V chunk around
        # the cp ranks in forward, and K/V plus their gradients in backward; each hop is sent
        # while the previous chunk's attention runs, so only what exceeds attention is exposed
        kv = st.micro_batch_size * (seq // st.cp) * 2 * shape.kv_heads * shape.head_dim / st.tp
        hop = inter if (inter is not None and st.tp * st.cp > gpn) else intra
        per_layer = 3 * (st.cp - 1) * comm.p2p_time(kv * pb.act, hop)
        cp_total = m * layers_stage * per_layer
        cp_exposed = max(0.0, cp_total - m * ct.parts.get("attention", 0.0) / virt)
    tp_mode = tp_overlap_mode(job.tp_comm_overlap, job.framework)
    tp_exposed = tp_exposed_time(tp_mode, tp_total, tp_backward, ov["tensor_parallel"])
    exposed = dp_exposed + tp_exposed + pp_total + cp_exposed + ep_total
    comm_total = dp_total + tp_total + pp_total + cp_total + ep_total
    step = (compute + bubble + exposed + optimizer_s + grad_passes_s) * (1 + eff.step_overhead)

    global_samples = st.micro_batch_size * m * st.dp
    samples_per_s = global_samples / step
    tokens_per_s = samples_per_s * tokens_per_sample if tokens_per_sample else None
    gpus = st.gpus
    # model FLOPs of the whole step: per-GPU stage FLOPs x TP ranks x stages x DP ranks
    model_flops_step = (
        ct.model_flops_per_micro_batch * m * st.dp * st.cp * st.tp * (shape.layers / layers_stage)
    )
    mfu = model_flops_step / (step * gpus * peak)
    steps = _work_steps(work, global_samples, tokens_per_sample)
    eval_samples: int | None = getattr(work, "eval_samples", None)
    evaluations: float | None = getattr(work, "evaluations", None)
    eval_s = _eval_time(eval_samples, evaluations, st, ct.forward_s / virt, eff)
    ttt = steps * step + eval_s if steps is not None else None
    if eval_s:
        assumptions.append(
            f"evaluation: {eval_samples} samples forward only in {evaluations or 1:g} "
            f"pass{'' if (evaluations or 1) == 1 else 'es'}, {eval_s:.0f} s in all, at the "
            "training micro-batch over the data-parallel ranks (each pass rounds its last "
            "micro-batch up; pipeline stages fill once a pass)"
        )
    parts = {
        **{k: m * v / virt for k, v in ct.parts.items()},
        "autocast weight casts": m * casts_s,
        "optimizer step": optimizer_s,
        "gradient passes": grad_passes_s,
        "pipeline bubble": bubble,
        "dp comm exposed": dp_exposed,
        "tp comm exposed": tp_exposed,
        "pp p2p exposed": pp_total,
        "cp ring exposed": cp_exposed,
        "ep all-to-all exposed": ep_total,
        "overhead (unmodelled)": step - step / (1 + eff.step_overhead),
    }
    assumptions += [
        f"intra-node link {intra.name}: {intra.bandwidth / 1e9:.0f} GB/s per GPU per direction achieved",
        (
            "overlap: data-parallel reduction after backward, exposed "
            "(parallelism.overlap_grad_reduce: false)"
            if job.overlap_grad_reduce is False and replicas > 1
            else f"overlap: data-parallel {ov['data_parallel']:.0%} of backward"
        )
        + f", FSDP prefetch {ov['fsdp']:.0%}"
        + (", " + TP_OVERLAP_NOTES[tp_mode].format(ov["tensor_parallel"]) if st.tp > 1 else ""),
        f"step overhead {eff.step_overhead:.0%} for data loading, Python and synchronisation"
        + overhead_note,
    ]
    if inter is not None:
        assumptions.append(
            f"inter-node {inter.name}: {inter.bandwidth * 8 / 1e9:.1f} Gbit/s per GPU achieved"
        )
    if virt < 1:
        assumptions.append(
            f"{topo.hosting}: {virt:.0%} of the GPU's compute (slice share x virtualization)"
        )
    return TimeEstimate(
        step_time_s=step,
        samples_per_s=samples_per_s,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / gpus if tokens_per_s is not None else None,
        mfu=mfu,
        compute_s=compute,
        exposed_comm_s=exposed,
        comm_fraction=exposed / step,
        scaling_efficiency=1.0,
        time_to_train_s=ttt,
        gpu_hours=ttt * gpus / 3600 if ttt is not None else None,
        bubble_s=bubble,
        optimizer_s=optimizer_s,
        comm_total_s=comm_total,
        parts=parts,
        assumptions=tuple(assumptions),
        eval_s=eval_s,
    )
