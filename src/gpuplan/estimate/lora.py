"""LoRA target names to canonical linear roles, and adapter sizes."""

from __future__ import annotations

from collections.abc import Iterable

from gpuplan.errors import SpecError
from gpuplan.estimate.shape import Shape

_ROLE_OF_NAME: dict[str, tuple[str, ...]] = {
    "q_proj": ("q",),
    "q": ("q",),
    "query": ("q",),
    "wq": ("q",),
    "q_lin": ("q",),
    "k_proj": ("k",),
    "k": ("k",),
    "key": ("k",),
    "wk": ("k",),
    "k_lin": ("k",),
    "v_proj": ("v",),
    "v": ("v",),
    "value": ("v",),
    "wv": ("v",),
    "v_lin": ("v",),
    "o_proj": ("o",),
    "out_proj": ("o",),
    "wo": ("o",),
    "o": ("o",),
    "attention.output.dense": ("o",),
    "c_attn": ("qkv",),
    "query_key_value": ("qkv",),
    "wqkv": ("qkv",),
    "qkv_proj": ("qkv",),
    "gate_proj": ("gate",),
    "w1": ("gate",),
    "gate": ("gate",),
    "up_proj": ("up",),
    "w3": ("up",),
    "up": ("up",),
    "gate_up_proj": ("gate", "up"),
    "down_proj": ("down",),
    "w2": ("down",),
    "down": ("down",),
    "fc1": ("fc1",),
    "c_fc": ("fc1",),
    "fc_in": ("fc1",),
    "dense_h_to_4h": ("fc1",),
    "intermediate.dense": ("fc1",),
    "up_proj_fc": ("fc1",),
    "fc2": ("fc2",),
    "fc_out": ("fc2",),
    "dense_4h_to_h": ("fc2",),
    "output.dense": ("fc2",),
    # GPT-2 and Phi name both the attention output and MLP output projections c_proj/dense
    "c_proj": ("o", "fc2"),
    "dense": ("o", "fc2"),
    "lm_head": ("head",),
}
ALL_ROLES = ("q", "k", "v", "qkv", "o", "gate", "up", "down", "fc1", "fc2")


def lora_roles(targets: Iterable[str], shape: Shape) -> frozenset[str]:
    """Canonical roles adapted by ``targets`` on this model.

    Fused projections (GPT-2 ``c_attn``) are adapted whole when any of q/k/v is named.
    """
    roles: set[str] = set()
    for name in targets:
        key = name.strip().lower()
        if key in ("all-linear", "all_linear", "all"):
            roles.update(ALL_ROLES)
            continue
        found = _ROLE_OF_NAME.get(key) or _ROLE_OF_NAME.get(key.rsplit(".", 1)[-1])
        if found is None:
            raise SpecError(
                f"lora.targets: unknown module name {name!r}",
                hint="use names such as q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
                "c_attn, query_key_value, or all-linear",
            )
        roles.update(found)
    present = {lin.role for lin in shape.linears}
    if "qkv" in present and roles & {"q", "k", "v"}:
        roles.add("qkv")
    if "qkv" not in present and "qkv" in roles:
        roles.update({"q", "k", "v"})
    if "gate_up" in present and roles & {"gate", "up"}:
        roles.add("gate_up")
    roles &= present | {"head"}
    if not roles:
        raise SpecError(
            f"lora.targets: none of {list(targets)} is a linear layer of {shape.model_id}",
            hint=f"this model's linear roles are {sorted(present)}",
        )
    return frozenset(roles)


def adapter_params_per_layer(shape: Shape, roles: frozenset[str], rank: int) -> int:
    """LoRA A and B elements per layer: r x (in + out) per adapted matrix."""
    return sum(
        lin.count * rank * (lin.in_features + lin.out_features)
        for lin in shape.linears
        if lin.role in roles
    )


def expert_adapter_params_per_layer(shape: Shape, roles: frozenset[str], rank: int) -> int:
    """Of :func:`adapter_params_per_layer`, the adapters on the experts' linears (all experts)."""
    return sum(
        lin.count * rank * (lin.in_features + lin.out_features)
        for lin in shape.linears
        if lin.role in roles and lin.count > 1
    )
