"""Analytic per-GPU peak memory of one training step.

The step is modelled in two phases, and the peak is the larger:

* **forward/backward**: weights + optimizer state + autocast weight copies +
  saved activations + the loss/logits gradients at the start of backward,
  plus gradients (already there when micro-batches accumulate, when
  ``zero_grad`` zeroes them instead of freeing them, or when the engine allocates
  them at init, as DeepSpeed ZeRO-3 and Megatron-core's DDP do, and DDP's bucket copy;
  otherwise they grow while activations are freed, so the phase peaks at
  ``max(activations, gradients)``);
* **optimizer step**: weights + optimizer state + gradients + the optimizer's
  temporaries (foreach AdamW materialises one parameter-sized buffer).

Peak = params + optimizer state + max(gradients + optimizer intermediates,
activations), as the PyTorch memory-visualisation guide observes
(huggingface/blog#2560). What each engine keeps per parameter under each
sharding value is :mod:`gpuplan.estimate.sharding`; tensor parallelism (with
sequence parallelism) divides weights and activations. With pipeline parallelism the
first and the last stage are sized apart (:mod:`gpuplan.estimate.pipeline`): the first keeps
the embedding and the most micro-batches in flight (Megatron-core's 1F1B warm-up, interleaved
or not), the last the LM head, the loss and fewer micro-batches; the larger is the estimate.
Each in-flight micro-batch keeps its checkpoints, and under activation checkpointing one layer
is rebuilt for backward. Totals
are reported three ways, as measurements are: ``peak_allocated_bytes``
(``torch.cuda.max_memory_allocated``), ``peak_reserved_bytes`` (caching
allocator) and ``device_used_bytes`` (nvidia-smi: reserved + CUDA context +
NCCL buffers).

The estimate is computed in named steps over typed fields (:func:`weight_bytes`,
:func:`training_state_bytes`, :func:`activation_bytes`, :func:`runtime_bytes`);
the ``details`` labels are for display only and never feed a sum.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable

from gpuplan.catalog.schema import GpuSpec
from gpuplan.estimate import overheads as ovh
from gpuplan.estimate import pipeline
from gpuplan.estimate.activations import (
    Item,
    Numerics,
    Trainable,
    backward_transient_per_token,
    boundary_items,
    head_items_cached,
    layer_items_cached,
    op_sac_items,
    per_tp_rank,
)
from gpuplan.estimate.frameworks import FRAMEWORKS
from gpuplan.estimate.lora import adapter_params_per_layer, expert_adapter_params_per_layer
from gpuplan.estimate.margin import DEFAULT_SAFETY_MARGIN
from gpuplan.estimate.numerics import (
    NF4_BYTES,
    NF4_BYTES_DQ,
    PRECISIONS,
    PrecisionBytes,
    optimizer_state_bytes,
    optimizer_temp_bytes,
)
from gpuplan.estimate.pipeline import PIPELINE_STAGES, PipelineStage
from gpuplan.estimate.shape import Shape
from gpuplan.estimate.sharding import (
    DeepSpeedOptions,
    MegatronOptions,
    StateLayout,
    state_layout,
)
from gpuplan.estimate.strategy import Strategy

__all__ = [
    "DEFAULT_SAFETY_MARGIN",
    "MemoryCheck",
    "MemoryEstimate",
    "MemoryJob",
    "check_memory",
    "estimate_memory",
]


Lines = tuple[tuple[str, float], ...]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MemoryJob:
    """The parts of a job spec that decide memory (besides the strategy)."""

    method: str
    precision: str
    optimizer: str
    seq_len: int
    """Tokens per sample that memory is sized for (the longest sample)."""
    mean_seq_len: float | None = None
    """Mean tokens per sample of unpadded data (time is sized by it); with ``packing`` the
    mean document length (attention is sized by it)."""
    packing: bool = False
    """Samples packed into full rows of ``seq_len`` tokens."""
    lora_roles: frozenset[str] = frozenset()
    lora_rank: int = 0
    lora_dropout: float = 0.0
    double_quant: bool = True
    megatron: MegatronOptions | None = None
    """Megatron-Core settings (spec ``megatron``)."""
    activation_offload_layers: int = 0
    """Layers whose saved activations go to host memory (Megatron ``cpu_offloading``)."""
    bnb_keeps_inputs: bool = False
    """QLoRA on bitsandbytes < 0.43.2: each 4-bit linear's input lives as long as its graph."""
    peft_base_dtype_adapters: bool = False
    """PEFT < 0.12 (spec ``lora.peft``): the adapters take the base weight's dtype instead of
    fp32 (``autocast_adapter_dtype`` came in 0.12)."""
    fused_attention: bool = True
    cudnn_attention: bool = False
    attention_auto: bool = False
    gqa_math_attention: bool = False
    """``attention: auto`` runs as SDPA's math backend: grouped K/V with ``enable_gqa`` in
    fp32 or TF32, which no fused kernel takes (:func:`gpuplan.estimate.fit.gqa_math_attention`)."""
    framework: str = "hf"
    framework_assumed: bool = False
    """The spec names no framework and states a layout ``hf`` has no engine for
    (:func:`gpuplan.estimate.fit.engine_spec`): ``framework`` is the engine that runs it."""
    compiled: bool = False
    compiled_loss: bool | None = None
    """The loss is compiled (spec ``compile_loss``); None: as ``compiled``."""
    optimizer_impl: str = "foreach"
    grads_kept: bool = False
    loss_chunks: int | None = None
    cuda_context_bytes: float | None = None
    cublas_workspace_per_handle: float | None = None
    """Bytes of each PyTorch cuBLAS workspace (spec ``cublas_workspace_config``); None:
    PyTorch's default for the GPU."""
    loss_kernel: str = "auto"
    """The LM head's loss kernel (spec ``loss_kernel``): auto, eager, fused, fused-linear."""
    fused_kernels: bool | None = None
    """Fused norm and gated-activation kernels (spec ``fused_kernels``); None: the
    framework's."""
    cnn_kernels: str = "eager"
    """How a CNN's kernels run (spec ``cnn_kernels``); decides time, not memory."""
    deepspeed: DeepSpeedOptions | None = None
    """DeepSpeed's ZeRO buffer sizes (spec ``deepspeed``); None: its defaults."""
    tp_comm_overlap: str = "auto"
    """Which tensor-parallel collectives overlap a GEMM (spec ``parallelism.tp_comm_overlap``:
    auto, none, backward, pipelined); decides time, not memory."""
    overlap_grad_reduce: bool | None = None
    """Whether the data-parallel reduction runs beside backward (spec
    ``parallelism.overlap_grad_reduce``; None: as the efficiency file's overlap); decides
    time, not memory."""
    zero3_parameter_gathers: bool = False
    """DeepSpeed before 0.6.0 (spec ``deepspeed.version``): ZeRO-3 gathers each parameter on
    its own, a device synchronize before each (time), and has no gradient partition buffer
    allocated at init (memory: ``StateLayout.grads_persistent`` does not apply)."""
    gradient_clipping: bool = False
    """Each step clips the gradients by their global norm (spec ``gradient_clipping``, or the
    framework's default: :func:`gpuplan.estimate.grad_passes.default_clipping`); decides time,
    not memory."""
    hf_trainer: bool = False
    """The step runs in Hugging Face's Trainer, which frees the model output before backward
    (spec ``hf_trainer``; ``Numerics.logits_released``)."""
    recompute_stops_early: bool = False
    """The job's activation checkpointing stops recomputing a layer once its saved tensors are
    back (:attr:`gpuplan.estimate.frameworks.Framework.checkpoint_early_stop`, PyTorch 2.1 on:
    spec ``pytorch_version``); decides time, not memory."""
    fsdp_root_embedding: bool = True
    """Under FSDP the root unit holds the embedding (not a unit of its own): it stays gathered
    with the final norm and LM head through forward and backward (:func:`fsdp_root_bytes`;
    :attr:`gpuplan.estimate.frameworks.Framework.embedding_own_unit_from`, spec
    ``pytorch_version``)."""
    optimizer_in_backward: bool = False
    """Each parameter is stepped in its post-accumulate-grad hook and its gradient freed
    (torchtune ``training/memory.py``, ``register_optim_in_bwd_hooks``: ``step()`` then
    ``zero_grad()``): one parameter's gradient and step temporaries at a time."""
    paged_optimizer: bool = False
    """bitsandbytes paged optimizer: the moments live in CUDA unified memory
    (``bitsandbytes/optim/optimizer.py``, ``Optimizer8bit.get_state_buffer``: ``F.get_paged``
    for parameters of 1e5 elements or more), outside PyTorch's allocator."""

    @property
    def loss_compiled(self) -> bool:
        """Whether the loss runs compiled (``compiled_loss``, else as the model)."""
        return self.compiled if self.compiled_loss is None else self.compiled_loss


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StagePeak:
    """One pipeline stage's peak, measured the three ways of :class:`MemoryEstimate`."""

    stage: PipelineStage
    peak_allocated_bytes: float
    peak_reserved_bytes: float
    device_used_bytes: float


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
    capacity_basis: str = "device-reported"
    """``device-reported`` (nvidia-smi memory.total), ``datasheet`` or ``given``."""
    steady_reserve_bytes: float = 0.0
    """The caching allocator's reserve while memory is plentiful (the reserve counted in
    ``peak_reserved_bytes`` is smaller where the device leaves less: :func:`squeezed_reserve`)."""
    evictable_bytes: float = 0.0
    """Of ``device_used_bytes``, what the driver pages out to the host when the rest needs the
    room (a paged optimizer's resident state): it never decides ``fits``, the verdict or the
    headroom."""
    pipeline_stage: PipelineStage | None = None
    """With pipeline parallelism, the stage this estimate is of: the one that peaks higher."""
    pipeline_stages: tuple[StagePeak, ...] = ()
    """With pipeline parallelism, the first and the last stage's own peaks."""

    @property
    def reserve_squeezed(self) -> bool:
        """It fits only because the allocator gives back part of its usual cache."""
        return squeezed(
            self.steady_reserve_bytes, self.peak_reserved_bytes - self.peak_allocated_bytes
        )


def squeezed(steady: float, held: float) -> bool:
    """Whether the allocator holds less than its usual reserve (``steady``) beyond the
    allocated peak (:func:`squeezed_reserve`); a byte's difference is rounding, not a squeeze."""
    return steady - held > 1.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters one rank holds: its pipeline stage, per tensor-parallel rank."""

    layer: float
    other: float
    """What no layer holds: the embedding, the final norm and the LM head, as the stage has them."""
    layers: int
    embedding: float = 0.0
    """Of ``other``, the word embedding's (the first stage's)."""
    expert: float = 0.0
    """The stage's expert parameters per tensor-parallel rank, all experts (part of ``layer``)."""
    ep: int = 1
    """Expert-parallel degree: a rank holds ``expert / ep`` of them."""

    @property
    def total(self) -> float:
        """All parameters of the stage on this rank (with expert parallelism: its own experts)."""
        return self.per_rank(1)

    def per_rank(self, ranks: int) -> float:
        """Parameters per rank when what each rank holds is split over ``ranks`` data-parallel
        ranks: :func:`split_over`."""
        return split_over(self.layer + self.other - self.expert, self.expert, self.ep, ranks)


def split_over(dense: float, expert: float, ep: int, ranks: int) -> float:
    """Per-rank share of ``dense`` parameters split over ``ranks`` and of ``expert`` ones
    (all experts) held by ``ep`` expert-parallel ranks and split over the ``ranks / ep`` that
    hold the same experts (Megatron-Core's expert-data-parallel group): expert / max(ep, ranks).
    Sharded state is therefore the same per rank with or without expert parallelism; what each
    rank holds whole (parameters and gradients under DDP) shrinks by ep."""
    return dense / max(1, ranks) + expert / max(ep, ranks, 1)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Trained:
    """What gets gradients, and in which dtypes."""

    params: float
    """Trainable parameter elements on this rank (the stage, or its LoRA adapters)."""
    trainable: Trainable
    grad_bytes: float
    state_bytes: int
    master_bytes: float
    expert: float = 0.0
    """Of ``params`` before expert parallelism, the experts' (all experts, per TP rank)."""
    ep: int = 1

    def per_rank(self, ranks: int) -> float:
        """Trainable elements per rank split over ``ranks`` (:func:`split_over`)."""
        return split_over(self.params - self.expert / self.ep, self.expert, self.ep, ranks)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WeightBytes:
    """Parameter memory: kept, live through forward/backward only, and gathered."""

    stored: float
    """Parameters kept through the whole step (sharded where the engine shards them)."""
    compute_copies: float
    """Low-precision copies and dequantised layers, live through forward/backward only."""
    gathered: float
    """Unsharded layers in flight (ZeRO-3 / FSDP all-gathers)."""
    lines: Lines


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TrainingStateBytes:
    """Gradients, optimizer state and the optimizer step's temporaries."""

    gradients: float
    """Gradient storage, including engine copies and reduction buckets."""
    kept_gradients: float = 0.0
    """The part of ``gradients`` allocated before forward and kept through it whatever the
    accumulation: DDP's bucket copy (``Reducer::initialize_buckets`` at construction)."""
    optimizer_state: float
    """Moments and master weights."""
    step_temporaries: float
    """Live only during the optimizer step."""
    lines: Lines
    paged_state: float = 0.0
    """Optimizer moments in CUDA unified memory (paged optimizer): outside PyTorch's allocator,
    resident while the card has room."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ActivationBytes:
    """Activations saved for backward and the loss gradients at the start of backward."""

    saved: float
    transient: float
    items: tuple[Item, ...]

    @property
    def total(self) -> float:
        """Activation bytes at the start of backward."""
        return self.saved + self.transient


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeBytes:
    """Memory outside the model's tensors."""

    cublas: float
    reserve: float
    context: float
    nccl: float


def stage_params(shape: Shape, st: Strategy, stage: PipelineStage = "first") -> StageParams:
    """The parameters a pipeline stage holds, per TP rank.

    The first stage has the embeddings, the last the final norm and the LM head; with tied
    embeddings the last keeps its own copy of the word embeddings as the output weight
    (Megatron's ``share_embeddings_and_output_weights``: the copy's gradient is all-reduced
    with the first stage's). Each holds its chunks' layers (:func:`pipeline.stage_layers`:
    ``ceil(layers / pp)``, one fewer where Megatron counts the embedding or the loss as one).
    """
    layers = pipeline.stage_layers(shape.layers, st, stage)
    head = 0 if shape.tied_embeddings else shape.params_head
    if st.pp == 1:
        other = shape.params_embedding + head + shape.params_final_norm
    elif stage == "first":
        other = shape.params_embedding
    else:
        copy = shape.vocab * shape.hidden if shape.tied_embeddings else head
        other = copy + shape.params_final_norm
    return StageParams(
        layer=layers * shape.params_per_layer / st.tp,
        other=other / st.tp,
        layers=layers,
        embedding=shape.params_embedding / st.tp if st.pp == 1 or stage == "first" else 0.0,
        expert=layers * expert_params_per_layer(shape) / st.tp if st.ep > 1 else 0.0,
        ep=st.ep,
    )


def expert_params_per_layer(shape: Shape) -> int:
    """Elements of one layer's experts (the linears a mixture of experts has num_experts of)."""
    return sum(lin.params for lin in shape.linears if lin.count > 1)


def layer_params_held(shape: Shape, ep: int) -> float:
    """Parameters of one layer a rank holds (or gathers): its own experts only under ep."""
    if ep == 1:
        return shape.params_per_layer
    expert = expert_params_per_layer(shape)
    return shape.params_per_layer - expert + expert / ep


def layout_for(job: MemoryJob, st: Strategy) -> StateLayout:
    """The engine's per-parameter state layout for this job and strategy."""
    return state_layout(
        job.framework,
        st.sharding,
        PRECISIONS[job.precision],
        ranks=st.shard_degree,
        dp=st.replicas,
        megatron=job.megatron,
        deepspeed=job.deepspeed,
        offload=st.offload,
        grad_accum=st.grad_accum,
    )


def engine_casts_to_16bit(lay: StateLayout) -> bool:
    """Whether the engine casts the whole module to 16 bits (adapters included). Megatron's
    ``fp8_params`` (1-byte parameters) makes only Transformer Engine's linears fp8
    (``fp8_model_init``); NeMo's LoRA adapters are plain layers built in the 16-bit model
    dtype, so they stay 16-bit there too."""
    if lay.engine == "megatron":
        return lay.param_bytes in (1, 2)
    return lay.engine in ("deepspeed", "apex") and lay.param_bytes == 2


def adapter_bytes(job: MemoryJob, lay: StateLayout) -> int:
    """Bytes of a LoRA adapter weight element. An engine that casts the whole module to 16
    bits casts the adapters too; PEFT (framework hf) upcasts them to fp32
    (``autocast_adapter_dtype=True``, its default since 0.12; before, they took the base
    weight's dtype); litgpt and torchtune keep them in the model dtype (fp32 under autocast)."""
    if engine_casts_to_16bit(lay):
        return 2
    fp32 = (
        (FRAMEWORKS[job.framework].fp32_adapters and not job.peft_base_dtype_adapters)
        or job.precision.endswith("-mixed")
        or job.precision in ("fp32", "tf32")
    )
    return 4 if fp32 else 2


def trained(
    shape: Shape, job: MemoryJob, st: Strategy, stage: StageParams, lay: StateLayout
) -> Trained:
    """Trainable elements and their gradient / optimizer dtypes."""
    if job.method == "full":
        return Trained(
            params=stage.total,
            trainable=Trainable(full=True),
            grad_bytes=lay.grad_bytes,
            state_bytes=lay.state_bytes,
            master_bytes=lay.master_bytes,
            expert=stage.expert,
            ep=st.ep,
        )
    per_layer = adapter_params_per_layer(shape, job.lora_roles, job.lora_rank)
    expert_adapters = 0.0
    if st.ep > 1:
        expert_adapters = (
            expert_adapter_params_per_layer(shape, job.lora_roles, job.lora_rank)
            * stage.layers
            / st.tp
        )
    adapters = per_layer * stage.layers / st.tp - expert_adapters + expert_adapters / st.ep
    adapter_b = adapter_bytes(job, lay)
    if engine_casts_to_16bit(lay):
        # the engine casts the module (adapters included) to 16 bits; fp32 master in the optimizer
        grad_b, state_b, master_b = lay.grad_bytes, lay.state_bytes, lay.master_bytes
    else:
        grad_b = state_b = adapter_b
        master_b = 0
    return Trained(
        params=adapters,
        trainable=Trainable(
            full=False,
            lora_roles=job.lora_roles,
            lora_rank=job.lora_rank,
            lora_dropout=job.lora_dropout,
            quantized_base=job.method == "qlora",
            adapter_bytes=adapter_b,
        ),
        grad_bytes=grad_b,
        state_bytes=state_b,
        master_bytes=master_b,
        expert=expert_adapters,
        ep=st.ep,
    )


def gathered_layer_bytes(
    shape: Shape, job: MemoryJob, pb: PrecisionBytes, lay: StateLayout
) -> float:
    """Bytes of one unsharded layer, in the dtype it is gathered in."""
    if job.method == "qlora":
        nf4 = NF4_BYTES_DQ if job.double_quant else NF4_BYTES
        linear = shape.params_linear_per_layer
        return linear * nf4 + (shape.params_per_layer - linear) * 2
    if job.method == "lora":
        return shape.params_per_layer * (4 if job.precision in ("fp32", "tf32") else 2)
    return shape.params_per_layer * lay.gather_bytes


def weight_bytes(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    stage: StageParams,
    lay: StateLayout,
    tr: Trained,
    assumptions: list[str],
) -> WeightBytes:
    """Step 1: parameters, autocast copies, dequantised layers and gathered layers."""
    pb = PRECISIONS[job.precision]
    lines: list[tuple[str, float]] = []
    stored = compute = gathered = 0.0
    offload_params = st.offload == "optimizer+params"
    offloaded = 2 * shape.params_per_layer / st.tp * pb.param
    if job.method == "full":
        stored = offloaded if offload_params else stage.per_rank(lay.param_ranks) * lay.param_bytes
        lines.append(("weights: parameters", stored))
        if lay.unsharded_compute_params:
            compute = stage.total * lay.gather_bytes
            lines.append(
                ("weights: bf16 parameters kept gathered from forward to backward", compute)
            )
        elif lay.compute_copy_bytes:
            sharded = lay.param_ranks > 1
            copies = (2 * layer_params_held(shape, st.ep) / st.tp) if sharded else stage.total
            compute = copies * lay.compute_copy_bytes
            lines.append(("weights: low-precision compute copies", compute))
    else:
        base_b = 4 if job.precision in ("fp32", "tf32") else 2
        if job.megatron is not None and job.megatron.fp8_params and job.precision == "fp8-mixed":
            base_b = 1  # Transformer Engine fp8 weights: the frozen base in 1 byte
        if job.method == "qlora":
            nf4 = NF4_BYTES_DQ if job.double_quant else NF4_BYTES
            linear_p = shape.params_linear_per_layer * stage.layers / st.tp
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
            nf4_b = linear_p * nf4 / lay.param_ranks
            rest_b = (stage.total - linear_p) * 2 / lay.param_ranks
            fp16_state = FRAMEWORKS[job.framework].qlora_fp16_quant_state
            # fp16 quant state under bf16: the fp16 dequantized weight and its bf16 cast
            deq = (4 if fp16_state and job.precision.startswith("bf16") else 2) * largest / st.tp
            lines += [
                ("weights: NF4 base linears" + (" and LM head" if head_q else ""), nf4_b),
                ("weights: 16-bit embeddings, norms" + ("" if head_q else ", head"), rest_b),
                ("weights: dequantized layer (transient)", deq),
            ]
            stored, compute = nf4_b + rest_b, deq
            assumptions.append(
                f"QLoRA NF4 base weights, {'double' if job.double_quant else 'single'} "
                "quantization of absmax (QLoRA paper)"
            )
        else:
            stored = offloaded if offload_params else stage.per_rank(lay.param_ranks) * base_b
            lines.append(("weights: frozen base", stored))
        if lay.unsharded_compute_params and lay.param_ranks > 1 and not offload_params:
            # FSDP SHARD_GRAD_OP: the whole stage's frozen base stays gathered until backward
            kept = stored * (lay.param_ranks - 1)
            compute += kept
            lines.append(("weights: frozen base kept gathered from forward to backward", kept))
        # sharded with the base where the engine shards parameters (FSDP's units and ZeRO-3's
        # partitions hold the adapters as they hold the frozen weights): a rank keeps its share
        sharded = lay.param_ranks > 1 and not lay.unsharded_compute_params
        adapters = (tr.per_rank(lay.param_ranks) if sharded else tr.params) * (
            tr.trainable.adapter_bytes
        )
        lines.append(("weights: LoRA adapters", adapters))
        stored += adapters
        assumptions.append(
            f"LoRA r={job.lora_rank} on {sorted(job.lora_roles)}; adapters in "
            f"{'fp32' if tr.trainable.adapter_bytes == 4 else '16-bit'}"
        )
    if lay.gathered_layers and not lay.unsharded_compute_params:
        per_elem = gathered_layer_bytes(shape, job, pb, lay) / shape.params_per_layer
        elems = min(
            lay.gathered_layers * layer_params_held(shape, st.ep) + lay.gathered_extra_elements,
            lay.gathered_cap_elements,
        )
        gathered = elems * per_elem / st.tp
        lines.append(("weights: unsharded layers in flight (all-gather)", gathered))
        root = fsdp_root_bytes(shape, job, st, stage, lay)
        if root:
            gathered += root
            lines.append(("weights: FSDP root unit gathered through forward and backward", root))
            assumptions.append(
                "FSDP root unit: "
                + ("the embedding, " if job.fsdp_root_embedding and stage.embedding else "")
                + "the final norm and LM head stay gathered from the root's pre-forward to its "
                "post-backward (FSDP's root is not resharded after forward)"
            )
    return WeightBytes(stored=stored, compute_copies=compute, gathered=gathered, lines=tuple(lines))


def fsdp_root_bytes(
    shape: Shape, job: MemoryJob, st: Strategy, stage: StageParams, lay: StateLayout
) -> float:
    """Bytes of the root FSDP unit's gathered parameters on one rank, live through forward and
    backward (0 where the engine does not gather parameters this way).

    PyTorch FSDP wraps each block as a unit and then the whole model as the root, which holds
    what no block does: the embedding, the final norm and the LM head (Hugging Face's
    transformer-layer auto-wrap, Lightning's, answer.ai's and torchtune's layer conditions,
    torchtitan before #1094). The root's pre-forward gathers them before the embedding runs;
    the root's forward encloses every block and ends with the head, and the head's backward
    opens the backward pass, so they stay gathered until the root's post-backward at its end:
    FSDP1 never frees the root after forward (``_runtime_utils._post_forward_reshard``:
    ``not state._is_root``), nor does FSDP2 before PyTorch 2.8 (``FSDPState._lazy_init``:
    ``post_forward_mesh_info = None``); since pytorch/pytorch#154704 it does where the root's
    ``reshard_after_forward`` is explicit, only to gather them again for the head's backward.
    Where the embedding is a unit of its own (torchtitan since #1094) it is resharded after its
    forward, and only the final norm and the head remain (a tied head is that unit's weight).
    DeepSpeed's ZeRO-3 releases each module's parameters after use and Megatron gathers per
    layer: nothing of this there.
    """
    if lay.engine not in ("pytorch", "torchtitan") or lay.param_ranks <= 1:
        return 0.0
    embedding = stage.embedding if job.fsdp_root_embedding or shape.tied_embeddings else 0.0
    head = stage.other - stage.embedding
    if job.method == "full":
        return (embedding + head) * lay.gather_bytes
    base = 4 if job.precision in ("fp32", "tf32") else 2
    head_b = float(base)
    if job.method == "qlora" and FRAMEWORKS[job.framework].qlora_quantizes_head and st.pp == 1:
        head_b = NF4_BYTES_DQ if job.double_quant else NF4_BYTES
    return embedding * base + head * head_b


def _adafactor_state(shape: Shape, stage: StageParams, st: Strategy) -> float:
    """Factored second moments of the matrices plus full vectors, fp32 (Shazeer & Stern 2018)."""
    rows_cols = sum(lin.count * (lin.in_features + lin.out_features) for lin in shape.linears)
    factored = stage.layers * rows_cols / st.tp + (shape.vocab + shape.hidden)
    vectors = (
        stage.total
        - stage.layers * shape.params_linear_per_layer / st.tp
        - shape.vocab * shape.hidden / st.tp
    )
    return (factored + max(vectors, 0)) * 4


def largest_parameter(shape: Shape, st: Strategy) -> float:
    """Elements of the largest parameter tensor on one tensor-parallel rank (a linear's
    weight, or the embedding / untied head)."""
    largest = max(
        [lin.in_features * lin.out_features for lin in shape.linears] + [shape.vocab * shape.hidden]
    )
    return largest / st.tp


def training_state_bytes(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    stage: StageParams,
    lay: StateLayout,
    tr: Trained,
    assumptions: list[str],
) -> TrainingStateBytes:
    """Step 2: gradients, optimizer state and step temporaries."""
    fw = FRAMEWORKS[job.framework]
    lines: list[tuple[str, float]] = []
    grads = 0.0 if lay.grads_on_host else tr.per_rank(lay.grad_ranks) * tr.grad_bytes
    if job.optimizer_in_backward:
        # the post-accumulate-grad hook steps and frees each gradient as it is accumulated
        grads = min(grads, largest_parameter(shape, st) / lay.grad_ranks * tr.grad_bytes)
    lines.append(("gradients", grads))
    total_grads = grads
    if lay.offload_grad_buffer:
        buffer = min(largest_parameter(shape, st), tr.params) * tr.grad_bytes
        lines.append(("gradients: offload staging buffer (largest parameter)", buffer))
        total_grads += buffer
    if lay.param_ranks > 1 and job.method != "full" and fw.fsdp_mixed_units:
        unsharded = fw.fsdp_unsharded_accumulation and st.grad_accum > 1
        extra = stage.per_rank(1 if unsharded else lay.param_ranks) * tr.grad_bytes - grads
        lines.append(("gradients: FSDP units mixing frozen and LoRA params", extra))
        total_grads += extra
        assumptions.append(
            f"{job.framework}: FSDP units mix frozen and LoRA parameters, so gradients are allocated "
            "for all of them" + (", unsharded while accumulating (no_sync)" if unsharded else "")
        )
    # whole-model gradient copies held through forward and backward (kept)
    kept = 0.0
    held_copies = (
        (
            tr.grad_bytes if lay.ddp_bucket_copy else 0.0,
            "gradients: DDP bucket copies",
            "DDP with gradient_as_bucket_view=False (the default) keeps a bucket copy of the grads",
        ),
        (
            lay.carried_grad_bytes,
            "gradients: previous step's, still referenced",
            "Megatron-LM v2's local DDP: each parameter's main_grad keeps the previous step's "
            "16-bit gradient, and the fp32 main gradients copied at the step stay, through the "
            "next forward and backward",
        ),
    )
    for per_element, label, why in held_copies:
        if per_element and job.method == "full":
            copy = tr.params * per_element
            lines.append((label, copy))
            total_grads += copy
            kept += copy
            assumptions.append(why)
    if lay.grad_partition_copy_bytes:
        copy = tr.per_rank(lay.optimizer_ranks) * lay.grad_partition_copy_bytes
        lines.append(("gradients: DeepSpeed contiguous copy of the own partition", copy))
        total_grads += copy
    if lay.bucket_bytes:
        lines.append(("gradients: reduction buckets", lay.bucket_bytes))
        total_grads += lay.bucket_bytes

    # per rank after the optimizer's sharding (expert parallelism: split_over)
    opt_params = tr.per_rank(lay.optimizer_ranks)
    if job.optimizer == "adafactor" and job.method == "full":
        opt_state = _adafactor_state(shape, stage, st) / lay.optimizer_ranks
    else:
        opt_state = opt_params * optimizer_state_bytes(job.optimizer, tr.state_bytes)
    opt_state += opt_params * tr.master_bytes
    opt_tmp = opt_params * optimizer_temp_bytes(job.optimizer, tr.state_bytes)
    if job.optimizer_impl == "fused":
        opt_tmp = 0.0
    elif job.optimizer_impl == "for-loop" or job.optimizer_in_backward:
        # one parameter tensor at a time (a per-parameter optimizer in backward steps one list
        # of one tensor): the largest one
        largest = largest_parameter(shape, st) / lay.optimizer_ranks
        opt_tmp = min(opt_tmp, largest * tr.state_bytes) if opt_tmp else 0.0
    step_grad = 0.0
    if lay.step_grad_bytes:
        step_grad = min(opt_params, lay.step_grad_cap_elements)
        step_grad *= lay.step_grad_bytes
    if st.offload != "none":
        assumptions.append("optimizer state and step on the CPU (offload)")
        opt_state = opt_tmp = step_grad = 0.0
    paged = 0.0
    if job.paged_optimizer:
        paged = opt_params * optimizer_state_bytes(job.optimizer, tr.state_bytes)
        opt_state -= paged
    if job.optimizer_in_backward:
        assumptions.append(
            "optimizer step in backward: each parameter is stepped as its gradient is "
            "accumulated and the gradient freed (torchtune optimizer_in_bwd), so one "
            "parameter's gradient and step temporaries exist at a time"
        )
    lines.append(("optimizer: state", opt_state))
    lines.append(("optimizer: step temporaries", opt_tmp))
    if step_grad:
        lines.append(("optimizer: fp32 gradient partition (step)", step_grad))
    return TrainingStateBytes(
        gradients=total_grads,
        kept_gradients=kept,
        optimizer_state=opt_state,
        step_temporaries=opt_tmp + step_grad,
        lines=tuple(lines),
        paged_state=paged,
    )


_INPUT_GROUPS = (
    frozenset({"q", "k", "v", "qkv"}),
    frozenset({"o"}),
    frozenset({"gate", "up", "gate_up", "fc1"}),
    frozenset({"down", "fc2"}),
)
"""Linears that read the same input tensor (one stored reference is one tensor)."""


def previous_step_inputs(shape: Shape, st: Strategy, act_bytes: int, head: bool) -> float:
    """Bytes per token of the previous step's inputs to the 4-bit linears, kept alive by
    bitsandbytes < 0.43.2 (``MatMul4Bit.forward``: ``ctx.tensors = (A, B)``) while the loop
    still references that step's graph: every base linear is 4-bit under QLoRA."""
    width = 0
    for group in _INPUT_GROUPS:
        widths = [lin.in_features for lin in shape.linears if lin.role in group]
        width += max(widths, default=0)
    per_token = math.ceil(shape.layers / st.pp) * width / st.tp
    if head and shape.family == "decoder" and not shape.tied_embeddings and st.pp == 1:
        per_token += shape.hidden
    return per_token * act_bytes


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _ActivationProfile:
    """Bytes per token of one micro-batch on one rank, before the pipeline schedule decides how
    many micro-batches each stage holds (what does not depend on the stage, dp or vp)."""

    tokens: int
    per_micro_batch: float
    """The stage's layers (their checkpoints, under activation checkpointing)."""
    layers: int
    """The layers ``per_micro_batch`` covers: the worst stage's ``ceil(layers / pp)`` (with
    CPU offloading, those kept on the GPU, plus the one being reloaded)."""
    offloaded: bool
    rebuilt: float
    """The one layer a checkpointed backward rebuilds (exists once, whatever is in flight)."""
    previous_step: float
    """The previous step's 4-bit linear inputs that bitsandbytes < 0.43.2 keeps alive."""
    embedding: float
    """The first stage's head items (the embedding's), per micro-batch in flight."""
    output: float
    """The last stage's head items (final norm, LM head, loss) for one micro-batch."""
    transient: float
    """Loss and logits gradients at the start of the last stage's backward."""
    items: tuple[Item, ...]


@functools.lru_cache(maxsize=4096)
def _activation_profile(
    shape: Shape,
    job: MemoryJob,
    tr: Trainable,
    act_bytes: int,
    autocast: bool,
    layout: tuple[int, bool, int, int, int, str],
) -> _ActivationProfile:
    """Per-token activations of a layout ``(tp, sequence_parallel, pp, cp, micro_batch_size,
    activation_checkpointing)``: what decides them, while dp, grad_accum and vp only decide how
    many micro-batches are in flight (a plan's many variants of a layout share this)."""
    tp, sequence_parallel, pp, cp, micro_batch_size, checkpointing = layout
    st = Strategy(
        tp=tp,
        sequence_parallel=sequence_parallel,
        pp=pp,
        cp=cp,
        micro_batch_size=micro_batch_size,
        activation_checkpointing=checkpointing,
    )
    fw = FRAMEWORKS[job.framework]
    chunks = job.loss_chunks or fw.loss_chunks
    num = Numerics(
        act_bytes=act_bytes,
        autocast=autocast,
        fp16=job.precision.startswith("fp16"),
        python_gelu=fw.python_gelu,
        compiled=job.compiled,
        compiled_loss=job.loss_compiled,
        fused_kernels=fw.fused_kernels if job.fused_kernels is None else job.fused_kernels,
        residual_16bit=fw.residual_16bit and autocast,
        fused_loss=fw.fused_loss if job.loss_kernel == "auto" else job.loss_kernel == "fused",
        fused_linear_loss=job.loss_kernel == "fused-linear",
        loss_grad_in_place=fw.loss_grad_in_place,
        te_cross_entropy=job.megatron is not None and job.megatron.te_cross_entropy,
        attention_output_shared=fw.attention_output_shared,
        fp8_linear_inputs=fw.te_fp8_linears and job.precision == "fp8-mixed",
        fp8_attention=job.megatron is not None
        and job.megatron.fp8_attention
        and job.precision == "fp8-mixed",
        fp8_activation_input=job.megatron is not None and job.megatron.fp8_activation_input,
        loss_chunks=chunks,
        logits_upcast_in_model=chunks == 1
        and (fw.upcast_unchunked_logits or (fw.upcast_in_loss and not job.loss_compiled)),
        loss_parallel=fw.dtensor_tensor_parallel and tp > 1,
        logits_released=job.hf_trainer,
    )

    def rank(items: Iterable[Item]) -> float:
        return per_tp_rank(
            items, st.tp, st.sequence_parallel, saves_gathered=fw.dtensor_tensor_parallel
        )

    seq = shape.fixed_tokens or job.seq_len
    tokens = st.micro_batch_size * seq // st.cp  # context parallelism: seq_len / cp per rank
    layers = math.ceil(shape.layers / st.pp)
    off = min(job.activation_offload_layers, layers)
    # Megatron's CPU offloading (Transformer Engine 2.9, ``cpu_offload.py``,
    # ``AsyncDoubleBufferGroupOffloadHandler``) offloads the first ``off`` layers; each one's GPU
    # copy is freed by the end of its ``layer_window_map`` window, and the first backward layer
    # starts reloading the last offloaded one while every kept layer is still held: one more
    # layer at the peak (TE 2.10's ``DefaultOffloadSynchronizer`` starts that reload a layer
    # later, after the last layer's activations are freed)
    layers = max(0, layers - off) + min(1, off) if off else layers
    items = tuple(layer_items_cached(shape, num, tr, seq, job.fused_attention))
    per_layer = rank(items)
    # ``act_tok``: what each in-flight micro-batch keeps; ``recomputed_tok``: the one layer a
    # checkpointed backward rebuilds. Pipeline schedules run one micro-batch's backward at a
    # time (Megatron ``forward_backward_pipelining_*``), so the rebuilt layer exists once while
    # every in-flight micro-batch holds its checkpoints.
    recomputed_tok = 0.0
    if st.activation_checkpointing == "full":
        kept = rank(boundary_items(shape, num))
        act_tok, recomputed_tok = layers * kept, per_layer
    elif st.activation_checkpointing == "selective-op":
        kept = rank(op_sac_items(shape, num))
        act_tok, recomputed_tok = layers * kept, per_layer
    elif st.activation_checkpointing == "selective":
        core = rank(i for i in items if i.attention_core)
        act_tok, recomputed_tok = layers * (per_layer - core), core
    else:
        act_tok = layers * per_layer
    previous = 0.0
    if job.bnb_keeps_inputs and fw.keeps_previous_graph:
        previous = previous_step_inputs(shape, st, act_bytes, fw.qlora_quantizes_head)
    heads = head_items_cached(shape, num, tr)
    return _ActivationProfile(
        tokens=tokens,
        per_micro_batch=act_tok,
        layers=layers,
        offloaded=off > 0,
        rebuilt=recomputed_tok,
        previous_step=previous,
        embedding=rank(i for i in heads if i.first_stage),
        output=rank(i for i in heads if not i.first_stage),
        transient=backward_transient_per_token(shape, num) / st.tp,
        items=items,
    )


def _transformer_activations(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    tr: Trainable,
    act_bytes: int,
    autocast: bool,
    stage: PipelineStage = "first",
) -> tuple[float, float, tuple[Item, ...]]:
    """(saved activation bytes, backward transient bytes, per-layer items) on ``stage``."""
    layout = (
        st.tp,
        st.sequence_parallel,
        st.pp,
        st.cp,
        st.micro_batch_size,
        st.activation_checkpointing,
    )
    prof = _activation_profile(shape, job, tr, act_bytes, autocast, layout)
    in_flight = pipeline.in_flight(st, stage)
    if prof.offloaded or st.pp == 1:
        kept = prof.per_micro_batch * in_flight
    else:
        # what the stage's chunks hold at once, layer by layer (one fewer layer in the chunk
        # beside the embedding or the loss, where Megatron counts them as layers)
        kept = prof.per_micro_batch / prof.layers * pipeline.held_layers(shape.layers, st, stage)
    saved = kept + prof.rebuilt + prof.previous_step
    # the embedding's items are the first stage's, once per micro-batch in flight there; the
    # final norm, LM head and loss are the last stage's, for the one micro-batch whose loss
    # is computed before its backward
    has_first = st.pp == 1 or stage == "first"
    has_last = st.pp == 1 or stage == "last"
    if has_first:
        saved += prof.embedding * in_flight
    if has_last:
        saved += prof.output
    transient = prof.transient * prof.tokens if has_last else 0.0
    return saved * prof.tokens, transient, prof.items


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


def activation_bytes(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    lay: StateLayout,
    tr: Trained,
    image_size: int | None,
    stage: PipelineStage = "first",
) -> ActivationBytes:
    """Step 3: activations saved for backward and the loss gradients (on ``stage``); what
    they assume is :func:`activation_notes`."""
    pb = PRECISIONS[job.precision]
    if shape.family == "cnn":
        saved = _cnn_activations(shape, st, pb.act, image_size)
        return ActivationBytes(saved=saved, transient=0.0, items=())
    saved, transient, items = _transformer_activations(
        shape, job, st, tr.trainable, pb.act, pb.autocast and lay.autocast, stage
    )
    return ActivationBytes(saved=saved, transient=transient, items=items)


def activation_notes(shape: Shape, job: MemoryJob, st: Strategy) -> tuple[str, ...]:
    """The assumptions behind :func:`activation_bytes` (built only for an explained estimate:
    a layout search compares thousands of verdicts, :func:`check_memory`)."""
    if shape.family == "cnn":
        return ()
    notes: list[str] = []
    if job.bnb_keeps_inputs and FRAMEWORKS[job.framework].keeps_previous_graph:
        notes.append(
            "bitsandbytes < 0.43.2 with a loop that holds the previous step's graph: the "
            "previous step's inputs to the 4-bit linears stay live through the next forward"
        )
    if st.tp > 1:
        notes.append(
            f"tp={st.tp} with sequence parallelism: norm inputs, column-parallel linear inputs "
            "and dropout masks split over the tp ranks (parallelism.sequence_parallel)"
            if st.sequence_parallel
            else f"tp={st.tp} without sequence parallelism: norm inputs, column-parallel linear "
            "inputs, dropout masks and checkpointed layer inputs whole on every tp rank"
        )
    if job.fused_attention:
        notes.append("fused attention (flash / memory-efficient SDPA): no s^2 buffers")
    else:
        notes.append(
            "eager attention: softmax probabilities (s^2 per head) kept for backward"
            + (
                f" (SDPA's math backend: {job.framework} hands grouped K/V to SDPA with "
                f"enable_gqa, and in {job.precision} no fused kernel takes it)"
                if job.gqa_math_attention
                else ""
            )
        )
    if job.hf_trainer and shape.family == "decoder":
        notes.append(
            "Hugging Face Trainer: compute_loss returns the loss alone, so the model output "
            "and its 16-bit logits are freed before backward"
        )
    return tuple(notes)


PAGED_DETAIL = "optimizer: paged state resident on the GPU (unified memory)"
RESERVE_DETAIL = "overhead: caching-allocator reserve"
"""The ``details`` key of the reserve counted (a derived estimate rewrites it by this key)."""


def squeezed_reserve(steady: float, allocated: float, outside: float, usable: float) -> float:
    """The caching allocator's reserve when the device is nearly full.

    ``steady`` is what it holds beyond the allocated peak while memory is plentiful; ``outside``
    is device memory outside the allocator (CUDA context, NCCL buffers). Before
    raising OOM, PyTorch's allocator frees enough cached blocks for the request, then every
    cached segment with no live block, and retries (``c10/cuda/CUDACachingAllocator.cpp``,
    ``DeviceCachingAllocator::malloc``: ``release_available_cached_blocks``, then
    ``release_cached_blocks``). So the reserve shrinks to what the device leaves; what stays is
    fragmentation inside live segments, counted as :data:`overheads.ALLOCATOR_RESERVE_MIN_BYTES`.
    """
    room = usable - allocated - outside
    floor = min(steady, ovh.ALLOCATOR_RESERVE_MIN_BYTES)
    return max(floor, min(steady, room))


RESERVE_NOTE_PREFIX = "the allocator's usual reserve"


def reserve_note(steady: float, reserve: float, used: float, usable: float) -> str:
    """The assumption that says the reserve was squeezed (:func:`squeezed_reserve`), or ""."""
    if reserve >= steady:
        return ""
    return (
        f"{RESERVE_NOTE_PREFIX} ({steady / 2**30:.1f} GiB) does not fit beside the allocated "
        "peak: PyTorch frees its cached blocks before it raises OOM, so it keeps "
        f"{reserve / 2**30:.1f} GiB"
        + (" (the least fragmentation counted)" if used > usable else "")
    )


def restate_reserve(assumptions: tuple[str, ...], note: str) -> tuple[str, ...]:
    """``assumptions`` with the reserve's note of a derived estimate in place of the base's."""
    kept = tuple(a for a in assumptions if not a.startswith(RESERVE_NOTE_PREFIX))
    return (*kept, note) if note else kept


def workspace_bytes(job: MemoryJob, gpu: GpuSpec | None) -> float:
    """The GEMM workspaces a rank allocates: PyTorch's two cuBLAS handles' (the spec's
    ``cublas_workspace_config`` or PyTorch's default) and, where Transformer Engine's linears
    run (``framework: megatron``, or an fp8 run of an engine whose fp8 linears are TE's),
    TE's own (:func:`overheads.cublas_workspace_bytes`)."""
    fw = FRAMEWORKS[job.framework]
    te = fw.fused_kernels or (fw.te_fp8_linears and job.precision == "fp8-mixed")
    return ovh.cublas_workspace_bytes(gpu, job.cublas_workspace_per_handle, te=te)


def nccl_groups(st: Strategy) -> tuple[int, ...]:
    """The sizes of a rank's NCCL communicators: one for each parallel dimension above 1."""
    return tuple(deg for deg in (st.dp, st.tp, st.pp, st.cp) if deg > 1)


def runtime_bytes(
    job: MemoryJob,
    st: Strategy,
    cublas: float,
    nccl_link: ovh.NcclLink,
    allocated_model: float,
    reserve_fraction: float | None = None,
) -> RuntimeBytes:
    """Step 4: cuBLAS workspaces (``cublas``, :func:`workspace_bytes` of the job and the
    GPU), allocator reserve, CUDA context, NCCL buffers (one communicator for each parallel
    dimension above 1, over ``nccl_link``: :func:`overheads.nccl_bytes`)."""
    return RuntimeBytes(
        cublas=cublas,
        reserve=ovh.allocator_reserve_bytes(allocated_model + cublas, reserve_fraction),
        context=(
            job.cuda_context_bytes if job.cuda_context_bytes is not None else ovh.CUDA_CONTEXT_BYTES
        ),
        nccl=ovh.nccl_bytes(nccl_groups(st), nccl_link),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelBytes:
    """Steps 1-3 of a memory estimate: what the job keeps, whatever the GPU it runs on."""

    layout: StateLayout
    trained: Trained
    weights: WeightBytes
    training_state: TrainingStateBytes
    activations: ActivationBytes
    assumptions: tuple[str, ...]
    """What the parameters' state assumes (the activations': :func:`activation_notes`)."""


@functools.lru_cache(maxsize=8192)
def _state_bytes(
    shape: Shape, job: MemoryJob, st: Strategy, pipeline_stage: PipelineStage
) -> tuple[StateLayout, Trained, WeightBytes, TrainingStateBytes, tuple[str, ...]]:
    """Steps 1-2 of :func:`model_bytes`: the stage's parameters, gradients and optimizer state."""
    assumptions: list[str] = []
    stage = stage_params(shape, st, pipeline_stage)
    lay = layout_for(job, st)
    tr = trained(shape, job, st, stage, lay)
    w = weight_bytes(shape, job, st, stage, lay, tr, assumptions)
    ts = training_state_bytes(shape, job, st, stage, lay, tr, assumptions)
    return lay, tr, w, ts, tuple(assumptions)


@functools.lru_cache(maxsize=8192)
def model_bytes(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    image_size: int | None = None,
    pipeline_stage: PipelineStage = "first",
) -> ModelBytes:
    """Weights, gradients and optimizer state, and activations of ``shape`` under ``st``, on
    one pipeline stage (``pipeline_stage`` matters only when ``st.pp`` > 1).

    None of it depends on the GPU (only the runtime overheads and the capacity do), so a plan
    over many offerings computes it once per layout: the function is pure and cached.
    """
    # the parameters and their state do not depend on the interleaving depth: its variants of a
    # layout share them
    lay, tr, w, ts, notes = _state_bytes(
        shape, job, dataclasses.replace(st, vp=1) if st.vp > 1 else st, pipeline_stage
    )
    act = activation_bytes(shape, job, st, lay, tr, image_size, pipeline_stage)
    return ModelBytes(
        layout=lay, trained=tr, weights=w, training_state=ts, activations=act, assumptions=notes
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Placement:
    """What of the GPU, its node and the verdict's rule an estimate depends on beyond the job and
    its layout (part of the memo tables' keys: a plan asks for one layout on many offerings)."""

    cublas: float
    """The GEMM workspaces a rank allocates (:func:`workspace_bytes`)."""
    nccl_link: ovh.NcclLink
    cap: float
    """The capacity the device-used bytes are compared with."""
    safety_margin: float
    reserve_fraction: float
    """The allocator reserve fraction in force (:data:`overheads.ALLOCATOR_RESERVE_FRACTION`)."""


def _placement(
    job: MemoryJob,
    st: Strategy,
    gpu: GpuSpec | None,
    cap: float,
    safety_margin: float,
    intra_node: str | None,
    gpus_per_node: int | None,
) -> _Placement:
    return _Placement(
        cublas=workspace_bytes(job, gpu),
        nccl_link=job_nccl_link(gpu, st, intra_node, gpus_per_node),
        cap=cap,
        safety_margin=safety_margin,
        reserve_fraction=ovh.ALLOCATOR_RESERVE_FRACTION,
    )


def job_nccl_link(
    gpu: GpuSpec | None, st: Strategy, intra_node: str | None, gpus_per_node: int | None
) -> ovh.NcclLink:
    """The link NCCL's communicators of ``st`` use (:func:`overheads.nccl_link`): the network's
    when the job spans nodes (``gpus_per_node``, default 8)."""
    return ovh.nccl_link(gpu, intra_node, multi_node=st.gpus > (gpus_per_node or 8))


def estimate_memory(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    gpu: GpuSpec | None,
    *,
    capacity_bytes: float | None = None,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    image_size: int | None = None,
    intra_node: str | None = None,
    gpus_per_node: int | None = None,
) -> MemoryEstimate:
    """Estimate per-GPU memory of one training step of ``shape`` under ``st``.

    ``capacity_bytes`` defaults to what the device reports (``memory.total``) where the
    catalog has it, else the datasheet figure; ``device_used_bytes`` is compared with it.
    ``intra_node`` (the GPUs' link in a node; None: the GPU's usual board) and
    ``gpus_per_node`` (None: 8) decide NCCL's buffers (:func:`job_nccl_link`).
    Of the GPU only its cuBLAS workspace size, its NCCL link and its capacity matter, so the
    estimate is cached on those and on the allocator reserve fraction in force (a plan asks for
    the same layout on many offerings; steps 1-3, :func:`model_bytes`, are cached apart, for
    any GPU).
    """
    cap, cap_basis = _capacity(gpu, capacity_bytes)
    place = _placement(job, st, gpu, cap, safety_margin, intra_node, gpus_per_node)
    return _estimate(shape, job, st, place, cap_basis, image_size)


def clear_caches() -> None:
    """Empty the memo tables of :func:`model_bytes` and :func:`estimate_memory` (for tests that
    patch a step, and for benchmarks that time a cold estimate)."""
    model_bytes.cache_clear()
    _estimate.cache_clear()
    _totals.cache_clear()
    _check.cache_clear()
    _activation_profile.cache_clear()
    _state_bytes.cache_clear()


@functools.lru_cache(maxsize=8192)
def _totals(
    shape: Shape, job: MemoryJob, st: Strategy, place: _Placement, image_size: int | None
) -> tuple[_StageTotals, ...]:
    """The numbers of every stage that is sized, the one that peaks highest first (ties go to
    the first stage): one stage without pipeline parallelism, the first and the last with it."""
    args = (shape, job, st, place, image_size)
    if st.pp <= 1 or shape.family == "cnn":
        return (_stage_totals(*args, "first"),)
    first, last = (_stage_totals(*args, stage) for stage in PIPELINE_STAGES)
    return (last, first) if last.used > first.used else (first, last)


@functools.lru_cache(maxsize=4096)
def _estimate(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    place: _Placement,
    cap_basis: str,
    image_size: int | None,
) -> MemoryEstimate:
    totals = _totals(shape, job, st, place, image_size)
    worst = totals[0]
    est = _stage_estimate(shape, job, st, place, cap_basis, image_size, worst.stage, worst)
    if len(totals) == 1:
        return est
    # the explained estimate is the higher stage's; the other's totals come beside it
    other = totals[1]
    peaks = tuple(
        StagePeak(
            stage=t.stage,
            peak_allocated_bytes=t.allocated,
            peak_reserved_bytes=t.reserved,
            device_used_bytes=t.used,
        )
        for t in sorted(totals, key=lambda t: PIPELINE_STAGES.index(t.stage))
    )
    note = (
        f"pipeline: the {worst.stage} stage peaks higher "
        f"({worst.used / 2**30:.1f} GiB device used) than the "
        f"{other.stage} ({other.used / 2**30:.1f} GiB): the first holds "
        "the embedding and the most micro-batches in flight, the last the LM head and the loss; "
        + pipeline.describe(st, shape.layers)
    )
    return dataclasses.replace(est, pipeline_stages=peaks, assumptions=(*est.assumptions, note))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MemoryCheck:
    """A memory estimate's verdict without its explanation (:func:`check_memory`): the same
    numbers :func:`estimate_memory` reports for the same arguments."""

    device_used_bytes: float
    capacity_bytes: float
    safety_margin: float
    fits: bool
    reserve_squeezed: bool
    """It fits only because the allocator gives back part of its usual cache
    (:attr:`MemoryEstimate.reserve_squeezed`)."""
    evictable_bytes: float = 0.0
    """Of the device-used bytes, what the driver pages out to make room
    (:attr:`MemoryEstimate.evictable_bytes`)."""
    sure: bool = True
    """The 80% upper bound fits too (the verdict ``fits``, not ``tight``). The bounds are the job
    class's, which the caller knows (:mod:`gpuplan.estimate.configure`); True until it says."""


def check_memory(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    gpu: GpuSpec | None,
    *,
    capacity_bytes: float | None = None,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    image_size: int | None = None,
    intra_node: str | None = None,
    gpus_per_node: int | None = None,
) -> MemoryCheck:
    """Whether ``st`` fits, and by how much, as :func:`estimate_memory` would say, without
    building its breakdown and assumptions: a layout search asks this of thousands of
    layouts and explains only the one it picks."""
    cap, _ = _capacity(gpu, capacity_bytes)
    place = _placement(job, st, gpu, cap, safety_margin, intra_node, gpus_per_node)
    return _check(shape, job, st, place, image_size)


@functools.lru_cache(maxsize=8192)
def _check(
    shape: Shape, job: MemoryJob, st: Strategy, place: _Placement, image_size: int | None
) -> MemoryCheck:
    t = _totals(shape, job, st, place, image_size)[0]
    return MemoryCheck(
        device_used_bytes=t.used,
        capacity_bytes=place.cap,
        safety_margin=place.safety_margin,
        fits=t.fits,
        reserve_squeezed=squeezed(t.runtime.reserve, t.reserve),
        evictable_bytes=t.resident,
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _StageTotals:
    """The numbers of one stage's estimate, before it is explained (:func:`_stage_estimate`)."""

    stage: PipelineStage
    model: ModelBytes
    kept_gradients: float
    """Gradient bytes there from before forward to the end of backward."""
    fwd_bwd: float
    step: float
    runtime: RuntimeBytes
    allocated: float
    reserve: float
    usable: float
    resident: float

    @property
    def reserved(self) -> float:
        return self.allocated + self.reserve

    @property
    def used(self) -> float:
        """Device used, a paged optimizer's resident state included."""
        return self.reserved + self.runtime.context + self.runtime.nccl + self.resident

    @property
    def fits(self) -> bool:
        """Device used fits what may be used; a paged optimizer's resident state never
        decides it (the driver pages it out when the rest needs the room)."""
        return self.used - self.resident <= self.usable


def grads_allocated_at_init(job: MemoryJob, lay: StateLayout) -> bool:
    """Whether the engine allocates the gradients (or their partition) at init and keeps them
    (:attr:`StateLayout.grads_persistent`; DeepSpeed's ZeRO-3 only from 0.6.0)."""
    return lay.grads_persistent and not job.zero3_parameter_gathers


def gradients_through_forward(job: MemoryJob, st: Strategy, lay: StateLayout) -> bool:
    """Whether the gradients are allocated through forward and backward: when micro-batches
    accumulate, when ``zero_grad`` zeroes them in place instead of freeing them, or when the
    engine allocates them at init (:func:`grads_allocated_at_init`). Otherwise they grow while
    activations are freed."""
    return st.grad_accum > 1 or job.grads_kept or grads_allocated_at_init(job, lay)


def _stage_totals(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    place: _Placement,
    image_size: int | None,
    pipeline_stage: PipelineStage,
) -> _StageTotals:
    mb = model_bytes(shape, job, st, image_size, pipeline_stage)
    w, ts, act = mb.weights, mb.training_state, mb.activations
    # gradients there before forward add to the activations; the rest grow while the
    # activations are freed
    kept = ts.gradients if gradients_through_forward(job, st, mb.layout) else ts.kept_gradients
    live = kept + max(act.total, ts.gradients - kept)
    fwd_bwd = w.stored + w.gathered + w.compute_copies + ts.optimizer_state + live
    # after backward the gathered layers are resharded: the step sees stored parameters only
    step = w.stored + ts.optimizer_state + ts.gradients + ts.step_temporaries
    rt = runtime_bytes(
        job, st, place.cublas, place.nccl_link, max(fwd_bwd, step), place.reserve_fraction
    )
    allocated = max(fwd_bwd, step) + rt.cublas
    usable = place.cap * (1 - place.safety_margin)
    reserve = squeezed_reserve(rt.reserve, allocated, rt.context + rt.nccl, usable)
    used = allocated + reserve + rt.context + rt.nccl
    # a paged optimizer's unified-memory state: resident where the card has room (within the
    # safety margin), paged out to the host beyond that, so nvidia-smi counts it but it never
    # makes a job fail
    resident = min(ts.paged_state, max(0.0, usable - used))
    return _StageTotals(
        stage=pipeline_stage,
        model=mb,
        kept_gradients=kept,
        fwd_bwd=fwd_bwd,
        step=step,
        runtime=rt,
        allocated=allocated,
        reserve=reserve,
        usable=usable,
        resident=resident,
    )


def _fragmentation_note(job: MemoryJob, st: Strategy, lay: StateLayout) -> str:
    """Where the caching allocator is known to reserve far more than the fitted share: full
    fine-tuning with checkpointing on an unsharded PyTorch rank (docs/accuracy.md, "The
    caching allocator replayed")."""
    if (
        job.method != "full"
        or st.activation_checkpointing == "none"
        or lay.engine != "pytorch"
        or lay.param_ranks > 1
    ):
        return ""
    return (
        "; full fine-tuning with checkpointing can fragment far more: PyTorch's caching "
        "allocator replayed over such steps reserves 0-35% above the allocated peak (17-26% "
        "measured on an H200), as the first optimizer step takes the blocks the loss freed; "
        "`fit --trace` replays it for this job"
    )


def _stage_estimate(
    shape: Shape,
    job: MemoryJob,
    st: Strategy,
    place: _Placement,
    cap_basis: str,
    image_size: int | None,
    pipeline_stage: PipelineStage,
    totals: _StageTotals | None = None,
) -> MemoryEstimate:
    t = totals or _stage_totals(shape, job, st, place, image_size, pipeline_stage)
    cap, safety_margin, nccl_link = place.cap, place.safety_margin, place.nccl_link
    reserve_fraction = place.reserve_fraction
    mb = t.model
    w, ts, act, lay, tr = mb.weights, mb.training_state, mb.activations, mb.layout, mb.trained
    assumptions = [*mb.assumptions, *activation_notes(shape, job, st)]
    kept, fwd_bwd, step, rt = t.kept_gradients, t.fwd_bwd, t.step, t.runtime
    if fwd_bwd >= step:
        phase = "forward/backward"
        parts = {
            "weights": w.stored + w.gathered + w.compute_copies,
            "gradients": kept + max(0.0, ts.gradients - kept - act.total),
            "optimizer": ts.optimizer_state,
            "activations": act.total,
        }
    else:
        phase = "optimizer step"
        parts = {
            "weights": w.stored,
            "gradients": ts.gradients,
            "optimizer": ts.optimizer_state + ts.step_temporaries,
            "activations": 0.0,
        }
    allocated, reserve, usable, resident = t.allocated, t.reserve, t.usable, t.resident
    reserved = t.reserved
    fits = t.fits
    used = t.used
    parts["optimizer"] += resident
    breakdown = {**parts, "overhead": used - sum(parts.values())}
    details = dict(w.lines + ts.lines)
    if ts.paged_state:
        details[PAGED_DETAIL] = resident
        assumptions.append(
            f"paged optimizer: {ts.paged_state / 2**30:.1f} GiB of moments in CUDA unified "
            "memory (bitsandbytes get_paged), outside PyTorch's allocator: not in the allocated "
            f"peak; resident while the card has room ({resident / 2**30:.1f} GiB counted in "
            "device used), paged to host memory beyond that"
        )
    details["activations: saved for backward"] = act.saved
    details["activations: loss/logits gradients (start of backward)"] = act.transient
    details["overhead: cuBLAS workspaces"] = rt.cublas
    details[RESERVE_DETAIL] = reserve
    details["overhead: CUDA context"] = rt.context
    details["overhead: NCCL buffers"] = rt.nccl
    assumptions += list(lay.notes)
    if grads_allocated_at_init(job, lay):
        assumptions.append(
            "DeepSpeed ZeRO-3 (0.6.0 on) allocates the gradient partition at init "
            "(stage3.py grad_partitions_flat_buffer): it is there through forward and backward"
            if lay.engine == "deepspeed"
            else "Megatron-core's DDP allocates the main-gradient buffer at init "
            "(param_and_grad_buffer.py grad_data) and zeroes it in place each step: the "
            "gradients are there through forward and backward"
        )
    note = reserve_note(rt.reserve, reserve, used, usable)
    if note:
        assumptions.append(note)
    if rt.nccl:
        assumptions.append(
            f"NCCL buffers {rt.nccl / 2**20:.0f} MiB, outside PyTorch's allocator: "
            + ovh.NCCL_LINK_NOTES[ovh.priced_link(nccl_groups(st), nccl_link)]
        )
    if job.framework_assumed:
        assumptions.append(
            f"framework not stated: with pp {st.pp} stated the job runs on a pipeline engine, "
            f"and {job.framework}'s semantics are assumed (Megatron-Core: Megatron-LM, NeMo, "
            "Megatron-Bridge, and the model code of Megatron-DeepSpeed); Hugging Face "
            "Transformers has none. Set framework to the engine that runs the job"
        )
    if job.framework == "hf" and st.pp > 1:
        assumptions.append(
            f"framework hf with pp {st.pp}: Hugging Face Transformers has no pipeline engine, so "
            "this is its modeling code (fp32 norm inputs, a cast per projection under autocast) "
            "under some pipeline runtime; Megatron, DeepSpeed and torchtitan keep less: set "
            "framework to the engine that runs the job"
        )
    assumptions += [
        f"precision {job.precision} under {lay.engine}: params {lay.param_bytes:g} B, grads "
        f"{tr.grad_bytes:g} B, optimizer state {tr.state_bytes} B/elem"
        + (f", fp32 master {tr.master_bytes:g} B" if tr.master_bytes else ""),
        f"optimizer {job.optimizer} ({job.optimizer_impl} implementation); framework {job.framework}"
        + (" with torch.compile" if job.compiled else "")
        + (
            f" ({'a compiled' if job.loss_compiled else 'an eager'} loss)"
            if job.loss_compiled != job.compiled
            else ""
        ),
        f"CUDA context {rt.context / 2**20:.0f} MiB; allocator reserve "
        f"{reserve_fraction:.0%} of allocated (min 256 MiB)" + _fragmentation_note(job, st, lay),
        f"fits when device_used <= capacity x (1 - {safety_margin:.0%}); capacity "
        f"{cap / 2**30:.1f} GiB ({_CAPACITY_BASIS.get(cap_basis, cap_basis)})",
    ]
    return MemoryEstimate(
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        device_used_bytes=used,
        capacity_bytes=cap,
        safety_margin=safety_margin,
        fits=fits,
        headroom_bytes=usable - (used - resident),
        peak_phase=phase,
        breakdown=breakdown,
        details=details,
        activation_items=act.items,
        assumptions=tuple(assumptions),
        capacity_basis=cap_basis,
        steady_reserve_bytes=rt.reserve,
        evictable_bytes=resident,
        pipeline_stage=pipeline_stage if st.pp > 1 and shape.family != "cnn" else None,
    )


_CAPACITY_BASIS = {
    "device-reported": "memory.total as the driver reports it",
    "datasheet": "datasheet figure: no nvidia-smi capture of this GPU is cited",
    "given": "as given",
}


def _capacity(gpu: GpuSpec | None, given: float | None) -> tuple[float, str]:
    if given is not None:
        return given, "given"
    if gpu is None:
        return math.inf, "none"
    return float(gpu.capacity_bytes), gpu.capacity_basis
