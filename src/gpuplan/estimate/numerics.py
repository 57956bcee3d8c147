"""Bytes per element of weights, gradients and optimizer state, by precision and optimizer.

Sources: PyTorch AMP keeps fp32 parameters and gradients and casts weights to
16 bits inside autocast (the casts are cached and kept for backward);
``*-true`` modes (Lightning/litgpt, torchtune) keep everything in 16 bits and
torch optimizers keep state in the parameter dtype; ``fp8-mixed``
(Transformer Engine with Megatron) keeps bf16 weights, fp32 main gradients and
an fp32 master copy. Optimizer state sizes: Adam(W) two moments, SGD with
momentum one buffer, Lion one, bitsandbytes 8-bit Adam two 1-byte moments
(Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"),
Adafactor factored second moments (Shazeer & Stern 2018). QLoRA NF4 with
double quantization costs 4.127 bits per weight (Dettmers et al. 2023), 4.5
without.
"""

from __future__ import annotations

import dataclasses

from gpuplan.estimate.activations import Numerics


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionBytes:
    """Storage of one precision mode (bytes per element)."""

    param: int
    grad: int
    state: int
    master: int
    compute_copy: int
    act: int
    autocast: bool

    @property
    def numerics(self) -> Numerics:
        """The activation numerics of this mode."""
        return Numerics(act_bytes=self.act, autocast=self.autocast)


PRECISIONS: dict[str, PrecisionBytes] = {
    "fp32": PrecisionBytes(
        param=4, grad=4, state=4, master=0, compute_copy=0, act=4, autocast=False
    ),
    "tf32": PrecisionBytes(
        param=4, grad=4, state=4, master=0, compute_copy=0, act=4, autocast=False
    ),
    "fp16-mixed": PrecisionBytes(
        param=4, grad=4, state=4, master=0, compute_copy=2, act=2, autocast=True
    ),
    "bf16-mixed": PrecisionBytes(
        param=4, grad=4, state=4, master=0, compute_copy=2, act=2, autocast=True
    ),
    "fp16-true": PrecisionBytes(
        param=2, grad=2, state=2, master=0, compute_copy=0, act=2, autocast=False
    ),
    "bf16-true": PrecisionBytes(
        param=2, grad=2, state=2, master=0, compute_copy=0, act=2, autocast=False
    ),
    "fp8-mixed": PrecisionBytes(
        param=2, grad=4, state=4, master=4, compute_copy=1, act=2, autocast=False
    ),
}

NF4_BYTES_DQ = (4 + 0.127) / 8
"""NF4 weight with double-quantized absmax constants (QLoRA paper, section 3)."""
NF4_BYTES = (4 + 32 / 64) / 8
"""NF4 weight with one fp32 absmax per 64-weight block."""


def optimizer_state_bytes(optimizer: str, state_bytes: int) -> float:
    """Optimizer state bytes per trainable element (Adafactor handled by the caller).

    >>> optimizer_state_bytes("adamw", 4)
    8
    """
    if optimizer == "adamw":
        return 2 * state_bytes
    if optimizer == "adamw-8bit":
        return 2 + 2 * 4 / 2048  # two int8 moments + fp32 block absmax per 2048
    if optimizer in ("sgd-momentum", "lion"):
        return state_bytes
    if optimizer in ("sgd", "adafactor"):
        return 0
    raise ValueError(f"optimizer: unknown {optimizer!r}")


def optimizer_temp_bytes(optimizer: str, state_bytes: int) -> float:
    """Transient bytes per trainable element in the optimizer step.

    torch's foreach Adam/AdamW (the CUDA default) materialises ``sqrt(v)`` for
    every parameter at once; Lion materialises the interpolated update. The
    bitsandbytes 8-bit kernels and SGD update in place.
    """
    if optimizer in ("adamw", "lion"):
        return state_bytes
    return 0
