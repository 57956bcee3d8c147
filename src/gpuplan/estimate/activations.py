"""Activation memory saved for backward, tensor by tensor, for the real implementations.

The textbook per-layer figure (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", MLSys 2023: ``sbh(34 + 5as/h)``
bytes) assumes Megatron's fused kernels. Hugging Face eager code keeps more:
RMSNorm upcasts to fp32 and keeps that copy, ``repeat_kv`` materialises
grouped K/V at full width, GPT-2's Python ``gelu_new`` keeps four
intermediates, and the loss upcasts logits to fp32. A trace of Llama-3-8B
gives about 53 sbh bytes per layer (``reference/estimators.md``). This module
lists what autograd actually saves, so the sum is explainable:

* a linear layer saves its *input* only if its weight is trainable (with LoRA
  the frozen base saves nothing; the adapter saves its dropout output);
* element-wise ops save what their backward reads (SiLU its input, a product
  both factors, ``tanh`` its output);
* fused attention (flash / memory-efficient SDPA) saves q, k, v, the output and
  a per-row log-sum-exp; eager attention also keeps the probabilities and the
  dropout mask, which grow with the square of the sequence;
* under autocast (``*-mixed``) LayerNorm and softmax run in fp32.

Every item is bytes **per token** for one layer (or for the model head), for
one sample, with the sequence length given for the quadratic terms.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable

from gpuplan.estimate.shape import Shape

FP32 = 4


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Numerics:
    """How a step stores activations."""

    act_bytes: int
    """Bytes per activation element (2 for fp16/bf16, 4 for fp32/tf32, 2 for fp8 training)."""
    autocast: bool
    """Whether torch autocast runs norms and softmax in fp32 (``*-mixed``)."""
    python_gelu: bool = True
    """Whether tanh-GELU runs as a Python expression (transformers' ``gelu_new``)."""
    compiled: bool = False
    """torch.compile: AOTAutograd's min-cut partitioner recomputes pointwise ops in backward,
    so norms keep only their 16-bit input and elementwise intermediates are not saved."""
    compiled_loss: bool | None = None
    """The loss is compiled (torchtitan ``compile.components``); None: as ``compiled``."""
    loss_chunks: int = 1
    """Chunks the LM loss runs in: only one chunk's fp32 gradient is live at a time."""
    logits_upcast_in_model: bool = False
    """The model itself returns fp32 logits and the 16-bit ones are not kept (torchtune's
    ``TransformerDecoder`` without output chunks: ``self.output(h).float()``)."""
    fp16: bool = False
    """The 16-bit activations are fp16 (not bf16): some model code upcasts fp16 softmax."""
    residual_16bit: bool = False
    """The parameters are 16-bit while autocast runs (FSDP ``MixedPrecision`` with a 16-bit
    ``param_dtype``), so the residual stream and the norm inputs are 16-bit and autocast makes
    no per-linear copies of them."""
    fused_loss: bool = False
    """flash-attn's ``CrossEntropyLoss``: keeps the 16-bit logits and an fp32 logsumexp per
    token, and its backward writes a 16-bit logits gradient (no fp32 copy)."""
    fused_linear_loss: bool = False
    """The LM head and the loss fused and chunked (Liger Kernel's
    ``LigerFusedLinearCrossEntropyLoss``): no logits are kept; forward computes the hidden
    state's gradient, in the input's dtype, chunk by chunk."""
    loss_grad_in_place: bool = False
    """The loss writes its fp32 gradient into the fp32 softmax it saved, and the backward of
    the logits' upcast casts it to 16 bits: the only new tensor at the start of backward is
    that 16-bit gradient (Megatron's ``vocab_parallel_cross_entropy``,
    ``megatron/core/tensor_parallel/cross_entropy.py``: ``grad_input = softmax`` then
    ``grad_input.mul_(grad_output)``; the ``native`` fused loss alike)."""
    te_cross_entropy: bool = False
    """Transformer Engine's ``parallel_cross_entropy`` writes the gradient into the 16-bit
    logits during forward and keeps only them (see ``MegatronOptions.te_cross_entropy``)."""
    attention_output_shared: bool = False
    """The fused attention's output is the out-projection's input (a view: flash-attn's
    (batch, seq, heads, dim), TE's (seq, batch, hidden)), so the tensor kept by both is counted
    once; an fp8 out-projection keeps its own fp8 cast, counted apart."""
    fp8_linear_inputs: bool = False
    """Transformer Engine fp8 linears keep their input as the fp8 cast they computed with
    (1 byte; ``transformer_engine/pytorch/module/linear.py``), for the weight gradient."""
    fp8_attention: bool = False
    """Transformer Engine's fp8 fused attention keeps q, k, v and its output as fp8 casts
    (1 byte; Megatron ``fp8_dot_product_attention``)."""
    fp8_activation_input: bool = False
    """Megatron's fused SwiGLU keeps its input in fp8 e4m3 (``activation_func_fp8_input_store``)."""
    loss_parallel: bool = False
    """The eager loss runs on vocabulary-sharded logits under PyTorch's ``loss_parallel``
    (torchtitan with tensor parallelism): its backward
    (``torch/distributed/tensor/parallel/loss.py``, ``_nll_loss_and_log_softmax_backward``,
    read at torch 2.13) builds ``zeros_like(x)``, ``exp(x)`` and their sum (then that times
    the output gradient) beside the saved fp32 log-softmax: three fp32 copies at once where
    the dense ``nll_loss`` / ``_log_softmax_backward_data`` pair is priced at one."""
    logits_released: bool = False
    """The model output, and with it the 16-bit logits, is freed before backward: Hugging
    Face's ``Trainer.compute_loss`` returns the loss alone (spec ``hf_trainer``); nothing
    autograd saves needs the 16-bit logits (the loss upcasts them and keeps its own fp32
    log-softmax)."""
    fused_kernels: bool = False
    """Fused norm and gated-activation kernels: Transformer Engine (Megatron), or the spec's
    ``fused_kernels`` (Liger Kernel, flash-attn's norms, xformers' SwiGLU). A fused norm keeps
    its input (16-bit under TE; the fp32 residual stream under autocast with fp32 parameters)
    and the fp32 rstd, the fused SwiGLU keeps its input (and the down projection its own
    input), and attention reads grouped K/V without repeating them."""

    @property
    def loss_is_compiled(self) -> bool:
        """Whether the loss runs compiled (``compiled_loss``, else as the model)."""
        return self.compiled if self.compiled_loss is None else self.compiled_loss


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Trainable:
    """Which weights get gradients (decides which linear inputs are saved)."""

    full: bool
    lora_roles: frozenset[str] = frozenset()
    lora_rank: int = 0
    lora_dropout: float = 0.0
    adapter_bytes: int = 2
    """Bytes per element of the LoRA adapter weights (PEFT keeps them in fp32)."""
    quantized_base: bool = False
    """bitsandbytes 4-bit linears (QLoRA): ``MatMul4Bit`` saves its input whenever the input
    needs a gradient, although the weight is frozen (bitsandbytes ``autograd/_functions.py``)."""

    def saves_input(self, role: str) -> bool:
        """Whether the linear of ``role`` keeps its input for backward."""
        return self.full or self.quantized_base

    def lora_on(self, role: str) -> bool:
        """Whether ``role`` has a LoRA adapter."""
        return not self.full and role in self.lora_roles


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """One saved tensor (or group), in bytes per token."""

    name: str
    bytes_per_token: float
    lora: bool = False
    """Kept for a LoRA adapter (its input, dropout copy, input cast or ``A`` output)."""
    branch: bool = False
    """Made by the adapter branch itself (dropout copy, input cast, ``A`` output), not by the
    base layer: the time model prices the branch's traffic on its own
    (:mod:`gpuplan.estimate.adapter_time`)."""
    tp_replicated: bool = False
    """Outside the tensor-parallel region (a norm's input, the input of a column-parallel
    linear, a residual dropout mask, a checkpointed layer input): every tp rank keeps all of
    it unless sequence parallelism splits it (Korthikanti et al., MLSys 2023: the 10 sbh of
    ``sbh(10 + 24/t + 5as/(ht))``); the rest is split over the tp ranks."""
    attention_core: bool = False
    """Kept by the attention kernel itself (q, k, v, its output and statistics, or eager
    attention's scores): what Megatron's selective recomputation drops and recomputes."""
    first_stage: bool = False
    """Kept by the embedding, so by the first pipeline stage, once per micro-batch in flight
    there; the other head items (final norm, LM head, loss) are the last stage's."""
    gathered_input: bool = False
    """The input of a column-parallel linear (QKV, MLP up, LM head) and its adapters'. Under
    sequence parallelism Megatron's linear saves the sequence-sharded input and all-gathers it
    again in backward; PyTorch's DTensor plan all-gathers it first (``PrepareModuleInput`` to
    ``Replicate``) and the linear saves the gathered tensor (``per_tp_rank``'s
    ``saves_gathered``)."""


def per_tp_rank(
    items: Iterable[Item], tp: int, sequence_parallel: bool, *, saves_gathered: bool = False
) -> float:
    """Bytes per token one tensor-parallel rank keeps of ``items``.

    Tensors inside the tensor-parallel region are split over the ``tp`` ranks; the others
    (``Item.tp_replicated``) only under sequence parallelism (Megatron's
    ``--sequence-parallel`` shards LayerNorm, dropout and the column-parallel linears' saved
    inputs by sequence, ``megatron/core/tensor_parallel/layers.py``,
    ``LinearWithGradAccumulationAndAsyncCommunication``, which all-gathers the sharded input
    again in backward; without it every rank keeps them whole). ``saves_gathered``: the
    engine's column-parallel linears save their all-gathered input (PyTorch DTensor tensor
    parallelism, as torchtitan applies it), so those items stay whole under sequence
    parallelism too.
    """

    def whole(i: Item) -> bool:
        return i.tp_replicated and (not sequence_parallel or (saves_gathered and i.gathered_input))

    return sum(i.bytes_per_token / (1 if whole(i) else tp) for i in items)


def _norm(shape: Shape, num: Numerics, tr: Trainable, where: str) -> list[Item]:
    h = shape.hidden
    a = num.act_bytes
    if num.compiled or num.fused_kernels:
        kind = "compiled" if num.compiled else "fused"
        # a fused kernel keeps its input as it comes: under autocast with fp32 parameters
        # the residual stream is fp32 (Transformer Engine's runs on 16-bit parameters)
        fp32_in = not num.compiled and num.autocast and not num.residual_16bit
        return [
            Item(
                name=f"{where} norm input ({kind})",
                bytes_per_token=(FP32 if fp32_in else a) * h + FP32,
                tp_replicated=True,
            )
        ]
    if shape.norm == "rmsnorm":
        # HF RMSNorm: x.to(float32); pow saves the fp32 x; weight * x.to(dtype) saves the cast
        items = [
            Item(name=f"{where} rmsnorm fp32 input", bytes_per_token=FP32 * h, tp_replicated=True)
        ]
        if tr.full:
            # under autocast the residual stream is fp32 (fp32 params): the normalised copy is fp32
            cast = FP32 if num.autocast else a
            items.append(
                Item(
                    name=f"{where} rmsnorm normalised (for weight grad)",
                    bytes_per_token=cast * h,
                    tp_replicated=True,
                )
            )
        return items
    # native layer_norm saves its input (fp32 under autocast) plus mean/rstd
    in_bytes = FP32 if num.autocast and not num.residual_16bit else a
    return [
        Item(
            name=f"{where} layernorm input",
            bytes_per_token=in_bytes * h + 2 * FP32,
            tp_replicated=True,
        )
    ]


def _linear_inputs(
    roles: Iterable[str],
    width: int,
    num: Numerics,
    tr: Trainable,
    where: str,
    *,
    fp32_input: bool = False,
    input_counted: bool = False,
    column_parallel: bool = False,
) -> list[Item]:
    """Input saved once for the linears sharing it, plus LoRA dropout copies.

    ``column_parallel``: the linears read the whole hidden state (QKV, MLP up), so under
    tensor parallelism without sequence parallelism every rank keeps all of their input.

    ``input_counted``: the input is a view of a tensor already kept (flash-attn's output
    read by the out-projection), so only the adapters' tensors are added.

    Under autocast an fp32 input (a norm output on the fp32 residual stream) is
    cast separately by each linear that reads it, and each keeps its own copy.
    """
    roles = list(roles)
    a = num.act_bytes
    items = []
    saving = [r for r in roles if tr.saves_input(r)]
    if saving and not input_counted:
        cast = num.autocast and fp32_input and not num.residual_16bit
        # autocast casts the fp32 input once per linear (a fused norm returns it in fp32 too);
        # a compiled graph casts it once for all of them
        copies = len(saving) if (cast and not num.compiled) else 1
        in_bytes = 1 if num.fp8_linear_inputs else a
        items.append(
            Item(
                name=f"{where} input ({'/'.join(saving)})"
                + (" (fp8)" if num.fp8_linear_inputs else ""),
                bytes_per_token=copies * in_bytes * width,
            )
        )
    lora = [r for r in roles if tr.lora_on(r)]
    if lora:
        mask = 1 if tr.lora_dropout > 0 else 0
        if tr.adapter_bytes != a:
            # PEFT casts each adapter's input to the adapter dtype; lora_A keeps that copy
            items.append(
                Item(
                    name=f"{where} LoRA input casts ({'/'.join(lora)})",
                    bytes_per_token=len(lora) * (tr.adapter_bytes + mask) * width,
                    lora=True,
                    branch=True,
                )
            )
        elif mask:
            # each adapter applies its own dropout: output copy + 1-byte mask
            items.append(
                Item(
                    name=f"{where} LoRA dropout ({'/'.join(lora)})",
                    bytes_per_token=len(lora) * (a + 1) * width,
                    lora=True,
                    branch=True,
                )
            )
        elif not any(tr.saves_input(r) for r in roles):
            items.append(
                Item(
                    name=f"{where} LoRA input ({'/'.join(lora)})",
                    bytes_per_token=a * width,
                    lora=True,
                )
            )
        items.append(
            Item(
                name=f"{where} LoRA A outputs",
                bytes_per_token=len(lora) * a * tr.lora_rank,
                lora=True,
                branch=True,
            )
        )
    return [
        dataclasses.replace(i, tp_replicated=column_parallel, gathered_input=column_parallel)
        for i in items
    ]


def _attention(shape: Shape, num: Numerics, tr: Trainable, seq: int, fused: bool) -> list[Item]:
    h, a = shape.hidden, num.act_bytes
    width_q = shape.heads * shape.head_dim
    width_kv = shape.kv_heads * shape.head_dim
    items = _norm(shape, num, tr, "attn")
    qkv_roles = ("qkv",) if any(lin.role == "qkv" for lin in shape.linears) else ("q", "k", "v")
    items += _linear_inputs(
        qkv_roles, h, num, tr, "attn qkv", fp32_input=True, column_parallel=True
    )
    repeat = shape.kv_heads < shape.heads and shape.family == "decoder" and not num.fused_kernels
    kv_saved = width_q if repeat else width_kv  # HF repeat_kv materialises full-width K/V
    outer = len(items)
    if fused:
        qkvo = 1 if num.fp8_attention else a  # fp8 attention keeps its fp8 casts
        tag = " (fp8)" if num.fp8_attention else ""
        items.append(
            Item(
                name=f"attn q, k, v (SDPA inputs){tag}",
                bytes_per_token=qkvo * (width_q + 2 * kv_saved),
            )
        )
        items.append(
            Item(
                name=f"attn SDPA output + logsumexp{tag}",
                bytes_per_token=qkvo * width_q + FP32 * shape.heads,
            )
        )
    else:
        sm_bytes = FP32 if num.autocast else a
        per_token_sq = shape.heads * seq  # one row of scores per head per token
        items.append(
            Item(name="attn q, k, v (matmul inputs)", bytes_per_token=a * (width_q + 2 * kv_saved))
        )
        if shape.model_type == "opt":
            # transformers' OPTAttention (2022-2023, PR #17437): scores + mask are clamped with
            # torch.max (maximum saves its input; fp32 under autocast, whose mask is fp32),
            # then softmax(dtype=float32) keeps its fp32 output and .to(float16) makes the
            # copy the probabilities-times-V matmul saves
            items.append(
                Item(
                    name="attn masked scores kept by the clamp (s^2)",
                    bytes_per_token=sm_bytes * per_token_sq,
                )
            )
            if num.autocast or num.fp16:
                sm_bytes = FP32 + a
        if shape.attention_softcapping:
            # Gemma 2's cap: tanh keeps its output for backward; the softmax runs in fp32
            # (``softmax(dtype=float32)``) and its cast back to the activation dtype is what
            # the product with V keeps (LitGPT ``scaled_dot_product_attention``, transformers'
            # eager ``Gemma2Attention``)
            items.append(
                Item(name="attn soft-cap tanh output (s^2)", bytes_per_token=a * per_token_sq)
            )
            sm_bytes = FP32 + a
        items.append(
            Item(name="attn softmax output (s^2)", bytes_per_token=sm_bytes * per_token_sq)
        )
        if shape.attn_dropout > 0:
            items.append(
                Item(
                    name="attn dropout mask + output (s^2)", bytes_per_token=(1 + a) * per_token_sq
                )
            )
    # what the attention kernel itself keeps: Megatron's selective checkpointing drops it
    items[outer:] = [dataclasses.replace(i, attention_core=True) for i in items[outer:]]
    o_roles = ("o",)
    items += _linear_inputs(
        o_roles,
        width_q,
        num,
        tr,
        "attn out-proj",
        # an fp8 linear keeps its own fp8 cast of the input, not a view of the attention output
        input_counted=fused and num.attention_output_shared and not num.fp8_linear_inputs,
    )
    if shape.hidden_dropout > 0:
        items.append(Item(name="attn residual dropout mask", bytes_per_token=h, tp_replicated=True))
    return items


def _mlp(shape: Shape, num: Numerics, tr: Trainable) -> list[Item]:
    h, a = shape.hidden, num.act_bytes
    k = shape.experts_per_token if shape.num_experts > 1 else 1
    f = shape.ffn
    items = [] if shape.parallel_attention else _norm(shape, num, tr, "mlp")
    up_roles = ("gate", "up") if shape.gated else ("fc1",)
    if shape.num_experts > 1:
        items.append(
            Item(name="moe router softmax (fp32)", bytes_per_token=FP32 * shape.num_experts)
        )
        if tr.full or any(tr.lora_on(r) for r in up_roles):
            # the experts' first linear keeps its input: under fp8 the cast it computed with
            # (Transformer Engine's GroupedLinear, as its Linear), and the 16-bit permuted
            # tokens are freed
            fp8 = num.fp8_linear_inputs
            items.append(
                Item(
                    name="moe gathered expert inputs" + (" (fp8)" if fp8 else ""),
                    bytes_per_token=k * (1 if fp8 else a) * h,
                )
            )
        items.append(
            Item(name="moe expert outputs (for routing-weight grad)", bytes_per_token=k * a * h)
        )
    else:
        items += _linear_inputs(
            up_roles, h, num, tr, "mlp up", fp32_input=True, column_parallel=True
        )
    if shape.gated and (num.compiled or num.fused_kernels):
        kind = "compiled" if num.compiled else "fused SwiGLU input"
        fp8_in = num.fp8_activation_input and not num.compiled
        kind += ", fp8" if fp8_in else ""
        width = 1 if fp8_in else a
        items.append(
            Item(name=f"mlp gate and up outputs ({kind})", bytes_per_token=k * 2 * width * f)
        )
    elif shape.gated:
        # act(gate) * up: activation saves its input; the product saves both factors
        items.append(Item(name="mlp gate output (activation input)", bytes_per_token=k * a * f))
        items.append(Item(name="mlp activation output + up output", bytes_per_token=k * 2 * a * f))
    elif (
        num.python_gelu
        and not num.compiled
        and not num.fused_kernels
        and shape.activation in ("gelu_new", "gelu_fast", "gelu_python")
    ):
        # 0.5*x*(1+tanh(c*(x+0.044715x^3))) in Python keeps x (for pow), tanh, 1+tanh and 0.5x;
        # under CUDA autocast pow runs in fp32, so x, tanh and 1+tanh are fp32 copies
        wide = FP32 if num.autocast else a
        items.append(Item(name="mlp fc1 output (pow input)", bytes_per_token=k * wide * f))
        items.append(
            Item(name="mlp python gelu tanh, 1+tanh, 0.5x", bytes_per_token=k * (2 * wide + a) * f)
        )
    else:
        items.append(Item(name="mlp fc1 output (activation input)", bytes_per_token=k * a * f))
    down_roles = ("down",) if shape.gated else ("fc2",)
    down = _linear_inputs(down_roles, f, num, tr, "mlp down")
    if num.compiled:  # the down-projection input is a pointwise product: recomputed
        down = [i for i in down if i.lora]
    items += [dataclasses.replace(i, bytes_per_token=i.bytes_per_token * k) for i in down]
    if shape.hidden_dropout > 0:
        items.append(Item(name="mlp residual dropout mask", bytes_per_token=h, tp_replicated=True))
    return items


@functools.lru_cache(maxsize=4096)
def layer_items_cached(
    shape: Shape, num: Numerics, tr: Trainable, seq: int, fused_attention: bool
) -> tuple[Item, ...]:
    """:func:`layer_items` memoised (shapes and settings repeat across a plan's candidates)."""
    return tuple(layer_items(shape, num, tr, seq=seq, fused_attention=fused_attention))


@functools.lru_cache(maxsize=4096)
def head_items_cached(shape: Shape, num: Numerics, tr: Trainable) -> tuple[Item, ...]:
    """:func:`head_items` memoised."""
    return tuple(head_items(shape, num, tr))


def layer_items(
    shape: Shape, num: Numerics, tr: Trainable, *, seq: int, fused_attention: bool
) -> list[Item]:
    """Saved tensors of one transformer layer, bytes per token."""
    return _attention(shape, num, tr, seq, fused_attention) + _mlp(shape, num, tr)


def op_sac_items(shape: Shape, num: Numerics) -> list[Item]:
    """What torchtitan's per-op selective checkpointing keeps per layer (bytes per token).

    Its policy saves the outputs of aten.mm (except every second one in forward order),
    of the SDPA kernels and of amax reductions, and recomputes everything else. torchao's
    Float8 linears call ``torch.mm`` on fp8 tensor subclasses; the checkpointing mode sees
    that ``aten.mm`` before the subclass turns it into ``_scaled_mm`` (dispatch modes run
    before subclasses), so fp8 runs keep the same (16-bit) outputs.
    """
    a = num.act_bytes
    width_q = shape.heads * shape.head_dim
    items = boundary_items(shape, num) + [
        Item(name="attention output (op SAC)", bytes_per_token=a * width_q),
        Item(name="attention logsumexp (op SAC)", bytes_per_token=FP32 * shape.heads),
    ]
    k = shape.experts_per_token if shape.num_experts > 1 else 1
    mms = [lin for lin in shape.linears if lin.role != "router"]
    for lin in mms[0::2]:
        copies = k if lin.count > 1 else 1
        items.append(
            Item(
                name=f"{lin.role} matmul output (op SAC)",
                bytes_per_token=a * lin.out_features * copies,
                # a row-parallel output (out-projection, MLP down) is whole after its reduction
                tp_replicated=lin.role in ("o", "down", "fc2"),
            )
        )
    return items


def boundary_items(shape: Shape, num: Numerics) -> list[Item]:
    """What full checkpointing keeps per layer: the layer's input hidden state."""
    return [
        Item(
            name="checkpointed layer input",
            bytes_per_token=num.act_bytes * shape.hidden,
            tp_replicated=True,
        )
    ]


def head_items(shape: Shape, num: Numerics, tr: Trainable) -> list[Item]:
    """Embedding output, final norm, LM head/logits and loss (per token)."""
    h, a = shape.hidden, num.act_bytes
    items: list[Item] = []
    if shape.hidden_dropout > 0:
        items.append(
            Item(
                name="embedding dropout mask",
                bytes_per_token=h,
                tp_replicated=True,
                first_stage=True,
            )
        )
    items += _norm(shape, num, tr, "final")
    if shape.family == "decoder":
        if tr.full:
            items.append(
                Item(
                    name="lm_head input",
                    bytes_per_token=a * h,
                    tp_replicated=True,
                    gathered_input=True,
                )
            )
        v = shape.vocab
        if num.fused_linear_loss:
            # Liger's fused_linear_cross_entropy_forward: grad_input (the hidden state's
            # gradient, in its dtype) is filled chunk by chunk in forward and kept for backward;
            # a chunk's logits (about as many elements as the hidden states) come and go
            items.append(
                Item(name="hidden-state gradient (fused linear loss)", bytes_per_token=a * h)
            )
            return items
        if shape.final_softcapping:
            # Gemma 2's capped logits, cap * tanh(logits / cap): tanh keeps its output
            # (transformers' Gemma2ForCausalLM; LitGPT's GPT.forward, per lm_head chunk)
            items.append(Item(name="logits soft-cap tanh output", bytes_per_token=a * v))
        if num.te_cross_entropy:
            items.append(
                Item(name="logits holding their gradient (TE loss)", bytes_per_token=a * v)
            )
            return items
        if num.fused_loss:
            items.append(Item(name="logits (fused loss input)", bytes_per_token=a * v))
            items.append(Item(name="loss logsumexp (fp32)", bytes_per_token=FP32))
            return items
        if num.logits_upcast_in_model:
            # fp32 logits: the loss keeps its fp32 input (compiled) or log_softmax output
            items.append(Item(name="fp32 logits / log_softmax (loss)", bytes_per_token=FP32 * v))
            return items
        if a < FP32 and not num.logits_released:
            # logits kept in the model output; the loss upcasts and log_softmax keeps fp32
            items.append(Item(name="logits (model output)", bytes_per_token=a * v))
        if not num.loss_is_compiled:
            items.append(Item(name="log_softmax output (fp32)", bytes_per_token=FP32 * v))
    return items


def backward_transient_per_token(shape: Shape, num: Numerics) -> float:
    """Extra bytes per token at the start of backward (loss and logits gradients)."""
    if shape.family != "decoder":
        return 0.0
    if num.te_cross_entropy or num.fused_linear_loss:
        # the gradient was written into the kept logits (TE) or computed for the hidden state
        # (a fused linear loss) during forward
        return 0.0
    if num.fused_loss:
        # flash-attn's cross-entropy backward writes the 16-bit logits gradient directly
        return num.act_bytes * shape.vocab
    if num.loss_grad_in_place:
        # the fp32 gradient overwrites the saved softmax; only its 16-bit cast is new
        return num.act_bytes * shape.vocab / max(1, num.loss_chunks)
    if num.loss_parallel and not num.loss_is_compiled:
        # zeros_like(x), exp(x) and their sum (or the product with the output gradient) live
        # at once beside the saved log-softmax; the 16-bit cast comes after x is released
        return 3 * FP32 * shape.vocab / max(1, num.loss_chunks)
    if num.loss_is_compiled and not num.logits_upcast_in_model:
        # a compiled loss that upcasts the logits itself fuses the backward of the upcast
        # and the log-softmax into one kernel writing the logits gradient in the logits
        # dtype: no fp32 gradient (a model that returns fp32 logits, as torchtune's, still
        # gets the fp32 gradient and casts it back outside the compiled loss)
        return num.act_bytes * shape.vocab / max(1, num.loss_chunks)
    # eager log_softmax + nll_loss: at ``_log_softmax_backward_data`` nll_loss's dense fp32
    # gradient (its input, still held by the autograd engine) and the new fp32 output live
    # beside the saved log-softmax (a head item): 8 bytes a logit on top of it, per chunk. The
    # cast back to the logits dtype comes after nll_loss's gradient is released (4 + 2 bytes).
    # Measured with a dispatch-level tracker of live storages (docs/accuracy.md, "The eager
    # loss's backward"); until 2026-12-05 this was the fp32 gradient plus its cast.
    return 2 * FP32 * shape.vocab / max(1, num.loss_chunks)
