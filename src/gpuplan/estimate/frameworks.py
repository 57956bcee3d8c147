"""What each training framework's code keeps for backward, beyond the model architecture.

Facts read from each project's source (model and loss code):

* ``hf``: transformers' modeling files. RMSNorm upcasts to fp32 and keeps the
  fp32 copy; ``gelu_new`` is a Python expression with saved intermediates;
  ``repeat_kv`` materialises grouped K/V; the causal-LM loss upcasts the whole
  logits tensor to fp32 (``ForCausalLMLoss``) and the logits stay referenced
  by the model output through backward in a loop that keeps ``outputs``; Hugging Face's
  ``Trainer`` frees it first (``compute_loss`` returns the loss alone: spec ``hf_trainer``).
* ``litgpt``: its own ``model.py``. GELU is ``torch.nn.functional.gelu``
  (saves only its input); the LM head and loss run in chunks
  (``chunked_cross_entropy``, 128-token chunks), so only one chunk's fp32
  gradient is live at a time.
* ``torchtune``: its own modules. ``CEWithChunkedOutputLoss`` splits the output
  into 8 chunks and upcasts chunk by chunk; LoRA parameters get their own FSDP units.
  With ``loss_chunks: 1`` (plain ``CrossEntropyLoss``) the decoder returns
  ``self.output(h).float()`` and the recipe deletes the logits before backward,
  so only the loss's fp32 tensor stays.

FSDP and LoRA: litgpt wraps whole transformer Blocks, so frozen weights and LoRA
adapters share FSDP units; PyTorch's FSDP then allocates gradients as if nothing
were frozen (PyTorch FSDP docs on ``use_orig_params``; litgpt#1417, #1538). litgpt
also accumulates gradients under ``no_backward_sync``, which keeps FSDP gradients
unsharded until the last micro-batch. Its QLoRA (Fabric's ``BitsandbytesPrecision``,
2023) swaps every ``nn.Linear`` built under ``init_module`` for the 4-bit class, the LM
head included (Fabric later added ``ignore_modules`` to keep it, for example ``{"lm_head"}``);
transformers and torchtune keep the head in 16 bits. Fabric quantizes from fp16
(``lightning/fabric/plugins/precision/bitsandbytes.py``, ``_Linear4bit.quantize``:
``weight.to(dtype=torch.half)``), so under bf16 each 4-bit forward holds the fp16
dequantized weight and its bf16 cast (bitsandbytes ``MatMul4Bit.forward``); the largest,
the LM head, sets the transient. ``litgpt/finetune/lora.py`` (``fit()``, commit 916a84ca)
rebinds ``logits = model(...)`` only when the next forward returns, so the previous step's
graph stays referenced through that forward: with bitsandbytes before 0.43.2, whose
``MatMul4Bit`` keeps its input in ``ctx.tensors`` (PR #1270), the previous step's inputs
to every 4-bit linear are still live (spec ``lora.bitsandbytes``).

* ``llmfoundry``: MosaicML's llm-foundry on Composer, read at commit 8c8dd48f (the
  benchmark tables' code). ``ComposerMPTCausalLM`` defaults ``loss_fn`` to
  ``fused_crossentropy`` (``llmfoundry/models/mpt/modeling_mpt.py``): flash-attn's
  ``CrossEntropyLoss``, which keeps the 16-bit logits and a logsumexp and writes a 16-bit
  gradient. ``scripts/train/benchmarking/submit_benchmarks.py`` sets ``norm_type:
  low_precision_layernorm`` (the norm runs on 16-bit inputs) and FSDP ``mixed_precision:
  DEFAULT`` (Composer: ``param_dtype`` = the autocast dtype), so the residual stream is
  16-bit; ``attn_impl: flash`` returns (batch, seq, heads, dim), and the out-projection reads
  a view of it. ``nn.GELU`` saves only its input.

The engines (what a framework keeps per parameter under each sharding value is in
:mod:`gpuplan.estimate.sharding`):

* ``deepspeed``: DeepSpeed's engine around Hugging Face model code (the HF Trainer or
  accelerate with a DeepSpeed config), so the activation facts are ``hf``'s. With
  ``bf16``/``fp16`` enabled the engine casts the module to 16 bits
  (``deepspeed/runtime/engine.py``, ``DeepSpeedEngine._configure_distributed_model``): no
  autocast, and PEFT adapters end up in 16 bits too.
* ``megatron``: Megatron-LM / NeMo / Megatron-Bridge with Transformer Engine. TE's fused
  ``LayerNormLinear``/RMSNorm keep the 16-bit input and the fp32 rstd only, the fused SwiGLU
  (``megatron/core/fusions/fused_bias_swiglu.py``) keeps its input, attention reads grouped
  K/V without repeating them, and ``vocab_parallel_cross_entropy``
  (``megatron/core/tensor_parallel/cross_entropy.py``) upcasts the logits to fp32 and keeps
  the fp32 softmax for backward (the 16-bit logits are not kept); its backward writes the
  gradient into that softmax, so only the 16-bit cast of it is new. With
  ``megatron.cross_entropy_fusion: te`` (Megatron-Bridge's providers) Transformer Engine's
  loss keeps the 16-bit logits holding their gradient instead. Its optimizers are fused
  (TE/Apex ``FusedAdam``). TE's ``FusedAttnFunc`` keeps its output for backward and
  ``linear_proj`` (a TE ``Linear``, ``megatron/core/transformer/attention.py``) keeps a view of
  that output as its input, so without fp8 linears the two are one tensor; with fp8 linears
  the projection keeps its own fp8 cast instead.
* ``apex``: NVIDIA Apex automatic mixed precision at opt level O2, as NVIDIA's
  DeepLearningExamples BERT scripts run it (``amp.initialize(model, optimizer,
  opt_level="O2")``, their logs print "Selected optimization level O2: FP16 training with
  FP32 batchnorm and FP32 master weights"): the model is cast to fp16 (no autocast, so
  softmax and dropout outputs are fp16), the optimizer holds fp32 master weights and
  gradients (``apex/amp/_process_optimizer.py``), and the optimizer is Apex ``FusedAdam``.
  Per parameter that is DeepSpeed's unsharded fp16 layout (2 + 2 + 12 and an fp32 gradient
  in the step). Their BERT fuses bias and GELU in a TorchScript function that saves its input
  only. Data parallel only (``sharding: none``).
* ``torchtitan``: its own Llama code; ``cross_entropy_loss``
  (``torchtitan/components/loss.py``) upcasts the whole logits tensor (``pred.float()``) and
  the trainer deletes the 16-bit ``pred`` before backward; ``optimizer.implementation``
  defaults to ``fused``. Under FSDP there is no autocast: ``maybe_enable_amp``
  (``torchtitan/distributed/utils.py``) returns a null context when FSDP is on and
  ``fully_shard`` computes with bf16 parameters, so the residual stream and every saved
  activation are bf16 (see :mod:`gpuplan.estimate.sharding`).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Framework:
    """Implementation facts that change saved activations."""

    name: str
    python_gelu: bool
    """Whether ``gelu_new``-style activations run as a Python expression (extra saved tensors)."""
    loss_chunks: int
    """Number of chunks the loss is computed in (1 = whole logits at once)."""
    default_optimizer_impl: str
    fsdp_mixed_units: bool = False
    """FSDP units mix frozen and trainable parameters (gradients for all of them)."""
    pads_vocab: int = 1
    """The vocabulary is padded to a multiple of this times the tensor-parallel degree
    (Megatron's ``--make-vocab-size-divisible-by``, 128 by default, ``_vocab_size_with_padding``
    in ``megatron/training/tokenizer``); 1: the tokenizer's size, as Hugging Face models keep it
    (GPT-2's 50257). It decides whether the LM head's GEMMs run aligned
    (:func:`gpuplan.estimate.compute.head_is_aligned`)."""
    fsdp_unsharded_accumulation: bool = False
    """Gradient accumulation under no_sync keeps FSDP gradients unsharded."""
    upcast_unchunked_logits: bool = False
    """Without loss chunks the model returns fp32 logits (the 16-bit ones are freed)."""
    upcast_in_loss: bool = False
    """The loss function upcasts the logits and the caller frees the 16-bit ones before
    backward: only the fp32 copy is kept, unless the loss is compiled, when the min-cut
    partitioner saves the smaller 16-bit input instead (torchtitan)."""
    qlora_quantizes_head: bool = False
    """QLoRA quantizes the LM head too (its dequantized copy is then the largest transient)."""
    qlora_fp16_quant_state: bool = False
    """QLoRA weights are quantized from fp16, so under bf16 ``MatMul4Bit.forward`` holds the
    fp16 dequantized weight and its bf16 cast at once (``dequantize_4bit(...).to(A.dtype)``)."""
    keeps_previous_graph: bool = False
    """The training loop keeps the previous step's output (and so its autograd graph) until
    the next forward returns; tensors stored as autograd-context attributes live on."""
    embedding_own_unit_from: tuple[int, int] | None = None
    """PyTorch release from which this engine wraps the embedding as an FSDP unit of its own,
    resharded after its forward, so that the root unit no longer holds it
    (:func:`gpuplan.estimate.memory.fsdp_root_bytes`); None: the root holds it."""
    engine: str = "pytorch"
    """Whose sharding semantics apply: pytorch (DDP/FSDP/ZeroRedundancyOptimizer under
    autocast), deepspeed, megatron, torchtitan or apex (see :mod:`gpuplan.estimate.sharding`)."""
    fp32_adapters: bool = False
    """PEFT keeps LoRA adapters in fp32 (``autocast_adapter_dtype=True``, its default)."""
    fused_kernels: bool = False
    """Transformer Engine kernels: fused norms keep the 16-bit input, no repeated K/V."""
    residual_16bit: bool = False
    """FSDP computes with 16-bit parameters under autocast: a 16-bit residual stream."""
    fused_loss: bool = False
    """flash-attn's fused cross-entropy: no fp32 copy of the logits or of their gradient."""
    loss_grad_in_place: bool = False
    """The loss's backward overwrites its saved fp32 softmax with the gradient (Megatron)."""
    attention_output_shared: bool = False
    """The fused attention's output is the out-projection's input (a view), kept once
    (flash-attn in llm-foundry, TE's fused attention in Megatron), unless the projection is an
    fp8 linear, which keeps its own fp8 cast."""
    te_fp8_linears: bool = False
    """fp8 runs use Transformer Engine linears, which keep the fp8 cast of their input."""
    shardings: tuple[str, ...] = ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp")
    """Sharding values this engine implements."""
    dtensor_tensor_parallel: bool = False
    """Tensor parallelism is PyTorch's DTensor plan (torchtitan ``parallelize_llama``, read at
    9dec370 and HEAD): ``PrepareModuleInput`` all-gathers each block's input to ``Replicate``
    before the ``ColwiseParallel`` QKV and MLP-up linears, which save that gathered input (the
    output projection's ``ColwiseParallel`` too), while ``SequenceParallel`` shards only the
    norms; and the loss runs under ``loss_parallel`` on vocabulary-sharded logits
    (``Numerics.loss_parallel``) unless it is compiled. Its collectives are waited on before
    the linear that needs them, so under ``parallelism.tp_comm_overlap: auto`` the time model
    hides none of them (torchtitan's async TP, off by default, overlaps them: state it as
    ``pipelined``)."""
    checkpoint_early_stop: bool = False
    """Activation checkpointing is ``torch.utils.checkpoint``'s non-reentrant implementation,
    which since PyTorch 2.1 stops recomputing a block once every tensor its backward saved is
    back (``_checkpoint_without_reentrant_generator``, ``set_checkpoint_early_stop``, on by
    default: pytorch/pytorch#96866, 2023-03). Autograd saves an op's inputs before it runs the
    op, so the recompute of a pre-norm decoder layer ends when its last projection has saved
    its input, before that projection's GEMM (the layer's output, the residual sum, is saved by
    nobody). torchtune (``training.set_activation_checkpointing``: torch's
    ``apply_activation_checkpointing`` with ``checkpoint_wrapper``, ``CheckpointImpl.NO_REENTRANT``
    by default), torchtitan (``ptd_checkpoint_wrapper``, no reentrant) and llm-foundry (its
    yamls set ``fsdp_config.activation_checkpointing_reentrant: false``) run it; Megatron
    (``tensor_parallel.checkpoint``'s ``CheckpointFunction``), DeepSpeed's and Hugging Face's
    ``gradient_checkpointing_enable`` (``use_reentrant=True`` unless told otherwise) recompute
    the whole forward. Counted on torch 2.13 (CPU): a checkpointed pre-norm block's backward runs
    5 of its 6 forward matmuls again without reentrance, all 6 with it."""
    unties_embeddings: bool = False
    """The engine builds its own model with a separate LM head, so a checkpoint with tied word
    embeddings is loaded into two weights: LitGPT's ``GPT`` has an ``nn.Linear`` lm_head
    and ``convert_hf_checkpoint`` copies ``wte`` into it where the checkpoint has no lm_head
    (Gemma, Llama 3.2 1B/3B, GPT-2); QLoRA then quantizes it with the other linears."""
    softcapping_eager: bool = False
    """A model with soft-capped attention scores (Gemma 2) runs its attention eagerly by
    default: LitGPT's ``CausalSelfAttention.scaled_dot_product_attention`` ("with softcapping
    we cannot use SDPA": scores, tanh cap, mask, fp32 softmax cast back, times V; at 916a84ca,
    2024-07, and still at 0.5.13). transformers (4.44 on) loads Gemma 2 with SDPA, which drops
    the cap, and only warns that training should use eager: ``hf`` keeps the spec's
    ``attention`` as given."""
    transformers_model: bool = False
    """The job runs Transformers' model code (``hf``, and ``deepspeed``, which wraps a Hugging
    Face model): what ``fit --trace`` builds and runs. The other engines run their own model
    code (Megatron-Core's with Transformer Engine, LitGPT's, torchtune's, torchtitan's,
    llm-foundry's, NVIDIA's apex BERT), which the tracer does not have: traced with
    Transformers' code instead, Megatron-LM's toy GPT rows came out 49-133% high and
    torchtune's README rows 4-46% high (``gpuplan validate memory --trace``, 2026-12-05)."""
    sdpa_enable_gqa: bool = False
    """The model code hands grouped K/V to SDPA with ``enable_gqa=True`` when no mask is
    passed (causal, unpadded or packed data): transformers' ``sdpa_attention_forward``
    (``integrations/sdpa_attention.py``, ``use_gqa_in_sdpa``: torch >= 2.5 and no mask),
    under which DeepSpeed runs the same model. FlashAttention and cuDNN take only 16-bit
    inputs and the memory-efficient kernel takes no ``enable_gqa``, so fp32 (and TF32) runs
    of such a model take SDPA's math backend, which keeps the softmax probabilities as eager
    attention does (measured on an H200: Llama 3.2 1B fp32, priced as fused 22% low, as eager
    5% low; ``validation/memory.csv``). The others repeat K/V before SDPA (litgpt, torchtune,
    torchtitan) or call their own kernels."""


FRAMEWORKS: dict[str, Framework] = {
    "hf": Framework(
        name="hf",
        transformers_model=True,
        python_gelu=True,
        loss_chunks=1,
        default_optimizer_impl="foreach",
        fp32_adapters=True,
        sdpa_enable_gqa=True,
    ),
    "litgpt": Framework(
        name="litgpt",
        python_gelu=False,
        loss_chunks=16,
        default_optimizer_impl="foreach",
        fsdp_mixed_units=True,
        fsdp_unsharded_accumulation=True,
        qlora_quantizes_head=True,
        qlora_fp16_quant_state=True,
        keeps_previous_graph=True,
        softcapping_eager=True,
        unties_embeddings=True,
    ),
    "torchtune": Framework(
        name="torchtune",
        checkpoint_early_stop=True,
        python_gelu=False,
        loss_chunks=8,
        default_optimizer_impl="foreach",
        upcast_unchunked_logits=True,
    ),
    "deepspeed": Framework(
        name="deepspeed",
        transformers_model=True,
        python_gelu=True,
        loss_chunks=1,
        default_optimizer_impl="fused",
        engine="deepspeed",
        sdpa_enable_gqa=True,
    ),
    "megatron": Framework(
        name="megatron",
        pads_vocab=128,
        python_gelu=False,
        loss_chunks=1,
        default_optimizer_impl="fused",
        upcast_unchunked_logits=True,
        loss_grad_in_place=True,
        engine="megatron",
        fused_kernels=True,
        attention_output_shared=True,
        te_fp8_linears=True,
    ),
    "apex": Framework(
        name="apex",
        python_gelu=False,
        loss_chunks=1,
        default_optimizer_impl="fused",
        engine="apex",
        shardings=("none",),
    ),
    "llmfoundry": Framework(
        name="llmfoundry",
        checkpoint_early_stop=True,
        python_gelu=False,
        loss_chunks=1,
        default_optimizer_impl="foreach",
        residual_16bit=True,
        fused_loss=True,
        attention_output_shared=True,
        te_fp8_linears=True,
    ),
    "torchtitan": Framework(
        name="torchtitan",
        checkpoint_early_stop=True,
        python_gelu=False,
        loss_chunks=1,
        default_optimizer_impl="fused",
        upcast_in_loss=True,
        engine="torchtitan",
        # torchtitan #1094 (2025-07-28, ``apply_fsdp``): ``fully_shard(model.tok_embeddings)``
        # and ``fully_shard([model.norm, model.output], reshard_after_forward=False)`` before the
        # root; torchtitan runs PyTorch nightlies, 2.9 development builds from that week on
        embedding_own_unit_from=(2, 9),
        shardings=("none", "zero2", "zero3", "fsdp", "hsdp"),
        dtensor_tensor_parallel=True,
    ),
}


CHECKPOINT_EARLY_STOP = (2, 1)
"""First PyTorch release whose non-reentrant checkpoint stops recomputing early by default
(:attr:`Framework.checkpoint_early_stop`)."""

DS_COALESCED_GATHERS = (0, 6, 0)
"""First DeepSpeed release whose ZeRO-3 fetch gathers a module's parameters in one call
(``all_gather_coalesced`` in ``PartitionedParameterCoordinator.fetch_sub_module``, v0.6.0,
2022-03-07). From v0.3.13 (ZeRO-3's first release, 2021-03-16) to v0.5.4 it called
``_allgather_param`` once per parameter (``deepspeed/runtime/zero/partition_parameters.py``):
``torch.cuda.synchronize()``, then ``torch.distributed.all_gather`` into a list of world-size
partitions; v0.5.5-v0.5.10 gathered a module's list at once (``_allgather_params``) but still
copied every parameter out of it one rank's partition at a time."""


DS_STAGE1_OVERLAP = (0, 13, 0)
"""First DeepSpeed release whose ZeRO stage 1 honours ``overlap_comm`` and
``contiguous_gradients`` (#4887, 2024-01). From #1246 (v0.4.4) the engine set both off for
stage 1 (``DeepSpeedEngine._configure_zero_optimizer``: "Overlap and contiguous grads are
meaningless in stage 1 and are ignored"), so ``reduce_ipg_grads`` took
``buffered_reduce_fallback``: a full all-reduce of every gradient bucket, not a
reduce-scatter."""


@dataclasses.dataclass(frozen=True, slots=True)
class DeepSpeedReduction:
    """How DeepSpeed reduces gradients under ZeRO stages 0-2 (``none``, ``zero1``, ``zero2``)."""

    collective: str
    """``all-reduce`` or ``reduce-scatter``."""
    overlapped: bool
    """Whether the reduction runs beside backward (``overlap_comm``'s reduction stream)."""
    why: str


def deepspeed_overlap_comm(
    sharding: str, overlap_comm: bool | None, version: tuple[int, ...] | None
) -> bool:
    """Whether DeepSpeed runs with ``overlap_comm`` on: as stated, else its default, on for
    ZeRO-3 only (``DeepSpeedZeroConfig.overlap_comm_valid``; ``ZERO_OPTIMIZATION_OVERLAP_COMM_
    DEFAULT = False`` in 0.5.x's ``zero/constants.py``); never for stage 0, nor for stage 1
    before 0.13.0 (:data:`DS_STAGE1_OVERLAP`)."""
    if sharding == "none":
        return False
    if sharding == "zero1" and version is not None and version < DS_STAGE1_OVERLAP:
        return False
    if overlap_comm is None:
        return sharding in ("zero3", "hsdp")
    return overlap_comm


def deepspeed_reduction(
    sharding: str, overlap_comm: bool | None, version: tuple[int, ...] | None
) -> DeepSpeedReduction:
    """The gradient reduction of DeepSpeed's engine for ZeRO stages 0-2, read from its source.

    * Stage 0 (``none``): the engine wraps no DDP; ``DeepSpeedEngine.backward`` calls
      ``allreduce_gradients`` after ``loss.backward()``, which all-reduces every gradient in
      buckets (``buffered_allreduce_fallback``): never beside backward.
    * Stage 1: ``allreduce_gradients`` calls the optimizer's ``reduce_gradients`` after
      backward; without ``overlap_comm`` it walks every parameter then
      (``stage_1_and_2.py``, ``reduce_gradients``). Before 0.13.0 ``overlap_comm`` was forced
      off and the buckets all-reduced (:data:`DS_STAGE1_OVERLAP`).
    * Stage 2: each parameter's hook adds its gradient to the bucket and reduces a full one;
      without ``overlap_comm`` on the compute stream (``reduction_stream`` only with it), so
      backward waits for each.

    ``overlap_comm`` as :func:`deepspeed_overlap_comm` resolves it.
    """
    old_stage1 = version is not None and version < DS_STAGE1_OVERLAP
    on = deepspeed_overlap_comm(sharding, overlap_comm, version)
    if sharding == "none":
        return DeepSpeedReduction(
            "all-reduce", False, "DeepSpeed without ZeRO all-reduces the gradients after backward"
        )
    if sharding == "zero1" and old_stage1:
        return DeepSpeedReduction(
            "all-reduce",
            False,
            "DeepSpeed before 0.13.0 ignores overlap_comm under ZeRO-1 and all-reduces the "
            "gradients after backward",
        )
    if sharding == "zero1":
        when = "beside backward (overlap_comm)" if on else "after backward (overlap_comm off)"
        return DeepSpeedReduction("reduce-scatter", on, f"ZeRO-1 reduces the gradients {when}")
    when = (
        "beside backward (overlap_comm)"
        if on
        else "on the compute stream (overlap_comm off, DeepSpeed's default below stage 3)"
    )
    return DeepSpeedReduction("reduce-scatter", on, f"ZeRO-2 reduces each bucket {when}")
