"""The optimizer step of a per-parameter loop: one kernel per op per tensor.

A ``for-loop`` optimizer (``torch.optim.AdamW(foreach=False)``, Hugging Face's ``adamw_hf`` and
``Adafactor``) updates one parameter tensor at a time, each op a kernel of its own. A large
weight's kernels stream its bytes; a bias's or a norm's finish in far less than a launch, so the
loop's time is the sum over tensors of the larger of the two. The foreach and fused kernels
(``multi_tensor_apply``) batch the tensors and are priced by their bytes alone.
"""

from __future__ import annotations

from gpuplan.estimate.shape import Shape

FORLOOP_KERNELS: dict[str, tuple[int, int]] = {
    "adamw": (8, 8),
    "sgd-momentum": (4, 4),
    "sgd": (1, 1),
    "adafactor": (16, 24),
}
"""CUDA kernels one tensor's step launches, (vector, matrix): counted with a TorchDispatchMode over
a second step of a one-tensor and a two-tensor model (the difference), torch 2.13's AdamW and SGD
with ``foreach=False`` and transformers 5.24's Adafactor. AdamW: ``param.mul_`` (weight decay),
``exp_avg.lerp_``, ``exp_avg_sq.mul_().addcmul_()``, ``sqrt``, ``div``, ``add_`` (eps),
``param.addcdiv_`` (the step counter's increment is a CPU tensor's); Hugging Face's ``adamw_hf``
runs the same eight. SGD with momentum and weight decay: ``grad.add``, ``buf.mul_().add_()``,
``param.add_``. Adafactor factors a matrix's second moment into row and column means (24 ops) and
keeps a vector's whole (16). Optimizers not listed (8-bit, Lion) run one fused kernel per
tensor or are not counted: their loop is priced by bytes alone."""


def forloop_step_s(
    shape: Shape,
    optimizer: str,
    *,
    full: bool,
    lora_roles: frozenset[str],
    lora_rank: int,
    layers: int,
    tp: int,
    bytes_per_param: float,
    bw: float,
    launch: float,
) -> float | None:
    """Seconds of one step of a per-parameter loop over the trainable tensors of ``layers``
    layers (and, for a full fine-tune, the embedding and head), each split over ``tp`` ranks;
    ``bw`` the achieved bandwidth, ``launch`` one kernel's launch. None for an optimizer whose
    loop is not counted (:data:`FORLOOP_KERNELS`). Norm tensors are the layer's parameters
    outside its linears, one per ``hidden`` elements."""
    if optimizer not in FORLOOP_KERNELS:
        return None
    vec, mat = FORLOOP_KERNELS[optimizer]

    def t(elements: float, kernels: int) -> float:
        """One tensor of ``elements`` (before the tp split): its bytes or its launches."""
        return max(elements / tp * bytes_per_param / bw, kernels * launch)

    per_layer = 0.0
    if full:
        in_linears = 0
        for lin in shape.linears:
            per_layer += lin.count * t(lin.in_features * lin.out_features, mat)
            if lin.bias:
                per_layer += lin.count * t(lin.out_features, vec)
            in_linears += lin.params
        norms = round(max(0, shape.params_per_layer - in_linears) / shape.hidden)
        per_layer += norms * t(shape.hidden, vec)
        outside = t(shape.params_embedding, mat)
        if shape.params_head:
            outside += t(shape.params_head, mat)
        if shape.params_final_norm:
            outside += t(shape.hidden, vec)
        return layers * per_layer + outside
    for lin in shape.linears:
        if lin.role in lora_roles:
            per_layer += lin.count * (
                t(lora_rank * lin.in_features, mat) + t(lora_rank * lin.out_features, mat)
            )
    return layers * per_layer
