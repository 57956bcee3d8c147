"""Trace two training iterations of the real model and read the memory peak.

What is forced to match a GPU run (``reference/estimators.md``, section 4):
fused attention through the CUDA kernels' meta implementations (flash for
16-bit, memory-efficient for fp32) instead of SDPA's math path, foreach
optimizers, CUDA autocast rules for ``*-mixed`` (:mod:`.autocast`), and the
first iteration discarded (optimizer state appears only after step 1).

Models with many layers are traced with 1 and 2 layers and extrapolated
linearly per layer (the result says so). Sharding, tensor and pipeline
parallelism and runtime overheads are applied analytically on top of the
traced single-device numbers.
"""

from __future__ import annotations

import dataclasses
import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

from gpuplan.errors import GpuPlanError, MissingInputError, SpecError

MAX_TRACED_PARAMS = 9e9
"""Above this the model is traced with 1 and 2 layers and extrapolated."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TraceResult:
    """Steady-state peaks of a traced step, bytes, by MemTracker category."""

    peak_bytes: float
    categories_at_peak: dict[str, float]
    activations_after_forward: float
    layers_traced: tuple[int, ...]
    extrapolated: bool
    wall_s: float


def _require_torch() -> Any:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise MissingInputError(
            "--trace: needs torch and transformers",
            hint="pip install 'gpuplan[trace]' (install torch==2.13.0 first for the CPU build)",
        ) from exc
    transformers.logging.set_verbosity_error()  # its notices would corrupt --json output
    return torch


def hf_config_dict(model_ref: str) -> dict[str, Any]:
    """The Hugging Face config of a preset (shipped JSON) or a config.json path."""
    path = Path(model_ref)
    if path.suffix == ".json" and path.is_file():
        from gpuplan.userfile import read_json

        data: dict[str, Any] = read_json(path, what="model", error=SpecError)
        return data
    from gpuplan.models import load_model

    cfg = load_model(model_ref)
    node = resources.files("gpuplan.models").joinpath("data", f"{cfg.id}.json")
    if not node.is_file():
        raise SpecError(
            f"--trace: no Hugging Face config shipped for {cfg.id}", hint="pass a config.json path"
        )
    data = json.loads(node.read_text(encoding="utf-8"))
    return data


def _register_fused_attention() -> str:
    import torch
    from transformers import AttentionInterface

    def fused(
        module: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **_: Any,
    ) -> tuple[Any, None]:
        from gpuplan.trace.autocast import CudaAutocast

        if CudaAutocast.active is not None:  # SDPA is on CUDA autocast's lower-precision list
            query, key, value = (t.to(CudaAutocast.active) for t in (query, key, value))
        n_rep = query.shape[1] // key.shape[1]
        if n_rep > 1:  # as transformers' sdpa path does (repeat_kv)
            b, kvh, s, d = key.shape
            key = key[:, :, None].expand(b, kvh, n_rep, s, d).reshape(b, kvh * n_rep, s, d)
            value = value[:, :, None].expand(b, kvh, n_rep, s, d).reshape(b, kvh * n_rep, s, d)
        causal = bool(getattr(module, "is_causal", True)) if is_causal is None else is_causal
        if query.dtype in (torch.bfloat16, torch.float16):
            out = torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout, causal, False, scale=scaling
            )[0]
        else:
            out = torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, None, False, dropout, causal, scale=scaling
            )[0]
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("gpuplan_fused", fused)
    return "gpuplan_fused"


def _apply_lora(
    model: Any, targets: tuple[str, ...], rank: int, alpha: float, dropout: float
) -> None:
    """Freeze the model and wrap target linears with LoRA adapters (PEFT's layout)."""
    import torch
    from torch import nn

    class LoraLinear(nn.Module):
        def __init__(self, base: nn.Linear) -> None:
            super().__init__()
            self.base = base
            self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            self.lora_A = nn.Linear(
                base.in_features, rank, bias=False, device=base.weight.device, dtype=torch.float32
            )
            self.lora_B = nn.Linear(
                rank, base.out_features, bias=False, device=base.weight.device, dtype=torch.float32
            )
            self.scale = alpha / rank

        def forward(self, x: Any) -> Any:
            out = self.base(x)
            lora = self.lora_B(self.lora_A(self.drop(x).to(self.lora_A.weight.dtype))) * self.scale
            return out + lora.to(out.dtype)

    for p in model.parameters():
        p.requires_grad_(False)
    names = {t.lower() for t in targets}
    everything = bool(names & {"all-linear", "all_linear", "all"})
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if (
                isinstance(child, nn.Linear)
                and child_name != "lm_head"
                and (everything or child_name.lower() in names)
            ):
                setattr(parent, child_name, LoraLinear(child))


def _optimizer(name: str, params: list[Any]) -> Any:
    import torch

    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-3, relative_step=False, scale_parameter=False)
    raise SpecError(
        f"--trace: optimizer {name} needs a package that is not traced (bitsandbytes or lion)",
        hint="drop --trace for the analytic estimate",
    )


def _build(config: dict[str, Any], layers: int | None, dtype: Any, family: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    cfg = dict(config)
    model_type = cfg.pop("model_type")
    for key in (
        "architectures",
        "transformers_version",
        "auto_map",
        "_name_or_path",
        "torch_dtype",
        "dtype",
    ):
        cfg.pop(key, None)
    hf = AutoConfig.for_model(model_type, **cfg)
    if layers is not None:
        for key in ("num_hidden_layers", "n_layer", "n_layers", "num_layers"):
            if hasattr(hf, key):
                setattr(hf, key, layers)
        if getattr(hf, "layer_types", None):
            hf.layer_types = hf.layer_types[:layers]
    attn = _register_fused_attention()
    with torch.device("meta"):
        cls = AutoModelForCausalLM if family == "decoder" else AutoModel
        model = cls.from_config(hf, dtype=dtype, attn_implementation=attn)
    model.train()
    return model


def _trace_once(
    config: dict[str, Any], spec: Any, family: str, layers: int | None, seq: int, batch: int
) -> tuple[float, dict[str, float], float]:
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from gpuplan.trace.autocast import CudaAutocast

    low = {"bf16": torch.bfloat16, "fp16": torch.float16}
    mixed = spec.precision.endswith("-mixed")
    if spec.precision in ("fp32", "tf32") or mixed:
        param_dtype = torch.float32
    else:
        param_dtype = low[spec.compute_dtype]
    if spec.method != "full":
        param_dtype = (
            torch.float32
            if spec.precision in ("fp32", "tf32")
            else low.get(spec.compute_dtype, torch.bfloat16)
        )
    model = _build(config, layers, param_dtype, family)
    if spec.activation_checkpointing != "none":
        # transformers 5 renamed gradient_checkpointing_enable (deprecated) to activation_*
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if spec.method == "lora":
        _apply_lora(model, spec.lora.targets, spec.lora.rank, spec.lora.alpha, spec.lora.dropout)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = _optimizer(spec.optimizer, trainable)
    vocab = int(getattr(model.config, "vocab_size", 32000))
    ids = torch.randint(0, vocab, (batch, seq), device="meta")
    tracker = MemTracker()
    tracker.track_external(model, opt)

    class _NoHook:
        def remove(self) -> None:
            """Nothing to remove: frozen parameters get no gradient hook."""

    # MemTracker hooks every parameter's gradient; frozen (LoRA base) ones cannot take a hook
    for param in model.parameters():
        if not param.requires_grad:
            tracker._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())
    cast = CudaAutocast(low[spec.compute_dtype]) if mixed else None
    peak = 0.0
    at_peak: dict[str, float] = {}
    act_fw = 0.0
    with tracker:
        for it in range(2):
            if cast is not None:
                cast.clear_cache()
                with cast:
                    out = (
                        model(input_ids=ids, labels=ids)
                        if family == "decoder"
                        else model(input_ids=ids)
                    )
            else:
                out = (
                    model(input_ids=ids, labels=ids)
                    if family == "decoder"
                    else model(input_ids=ids)
                )
            loss = out.loss if family == "decoder" else out.last_hidden_state.float().pow(2).mean()
            loss.backward()
            del out, loss
            opt.step()
            opt.zero_grad(set_to_none=True)
            if it == 0:
                tracker.reset_mod_stats()
    meta = torch.device("meta")
    for state, snaps in tracker.memory_tracking[model].snapshots.items():
        for snap in snaps if isinstance(snaps, list) else [snaps]:
            dev = snap.get(meta, {})
            total = float(dev.get("Total", 0.0))
            if "POST_FW" in str(state):
                act_fw = max(act_fw, float(sum(v for k, v in dev.items() if "ACT" in str(k))))
            if total > peak:
                peak = total
                at_peak = {
                    str(k).split(".")[-1].lower(): float(v)
                    for k, v in dev.items()
                    if str(k) != "Total"
                }
    overall = tracker.get_tracker_snapshot("peak").get(meta, {})
    overall_total = float(overall.get("Total", 0.0))
    if overall_total > peak:
        peak = overall_total
        at_peak = {
            str(k).split(".")[-1].lower(): float(v) for k, v in overall.items() if str(k) != "Total"
        }
    return peak, at_peak, act_fw


def trace_memory(spec: Any) -> TraceResult:
    """Trace the spec's model on meta and return the steady-state single-device peak."""
    _require_torch()
    from gpuplan.estimate.fit import model_shape, sequence_length

    shape = model_shape(spec.model)
    if shape.family not in ("decoder", "encoder"):
        raise SpecError(
            f"--trace: traces Hugging Face text models; {shape.model_id} is a {shape.family} model",
            hint="drop --trace for the analytic estimate",
        )
    if spec.method == "qlora":
        raise SpecError(
            "--trace: qlora needs bitsandbytes kernels, which are not traced",
            hint="drop --trace for the analytic estimate",
        )
    config = hf_config_dict(spec.model)
    seq = sequence_length(spec, shape)
    start = time.perf_counter()
    try:
        if shape.params_total <= MAX_TRACED_PARAMS:
            peak, cats, act = _trace_once(
                config, spec, shape.family, None, seq, spec.micro_batch_size
            )
            layers: tuple[int, ...] = (shape.layers,)
            extrapolated = False
        else:
            p1, c1, a1 = _trace_once(config, spec, shape.family, 1, seq, spec.micro_batch_size)
            p2, c2, a2 = _trace_once(config, spec, shape.family, 2, seq, spec.micro_batch_size)
            n = shape.layers - 1
            peak = p1 + n * (p2 - p1)
            cats = {
                k: c1.get(k, 0.0) + n * (c2.get(k, 0.0) - c1.get(k, 0.0)) for k in set(c1) | set(c2)
            }
            act = a1 + n * (a2 - a1)
            layers, extrapolated = (1, 2), True
    except GpuPlanError:
        raise
    except Exception as exc:  # noqa: BLE001 - a model the tracer cannot run is a user-facing limit
        raise SpecError(
            f"--trace: tracing {shape.model_id} failed: {type(exc).__name__}: {exc}",
            hint="drop --trace for the analytic estimate",
        ) from exc
    return TraceResult(
        peak_bytes=peak,
        categories_at_peak=cats,
        activations_after_forward=act,
        layers_traced=layers,
        extrapolated=extrapolated,
        wall_s=time.perf_counter() - start,
    )


def trace_fit(spec: Any, analytic: Any) -> Any:
    """Replace an analytic FitResult's single-device numbers with traced ones.

    The traced peak is taken as the model part of ``peak_allocated``; sharding
    is applied by scaling params/grads/optimizer categories as the analytic
    model does, and the analytic runtime overheads are added on top.
    """
    from gpuplan.estimate import overheads as ovh

    st = analytic.strategy
    if st.tp > 1 or st.pp > 1:
        raise SpecError(
            "--trace: tensor/pipeline parallel layouts are estimated analytically only",
            hint="drop --trace, or set parallelism to sharding only",
        )
    from gpuplan.estimate.frameworks import FRAMEWORKS

    engine = FRAMEWORKS[spec.framework].engine
    if engine != "pytorch" and st.sharding != "none" and st.dp > 1:
        raise SpecError(
            f"--trace: traces PyTorch autocast training; {spec.framework}'s {st.sharding} "
            "is estimated analytically only",
            hint="drop --trace, or set framework: hf",
        )
    traced = trace_memory(spec)
    cats = dict(traced.categories_at_peak)
    dp = st.shard_degree
    if dp > 1 and st.sharding != "none":
        cats["opt"] = cats.get("opt", 0.0) / dp
        if st.sharding in ("zero2", "zero3", "fsdp", "hsdp"):
            cats["grad"] = cats.get("grad", 0.0) / dp
        if st.sharding in ("zero3", "fsdp", "hsdp"):
            cats["param"] = cats.get("param", 0.0) / dp
    model_bytes = sum(cats.values())
    m = analytic.memory
    cublas = ovh.cublas_workspace_bytes(analytic.gpu)
    allocated = model_bytes + cublas
    reserve = ovh.allocator_reserve_bytes(allocated)
    extra = m.device_used_bytes - m.peak_reserved_bytes  # context + NCCL
    used = allocated + reserve + extra
    usable = m.capacity_bytes * (1 - m.safety_margin)
    breakdown = {
        "weights": cats.get("param", 0.0) + cats.get("buffer", 0.0),
        "gradients": cats.get("grad", 0.0),
        "optimizer": cats.get("opt", 0.0),
        "activations": cats.get("act", 0.0) + cats.get("temp", 0.0),
    }
    breakdown["overhead"] = used - sum(breakdown.values())
    note = (
        f"traced on meta with layers {traced.layers_traced}"
        + (", extrapolated per layer" if traced.extrapolated else "")
        + f" in {traced.wall_s:.1f}s"
    )
    if spec.activation_checkpointing in ("selective", "selective-op"):
        note += (
            f"; {spec.activation_checkpointing} checkpointing traced as full (Hugging Face models "
            "only checkpoint whole layers), so the traced peak is a lower bound"
        )
    details = {f"traced: {k}": v for k, v in cats.items() if v}
    details["traced: activations after forward"] = traced.activations_after_forward
    details["analytic peak allocated (cross-check)"] = m.peak_allocated_bytes
    memory = dataclasses.replace(
        m,
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=allocated + reserve,
        device_used_bytes=used,
        fits=used <= usable,
        headroom_bytes=usable - used,
        breakdown=breakdown,
        details=details,
        assumptions=(*m.assumptions, note),
        basis="traced",
    )
    return dataclasses.replace(analytic, memory=memory)
