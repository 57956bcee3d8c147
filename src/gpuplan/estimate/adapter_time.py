"""Time of the LoRA adapter branch that runs beside each adapted linear.

An adapted linear computes ``base(x) + B(A(dropout(x))) * scaling``: PEFT's
``lora.Linear.forward`` (``src/peft/tuners/lora/layer.py``) and ``lora.Linear4bit.forward``
(``src/peft/tuners/lora/bnb.py``), torchtune's ``LoRALinear.forward``
(``torchtune/modules/peft/lora.py``), LitGPT's ``LoRALinear.forward`` (``litgpt/lora.py``) and
Megatron-Bridge / NeMo's ``ParallelLinearAdapter.forward`` all run these as separate eager ops.
With a rank in the tens the two adapter GEMMs are thin (memory-bound in 16 bits) and the
branch's element-wise ops each read and write a whole activation of the linear's input or
output width, so the branch costs its traffic, not its FLOPs. The frozen base skips its
weight gradient, which the GEMM term already prices; this module adds what the adapters do.

Per token and adapted linear, with ``d_in`` / ``d_out`` its widths on this rank:

forward
    PEFT casts ``x`` to the adapters' dtype when they differ (``_cast_input_dtype``; not for a
    4-bit base under autocast); dropout reads and writes it and writes a 1-byte mask; autocast
    casts the fp32 input to 16 bits for ``A``; ``A`` reads it; ``B`` writes ``d_out``; the
    scaling reads and writes it; the add reads both and writes the sum. PEFT's ``Linear``
    adds an fp32 adapter output to the 16-bit result without autocast, so the sum is fp32
    and ``result.to(torch_result_dtype)`` casts it back; PEFT's ``Linear4bit`` instead clones
    the base output ("defensively") and casts the adapter output before the add.
backward
    each cast, the scaling and the dropout read and write the gradient once more; ``B``'s two
    gradients read the output gradient twice; ``A``'s write the input gradient and read the
    input; the branch's input gradient is summed into ``x``'s (read two, write one).
"""

from __future__ import annotations

import dataclasses

from gpuplan.estimate.calibration import ArchEfficiency
from gpuplan.estimate.shape import Shape

ROW_PARALLEL_ROLES = frozenset({"o", "down", "fc2"})
"""Linears whose input is split under tensor parallelism (their output is whole)."""
NORM_FED_ROLES = frozenset({"q", "k", "v", "qkv", "gate", "up", "gate_up", "fc1"})
"""Linears that read a norm's output: fp32 under autocast with fp32 parameters."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AdapterImpl:
    """How an engine runs the adapter branch (which casts and copies it makes)."""

    adapter_bytes: int
    """Bytes of an adapter weight element (PEFT: 4, its ``autocast_adapter_dtype`` default)."""
    act_bytes: int
    """Bytes of the base linear's output (the activation dtype)."""
    autocast: bool
    """torch autocast: the adapter GEMMs run in 16 bits and write 16-bit outputs."""
    dropout: bool
    """Adapter dropout above zero (``nn.Identity`` otherwise: no pass, no mask)."""
    peft: bool
    """PEFT's casts (input to the adapter dtype, fp32 sum cast back) apply."""
    four_bit_base: bool = False
    """PEFT's ``Linear4bit``: the base output is cloned, no input cast under autocast."""
    compiled: bool = False
    """torch.compile (Inductor) fuses the branch's pointwise ops: each cast rides in the kernel
    that consumes it, the scaling in the add (forward) and in the gradient it scales
    (backward), the dropout's backward in the sum into ``x``'s gradient."""
    fused_qkv: bool = False
    """The engine runs q, k and v as one fused linear (Megatron's ``linear_qkv``), so LoRA on
    any of them is one adapter that reads the input once and writes their joint width."""
    fp32_stream: bool = False
    """The norms are fp32 modules, so the residual stream runs in fp32 (see
    :func:`fp32_stream_cast_bytes`): QLoRA through PEFT/TRL."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AdapterPasses:
    """One adapted linear's branch, per token: element-wise bytes and GEMM passes."""

    forward_bytes: float
    backward_bytes: float
    forward_gemms: tuple[tuple[float, float], ...]
    """(FLOPs, bytes) of each forward GEMM pass."""
    backward_gemms: tuple[tuple[float, float], ...]
    forward_kernels: int
    """Element-wise kernels (each GEMM pass pays its own launch)."""
    backward_kernels: int


def adapter_passes(
    d_in: float, d_out: float, rank: int, impl: AdapterImpl, *, input_bytes: int
) -> AdapterPasses:
    """The branch of one adapted linear of widths ``d_in`` -> ``d_out``, per token.

    ``input_bytes`` is the dtype of ``x`` as the linear receives it (4 for a norm output on an
    fp32 residual stream under autocast).
    """
    a = impl.act_bytes
    c = impl.adapter_bytes
    fused = impl.compiled
    fwd = bwd = 0.0
    kf = kb = 0
    xd = input_bytes
    if impl.peft and not (impl.four_bit_base and impl.autocast) and c != xd:
        if not fused:
            fwd += (xd + c) * d_in  # x.to(adapter dtype)
            bwd += (c + input_bytes) * d_in
            kf, kb = kf + 1, kb + 1
        xd = c
    if impl.dropout:
        fwd += (2 * xd + 1) * d_in
        kf += 1
        if fused:
            bwd += d_in  # the mask, read in the fused gradient sum
        else:
            bwd += (2 * xd + 1) * d_in
            kb += 1
    gd = xd
    if impl.autocast and xd != 2:
        if not fused:
            fwd += (xd + 2) * d_in  # autocast's 16-bit copy for A
            bwd += (2 + xd) * d_in
            kf, kb = kf + 1, kb + 1
        gd = 2
    e = 2 if impl.autocast else (c if impl.peft else a)
    forward_gemms = ((2.0 * rank * d_in, gd * d_in), (2.0 * rank * d_out, e * d_out))
    backward_gemms = (
        (2.0 * rank * d_out, e * d_out),  # B: input gradient
        (2.0 * rank * d_out, e * d_out),  # B: weight gradient
        (2.0 * rank * d_in, gd * d_in),  # A: input gradient (written)
        (2.0 * rank * d_in, gd * d_in),  # A: weight gradient (reads the input)
    )
    if not fused:
        fwd += 2 * e * d_out  # * scaling
        bwd += 2 * e * d_out
        kf, kb = kf + 1, kb + 1
    if impl.four_bit_base:
        fwd += 2 * a * d_out  # result.clone()
        kf += 1
        if not impl.autocast and e != a:
            if not fused:
                fwd += (e + a) * d_out  # output.to(expected_dtype) before the add
                bwd += (a + e) * d_out
                kf, kb = kf + 1, kb + 1
            e = a
    s = max(a, e)
    fwd += (a + e + (a if fused else s)) * d_out  # result + adapter output
    kf += 1
    if s != a and not fused:
        fwd += (s + a) * d_out  # result.to(torch_result_dtype)
        bwd += (a + s) * d_out + (s + a) * d_out  # its backward; the add's cast for result
        kf, kb = kf + 1, kb + 2
    bwd += 3 * input_bytes * d_in  # the branch's input gradient summed into x's
    kb += 1
    return AdapterPasses(
        forward_bytes=fwd,
        backward_bytes=bwd,
        forward_gemms=forward_gemms,
        backward_gemms=backward_gemms,
        forward_kernels=kf,
        backward_kernels=kb,
    )


def fp32_stream_cast_bytes(shape: Shape, tp: int, experts_per_token: int = 1) -> float:
    """Bytes per token and layer, forward, that an fp32 stream's casts move around 4-bit linears.

    PEFT's ``prepare_model_for_kbit_training`` (``src/peft/utils/other.py``) casts every
    non-4-bit parameter to fp32, and TRL's SFTTrainer (``peft_module_casting_to_bf16``) keeps the
    norms in fp32 under ``bf16``. An RMSNorm returns ``weight * x.to(input_dtype)``, fp32 with an
    fp32 weight; bitsandbytes' ``Linear4bit.forward`` casts its input to the compute dtype and
    its output back to the input's (``out.to(inp_dtype)``), so every linear fed by a norm or by
    the fp32 MLP product writes fp32 and the residual adds promote the stream to fp32. Each such
    linear then casts its input (read 4, write 2 bytes) and its output (read 2, write 4);
    flash attention casts the fp32 q, k, v to 16 bits (transformers' ``_flash_attention_forward``
    "silently casted in float32" path). The out-projection reads attention's 16-bit output and
    makes no casts. Backward casts each gradient back: the same bytes again. The element-wise
    ops between them (RoPE, the gated activation, the residual adds) then run in fp32, which
    the caller prices by timing the saved activations at 4 bytes.
    """
    total = 0.0
    for lin in shape.linears:
        if lin.role in ("o", "router"):
            continue
        d_in = lin.in_features / tp if lin.role in ROW_PARALLEL_ROLES else lin.in_features
        d_out = lin.out_features if lin.role in ROW_PARALLEL_ROLES else lin.out_features / tp
        total += 6.0 * (d_in + d_out) * (experts_per_token if lin.count > 1 else 1)
        if lin.role in ("q", "k", "v", "qkv"):
            total += 6.0 * d_out  # flash attention's cast to 16 bits
    return total


def _adapted(
    shape: Shape, roles: frozenset[str], fused_qkv: bool
) -> list[tuple[str, float, float, int]]:
    """(role, input width, output width, count) of each adapter in a layer, whole (before
    tensor parallelism); separate q, k, v adapters merge into one under ``fused_qkv``."""
    out: list[tuple[str, float, float, int]] = []
    qkv_out = 0.0
    qkv_in = 0.0
    for lin in shape.linears:
        if lin.role not in roles:
            continue
        if fused_qkv and lin.role in ("q", "k", "v"):
            qkv_in = float(lin.in_features)
            qkv_out += lin.out_features
            continue
        out.append((lin.role, float(lin.in_features), float(lin.out_features), lin.count))
    if qkv_out:
        out.append(("qkv", qkv_in, qkv_out, 1))
    return out


def _pass_time(flops: float, nbytes: float, peak: float, bw: float, eff: ArchEfficiency) -> float:
    """A thin GEMM pass: the slower of its FLOPs at the GEMM ceiling and its bytes at HBM's."""
    return max(flops / (peak * eff.gemm), nbytes / (bw * eff.hbm)) + eff.kernel_overhead_s


def adapter_layer_time(
    shape: Shape,
    roles: frozenset[str],
    rank: int,
    impl: AdapterImpl,
    *,
    tokens: float,
    tp: int,
    experts_per_token: int,
    peak: float,
    bw: float,
    eff: ArchEfficiency,
) -> tuple[float, float]:
    """Forward, and forward plus backward, seconds of one layer's adapter branches.

    ``peak`` is the FLOP/s the adapter GEMMs run at (the 16-bit peak under autocast or with
    16-bit adapters, the fp32 non-tensor peak for fp32 adapters without autocast: PyTorch
    leaves TF32 off for matmuls by default).
    """
    t_fwd = t_all = 0.0
    hbm = bw * eff.hbm
    for role, d_in, d_out, count in _adapted(shape, roles, impl.fused_qkv):
        if role in ROW_PARALLEL_ROLES:
            d_in /= tp
        else:
            d_out /= tp
        copies = experts_per_token if count > 1 else 1
        rows = tokens * copies
        norm_fed = impl.autocast and role in NORM_FED_ROLES
        p = adapter_passes(d_in, d_out, rank, impl, input_bytes=4 if norm_fed else impl.act_bytes)
        fwd = p.forward_bytes * rows / hbm + p.forward_kernels * eff.kernel_overhead_s
        fwd += sum(_pass_time(f * rows, b * rows, peak, bw, eff) for f, b in p.forward_gemms)
        bwd = p.backward_bytes * rows / hbm + p.backward_kernels * eff.kernel_overhead_s
        bwd += sum(_pass_time(f * rows, b * rows, peak, bw, eff) for f, b in p.backward_gemms)
        t_fwd += fwd
        t_all += fwd + bwd
    if impl.fp32_stream:
        casts = fp32_stream_cast_bytes(shape, tp, experts_per_token) * tokens / hbm
        launches = 2 * sum(1 for lin in shape.linears if lin.role not in ("o", "router"))
        t_fwd += casts + launches * eff.kernel_overhead_s
        t_all += 2 * (casts + launches * eff.kernel_overhead_s)
    return t_fwd, t_all
