"""Compute time of one training step on one GPU, operator by operator.

Each operator's time is ``max(FLOPs / (peak x efficiency), bytes / (HBM x
efficiency)) + kernel overhead`` (a roofline with achieved, not datasheet,
ceilings). GEMM efficiency depends on size: ``gemm x F / (F + F_half)`` for an
operator of F FLOPs, so small GEMMs reach less than large ones. Backward costs
twice the forward GEMM FLOPs (input and weight gradients; only the input
gradient for frozen weights); fused attention's backward costs 2.5x its forward
(it recomputes the scores). Element-wise work (norms, activations, dropout,
residuals) is memory-bound: its traffic is taken as the saved activations
written and read in forward and read again in backward. Those include eager
attention's saved probabilities, whose passes the score count prices too: a
double count kept because removing it raised the out-of-sample error (8.3% to
11-12%; docs/accuracy.md, "Eager attention's score traffic"). Full activation
checkpointing reruns each layer's forward.
"""

from __future__ import annotations

import dataclasses
import functools

from gpuplan.catalog.schema import GpuSpec
from gpuplan.estimate.activations import Item, Trainable, per_tp_rank
from gpuplan.estimate.adapter_time import AdapterImpl, adapter_layer_time
from gpuplan.estimate.calibration import ATTENTION_PRIOR, ArchEfficiency
from gpuplan.estimate.shape import Shape
from gpuplan.estimate.strategy import Strategy

FLASH_BWD_FACTOR = 2.5
"""FlashAttention backward FLOPs / forward FLOPs (Dao, "FlashAttention-2", 2023: 5 matmuls vs 2)."""
ELEMENTWISE_PASSES = 3.0
"""Saved activations are written and read in forward, read again in backward."""
EAGER_SCORE_PASSES = 16
"""Reads and writes of each score element in eager attention, per training step: forward
QK^T writes the scores (1), the 1/sqrt(d) scale and the mask add each read and write (2 + 2),
softmax reads and writes (2), the product with V reads (1); backward the probabilities'
gradient is written (1), softmax backward reads the output and the gradient and writes (3),
the scale's backward reads and writes (2), the two matmuls for dQ and dK read it (2)."""
MEGATRON_SOFTMAX_PASSES = 10
"""The same under Megatron's fused attention softmax: the 1/sqrt(d) scale rides in the QK^T
GEMM (``torch.baddbmm(..., alpha=1/norm_factor)``) and scale, causal mask and softmax are one
CUDA kernel each way (``FusedScaleMaskSoftmax`` -> ``ScaledUpperTriangMaskedSoftmax``), so the
forward's scale and mask passes (4) and the scale's backward (2) go: forward writes (1), the
fused softmax reads and writes (2), the product with V reads (1); backward writes the
probabilities' gradient (1), the fused softmax backward reads two and writes (3), dQ and dK
read it (2). Megatron-LM megatron/model/transformer.py ``ParallelAttention.forward`` and
megatron/model/fused_softmax.py at 6985e589 (2021), megatron/core/transformer/
dot_product_attention.py and megatron/core/fusions/fused_softmax.py today."""
SOFTCAP_PASSES = 13
"""Soft-capped scores (Gemma 2: ``cap * tanh(scores / cap)`` before the mask) add, per score
element and step: forward the division, tanh and multiplication each read and write (6);
backward the multiplication's and the division's gradients each read and write (4) and
tanh's reads its output and the gradient and writes (3). LitGPT's
``scaled_dot_product_attention`` and transformers' eager ``Gemma2Attention`` run them as
separate ops."""
EAGER_DROPOUT_PASSES = 4
"""Attention dropout: forward reads and writes (2), backward reads and writes (2), plus its
1-byte mask written and read."""
DEQUANT_BYTES_PER_WEIGHT = 2.5
"""Bytes a 4-bit (NF4) base weight moves each time it is used: its packed nibbles read (0.5)
and the 16-bit weight written (2); the block scales (at most 1/16 byte a weight) are left
out. QLoRA's linears dequantize the whole weight at every use and run a 16-bit GEMM:
bitsandbytes ``MatMul4Bit`` (``autograd/_functions.py``) calls ``dequantize_4bit`` in forward
and again in backward for the input gradient, torchao's ``LinearNF4`` (``dtypes/nf4tensor.py``,
torchtune's QLoRA) does ``weight.to(input.dtype)`` in both; a checkpointed layer's recompute
dequantizes once more. Priced as one streaming pass at the achieved bandwidth per use (a fused
kernel: torch.compile fuses torchao's eager unpack, lookup and scale ops)."""
KERNELS_PER_LAYER = 40
"""Kernel launches per transformer layer for forward + backward where kernels are fused
(Transformer Engine, Megatron, compiled models, MLPerf's apex BERT): a prior, not counted."""
EAGER_KERNELS_PER_LAYER = {"llama": 113, "gpt2": 76, "bert": 66}
"""Kernel-launching ops per layer, forward and backward, of Hugging Face transformers' eager
models, counted with a TorchDispatchMode over a 2-layer model less a 1-layer one (transformers
5.24 on torch 2.13, views left out; ``scripts/count_eager_kernels.py``): Llama-style
(RMSNorm as seven ops, RoPE's ``rotate_half`` with slices, ``cat`` and ``neg``, repeated K/V,
SDPA, SwiGLU) 113; GPT-2-style (layer norms, ``gelu_new`` as a tanh expression, eager attention
with dropout) 76; BERT-style 66. The LoRA branch's own ops are counted in
:mod:`gpuplan.estimate.adapter_time`."""
EAGER_KERNELS_PER_LAYER_AUTOCAST = {"llama": 139, "gpt2": 107, "bert": 104}
"""The same fp32 models run under CUDA autocast (``torch.autocast("cuda", float16)``, emulated on
the CPU by :class:`gpuplan.trace.autocast.CudaAutocast`; ``scripts/count_eager_kernels.py``):
autocast adds a cast kernel (``_to_copy``) for each linear's weight (cached once per forward) and
fp32 input, for softmax's and the norms' 16-bit inputs, and the casts' gradients in backward:
Llama 26 more, GPT-2 31, BERT 38."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ComputeTime:
    """Per-micro-batch compute of the layers and the head, seconds and FLOPs."""

    layer_s: float
    head_s: float
    model_flops_per_micro_batch: float
    hardware_flops_per_micro_batch: float
    parts: dict[str, float]
    forward_s: float = 0.0
    """The forward pass alone of one micro-batch (layers and head): what an evaluation pass
    costs, with the loss but no backward, no recompute and no optimizer."""


GEMM_ALIGN_ELEMENTS = 8
"""Elements a 16-bit GEMM's dimensions must be a multiple of for cuBLAS's tensor-core kernels
(16 bytes: the alignment of their vector loads and, on Hopper, of TMA's tensor maps)."""

UNALIGNED_GEMM_SLOWDOWN = 4.9
"""How much longer a 16-bit GEMM takes when one dimension is not a multiple of
:data:`GEMM_ALIGN_ELEMENTS`. Measured on an H200 (``validation/pending/gemm_h200_20261204.csv``,
``scripts/gpu-speed-check.py``, torch 2.11 + CUDA 13.0): GPT-2's LM head at 16,384 tokens,
vocabulary 50257 against the same GEMM padded to 50304, runs 4.8x longer forward
(126 against 602 TFLOP/s) and 4.9x longer for the input gradient (141 against 700). Taken for
every architecture and for the weight gradient too: only this one card was measured."""


def head_is_aligned(vocab: int, tp: int, pads_vocab: int) -> bool:
    """Whether the LM head's GEMMs run aligned: the vocabulary, padded as the engine pads it
    (to a multiple of ``pads_vocab`` x ``tp``, Megatron's ``--make-vocab-size-divisible-by``;
    ``pads_vocab`` 1 for engines that keep the tokenizer's size), splits over ``tp`` ranks into
    rows a multiple of :data:`GEMM_ALIGN_ELEMENTS`.

    >>> head_is_aligned(50257, 1, 1), head_is_aligned(50257, 1, 128), head_is_aligned(128256, 8, 1)
    (False, True, True)
    """
    unit = pads_vocab * tp if pads_vocab > 1 else 1
    padded = -(-vocab // unit) * unit
    return padded % tp == 0 and (padded // tp) % GEMM_ALIGN_ELEMENTS == 0


def _gemm_time(
    flops: float,
    nbytes: float,
    peak: float,
    bw: float,
    eff: ArchEfficiency,
    half_size: float | None = None,
    out_bytes: float = 0.0,
) -> float:
    """Time of one GEMM pass: its reduction at the size-scaled efficiency, then its epilogue.

    ``out_bytes`` is the output the pass writes. A GEMM kernel reduces each output tile, then
    stores it (the epilogue); with one large tile per SM at a time, a wave's stores do not
    overlap its reductions, so they add to the time rather than hiding under it. That is why a
    GEMM with a short reduction reaches less of the peak: for reduction length K the
    efficiency falls by K / (K + peak x e x bytes / (2 x bandwidth x hbm)), about 0.96 at K
    4096 and 0.82 at K 768 on an H100 in bf16 (the H200 reference's "smaller or skinnier GEMMs
    reach less", ``../shared/reference/measured_h200.md``). Kernels that overlap the epilogue
    (Hopper's persistent ping-pong kernels) lose less: this is the serial bound, not fitted.
    The whole pass is never faster than moving ``nbytes`` at the achievable bandwidth.
    """
    if flops <= 0:
        return 0.0
    half = eff.gemm_half_size if half_size is None else half_size
    e = eff.gemm * flops / (flops + half)
    return max(flops / (peak * e) + out_bytes / (bw * eff.hbm), nbytes / (bw * eff.hbm))


def _gemm_passes(
    flops: float,
    nbytes: float,
    peak: float,
    bw: float,
    eff: ArchEfficiency,
    half: float | None,
    out_bytes: tuple[float, float, float],
    *,
    wgrad: bool,
) -> tuple[float, float]:
    """Forward, and forward plus backward, time of one GEMM of ``flops`` per pass.

    ``out_bytes`` is what each pass writes: the output (forward), the input gradient (dgrad)
    and the weight gradient (wgrad, skipped for a frozen weight). Each pass pays its own
    epilogue (see :func:`_gemm_time`), which is why a GEMM with a short reduction (a narrow
    layer) reaches less of the peak than a wide one of the same FLOPs.
    """
    fwd_out, dgrad_out, wgrad_out = out_bytes
    t_fwd = _gemm_time(flops, nbytes, peak, bw, eff, half, fwd_out)
    t_bwd = _gemm_time(flops, nbytes, peak, bw, eff, half, dgrad_out)
    if wgrad:
        t_bwd += _gemm_time(flops, nbytes, peak, bw, eff, half, wgrad_out)
    return t_fwd, t_fwd + t_bwd


def fp8_needs_transposes(compute_capability: str | None) -> bool:
    """Whether fp8 GEMMs on this GPU take only the TN layout, so that each fp8 cast also writes
    a transposed copy for the backward GEMMs.

    cuBLASLt's fp8 GEMMs on Ada and Hopper (8.9, 9.0) and consumer Blackwell (12.x) are TN only;
    data-centre Blackwell (10.x, 11.x) and later take other layouts. Transformer Engine reads it
    from the device (``transformer_engine/pytorch/utils.py``, ``is_non_tn_fp8_gemm_supported``)
    and then casts with a fused cast-transpose (TE 1.x ``module/linear.py``, ``_Linear``:
    ``fp8_cast_transpose_fused`` of the input when the weight takes a gradient, of the weight,
    and of the output gradient in backward; TE 2.x asks the quantizer for columnwise data for
    the same operands). A GPU without a stated compute capability is taken as TN only.
    """
    if not compute_capability:
        return True
    major = int(compute_capability.split(".")[0])
    return not (10 <= major < 12 or major >= 13)


def peak_flops(gpu: GpuSpec, dtype: str) -> float:
    """Dense peak FLOP/s of ``gpu`` in ``dtype`` (fp8 falls back to bf16 where absent)."""
    table = gpu.peak_tflops_dense
    value = table.get(dtype) or table.get("bf16") or table.get("fp16") or table["fp32"]  # type: ignore[call-overload]
    return float(value) * 1e12


@functools.lru_cache(maxsize=4096)
def transformer_step(
    shape: Shape,
    st: Strategy,
    *,
    peak: float,
    peak16: float,
    bw: float,
    seq: int,
    attention_seq: int | None = None,
    dtype: str,
    act_bytes: int,
    tr: Trainable,
    items: tuple[Item, ...],
    eff: ArchEfficiency,
    fused_attention: bool,
    cudnn_attention: bool = False,
    eff16: ArchEfficiency | None = None,
    score_bytes: int = 4,
    score_passes: int = EAGER_SCORE_PASSES,
    adapter: AdapterImpl | None = None,
    adapter_peak: float = 0.0,
    kernels_per_layer: int = KERNELS_PER_LAYER,
    fp8_transposes: bool = True,
    head_aligned: bool = True,
    recompute_stops_early: bool = False,
    fused_loss: bool = False,
) -> ComputeTime:
    """Compute time of the worst pipeline stage for one micro-batch.

    ``peak`` is the dense peak FLOP/s in ``dtype``, ``peak16`` the 16-bit one, ``bw`` the
    memory bandwidth in bytes/s (:func:`peak_flops`, the GPU's datasheet). Of ``st`` only the
    tensor and pipeline degrees, the micro-batch and the checkpointing matter; the function is
    pure and cached (a plan times the same micro-batch on many offerings and GPU counts).

    ``eff16`` is the 16-bit efficiency, for what fp8 recipes keep in 16 bits (the LM head).
    ``score_bytes``: bytes of one materialised attention score in eager attention (4 under
    autocast, whose softmax runs in fp32, and in fp32; 2 in a model cast to 16 bits);
    ``score_passes`` how often each is read or written in a step (:data:`EAGER_SCORE_PASSES`,
    :data:`MEGATRON_SOFTMAX_PASSES`).
    ``attention_seq`` is the length each token attends over (packed rows with document
    masking attend within a document); default ``seq``.
    ``kernels_per_layer``: kernel launches of one layer's forward and backward
    (:data:`EAGER_KERNELS_PER_LAYER` for eager engines, :data:`KERNELS_PER_LAYER` otherwise).
    ``adapter``: how the LoRA branches run (:mod:`gpuplan.estimate.adapter_time`), priced at
    ``adapter_peak`` FLOP/s for their GEMMs; their saved tensors then leave the element-wise
    term (``Item.branch``), which would otherwise price them a second time.
    ``fp8_transposes``: fp8 casts also write a transposed copy (:func:`fp8_needs_transposes`).
    ``head_aligned``: the LM head's vocabulary rows on this rank are a multiple of
    :data:`GEMM_ALIGN_ELEMENTS` (:func:`head_is_aligned`); otherwise its three GEMMs take
    :data:`UNALIGNED_GEMM_SLOWDOWN` times as long.
    ``recompute_stops_early``: full checkpointing's recompute stops before the layer's last
    projection (:func:`recompute_skips_last_linear`).
    ``fused_loss``: the spec states a fused cross-entropy (flash-attn's, Liger's, or the head
    and loss fused): one kernel reads the 16-bit logits and writes their 16-bit gradient, in
    place of the eager loss's three fp32 passes.
    """
    ctx = attention_seq or seq
    # a GEMM's fixed cost (launch, tail, wave quantisation) is a time: in FLOPs it grows
    # with the peak, so fp8's half-efficiency size is the 16-bit one scaled by the peak ratio
    half = eff.gemm_half_size * (peak / peak16 if dtype == "fp8" else 1.0)
    a = act_bytes
    tokens = st.micro_batch_size * seq
    tp = st.tp
    layers = -(-shape.layers // st.pp)
    k_routed = shape.experts_per_token if shape.num_experts > 1 else 1
    gemm_fwd = gemm_bwd = 0.0
    t_gemm = 0.0
    cast_bytes = 0.0
    t_gemm_kept = 0.0  # forward GEMM time whose output per-op checkpointing keeps
    t_gemm_fwd = 0.0
    t_last_fwd = 0.0  # forward GEMM time of the layer's last projection
    t_deq = t_deq_kept = 0.0  # one dequantization of the layer's 4-bit base weights (QLoRA)
    mms = [lin for lin in shape.linears if lin.role != "router"]
    kept_linears = {id(lin) for lin in mms[0::2]}
    for lin in shape.linears:
        per_token: float
        if lin.role == "router":
            per_token = 2 * lin.in_features * lin.out_features
            copies = 1
        else:
            copies = k_routed if lin.count > 1 else 1
            per_token = 2 * lin.in_features * lin.out_features / tp
        flops = per_token * tokens * copies
        nbytes = (
            tokens * (lin.in_features + lin.out_features / tp) * copies
            + lin.in_features * lin.out_features / tp
        ) * a
        bwd_mult = 2.0 if tr.full else 1.0  # frozen base: input gradient only
        if dtype == "fp8" and lin.role != "router":
            # Transformer Engine casts each GEMM's operands to fp8 with a scale: forward input and
            # weight, backward output gradient (read in 16 bits, written in 8); where the fp8
            # GEMM takes only the TN layout, each cast also writes the transposed copy a backward
            # GEMM reads: the weight's for the input gradient, the input's and the output
            # gradient's for the weight gradient (none of those two for a frozen weight)
            w = lin.in_features * lin.out_features / tp
            act_t = int(fp8_transposes and tr.full)
            cast_bytes += tokens * copies * (lin.in_features + lin.out_features / tp) * (
                a + 1 + act_t
            ) + w * (a + 1 + int(fp8_transposes))
        gemm_fwd += flops
        gemm_bwd += flops * bwd_mult
        out_w = lin.out_features / tp if lin.role != "router" else lin.out_features
        rows = tokens * copies
        t_lin, t_all = _gemm_passes(
            flops,
            nbytes,
            peak,
            bw,
            eff,
            half,
            (rows * out_w * a, rows * lin.in_features * a, lin.in_features * out_w * a),
            wgrad=tr.full,
        )
        t_gemm += t_all
        t_gemm_fwd += t_lin
        if lin.role != "router":
            t_last_fwd = t_lin
        deq = 0.0
        if tr.quantized_base and lin.role != "router":
            w = lin.in_features * lin.out_features / tp * lin.count
            deq = w * DEQUANT_BYTES_PER_WEIGHT / (bw * eff.hbm) + eff.kernel_overhead_s
            t_deq += deq
        if id(lin) in kept_linears:
            t_gemm_kept += t_lin
            t_deq_kept += deq
    # attention core (per layer, causal halves the work with flash)
    width_q = shape.heads * shape.head_dim / tp
    attn_fwd = (
        4 * st.micro_batch_size * seq * ctx * width_q * (0.5 if shape.family == "decoder" else 1.0)
    )
    if fused_attention:
        # flash attention runs in 16 bits even in fp8 recipes (Transformer Engine and torchao
        # Float8 convert linear layers only); fp32 models keep the scaled GEMM efficiency
        if dtype in ("fp32", "tf32"):
            att_peak, att = peak, eff.gemm * ATTENTION_PRIOR
        else:
            att_peak = peak16
            att = eff.attention_cudnn if cudnn_attention else eff.attention
        att_eff = dataclasses.replace(eff, gemm=att)
        t_attn = _gemm_time(attn_fwd * (1 + FLASH_BWD_FACTOR), 0.0, att_peak, bw, att_eff)
        attn_hw = attn_fwd * (1 + FLASH_BWD_FACTOR)
    else:
        # materialised scores: each pass reads or writes one score element (EAGER_SCORE_PASSES)
        elements = st.micro_batch_size * shape.heads / tp * seq * ctx
        dropout = shape.attn_dropout > 0
        passes = score_passes + (EAGER_DROPOUT_PASSES if dropout else 0)
        sq_bytes = elements * (passes * score_bytes + (2 if dropout else 0))
        t_attn = 3 * _gemm_time(attn_fwd, sq_bytes / 3, peak, bw, eff)
        attn_hw = attn_fwd * 3
    t_adapt_fwd = t_adapt = 0.0
    if adapter is not None and not tr.full and tr.lora_roles:
        items = tuple(i for i in items if not i.branch)
        t_adapt_fwd, t_adapt = adapter_layer_time(
            shape,
            tr.lora_roles,
            tr.lora_rank,
            adapter,
            tokens=tokens,
            tp=tp,
            experts_per_token=k_routed,
            peak=adapter_peak or peak16,
            bw=bw,
            eff=eff,
        )
    saved = per_tp_rank(items, tp, st.sequence_parallel) * tokens
    t_elem = (ELEMENTWISE_PASSES * saved + cast_bytes) / (bw * eff.hbm)
    t_launch = kernels_per_layer * eff.kernel_overhead_s
    # the attention core's forward: fused attention's backward is 2.5 forwards (it recomputes
    # the scores), eager attention's two (the score and value gradients), as priced above
    t_attn_fwd = t_attn / ((1 + FLASH_BWD_FACTOR) if fused_attention else 3)
    layer_fwd_share = t_gemm / 3 + t_attn_fwd + t_elem / 3 + t_launch / 3 + t_deq + t_adapt_fwd
    # a 4-bit base weight is dequantized in forward and again for the input gradient
    per_layer = t_gemm + t_attn + t_elem + t_launch + 2 * t_deq + t_adapt
    if st.activation_checkpointing == "full":
        per_layer += layer_fwd_share
        if recompute_stops_early and recompute_skips_last_linear(shape, tr):
            per_layer -= t_last_fwd
    elif st.activation_checkpointing == "selective":
        per_layer += t_attn_fwd
    elif st.activation_checkpointing == "selective-op":
        # the forward again, less the attention and the matmuls whose outputs were kept
        per_layer += (
            t_gemm / (1 + (2.0 if tr.full else 1.0))
            - t_gemm_kept
            + t_elem / 3
            + t_deq
            - t_deq_kept
            + t_adapt_fwd
        )
    layer_s = layers * per_layer
    # LM head + loss on the last stage (vocab-parallel under TP)
    head_s = head_fwd = 0.0
    head_flops = 0.0
    if shape.family == "decoder" and shape.vocab:
        head_flops = 2 * tokens * shape.hidden * shape.vocab / tp
        head_bwd = 2.0 if tr.full else 1.0
        head_bytes = (
            tokens * (shape.hidden + shape.vocab / tp) + shape.hidden * shape.vocab / tp
        ) * a
        # fp8 recipes keep the output layer in 16 bits (Transformer Engine converts the
        # transformer layers; torchtitan's Float8 skips "output"; llm-foundry's head is tied)
        head_outs = (
            tokens * shape.vocab / tp * a,
            tokens * shape.hidden * a,
            shape.hidden * shape.vocab / tp * a,
        )
        head_peak, head_eff = (peak16, eff16 or eff) if dtype == "fp8" else (peak, eff)
        head_fwd, head_s = _gemm_passes(
            head_flops, head_bytes, head_peak, bw, head_eff, None, head_outs, wgrad=tr.full
        )
        if not head_aligned:
            head_fwd *= UNALIGNED_GEMM_SLOWDOWN
            head_s *= UNALIGNED_GEMM_SLOWDOWN
        if fused_loss:
            loss_pass = tokens * shape.vocab / tp * a / (bw * eff.hbm)
            head_s += 2 * loss_pass  # 16-bit logits read, their gradient written
            head_fwd += loss_pass
        else:
            loss_pass = tokens * shape.vocab / tp * 4 / (bw * eff.hbm)
            head_s += 3 * loss_pass  # fp32 loss passes: softmax read and write, gradient write
            head_fwd += 2 * loss_pass
        head_flops *= 1 + head_bwd
    # model FLOPs are what the method needs, recompute left out: a frozen base's linears and
    # head run forward and input gradient (no weight gradient), so PEFT counts 4N, not 6N
    model = layers * (gemm_fwd + gemm_bwd + 3 * attn_fwd) + head_flops
    hw = layers * (gemm_fwd + gemm_bwd + attn_hw) + head_flops
    return ComputeTime(
        layer_s=layer_s,
        head_s=head_s,
        model_flops_per_micro_batch=model,
        hardware_flops_per_micro_batch=hw,
        forward_s=layers
        * (
            t_gemm_fwd
            + t_attn_fwd
            + t_elem * 2 / ELEMENTWISE_PASSES
            + t_launch / 3
            + t_deq
            + t_adapt_fwd
        )
        + head_fwd,
        parts={
            "gemm": layers * t_gemm,
            "attention": layers * t_attn,
            "elementwise": layers * t_elem,
            "kernel launches": layers * t_launch,
            "4-bit dequantize": layers * 2 * t_deq,
            "LoRA adapters": layers * t_adapt,
            "recompute": layer_s
            - layers * (t_gemm + t_attn + t_elem + t_launch + 2 * t_deq + t_adapt),
            "lm head + loss": head_s,
        },
    )


def recompute_skips_last_linear(shape: Shape, tr: Trainable) -> bool:
    """Whether a recompute that stops once the layer's saved tensors are back
    (:attr:`gpuplan.estimate.frameworks.Framework.checkpoint_early_stop`) skips the GEMM of
    the layer's last projection. Autograd saves a matmul's inputs before it runs it, and in a
    pre-norm decoder layer nothing saves that projection's output (the residual add keeps
    nothing). Not where something after it saves: a residual dropout's mask, a mixture of
    experts' routing weights (which scale the experts' outputs), a LoRA branch on that
    projection (its up-projection's input is saved after the base GEMM has run); a 4-bit base
    is left out too (bitsandbytes' and torchao's 4-bit matmuls are autograd Functions of their
    own, whose saving is not read here). Encoders (post-norm: the layer ends in a norm, which
    saves its input) are not decoders."""
    mms = [lin for lin in shape.linears if lin.role != "router"]
    if shape.family != "decoder" or not mms or shape.hidden_dropout > 0:
        return False
    last = mms[-1]
    return last.count == 1 and last.role not in tr.lora_roles and not tr.quantized_base


EAGER_PASSES = {"batchnorm": 8, "relu": 5, "add": 6}
"""Passes over a layer's output (reads plus writes) that PyTorch's eager kernels make in one
training step. Batch norm (cuDNN training kernels): forward reads x for the statistics, reads it
again and writes y (3); backward reads x and dy for the reductions, then x and dy again and writes
dx (5). In-place ReLU: read and write (2); ``threshold_backward`` reads y and dy, writes dx (3).
Residual add: reads two, writes one (3); in backward the two branches' gradients are summed at the
block input (3). Other layers (pooling) and fused kernels: 4, the saved output written and read in
forward and read again in backward."""
EAGER_FORWARD_PASSES = {"batchnorm": 3, "relu": 2, "add": 3}
"""The forward share of :data:`EAGER_PASSES` (batch norm reads x twice and writes y; ReLU reads
and writes; the add reads two and writes one); other layers and fused kernels 2 (the output
written and read)."""
FUSED_PASSES = 4
"""Passes over a non-convolution layer's output when it is fused or not in ``EAGER_PASSES``."""
NCHW_TRANSPOSE_PASSES = 6
"""cuDNN's tensor-core convolutions run in NHWC; on NCHW tensors each of a convolution's three
calls (forward, data gradient, weight gradient) transposes its two activation operands in and
out (a read and a write each): 6 x (input + output) elements (NVIDIA Deep Learning Performance
Guide, "Convolutional Layers User's Guide": tensor-core kernels need NHWC, NCHW is transposed
at a cost; PyTorch's channels_last tutorial)."""
CUDNN_BENCHMARK_CHOICE = (
    "NCHW tf32 convolutions: each call runs on the tensor-core kernel with its transposes or on "
    "the fp32 CUDA-core kernel, whichever is faster (cuDNN's autotuner, torch.backends.cudnn."
    "benchmark = True, as NVIDIA DeepLearningExamples' ConvNets main.py and timm's benchmark.py set it)"
)
"""Why an NCHW tf32 convolution may skip its transposes: with ``cudnn.benchmark`` on, cuDNN
times every algorithm for each convolution shape and call and keeps the fastest; the fp32
CUDA-core kernels read NCHW directly. Where the tf32 tensor-core peak is no higher than the fp32
one (the GeForce RTX 3090 and 4090: TF32 accumulates in fp32 at half rate), the fp32 kernels
win wherever the transposes cost more than the tensor cores save."""
CNN_KERNELS = {
    "eager": "CNN kernels: PyTorch eager in NCHW (batch norm, ReLU, adds as separate kernels; "
    "cuDNN transposes around each tensor-core convolution)",
    "channels-last": "CNN kernels: PyTorch eager in channels-last (separate batch norm, ReLU "
    "and add kernels, no transposes)",
    "fused": "CNN kernels: NHWC with batch norm, ReLU and adds fused into the convolutions",
}


@functools.lru_cache(maxsize=1024)
def cnn_step(
    shape: Shape,
    micro_batch_size: int,
    *,
    peak: float,
    bw: float,
    dtype: str,
    act_bytes: int,
    eff: ArchEfficiency,
    image_scale: float,
    kernels: str = "eager",
    fp32_alternative: tuple[float, ArchEfficiency] | None = None,
) -> ComputeTime:
    """Compute time of a CNN micro-batch: convolutions as GEMMs, BN/ReLU memory-bound.

    ``peak`` is the dense peak FLOP/s in ``dtype`` and ``bw`` the memory bandwidth in bytes/s.
    ``kernels`` (spec ``cnn_kernels``) decides the element-wise passes (:data:`EAGER_PASSES`
    or :data:`FUSED_PASSES`) and whether NCHW transposes are paid (eager, tensor-core dtypes).
    ``fp32_alternative`` (the fp32 CUDA-core peak and efficiencies; given for tf32 jobs) lets each
    NCHW convolution call run on the fp32 kernels instead where that is faster than the
    tensor-core kernel with its transposes (:data:`NCHW_TRANSPOSE_PASSES`), as cuDNN's autotuner
    chooses (:data:`CUDNN_BENCHMARK_CHOICE`).
    """
    b = micro_batch_size
    t = 0.0
    fwd = 0.0
    elem_bytes = 0.0
    transpose_bytes = 0.0
    transpose_fwd_bytes = 0.0
    t_cuda_cores = 0.0  # convolution calls the autotuner moves to fp32 CUDA-core kernels
    launches = 0
    transposes = kernels == "eager" and dtype != "fp32"
    prev_out = 0.0
    t_fwd = 0.0  # the forward convolutions
    elem_fwd_bytes = 0.0
    per_byte = 1.0 / (bw * eff.hbm)
    for layer in shape.cnn_layers:
        flops = layer.forward_flops * b * image_scale
        out = layer.output_elements * b * image_scale
        if layer.kind in ("conv", "linear"):
            nbytes = 2 * out * act_bytes + layer.params * act_bytes
            outs = (out * act_bytes, prev_out * act_bytes, layer.params * act_bytes)
            conv_fwd, conv_all = _gemm_passes(flops, nbytes, peak, bw, eff, None, outs, wgrad=True)
            if transposes and layer.kind == "conv":
                # the input is the previous layer's output (the image for the stem); each of
                # the three calls transposes both operands in and out (a third of the passes)
                call_bytes = NCHW_TRANSPOSE_PASSES / 3 * (prev_out + out) * act_bytes
                alt_fwd = alt_bwd = float("inf")  # no alternative: the tensor cores
                if fp32_alternative is not None:
                    alt_peak, alt_eff = fp32_alternative
                    alt_fwd, alt_all = _gemm_passes(
                        flops, nbytes, alt_peak, bw, alt_eff, None, outs, wgrad=True
                    )
                    alt_bwd = alt_all - alt_fwd
                # forward is one call; backward two (data and weight gradients)
                for tensor_s, alt_s, n_calls in (
                    (conv_fwd, alt_fwd, 1),
                    (conv_all - conv_fwd, alt_bwd, 2),
                ):
                    if alt_s < tensor_s + n_calls * call_bytes * per_byte:
                        chosen = alt_s
                        t_cuda_cores += alt_s
                    else:
                        chosen = tensor_s
                        transpose_bytes += n_calls * call_bytes
                        transpose_fwd_bytes += call_bytes if n_calls == 1 else 0.0
                    t += chosen
                    t_fwd += chosen if n_calls == 1 else 0.0
            else:
                t += conv_all
                t_fwd += conv_fwd
            fwd += flops
        else:
            passes = (
                FUSED_PASSES if kernels == "fused" else EAGER_PASSES.get(layer.kind, FUSED_PASSES)
            )
            elem_bytes += out * act_bytes * passes
            fwd_passes = 2 if kernels == "fused" else EAGER_FORWARD_PASSES.get(layer.kind, 2)
            elem_fwd_bytes += out * act_bytes * fwd_passes
        prev_out = out
        launches += 3
    t_elem = elem_bytes * per_byte
    t_transpose = transpose_bytes * per_byte
    t += t_elem + t_transpose + launches * eff.kernel_overhead_s
    parts = {"convolutions": t - t_elem - t_transpose - t_cuda_cores, "elementwise": t_elem}
    if t_cuda_cores:
        parts["convolutions on fp32 CUDA cores"] = t_cuda_cores
    if t_transpose:
        parts["NCHW transposes"] = t_transpose
    return ComputeTime(
        layer_s=t,
        head_s=0.0,
        model_flops_per_micro_batch=3 * fwd,
        hardware_flops_per_micro_batch=3 * fwd,
        parts=parts,
        forward_s=t_fwd
        + (elem_fwd_bytes + transpose_fwd_bytes) * per_byte
        + launches / 3 * eff.kernel_overhead_s,
    )
