"""What each engine keeps per parameter under each ``sharding`` value, read from its code.

One sharding value has one meaning per engine. ``N`` below is the number of ranks the
sharded state is split over: every data-parallel rank, except under ``hsdp`` (shard
within a node, replicate across nodes), where it is the data-parallel ranks of one
node. Bytes are per parameter element of the pipeline stage a rank holds (already
divided by tensor parallelism); ``P`` is that element count.

**pytorch** (``hf``, ``torchtune``, ``litgpt``: PyTorch DDP, ``ZeroRedundancyOptimizer``,
FSDP under autocast). Parameters, gradients and optimizer state are in the parameter
dtype (fp32 under ``*-mixed``); autocast keeps a 16-bit copy of each weight it casts.

* ``none``: everything replicated; with DDP (dp > 1) the reducer keeps a bucket copy of
  the gradients (``torch/nn/parallel/distributed.py``, ``gradient_as_bucket_view=False``).
* ``zero1``: optimizer state / N (``torch/distributed/optim/zero_redundancy_optimizer.py``).
* ``zero2``: FSDP ``SHARD_GRAD_OP``: parameters, gradients and optimizer state / N, like
  ``fsdp`` (``torch/distributed/fsdp/_flat_param.py``, ``FlatParamHandle.shard`` shards under
  every strategy but ``NO_SHARD``), except that the gathered parameters of the whole stage stay
  from forward to backward (``_runtime_utils.py``: only the strategies in
  ``RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES``, ``FULL_SHARD`` and ``HYBRID_SHARD``, reshard
  after forward).
* ``zero3`` = ``fsdp``: parameters / N too (FSDP ``FULL_SHARD``,
  ``torch/distributed/fsdp/``); the current and the prefetched unit are gathered.
* ``hsdp``: ``fsdp`` within a node, replicated across nodes (FSDP ``HYBRID_SHARD``).

**deepspeed** (16-bit: ``bf16``/``fp16`` enabled; the ZeRO paper, Rajbhandari et al.
2020, counts 2 + 2 + 12 bytes). 16-bit parameters and gradients; fp32 master weights and
Adam moments in the optimizer.

* ``none``: ``FP16_Optimizer`` (``deepspeed/runtime/fp16/fused_optimizer.py``) keeps fp32
  master weights of every parameter; ``step`` flattens the gradients to one fp32 tensor.
* ``zero1``: 2 + 2 + 12/N (``deepspeed/runtime/zero/stage_1_and_2.py``,
  ``DeepSpeedZeroOptimizer``: ``bit16_groups`` whole, ``single_partition_of_fp32_groups``
  sharded); ``copy_grads_in_partition`` keeps a 16-bit copy of the own partition's
  gradients (``contiguous_gradients``, default on) and ``step`` casts that partition to an
  fp32 gradient (4/N) before the update. With ``overlap_comm`` (honoured by stage 1 from
  0.13.0, :data:`~gpuplan.estimate.frameworks.DS_STAGE1_OVERLAP`) the gradient hooks run as
  under stage 2 (``process_gradients``): on the gradient-accumulation boundary
  ``reduce_independent_p_g_buckets_and_remove_grads`` copies each gradient into the
  reduction bucket and points ``param.grad`` at that copy, freeing its own storage. With one
  micro-batch a step every micro-step is that boundary, so no whole gradient outlives its
  hook: 2 + 2/N + 12/N, as stage 2. Accumulating micro-batches keep them whole between
  boundaries.
* ``zero2``: 2 + 2/N + 12/N (same class, ``partition_gradients``).
* ``zero3`` = ``fsdp``: (2 + 2 + 12)/N (``deepspeed/runtime/zero/stage3.py``,
  ``DeepSpeedZeroOptimizer_Stage3``: ``fp16_partitioned_groups_flat``,
  ``grad_partitions_flat_buffer`` in the gradient-accumulation dtype, which defaults to the
  model dtype, ``DeepSpeedEngine.get_data_types``; since 0.6.0, #1453, the optimizer allocates
  that buffer with ``torch.zeros`` at init and keeps it, so the gradient partition is there
  through forward and backward); ``step`` materialises an fp32 gradient
  for one sub-group at a time (``sub_group_size``, 1e9 elements); the live gathered
  parameters are the current module plus ``stage3_prefetch_bucket_size`` (5e7) elements.
* ``hsdp``: ZeRO-3 within a node (MiCS, ``deepspeed/runtime/zero/mics.py``,
  ``mics_shard_size`` = GPUs per node).
* ``offload`` (``offload_optimizer: {device: cpu}``, ZeRO-Offload): the fp32 master weights,
  Adam moments and step live on the host. Under stages 2 and 3 the gradients follow them as
  they are reduced: stage 2 copies each reduced bucket's own-partition gradients into the
  host fp32 buffer and frees the GPU ones (``stage_1_and_2.py``, ``copy_grads_in_partition``
  -> ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` -> ``clear_grad_attribute``), and
  stage 3 allocates ``grad_partitions_flat_buffer`` on ``self.device``, the CPU when the
  optimizer is offloaded (``stage3.py``), so only the reduction bucket stays on the GPU.
  Stage 1 reduces once all gradients exist, so they are all on the GPU at the end of
  backward, and its own partition goes to the host, not to a GPU copy. Stages 1 and 2 also
  keep ``temp_grad_buffer_for_gpu_offload``, 16-bit, the size of the largest parameter.
* all stages: the gradient reduction bucket (``reduce_bucket_size``, 5e8 elements, 16-bit;
  two of them with ``overlap_comm``, which defaults on only for stage 3 and where stage 3
  allocates one, ``deepspeed/runtime/zero/config.py``, ``stage_1_and_2.py::setup_buckets``,
  ``stage3.py`` IPG buffer).

**megatron** (``--bf16`` sets ``accumulate_allreduce_grads_in_fp32``,
``megatron/training/arguments.py``; Megatron's distributed-optimizer guide counts 18 bytes
per parameter without and 6 + 12/N with it). bf16 parameters in a contiguous param
buffer, fp32 ``main_grad`` buffer (``megatron/core/distributed/param_and_grad_buffer.py``:
``grad_dtype = torch.float if grad_reduce_in_fp32``), fp32 main parameters and Adam
moments in the optimizer.

The gradient buffer is allocated once: ``_ParamAndGradBuffer.__init__`` makes ``grad_data``
with ``torch.zeros`` (every trainable parameter's ``main_grad`` is a view into it) and each
step zeroes it in place (``zero_grad_buffer``), so under ``none`` and ``zero1`` the gradients
are there through forward and backward.

* ``none``: 2 + 4 + 12.
* ``zero1``: the distributed optimizer, 2 + 4 + 12/N
  (``megatron/core/optimizer/distrib_optimizer.py``,
  ``DistributedOptimizer._build_model_and_main_param_groups``: ``shard_main_param`` per
  rank; the gradient buffer stays whole, reduce-scattered in place).
* ``zero2``: Megatron-FSDP ``optim_grads``, 2 + (4 + 12)/N.
* ``zero3`` = ``fsdp``: Megatron-FSDP ``optim_grads_params``, (2 + 4 + 12)/N, two bf16
  layers gathered (``megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py``,
  double buffer).
* ``hsdp``: Megatron-FSDP hybrid (outer data-parallel replicas across nodes).
* NeMo 1.x ``distributed_fused_adam`` (Apex ``DistributedFusedAdam``, spec
  ``megatron.param_remainders``): a bf16 model with an fp32 optimizer keeps only the 16 bits
  each main parameter has beyond its bf16 copy (``store_param_remainders``), so ``zero1`` is
  2 + 4 + 10/N.

**torchtitan** (FSDP2 ``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)``, ``torchtitan/distributed/fsdp.py::apply_fsdp_to_decoder``): fp32
sharded parameters, each block all-gathered in bf16 for its forward and backward, fp32
gradients reduce-scattered, optimizer state sharded: 16/N plus two gathered bf16 blocks
(fp8 with ``enable_fsdp_float8_all_gather``: the blocks are gathered in fp8).

Under FSDP torchtitan runs no autocast (``torchtitan/distributed/utils.py::maybe_enable_amp``
returns a null context when FSDP is on): the blocks compute with their bf16 parameters, so
activations and the residual stream are bf16 and no per-op casts are kept.

* ``none``: no FSDP: the PyTorch semantics above (autocast).
* ``zero2``: ``reshard_after_forward=False``: the gathered bf16 parameters of the whole
  stage stay from forward to backward.
* ``zero3`` = ``fsdp``: as above. ``hsdp``: ``data_parallel_replicate_degree`` x shard.
* ``zero1`` does not exist in torchtitan.
"""

from __future__ import annotations

import dataclasses

from gpuplan.errors import SpecError
from gpuplan.estimate.frameworks import FRAMEWORKS, deepspeed_overlap_comm
from gpuplan.estimate.numerics import PrecisionBytes

DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 5e8
"""``reduce_bucket_size`` default (``deepspeed/runtime/zero/config.py``)."""
DEEPSPEED_PREFETCH_BUCKET_ELEMENTS = 5e7
"""``stage3_prefetch_bucket_size`` default (same file)."""
DEEPSPEED_MAX_LIVE_PARAMETERS = 1e9
"""``stage3_max_live_parameters`` default (same file)."""
DEEPSPEED_SUB_GROUP_ELEMENTS = 1e9
"""``sub_group_size`` default (same file): ZeRO-3 steps one sub-group at a time."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedOptions:
    """DeepSpeed's ZeRO settings (spec ``deepspeed``; its defaults): buffer sizes in elements,
    ``overlap_comm`` (None: DeepSpeed's default for the stage) and the release (None: a
    current one)."""

    reduce_bucket: float = DEEPSPEED_REDUCE_BUCKET_ELEMENTS
    prefetch_bucket: float = DEEPSPEED_PREFETCH_BUCKET_ELEMENTS
    max_live_parameters: float = DEEPSPEED_MAX_LIVE_PARAMETERS
    sub_group: float = DEEPSPEED_SUB_GROUP_ELEMENTS
    overlap_comm: bool | None = None
    version: tuple[int, ...] | None = None


SHARDED_PARAMS = ("zero3", "fsdp", "hsdp")
SHARDED_GRADS = ("zero2", *SHARDED_PARAMS)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StateLayout:
    """Bytes per parameter element an engine keeps on one rank, and how each is split.

    The ``*_ranks`` fields are divisors (1 = replicated on every rank).
    """

    engine: str
    sharding: str
    param_bytes: float
    """Stored parameters (fp32 under autocast, 16-bit in DeepSpeed/Megatron)."""
    param_ranks: int
    grad_bytes: float
    grad_ranks: int
    optimizer_ranks: int
    """Divisor of the optimizer state (master weights and moments)."""
    master_bytes: float
    """fp32 master copy kept by the optimizer (0 when the parameters are fp32)."""
    state_bytes: int
    """Bytes per element of each optimizer moment."""
    compute_copy_bytes: float
    """Autocast's cached low-precision copy of every weight (0 when none)."""
    gather_bytes: float
    """Bytes per element of a gathered (unsharded) layer; 0 when nothing is gathered."""
    gathered_layers: float
    """Layers gathered at once (current + prefetched)."""
    gathered_extra_elements: float = 0.0
    """Gathered elements beyond whole layers (DeepSpeed's prefetch bucket)."""
    gathered_cap_elements: float = float("inf")
    """Most gathered elements live at once (DeepSpeed's ``stage3_max_live_parameters``)."""
    unsharded_compute_params: bool = False
    """The gathered compute copy of the whole stage stays from forward to backward."""
    grad_partition_copy_bytes: float = 0.0
    """Per element / N: DeepSpeed's contiguous copy of the own partition's gradients."""
    step_grad_bytes: float = 0.0
    """Per element / optimizer_ranks: fp32 gradient materialised for the optimizer step."""
    carried_grad_bytes: float = 0.0
    """Per element: gradients carried from the previous step through forward and backward
    (:attr:`MegatronOptions.legacy_local_ddp`: the previous 16-bit gradient and the fp32 main
    gradient)."""
    step_grad_cap_elements: float = float("inf")
    """Most elements of that fp32 gradient at once (ZeRO-3 steps sub-group by sub-group)."""
    bucket_bytes: float = 0.0
    """Fixed bytes of gradient reduction buckets."""
    grads_on_host: bool = False
    """Gradients leave the GPU as they are reduced (DeepSpeed ZeRO-Offload, stages 2 and 3):
    only the reduction bucket (and ``offload_grad_buffer``) stays."""
    grads_persistent: bool = False
    """The engine allocates the gradients (or their partition) once, at init, and keeps them
    through forward and backward (DeepSpeed ZeRO-3 since 0.6.0: ``grad_partitions_flat_buffer``;
    Megatron-core's DDP: the ``main_grad`` buffer), so they add to the activations at the
    backward peak instead of growing as they are freed."""
    offload_grad_buffer: bool = False
    """DeepSpeed stages 1-2 with offload keep a 16-bit buffer the size of the largest
    parameter (``temp_grad_buffer_for_gpu_offload``)."""
    ddp_bucket_copy: bool = False
    """DDP keeps a bucket copy of the gradients (replicated data parallelism)."""
    autocast: bool = True
    """Whether the precision's autocast applies (the engine may cast the model to 16 bits)."""
    notes: tuple[str, ...] = ()


def _sixteen_bit(pb: PrecisionBytes) -> bool:
    return pb.act == 2 and pb.param <= 4 and (pb.compute_copy > 0 or pb.param == 2)


def check_sharding(framework: str, sharding: str) -> None:
    """Raise a SpecError if ``framework`` has no ``sharding`` of that name."""
    allowed = FRAMEWORKS[framework].shardings
    if sharding not in allowed:
        raise SpecError(
            f"parallelism.sharding: {framework} has no {sharding}; allowed with "
            f"framework {framework}: {', '.join(allowed)}"
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MegatronOptions:
    """Megatron-Core settings that change the per-parameter state (spec ``megatron``)."""

    fp8_params: bool = False
    """``fp8_params``: Transformer Engine ``Float8Tensor`` weights, 1 byte, no bf16 copy
    (``megatron/core/fp8_utils.py``; TE ``fp8_model_init``)."""
    grad_reduce_in_fp32: bool = True
    """``DistributedDataParallelConfig.grad_reduce_in_fp32``: the ``main_grad`` buffer dtype."""
    optimizer_bf16: bool = False
    """Main parameters and moments in bf16 (Apex ``DistributedFusedAdam(dtype=bf16)``)."""
    fp8_attention: bool = False
    """``fp8_dot_product_attention``: Transformer Engine's fused attention in fp8 keeps the fp8
    casts of q, k, v and its output for backward (``transformer_engine/pytorch/attention/
    dot_product_attention/backends.py``, ``FusedAttnFunc.forward``: ``fp8_tensors = (q_fp8,
    k_fp8, v_fp8, out_fp8)`` under delayed scaling with ``NVTE_FP8_DPA_BWD=1``, its default)."""
    fp8_activation_input: bool = False
    """``activation_func_fp8_input_store``: the fused SwiGLU saves its input as
    ``torch.float8_e4m3fn`` (``megatron/core/fusions/fused_bias_swiglu.py``,
    ``SwiGLUFunction.forward``; ``fused_bias_geglu.py`` alike)."""
    te_cross_entropy: bool = False
    """``cross_entropy_fusion_impl: te``: Transformer Engine's ``parallel_cross_entropy``
    (``transformer_engine/pytorch/cross_entropy.py``, ``CrossEntropyFunction.forward``, releases
    up to 2.17) writes the logits gradient into the 16-bit logits during forward and saves only
    that tensor; the backward hands it on (no fp32 softmax, no new gradient)."""
    legacy_local_ddp: bool = False
    """Megatron-LM v2 before July 2021 (through the v2.5 tag) with its local DDP and no
    contiguous gradient buffers: ``DistributedDataParallel.allreduce_gradients``
    (``megatron/model/distributed.py``) sets ``param.main_grad = param.grad``, so once
    ``zero_grad`` frees ``.grad`` the previous step's 16-bit gradient lives on through the next
    forward and backward, and ``Float16OptimizerWithFloat16Params.zero_grad``
    (``megatron/optimizer/optimizer.py``) cleared only the 16-bit groups, so the fp32 main
    gradients copied at the step stay too (both changed on 2021-07-12 and 2021-07-16)."""
    param_remainders: bool = False
    """fp32 main parameters stored as the low 16 bits the bf16 parameter lacks: Apex
    ``DistributedFusedAdam(store_param_remainders=True)`` (``apex/contrib/optimizers/
    distributed_fused_adam.py``), which NeMo 1.x's ``MegatronBaseModel.setup_optimization``
    (``nemo/collections/nlp/models/language_modeling/megatron_base_model.py``) sets for
    ``distributed_fused_adam`` when the model is bf16 and the optimizer dtype fp32."""


def state_layout(
    framework: str,
    sharding: str,
    pb: PrecisionBytes,
    *,
    ranks: int,
    dp: int,
    megatron: MegatronOptions | None = None,
    deepspeed: DeepSpeedOptions | None = None,
    offload: str = "none",
    grad_accum: int = 1,
) -> StateLayout:
    """What ``framework`` keeps per parameter under ``sharding`` over ``ranks`` shards.

    ``ranks`` is the shard group (dp, or the node's data-parallel ranks under hsdp);
    ``dp`` the data-parallel degree (replication only matters when dp > 1); ``offload`` the
    spec's CPU offload (it moves DeepSpeed's gradients too, see the module docstring);
    ``grad_accum`` the micro-batches a step (DeepSpeed's stage 1 frees its gradients as
    they are reduced only when every micro-step is a boundary).
    """
    check_sharding(framework, sharding)
    engine = FRAMEWORKS[framework].engine
    n = ranks if dp > 1 else 1
    p_ranks = n if sharding in SHARDED_PARAMS else 1
    g_ranks = n if sharding in SHARDED_GRADS else 1
    o_ranks = n if sharding != "none" else 1
    sixteen = _sixteen_bit(pb)
    if engine == "deepspeed" and sixteen:
        opts = deepspeed or DeepSpeedOptions()
        if deepspeed_stage1_frees_grads(sharding, n, opts, grad_accum):
            g_ranks = n
        lay = _deepspeed(sharding, pb, n, p_ranks, g_ranks, o_ranks, opts)
        return _deepspeed_offload(lay) if offload != "none" and sharding != "none" else lay
    if engine == "apex" and sixteen:
        # amp O2 keeps what DeepSpeed's unsharded fp16 engine keeps (frameworks.py: apex)
        return dataclasses.replace(
            _deepspeed(sharding, pb, n, p_ranks, g_ranks, o_ranks, DeepSpeedOptions()),
            engine="apex",
            notes=(
                "Apex amp O2: fp16 parameters and gradients, fp32 master weights, their "
                "gradients and Adam moments in the optimizer",
            ),
        )
    if engine == "megatron" and sixteen:
        return _megatron(sharding, pb, p_ranks, g_ranks, o_ranks, megatron or MegatronOptions())
    if engine == "torchtitan" and sharding != "none" and pb.compute_copy:
        return StateLayout(
            engine=engine,
            sharding=sharding,
            param_bytes=4,
            param_ranks=p_ranks if sharding != "zero2" else n,
            grad_bytes=4,
            grad_ranks=g_ranks,
            optimizer_ranks=o_ranks,
            master_bytes=0,
            state_bytes=4,
            compute_copy_bytes=0,
            gather_bytes=pb.compute_copy,
            gathered_layers=2,
            unsharded_compute_params=sharding == "zero2",
            autocast=False,
            notes=(
                "torchtitan FSDP2: fp32 sharded parameters gathered in bf16 per block, "
                "fp32 gradients reduce-scattered (MixedPrecisionPolicy)"
                + (", reshard_after_forward=False" if sharding == "zero2" else ""),
            ),
        )
    sharded = sharding in SHARDED_PARAMS and n > 1
    shard_grad_op = sharding == "zero2" and n > 1
    return StateLayout(
        engine="pytorch",
        sharding=sharding,
        param_bytes=pb.param,
        param_ranks=n if shard_grad_op else p_ranks,
        grad_bytes=pb.grad,
        grad_ranks=g_ranks,
        optimizer_ranks=o_ranks,
        master_bytes=pb.master,
        state_bytes=pb.state,
        compute_copy_bytes=pb.compute_copy,
        gather_bytes=(pb.compute_copy or pb.param) if sharded or shard_grad_op else 0,
        gathered_layers=2 if sharded else 0,
        unsharded_compute_params=shard_grad_op,
        ddp_bucket_copy=sharding == "none" and dp > 1,
        autocast=pb.autocast,
        notes=(
            (
                "FSDP SHARD_GRAD_OP: parameters sharded, the gathered parameters of the stage "
                "kept from forward to backward",
            )
            if shard_grad_op
            else ()
        ),
    )


def deepspeed_stage1_frees_grads(
    sharding: str, n: int, opts: DeepSpeedOptions, grad_accum: int
) -> bool:
    """Whether DeepSpeed's ZeRO-1 moves each gradient into the reduction bucket in its hook
    (``overlap_comm`` on, honoured from 0.13.0) on every micro-step, so that it keeps only
    its own partition, as stage 2 does (module docstring)."""
    return (
        sharding == "zero1"
        and n > 1
        and grad_accum == 1
        and deepspeed_overlap_comm(sharding, opts.overlap_comm, opts.version)
    )


def _deepspeed(
    sharding: str,
    pb: PrecisionBytes,
    n: int,
    p_ranks: int,
    g_ranks: int,
    o_ranks: int,
    opts: DeepSpeedOptions,
) -> StateLayout:
    stage3 = sharding in SHARDED_PARAMS
    buckets = 0.0
    if sharding != "none":
        # stages 1 and 2 double-buffer the bucket with overlap_comm (setup_buckets)
        double = not stage3 and deepspeed_overlap_comm(sharding, opts.overlap_comm, opts.version)
        buckets = opts.reduce_bucket * 2 * (2 if double else 1)
    default = opts.reduce_bucket == DEEPSPEED_REDUCE_BUCKET_ELEMENTS
    return StateLayout(
        engine="deepspeed",
        sharding=sharding,
        param_bytes=2,
        param_ranks=p_ranks,
        grad_bytes=2,
        grad_ranks=g_ranks,
        optimizer_ranks=o_ranks,
        master_bytes=4,
        state_bytes=4,
        compute_copy_bytes=0,
        gather_bytes=2 if stage3 and n > 1 else 0,
        gathered_layers=1 if stage3 and n > 1 else 0,
        gathered_extra_elements=opts.prefetch_bucket if stage3 and n > 1 else 0,
        gathered_cap_elements=opts.max_live_parameters,
        # the own partition's contiguous copy, beside whole gradients (none when the hooks
        # free them: the copy is then the gradients, g_ranks = n)
        grad_partition_copy_bytes=2.0 if n > 1 and sharding == "zero1" and g_ranks == 1 else 0.0,
        grads_persistent=stage3,
        step_grad_bytes=4,
        step_grad_cap_elements=opts.sub_group if stage3 else float("inf"),
        bucket_bytes=buckets,
        autocast=False,
        notes=(
            f"DeepSpeed {'ZeRO stage ' + sharding[-1] if sharding.startswith('zero') else sharding}"
            ": 16-bit parameters and gradients, fp32 master weights and Adam moments"
            + (" sharded" if sharding != "none" else "")
            + (
                f"; reduce bucket {opts.reduce_bucket:.0e} elements"
                + (" (default)" if default else "")
                + (", two of them (overlap_comm)" if buckets > opts.reduce_bucket * 2 else "")
                if buckets
                else ""
            )
            + (
                "; stage 1 with overlap_comm and one micro-batch a step: each gradient moves "
                "into the reduction bucket in its hook, so only the own partition stays"
                if sharding == "zero1" and g_ranks > 1
                else ""
            ),
        ),
    )


def _deepspeed_offload(lay: StateLayout) -> StateLayout:
    """``lay`` under ZeRO-Offload: gradients to the host under stages 2 and 3, the own
    partition's copy to the host under stage 1 (module docstring)."""
    stage12 = lay.sharding in ("zero1", "zero2")
    # stage 1 with its hooks on (gradients sharded in the layout) sends them as stage 2 does
    to_host = lay.sharding != "zero1" or lay.grad_ranks > 1
    return dataclasses.replace(
        lay,
        grads_on_host=to_host,
        grads_persistent=False,
        grad_partition_copy_bytes=0.0,
        offload_grad_buffer=stage12,
        notes=(
            *lay.notes,
            "ZeRO-Offload: "
            + (
                "gradients go to the host fp32 buffer as each bucket is reduced, only the bucket "
                "stays on the GPU"
                if to_host
                else "stage 1 keeps every 16-bit gradient until backward ends, its own partition "
                "goes to the host"
            )
            + (
                "; a 16-bit gradient buffer the size of the largest parameter "
                "(temp_grad_buffer_for_gpu_offload)"
                if stage12
                else ""
            ),
        ),
    )


def _megatron(
    sharding: str,
    pb: PrecisionBytes,
    p_ranks: int,
    g_ranks: int,
    o_ranks: int,
    opts: MegatronOptions,
) -> StateLayout:
    gathered = sharding in SHARDED_PARAMS and p_ranks > 1
    label = {
        "none": "no distributed optimizer",
        "zero1": "distributed optimizer",
        "zero2": "Megatron-FSDP optim_grads",
    }.get(sharding, "Megatron-FSDP optim_grads_params")
    fp8_params = opts.fp8_params and pb.compute_copy == 1
    param_bytes = 1 if fp8_params else 2
    grad_bytes = 4 if opts.grad_reduce_in_fp32 else 2
    state_bytes = 2 if opts.optimizer_bf16 else 4
    master_bytes = 2 if opts.param_remainders else state_bytes
    return StateLayout(
        engine="megatron",
        sharding=sharding,
        param_bytes=param_bytes,
        param_ranks=p_ranks,
        grad_bytes=grad_bytes,
        grad_ranks=g_ranks,
        optimizer_ranks=o_ranks,
        master_bytes=master_bytes,
        state_bytes=state_bytes,
        compute_copy_bytes=1 if pb.compute_copy == 1 and not fp8_params else 0,
        gather_bytes=param_bytes if gathered else 0,
        gathered_layers=2 if gathered else 0,
        grads_persistent=sharding in ("none", "zero1"),
        # 16-bit main gradients: the step copies them to fp32 (``.float()`` in
        # ``_copy_model_grads_to_main_grads``, on the shard under the distributed optimizer),
        # freed at the next ``zero_grad``; Megatron-LM v2's local DDP kept them and the
        # previous 16-bit gradients through the next step instead
        step_grad_bytes=0 if opts.grad_reduce_in_fp32 or opts.legacy_local_ddp else 4,
        carried_grad_bytes=6 if opts.legacy_local_ddp else 0,
        autocast=False,
        notes=(
            f"Megatron {label}: {'fp8' if fp8_params else '16-bit'} parameters, "
            f"{'fp32' if opts.grad_reduce_in_fp32 else '16-bit'} main gradients, "
            + (
                "fp32 Adam moments and 16-bit main-parameter remainders"
                if opts.param_remainders
                else f"{'bf16' if opts.optimizer_bf16 else 'fp32'} main parameters and Adam moments"
            )
            + (" sharded" if sharding != "none" else ""),
        ),
    )
