"""Fit: resolve a job spec on a GPU and count into a strategy and a memory estimate.

This is the glue between the job spec, the model and the catalog; the
arithmetic lives in :mod:`gpuplan.estimate.memory`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import TypeVar

from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import MissingInputError, SpecError
from gpuplan.estimate import bounds as bnd
from gpuplan.estimate import overheads as ovh
from gpuplan.estimate.frameworks import CHECKPOINT_EARLY_STOP, DS_COALESCED_GATHERS, FRAMEWORKS
from gpuplan.estimate.grad_passes import default_clipping
from gpuplan.estimate.lora import lora_roles
from gpuplan.estimate.memory import (
    DEFAULT_SAFETY_MARGIN,
    MemoryCheck,
    MemoryEstimate,
    MemoryJob,
    check_memory,
    estimate_memory,
)
from gpuplan.estimate.shape import Shape, shape_of
from gpuplan.estimate.sharding import DeepSpeedOptions, MegatronOptions, check_sharding
from gpuplan.estimate.strategy import Strategy, candidate_layouts, grad_accum_for
from gpuplan.spec import JobSpec, ParallelismSpec, nearest_multiples, release

MAX_MICRO_BATCH_SEARCH = 4096


@functools.lru_cache(maxsize=64)
def model_shape(model_ref: str) -> Shape:
    """The estimator shape of a preset id or config path (cached)."""
    from gpuplan.models import load_model

    return shape_of(load_model(model_ref))


def spec_shape(spec: JobSpec) -> Shape:
    """The model's shape at the spec's input: a ViT's token count follows ``image_size``, and
    an engine that unties the word embeddings (:attr:`Framework.unties_embeddings`) holds a
    separate LM head.

    A ViT cuts the image into patches: ``(image_size / patch) ** 2`` tokens plus the class
    token, so fine-tuning at 384 pixels costs 577 tokens a sample where the 224-pixel preset
    has 197 (transformers' ``ViTEmbeddings`` with ``interpolate_pos_encoding``).
    """
    shape = model_shape(spec.model)
    if shape.tied_embeddings and FRAMEWORKS[engine_spec(spec).framework].unties_embeddings:
        head = shape.vocab * shape.hidden
        shape = dataclasses.replace(
            shape,
            tied_embeddings=False,
            params_head=shape.params_head + head,
            params_total=shape.params_total + head,
        )
    if (
        shape.family != "vit"
        or spec.image_size is None
        or shape.image_size is None
        or shape.fixed_tokens is None
        or spec.image_size == shape.image_size
    ):
        return shape
    patch = shape.image_size // math.isqrt(shape.fixed_tokens - 1)
    if spec.image_size % patch:
        raise SpecError(
            f"image_size: {spec.image_size} is not a multiple of {shape.model_id}'s patch size "
            f"({patch} pixels); nearest valid: "
            + ", ".join(str(v) for v in nearest_multiples(spec.image_size, patch))
        )
    grid = spec.image_size // patch
    return dataclasses.replace(shape, fixed_tokens=grid * grid + 1, image_size=spec.image_size)


def check_precision(spec: JobSpec, gpu: GpuSpec) -> None:
    """Raise a SpecError if the GPU cannot compute in the spec's precision."""
    dtype = spec.compute_dtype
    if dtype == "fp32":
        return
    if not gpu.supports(dtype):
        supported = [
            p
            for p in (
                "fp32",
                "tf32",
                "fp16-mixed",
                "bf16-mixed",
                "fp16-true",
                "bf16-true",
                "fp8-mixed",
            )
            if p.split("-")[0] in gpu.precisions or p == "fp32"
        ]
        raise SpecError(
            f"precision: {spec.precision} needs {dtype}, which {gpu.id} ({gpu.architecture}) does not support; "
            f"allowed on {gpu.id}: {', '.join(supported)}",
            hint="pick another --gpu or --set precision=...",
        )


def sequence_length(spec: JobSpec, shape: Shape) -> int:
    """Tokens per sample for the memory model."""
    if shape.fixed_tokens is not None:
        return shape.fixed_tokens
    if shape.family == "cnn":
        return 1
    if spec.seq_len is None:
        raise MissingInputError(
            f"seq_len: required for the text model {shape.model_id}",
            hint="add `seq_len: 2048` to the spec or --set seq_len=2048",
        )
    return spec.seq_len


BNB_FREES_INPUTS = (0, 43, 2)
"""First bitsandbytes release whose ``MatMul4Bit.forward`` stores ``ctx.tensors = (None, B)``
instead of ``(A, B)`` (bitsandbytes PR #1270, commit 9e753741, 2024-07-16)."""
PEFT_FP32_ADAPTERS = (0, 12, 0)
"""PEFT 0.12 added ``autocast_adapter_dtype`` (default True): fp32 adapters on a 16-bit base
(TRL's ``prepare_peft_model`` checks the same release)."""


PIPELINE_ENGINE = "megatron"
"""The engine a spec that states pipeline stages but no framework is read as."""


def engine_spec(spec: JobSpec) -> JobSpec:
    """``spec`` as the engine that runs it reads it.

    A spec that names no ``framework`` is read as ``hf``: Transformers' model code in a
    PyTorch training loop. Transformers has no pipeline engine, so a spec that states pipeline
    stages (``parallelism.pp > 1``) and no framework runs on another engine's model code; it is
    read as Megatron-Core's, the engine of Megatron-LM, NeMo and Megatron-Bridge and the model
    code that Megatron-DeepSpeed pipelines. A spec that asks for what only a PyTorch training
    loop has (``hf_trainer``, ``optimizer_in_backward``, ``paged_optimizer``) stays ``hf``, and
    a stated framework is always kept. ``parallelism: auto`` keeps ``hf`` for every layout it
    tries, so that its layouts are compared under one engine.
    """
    par = spec.parallelism
    if (
        not isinstance(par, ParallelismSpec)
        or par.pp == 1
        or "framework" in spec.model_fields_set
        or spec.hf_trainer
        or spec.optimizer_in_backward
        or spec.paged_optimizer
    ):
        return spec
    return spec.model_copy(update={"framework": PIPELINE_ENGINE})


def pinned_framework(spec: JobSpec) -> JobSpec:
    """``spec`` with its framework stated, so that it is read as that framework whatever its
    layout (the tracer runs Transformers' model code)."""
    return spec.model_copy(update={"framework": spec.framework})


def gqa_math_attention(spec: JobSpec, shape: Shape) -> bool:
    """Whether ``attention: auto`` runs as SDPA's math backend: grouped K/V handed to SDPA
    with ``enable_gqa`` (:attr:`Framework.sdpa_enable_gqa`, no mask: not padded data) in
    fp32 or TF32, which no fused kernel takes."""
    padded = spec.mean_seq_len is not None and not spec.packing
    return (
        spec.attention == "auto"
        and shape.family == "decoder"
        and 0 < shape.kv_heads < shape.heads
        and spec.precision in ("fp32", "tf32")
        and FRAMEWORKS[spec.framework].sdpa_enable_gqa
        and not padded
    )


def _megatron_options(spec: JobSpec) -> MegatronOptions | None:
    """The Megatron settings of ``spec``; None where every one is Megatron's default. The
    main-gradient dtype defaults as Megatron's ``--accumulate-allreduce-grads-in-fp32`` does:
    off, unless ``--bf16`` turns it on (``megatron/training/arguments.py``), so 16-bit under
    fp16 and fp32 otherwise."""
    m = spec.megatron
    fp32_grads = spec.precision != "fp16-mixed"
    if m is not None and m.grad_reduce_in_fp32 is not None:
        fp32_grads = m.grad_reduce_in_fp32
    if m is None:
        return None if fp32_grads else MegatronOptions(grad_reduce_in_fp32=False)
    return MegatronOptions(
        fp8_params=m.fp8_params,
        grad_reduce_in_fp32=fp32_grads,
        optimizer_bf16=m.optimizer_dtype == "bf16",
        param_remainders=m.param_remainders,
        fp8_attention=m.fp8_dot_product_attention,
        fp8_activation_input=m.activation_func_fp8_input_store,
        te_cross_entropy=m.cross_entropy_fusion == "te",
        legacy_local_ddp=m.legacy_local_ddp,
    )


def memory_job(spec: JobSpec, shape: Shape) -> MemoryJob:
    """The memory-relevant part of a spec, resolved against the model, as the engine that runs
    it reads it (:func:`engine_spec`)."""
    engine = engine_spec(spec)
    if engine is not spec:
        return dataclasses.replace(memory_job(engine, shape), framework_assumed=True)
    roles: frozenset[str] = frozenset()
    rank = 0
    dropout = 0.0
    double_quant = True
    bnb_keeps_inputs = False
    peft_old = False
    if spec.method != "full":
        assert spec.lora is not None
        roles = lora_roles(spec.lora.targets, shape)
        rank, dropout, double_quant = spec.lora.rank, spec.lora.dropout, spec.lora.double_quant
        bnb = spec.lora.bitsandbytes
        bnb_keeps_inputs = bnb is not None and release(bnb) < BNB_FREES_INPUTS
        peft = spec.lora.peft
        peft_old = peft is not None and release(peft) < PEFT_FP32_ADAPTERS
    if spec.method == "qlora" and spec.precision in ("fp32", "tf32"):
        raise SpecError(
            "precision: qlora computes in 16 bits; use bf16-mixed, bf16-true, fp16-mixed or fp16-true"
        )
    # attention: auto runs eagerly where no kernel takes the job: soft-capped scores (Gemma 2)
    # under an engine that honours the cap, and grouped K/V in fp32 handed to SDPA with
    # enable_gqa (its math backend)
    gqa_math = gqa_math_attention(spec, shape)
    eager_by_engine = (
        spec.attention == "auto"
        and shape.attention_softcapping
        and FRAMEWORKS[spec.framework].softcapping_eager
    ) or gqa_math
    return MemoryJob(
        method=spec.method,
        precision=spec.precision,
        optimizer=spec.optimizer,
        seq_len=sequence_length(spec, shape),
        mean_seq_len=spec.mean_seq_len if shape.is_text else None,
        packing=spec.packing,
        lora_roles=roles,
        lora_rank=rank,
        lora_dropout=dropout,
        double_quant=double_quant,
        bnb_keeps_inputs=spec.method == "qlora" and bnb_keeps_inputs,
        peft_base_dtype_adapters=peft_old,
        megatron=_megatron_options(spec),
        activation_offload_layers=0
        if spec.megatron is None
        else spec.megatron.activation_offload_layers,
        fused_attention=spec.attention != "eager" and not eager_by_engine,
        cudnn_attention=spec.attention == "cudnn",
        attention_auto=spec.attention == "auto" and not eager_by_engine,
        gqa_math_attention=gqa_math,
        framework=spec.framework,
        compiled=spec.compile,
        compiled_loss=spec.compile_loss,
        optimizer_impl=_optimizer_impl(spec),
        grads_kept=spec.zero_grad == "zeros",
        optimizer_in_backward=spec.optimizer_in_backward,
        paged_optimizer=spec.paged_optimizer,
        loss_chunks=spec.loss_chunks,
        cublas_workspace_per_handle=None
        if spec.cublas_workspace_config is None
        else ovh.cublas_config_bytes(spec.cublas_workspace_config),
        cnn_kernels=spec.cnn_kernels,
        fused_kernels=spec.fused_kernels,
        loss_kernel=spec.loss_kernel,
        tp_comm_overlap=spec.parallelism.tp_comm_overlap
        if isinstance(spec.parallelism, ParallelismSpec)
        else "auto",
        overlap_grad_reduce=spec.parallelism.overlap_grad_reduce
        if isinstance(spec.parallelism, ParallelismSpec)
        else None,
        deepspeed=_deepspeed_options(spec),
        zero3_parameter_gathers=spec.deepspeed is not None
        and spec.deepspeed.version is not None
        and release(spec.deepspeed.version) < DS_COALESCED_GATHERS,
        hf_trainer=spec.hf_trainer,
        gradient_clipping=(
            default_clipping(spec.framework, spec.hf_trainer)
            if spec.gradient_clipping is None
            else spec.gradient_clipping
        ),
        fsdp_root_embedding=_root_holds_embedding(spec),
        recompute_stops_early=FRAMEWORKS[spec.framework].checkpoint_early_stop
        and (
            spec.pytorch_version is None or release(spec.pytorch_version) >= CHECKPOINT_EARLY_STOP
        ),
    )


def _root_holds_embedding(spec: JobSpec) -> bool:
    """Whether the engine leaves the embedding in the root FSDP unit (for the release the spec
    states, a current one when unset)."""
    since = FRAMEWORKS[spec.framework].embedding_own_unit_from
    if since is None:
        return True
    return spec.pytorch_version is not None and release(spec.pytorch_version) < since


def _deepspeed_options(spec: JobSpec) -> DeepSpeedOptions | None:
    """The ZeRO settings the spec states (DeepSpeed's defaults for the rest)."""
    ds = spec.deepspeed
    if ds is None:
        return None
    d = DeepSpeedOptions()
    return DeepSpeedOptions(
        reduce_bucket=ds.reduce_bucket_size or d.reduce_bucket,
        prefetch_bucket=ds.stage3_prefetch_bucket_size or d.prefetch_bucket,
        max_live_parameters=ds.stage3_max_live_parameters or d.max_live_parameters,
        sub_group=ds.sub_group_size or d.sub_group,
        overlap_comm=ds.overlap_comm,
        version=release(ds.version) if ds.version is not None else None,
    )


def _optimizer_impl(spec: JobSpec) -> str:
    if spec.optimizer_impl != "auto":
        return spec.optimizer_impl
    if spec.optimizer in ("adamw-8bit", "adafactor"):
        return "fused" if spec.optimizer == "adamw-8bit" else "for-loop"
    return FRAMEWORKS[spec.framework].default_optimizer_impl


def check_expert_parallel(ep: int, shape: Shape, replicas: int) -> None:
    """Expert parallelism needs experts to split and data x context ranks to carve it from."""
    if ep == 1:
        return
    if shape.num_experts <= 1:
        raise SpecError(
            f"parallelism.ep: {ep} needs a mixture-of-experts model; {shape.model_id} has no experts"
        )
    if shape.num_experts % ep:
        raise SpecError(
            f"parallelism.ep: {ep} does not divide the {shape.num_experts} experts of "
            f"{shape.model_id}"
        )
    if replicas % ep:
        raise SpecError(
            f"parallelism.ep: {ep} does not divide the {replicas} data x context parallel ranks "
            "it is carved from (GPUs / (tp x pp))"
        )


def explicit_strategy(
    spec: JobSpec,
    count: int,
    shape: Shape,
    micro_batch: int | None = None,
    *,
    gpus_per_node: int = 8,
) -> Strategy:
    """The strategy the spec names, on ``count`` GPUs.

    ``hsdp`` shards over the data-parallel ranks of one node (``gpus_per_node / (tp x pp)``)
    and replicates across nodes.
    """
    par = spec.parallelism if isinstance(spec.parallelism, ParallelismSpec) else ParallelismSpec()
    check_sharding(spec.framework, par.sharding)
    model_par = par.tp * par.pp * par.cp
    if count % model_par:
        what = "tp x pp x cp" if par.cp > 1 else "tp x pp"
        raise SpecError(f"parallelism: {what} = {model_par} does not divide the GPU count {count}")
    if par.cp > 1:
        seq = sequence_length(spec, shape)
        if not shape.is_text or seq % (2 * par.cp):
            raise SpecError(
                f"parallelism.cp: {par.cp} needs a text model whose seq_len divides by 2 x cp "
                f"= {2 * par.cp} (got {seq if shape.is_text else 'an image model'})"
            )
    if shape.family != "cnn" and shape.heads % par.tp:
        raise SpecError(
            f"parallelism.tp: {par.tp} does not divide the {shape.heads} attention heads"
        )
    if par.pp > shape.layers:
        raise SpecError(f"parallelism.pp: {par.pp} stages exceed the {shape.layers} layers")
    dp = count // model_par
    check_expert_parallel(par.ep, shape, dp * par.cp)
    if par.ep > 1 and spec.method == "qlora":
        raise SpecError(
            "parallelism.ep: expert parallelism with qlora is not modelled (4-bit experts)",
            hint="--set parallelism.ep=1",
        )
    mb = micro_batch or spec.micro_batch_size
    ga = grad_accum_for(spec.global_batch_size, mb, dp)
    if ga is None:
        assert spec.global_batch_size is not None
        unit = mb * dp
        raise SpecError(
            f"global_batch_size: {spec.global_batch_size} does not divide over {dp} data-parallel "
            f"ranks x micro_batch_size {mb} (multiples of {unit}) on {count} GPUs; nearest valid: "
            + ", ".join(map(str, nearest_multiples(spec.global_batch_size, unit))),
            hint="--set global_batch_size=N, or another micro_batch_size or GPU count",
        )
    if spec.optimizer_in_backward and ga > 1:
        unit = mb * dp
        raise SpecError(
            f"optimizer_in_backward: steps each parameter as its gradient arrives, so it takes "
            f"no gradient accumulation; this layout accumulates {ga} micro-batches (global "
            f"batch {spec.global_batch_size} over {dp} data-parallel ranks x micro-batch {mb})",
            hint=f"--set global_batch_size={unit}, or optimizer_in_backward=false",
        )
    return Strategy(
        sharding=par.sharding,
        tp=par.tp,
        pp=par.pp,
        vp=par.vp if par.pp > 1 else 1,
        cp=par.cp,
        ep=par.ep,
        sequence_parallel=par.sequence_parallel,
        dp=dp,
        micro_batch_size=mb,
        grad_accum=ga,
        activation_checkpointing=spec.activation_checkpointing,
        offload=spec.offload,
        shard_ranks=max(1, gpus_per_node // (par.tp * par.pp)) if par.sharding == "hsdp" else 0,
    )


def candidate_strategies(
    spec: JobSpec, count: int, shape: Shape, gpus_per_node: int = 8
) -> list[Strategy]:
    """Strategies to consider: the spec's own if explicit, else every layout for ``count``."""
    if isinstance(spec.parallelism, ParallelismSpec):
        return [explicit_strategy(spec, count, shape, gpus_per_node=gpus_per_node)]
    heads = shape.heads if shape.family != "cnn" else 1
    layers = shape.layers if shape.family != "cnn" else 1
    kv_heads = shape.kv_heads if shape.family != "cnn" else 1
    supported = FRAMEWORKS[spec.framework].shardings
    out = []
    layouts: set[int] = set()
    for sharding, tp, pp, dp in candidate_layouts(
        count, heads=heads, kv_heads=kv_heads, layers=layers, gpus_per_node=gpus_per_node
    ):
        if sharding not in supported:
            continue
        ga = grad_accum_for(spec.global_batch_size, spec.micro_batch_size, dp)
        layouts.add(dp)
        if ga is None:
            continue
        out.append(
            Strategy(
                sharding=sharding,
                tp=tp,
                pp=pp,
                dp=dp,
                micro_batch_size=spec.micro_batch_size,
                grad_accum=ga,
                activation_checkpointing=spec.activation_checkpointing,
                offload=spec.offload,
            )
        )
    if not out:
        assert spec.global_batch_size is not None
        gb = spec.global_batch_size
        near = sorted(
            {m for st in layouts for m in nearest_multiples(gb, spec.micro_batch_size * st)},
            key=lambda m: (abs(m - gb), m),
        )[:4]
        raise SpecError(
            f"global_batch_size: {gb} is not divisible by micro_batch_size x data-parallel "
            f"ranks for any layout of {count} GPUs; nearest valid: "
            + ", ".join(map(str, sorted(near))),
            hint="--set global_batch_size=N, or another micro_batch_size or GPU count",
        )
    return out


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """The memory verdict of one spec on one GPU type and count."""

    gpu: GpuSpec
    count: int
    strategy: Strategy
    memory: MemoryEstimate
    max_micro_batch: int
    job_class: str = bnd.POOLED
    """The job class whose leave-one-source-out residuals size the bounds."""

    @property
    def memory_bounds(self) -> bnd.ClassBounds:
        """The calibrated 80% bounds of this job class's memory."""
        return bnd.bounds_for("memory", self.job_class)

    def bounds(self) -> dict[str, list[float]]:
        """80% intervals ``[lo, hi]`` of the three memory totals, bytes."""
        m, b = self.memory, self.memory_bounds
        return {
            "peak_allocated_bytes": b.around(m.peak_allocated_bytes),
            "peak_reserved_bytes": b.around(m.peak_reserved_bytes),
            "device_used_bytes": b.around(m.device_used_bytes),
        }

    @property
    def verdict(self) -> bnd.Verdict:
        """``fits`` (the upper bound fits), ``tight`` (only the estimate fits) or ``no``."""
        return memory_verdict(self.job_class, self.memory)

    def as_contract(self) -> dict[str, object]:
        """The ``memory`` object of ``gpuplan estimate --json``."""
        m = self.memory
        return {
            "peak_allocated_bytes": round(m.peak_allocated_bytes),
            "peak_reserved_bytes": round(m.peak_reserved_bytes),
            "device_used_bytes": round(m.device_used_bytes),
            "capacity_bytes": round(m.capacity_bytes),
            "fits": m.fits,
            "max_micro_batch": self.max_micro_batch,
            "breakdown": {k: round(v) for k, v in m.breakdown.items()},
            "headroom_bytes": round(m.headroom_bytes),
            "safety_margin": m.safety_margin,
            "peak_phase": m.peak_phase,
            "details": {k: round(v) for k, v in m.details.items()},
            "activation_items_per_token": {i.name: i.bytes_per_token for i in m.activation_items},
            "assumptions": list(m.assumptions),
            "basis": m.basis,
            "bounds": {k: [round(lo), round(hi)] for k, (lo, hi) in self.bounds().items()},
            "verdict": self.verdict,
            "job_class": self.job_class,
            "bounds_basis": self.memory_bounds.describe(),
            "capacity_basis": m.capacity_basis,
            "pipeline_stage": m.pipeline_stage,
            "pipeline_stages": {
                p.stage: {
                    "peak_allocated_bytes": round(p.peak_allocated_bytes),
                    "peak_reserved_bytes": round(p.peak_reserved_bytes),
                    "device_used_bytes": round(p.device_used_bytes),
                }
                for p in m.pipeline_stages
            }
            or None,
        }


def memory_verdict(job_class: str, m: MemoryEstimate | MemoryCheck) -> bnd.Verdict:
    """The verdict of a memory estimate (or check) against the 80% bounds of ``job_class``."""
    # what the driver pages out makes room for the rest: only the rest is bounded
    upper = bnd.bounds_for("memory", job_class).around(m.device_used_bytes - m.evictable_bytes)[1]
    return bnd.verdict(m.fits, upper, m.capacity_bytes)


_Judged = TypeVar("_Judged", MemoryEstimate, MemoryCheck)


@dataclasses.dataclass(frozen=True)
class OnGpu:
    """Where a job's memory is judged: the GPU, the capacity and margin it is held to (None:
    the GPU's reported capacity), the image size of a vision job, and the node's link and
    width, which decide NCCL's buffers (:func:`gpuplan.estimate.memory.estimate_memory`)."""

    gpu: GpuSpec
    capacity: float | None = None
    margin: float = DEFAULT_SAFETY_MARGIN
    image_size: int | None = None
    intra_node: str | None = None
    gpus_per_node: int | None = None

    def estimate(self, shape: Shape, job: MemoryJob, st: Strategy) -> MemoryEstimate:
        """The full memory estimate of ``st`` here."""
        return self._judge(estimate_memory, shape, job, st)

    def check(self, shape: Shape, job: MemoryJob, st: Strategy) -> MemoryCheck:
        """The verdict and the totals of ``st`` here, without the breakdown."""
        return self._judge(check_memory, shape, job, st)

    def _judge(
        self, how: Callable[..., _Judged], shape: Shape, job: MemoryJob, st: Strategy
    ) -> _Judged:
        return how(
            shape,
            job,
            st,
            self.gpu,
            capacity_bytes=self.capacity,
            safety_margin=self.margin,
            image_size=self.image_size,
            intra_node=self.intra_node,
            gpus_per_node=self.gpus_per_node,
        )


def max_micro_batch(shape: Shape, job: MemoryJob, st: Strategy, where: OnGpu) -> int:
    """Largest micro-batch that fits under ``st`` on ``where`` (0 if even 1 does not)."""

    def fits(mb: int) -> bool:
        return where.check(shape, job, dataclasses.replace(st, micro_batch_size=mb)).fits

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_MICRO_BATCH_SEARCH and fits(hi):
        lo, hi = hi, hi * 2
    if hi > MAX_MICRO_BATCH_SEARCH:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def fit(
    spec: JobSpec,
    gpu: GpuSpec,
    count: int = 1,
    *,
    capacity: float | None = None,
    margin: float = DEFAULT_SAFETY_MARGIN,
    gpus_per_node: int = 8,
    cuda_context_bytes: float | None = None,
    intra_node: str | None = None,
) -> FitResult:
    """Memory verdict for ``spec`` on ``count`` x ``gpu`` (``intra_node``: the GPUs' link in
    a node, None for the GPU's usual board; it decides NCCL's buffers).

    With ``parallelism: auto`` the least memory-hungry layout is chosen (the
    speed estimator later chooses the fastest that fits).
    """
    if count < 1:
        raise SpecError(f"--count: must be >= 1, got {count}")
    check_precision(spec, gpu)
    shape = spec_shape(spec)
    if shape.family in ("cnn", "vit") and spec.seq_len is not None:
        raise SpecError(f"seq_len: {shape.model_id} is a vision model; use image_size")
    if shape.is_text and spec.image_size is not None:
        raise SpecError(f"image_size: {shape.model_id} is a text model; use seq_len")
    job = memory_job(spec, shape)
    if cuda_context_bytes is not None:
        job = dataclasses.replace(job, cuda_context_bytes=cuda_context_bytes)
    where = OnGpu(gpu, capacity, margin, spec.image_size, intra_node, gpus_per_node)
    best: tuple[float, Strategy, MemoryEstimate] | None = None
    for st in candidate_strategies(spec, count, shape, gpus_per_node):
        est = where.estimate(shape, job, st)
        key = est.device_used_bytes
        if best is None or key < best[0]:
            best = (key, st, est)
    assert best is not None
    _, st, est = best
    mmb = max_micro_batch(shape, job, st, where)
    return FitResult(
        gpu=gpu,
        count=count,
        strategy=st,
        memory=est,
        max_micro_batch=mmb,
        job_class=strategy_class(spec, st, count, gpus_per_node),
    )


def strategy_class(spec: JobSpec, st: Strategy, count: int, gpus_per_node: int) -> str:
    """The bounds' job class of ``spec`` run with ``st`` on ``count`` GPUs."""
    return bnd.job_class(
        family=spec_shape(spec).family,
        method=spec.method,
        count=count,
        tp=st.tp,
        pp=st.pp,
        gpus_per_node=gpus_per_node,
        sharded=st.sharding != "none",
    )
