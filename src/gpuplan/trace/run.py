"""Trace two training iterations of the real model and read the memory peak.

What is forced to match a GPU run (``reference/estimators.md``, section 4):
fused attention through the CUDA kernels' meta implementations (flash for
16-bit, memory-efficient for fp32) instead of SDPA's math path, foreach
optimizers, CUDA autocast rules for ``*-mixed`` (:mod:`.autocast`), and the
first iteration discarded (optimizer state appears only after step 1).

Models with many layers are traced with 1 and 2 layers and extrapolated
linearly per layer (the result says so). Tensor parallelism is traced as one
rank's sharded linears, pipeline parallelism as the first and the last stage
apart, each with its micro-batches in flight (traced at 1 and 2, grown
linearly). Sharding and runtime overheads are applied analytically on top.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import weakref
from importlib import resources
from pathlib import Path
from typing import Any

from gpuplan.errors import GpuPlanError, MissingInputError, SpecError
from gpuplan.estimate import pipeline
from gpuplan.estimate.memory import StagePeak
from gpuplan.estimate.pipeline import PIPELINE_STAGES, PipelineStage

MAX_TRACED_PARAMS = 9e9
"""Above this the model is traced with 1 and 2 layers and extrapolated."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TraceResult:
    """Steady-state peaks of a traced step, bytes, by MemTracker category."""

    peak_bytes: float
    categories_at_peak: dict[str, float]
    phases: dict[str, dict[str, float]]
    """Bytes by category at each traced phase's own peak (forward, backward, optimizer step)."""
    activations_after_forward: float
    weight_casts_bytes: float
    """16-bit copies of the trainable weights that autocast keeps from forward to backward
    (inside the ``act`` category)."""
    layers_traced: tuple[int, ...]
    extrapolated: bool
    wall_s: float
    in_flight_traced: tuple[int, ...] = (1,)
    """Micro-batches in flight traced (1 and 2 when a pipeline stage holds more than one:
    grown linearly to the stage's count)."""
    allocator_reserve: float = 0.0
    """Reserved beyond the allocated peak: PyTorch's caching allocator replayed over the
    traced step's allocations (:mod:`gpuplan.trace.allocator`; grown like the other figures
    where the trace is)."""


def require_torch() -> Any:
    """torch, once torch and transformers are importable (the ``trace`` extra)."""
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
    from gpuplan.userfile import path_kind, read_json

    path = Path(model_ref)
    if path.suffix == ".json" and path_kind(path) == "file":
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


def _sdpa_math(
    query: Any,
    key: Any,
    value: Any,
    dropout: float,
    causal: bool,
    scale: float | None,
    mask: Any = None,
) -> Any:
    """SDPA's math backend with grouped K/V (``enable_gqa``): its ops run one by one, and
    autograd keeps the softmax probabilities as eager attention does."""
    import torch

    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, mask, dropout, causal, None, scale=scale, enable_gqa=True
    )[0]


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
        causal = bool(getattr(module, "is_causal", True)) if is_causal is None else is_causal
        if n_rep > 1 and query.dtype not in (torch.bfloat16, torch.float16):
            # transformers hands grouped K/V to SDPA with enable_gqa when there is no mask (the
            # traced data is unpadded), which only FlashAttention (16-bit) takes: CUDA runs
            # SDPA's math backend, which keeps the probabilities
            # (gpuplan.estimate.frameworks.Framework.sdpa_enable_gqa)
            out = _sdpa_math(query, key, value, dropout, causal, scaling)
            return out.transpose(1, 2).contiguous(), None
        if n_rep > 1:  # as transformers' sdpa path does (repeat_kv)
            b, kvh, s, d = key.shape
            key = key[:, :, None].expand(b, kvh, n_rep, s, d).reshape(b, kvh * n_rep, s, d)
            value = value[:, :, None].expand(b, kvh, n_rep, s, d).reshape(b, kvh * n_rep, s, d)
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


class _FusedSdpa:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` to the fused CUDA kernels'
    meta implementations while a step is traced, as CUDA's dispatcher would: FlashAttention for
    16-bit inputs without a mask, the memory-efficient kernel (which takes an additive mask)
    otherwise. On the meta device SDPA would take its math path, which saves the attention
    probabilities (s^2 per head). This reaches models whose attention calls SDPA itself instead
    of transformers' attention interface (Falcon, which always passes its causal mask)."""

    def __init__(self) -> None:
        self._saved: Any = None

    def __enter__(self) -> _FusedSdpa:
        import torch
        import torch.nn.functional as functional

        from gpuplan.trace.autocast import CudaAutocast

        def fused(
            query: Any,
            key: Any,
            value: Any,
            attn_mask: Any = None,
            dropout_p: float = 0.0,
            is_causal: bool = False,
            scale: float | None = None,
            enable_gqa: bool = False,
        ) -> Any:
            if CudaAutocast.active is not None:  # SDPA is on autocast's lower-precision list
                query, key, value = (t.to(CudaAutocast.active) for t in (query, key, value))
            n_rep = query.shape[-3] // key.shape[-3]
            sixteen = query.dtype in (torch.bfloat16, torch.float16)
            if enable_gqa and n_rep > 1 and not (attn_mask is None and sixteen):
                # only FlashAttention takes enable_gqa (16-bit, no mask); the memory-efficient
                # kernel does not, so CUDA runs SDPA's math backend, as the meta device does
                # (gpuplan.estimate.frameworks.Framework.sdpa_enable_gqa)
                return _sdpa_math(query, key, value, dropout_p, is_causal, scale, attn_mask)
            if n_rep > 1:
                key = key.repeat_interleave(n_rep, dim=-3)
                value = value.repeat_interleave(n_rep, dim=-3)
            if attn_mask is None and sixteen:
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale
                )[0]
            bias = attn_mask
            if bias is not None and bias.dtype == torch.bool:
                # the kernel takes an additive bias; on the meta device only its shape matters
                bias = torch.zeros(bias.shape, dtype=query.dtype, device=bias.device)
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, bias, False, dropout_p, is_causal, scale=scale
            )[0]

        self._saved = functional.scaled_dot_product_attention
        functional.scaled_dot_product_attention = fused  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.nn.functional as functional

        functional.scaled_dot_product_attention = self._saved


class _AllocatorReplay:
    """Feed every storage the traced step creates, and its release, to a model of PyTorch's
    CUDA caching allocator (:mod:`gpuplan.trace.allocator`), in the order the step makes them.

    A ``TorchDispatchMode`` sees each op's outputs; a storage is counted once (views share it)
    and returned when its Python object is collected, as MemTracker tracks them
    (``torch.distributed._tools.mem_tracker``). Parameters and buffers are allocated first."""

    def __init__(self, model: Any) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        from gpuplan.trace.allocator import CachingAllocator

        self.allocator = CachingAllocator()
        self._tensor = torch.Tensor
        self._flatten = tree_flatten
        replay = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                replay.track_all(out)
                return out

        self._live: dict[int, Any] = {}
        self.mode = Mode()
        for tensor in (*model.parameters(), *model.buffers()):
            self.track(tensor)

    def track_all(self, out: Any) -> None:
        """Allocate the storages of an op's tensor outputs not seen before."""
        for t in self._flatten(out)[0]:
            if isinstance(t, self._tensor) and t.device.type == "meta":
                self.track(t)

    def track(self, tensor: Any) -> None:
        """Allocate ``tensor``'s storage unless it is already live; free it when collected."""
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._live or storage.nbytes() == 0:
            return
        self._live[key] = self.allocator.malloc(int(storage.nbytes()))
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        block = self._live.pop(key, None)
        if block is not None:
            self.allocator.free(block)

    @property
    def reserve(self) -> float:
        """Reserved beyond allocated, at the peaks since the last reset."""
        return float(self.allocator.peak_reserved - self.allocator.peak_allocated)


def _apply_lora(
    model: Any, targets: tuple[str, ...], rank: int, alpha: float, dropout: float, shape: Any
) -> None:
    """Freeze the model and wrap target linears with LoRA adapters (PEFT's layout).

    Targets are matched by role, as the analytic model matches them
    (:func:`gpuplan.estimate.lora.lora_roles`): ``q_proj`` also adapts GPT-2's fused
    ``c_attn``, and ``all-linear`` every linear but the LM head.
    """
    import torch
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    from gpuplan.errors import SpecError as _SpecError
    from gpuplan.estimate.lora import lora_roles

    class LoraLinear(nn.Module):
        def __init__(self, base: Any, fan_in: int, fan_out: int) -> None:
            super().__init__()
            self.base = base
            self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            device = base.weight.device
            self.lora_A = nn.Linear(fan_in, rank, bias=False, device=device, dtype=torch.float32)
            self.lora_B = nn.Linear(rank, fan_out, bias=False, device=device, dtype=torch.float32)
            self.scale = alpha / rank

        def forward(self, x: Any) -> Any:
            out = self.base(x)
            lora = self.lora_B(self.lora_A(self.drop(x).to(self.lora_A.weight.dtype))) * self.scale
            return out + lora.to(out.dtype)

    def roles_of(name: str) -> frozenset[str]:
        try:
            return lora_roles([name], shape)
        except _SpecError:  # a linear the role table does not know (a classifier head)
            return frozenset()

    for p in model.parameters():
        p.requires_grad_(False)
    wanted = lora_roles(targets, shape)
    everything = bool({t.lower() for t in targets} & {"all-linear", "all_linear", "all"})
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                fan_in, fan_out = child.in_features, child.out_features
            elif isinstance(child, Conv1D):  # GPT-2's transposed linear
                fan_in, fan_out = child.weight.shape
            else:
                continue
            qualified = f"{parent_name.rsplit('.', 1)[-1]}.{child_name}"
            roles = roles_of(qualified) if parent_name else roles_of(child_name)
            if child_name == "lm_head":
                adapt = "head" in wanted
            else:
                adapt = everything or bool(roles & wanted)
            if adapt:
                setattr(parent, child_name, LoraLinear(child, int(fan_in), int(fan_out)))


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


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RankSlice:
    """What one rank of a TP x PP layout holds, for the tracer.

    Attributes:
        tp: tensor-parallel degree. Linears are sharded as Megatron-LM's
            ``ColumnParallelLinear`` (QKV, gate/up: output features / tp) and
            ``RowParallelLinear`` (attention out, down: input features / tp), which
            is the same as a model with ``heads / tp``, ``kv_heads / tp`` (at least
            one, replicated below tp as Megatron does) and ``intermediate / tp`` at
            the same head size; the embedding and LM head are vocab-parallel
            (``vocab / tp``).
        stage_layers: transformer layers of the traced pipeline stage
            (:func:`gpuplan.estimate.pipeline.stage_layers`).
        stage: the pipeline stage traced, as the analytic model sizes them
            (:mod:`gpuplan.estimate.pipeline`): ``first`` holds the embedding and no final
            norm or head, and sends its last layer's output on; ``last`` receives its input
            (no embedding) and holds the final norm, the LM head (its own copy of tied
            embeddings, Megatron's ``share_embeddings_and_output_weights``) and the loss.
            None: not pipelined, the whole model.
        in_flight: micro-batches whose activations the stage holds at its peak
            (:func:`gpuplan.estimate.pipeline.in_flight`; fractional when interleaved; the
            layer-micro-batches held over the stage's layers when its chunks are uneven).
            One of them reaches the head on the last stage.
    """

    tp: int = 1
    stage_layers: int | None = None
    stage: PipelineStage | None = None
    in_flight: float = 1.0


_TP_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma2", "mixtral", "phi3"})
"""Model types whose attention honours an explicit ``head_dim`` (needed to shard heads)."""


def _slice_config(cfg: dict[str, Any], model_type: str, part: RankSlice) -> dict[str, Any]:
    out = dict(cfg)
    if part.tp > 1:
        if model_type not in _TP_MODEL_TYPES:
            raise SpecError(
                f"--trace: tensor parallelism is traced for Llama-style models, not {model_type}",
                hint="drop --trace for the analytic estimate",
            )
        heads = int(out["num_attention_heads"])
        kv = int(out.get("num_key_value_heads") or heads)
        out.setdefault("head_dim", int(out["hidden_size"]) // heads)
        out["num_attention_heads"] = heads // part.tp
        out["num_key_value_heads"] = max(1, kv // part.tp)
        out["intermediate_size"] = -(-int(out["intermediate_size"]) // part.tp)
        out["vocab_size"] = -(-int(out["vocab_size"]) // part.tp)
    if part.stage is not None:  # each end holds its own matrix; the other end's is dropped
        out["tie_word_embeddings"] = False
    return out


def uses_attention_interface(auto_cls: Any, hf_config: Any) -> bool:
    """Whether the model class behind ``auto_cls`` takes a registered attention function."""
    model_cls = auto_cls._model_mapping[type(hf_config)]
    return bool(getattr(model_cls, "_supports_attention_backend", False))


def _build(
    config: dict[str, Any],
    layers: int | None,
    dtype: Any,
    family: str,
    part: RankSlice | None = None,
    *,
    eager: bool = False,
) -> Any:
    """The Hugging Face model on the meta device; its attention runs the fused kernels' meta
    implementations (:func:`_register_fused_attention`), or transformers' eager attention
    where ``eager`` (the spec's ``attention: eager``: probabilities kept, dropout applied)."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForImageClassification,
    )

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
    if part is not None:
        cfg = _slice_config(cfg, model_type, part)
    hf = AutoConfig.for_model(model_type, **cfg)
    if layers is not None:
        for key in ("num_hidden_layers", "n_layer", "n_layers", "num_layers"):
            if hasattr(hf, key):
                setattr(hf, key, layers)
        if getattr(hf, "layer_types", None):
            hf.layer_types = hf.layer_types[:layers]
    classes = {"decoder": AutoModelForCausalLM, "cnn": AutoModelForImageClassification}
    cls = classes.get(family, AutoModelForImageClassification if family == "vit" else AutoModel)
    # models without transformers' attention interface (ALiBi: MPT, BLOOM) run their own eager
    # attention; CNNs have none
    attn = None
    if uses_attention_interface(cls, hf):
        attn = "eager" if eager else _register_fused_attention()
    with torch.device("meta"):
        model = cls.from_config(hf, dtype=dtype, attn_implementation=attn)
        if part is not None and part.stage is not None:
            _cut_stage(model, part.stage, dtype)
    model.train()
    return model


_FINAL_NORMS = ("norm", "ln_f", "final_layernorm", "final_layer_norm")
"""Attribute names of the final norm on Hugging Face base models (Llama-style, GPT-2, others)."""


def _cut_stage(model: Any, stage: PipelineStage, dtype: Any) -> None:
    """Drop what the other end of the pipeline holds: the first stage keeps the embedding and
    loses the final norm and the head; the last keeps those and loses the embedding (its input
    arrives as hidden states). A dropped matrix becomes a one-row stand-in."""
    from torch import nn

    base = model.base_model
    if stage == "first":
        head = model.get_output_embeddings()
        if head is not None:
            model.set_output_embeddings(nn.Linear(head.in_features, 1, bias=False, dtype=dtype))
        for name in _FINAL_NORMS:
            if isinstance(getattr(base, name, None), nn.Module):
                setattr(base, name, nn.Identity())
    else:
        emb = model.get_input_embeddings()
        model.set_input_embeddings(nn.Embedding(1, emb.embedding_dim, dtype=dtype))


def _Step(model: Any, family: str, stage: PipelineStage | None) -> Any:  # noqa: N802 - an nn.Module
    """An ``nn.Module`` whose forward is the forwards and losses of the micro-batches the
    traced rank holds at once, in order (one call, as MemTracker tracks one call of its root a
    step). The first reaches the head; the others (a pipeline stage's micro-batches in
    flight) backpropagate from a stand-in for the gradient the next stage sends back."""
    from torch import nn

    class Step(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, batches: list[tuple[Any, Any]]) -> tuple[Any, ...]:
            return tuple(
                _loss(self.model, family, stage, x, y, head=i == 0)
                for i, (x, y) in enumerate(batches)
            )

    return Step()


def _loss(
    model: Any, family: str, stage: PipelineStage | None, inputs: Any, labels: Any, head: bool
) -> Any:
    """Forward and loss of one traced micro-batch (a decoder head returns its whole output).

    ``inputs`` are token ids, or hidden states on the last pipeline stage. A pipeline stage
    that sends its output on backpropagates from a gradient of that output's shape and dtype
    (``h.float().sum()`` makes one in the output's dtype)."""
    if family == "vit":  # position embeddings interpolated to the job's image size
        return model(pixel_values=inputs, labels=labels, interpolate_pos_encoding=True).loss
    if family == "cnn":
        return model(pixel_values=inputs, labels=labels).loss
    key = "inputs_embeds" if stage == "last" else "input_ids"
    if family != "decoder":
        return model(**{key: inputs}).last_hidden_state.float().pow(2).mean()
    if stage is None or (stage == "last" and head):
        # the whole output, not its loss: the caller holds it through backward, so the 16-bit
        # logits stay referenced as in a loop that keeps ``outputs`` (the ``hf`` path's
        # assumption, ``gpuplan.estimate.frameworks``), unless the spec says the step runs
        # in Hugging Face's Trainer (``hf_trainer``), which keeps the loss alone
        return model(**{key: inputs}, labels=labels)
    return model.base_model(**{key: inputs}).last_hidden_state.float().sum()


def _name_modules_apart(tracker: Any) -> None:
    """Give each module the tracked tree does not reach a name of its own.

    ModTracker names such a module by its class and warns when a module enters under a name
    already active. transformers 5.25 routes functions such as ``apply_rotary_pos_emb``
    through the ``kernels`` package's function modules: a module-level ``Func`` instance
    that calls a private per-model copy, another ``Func`` outside the model's children. Two
    nested ``Func`` names are no hierarchy error, but the warning (an error under
    ``-W error``) broke the trace. Only the names change; the snapshots are the root's.
    """
    mods = tracker._mod_tracker
    by_class = mods._get_mod_name

    def name_of(mod: Any) -> str:
        if mod not in mods._known_modules:
            mods._known_modules[mod] = f"{type(mod).__name__}@{id(mod):x}"
        return str(by_class(mod))

    mods._get_mod_name = name_of


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Traced:
    """What one traced run gives (:func:`_trace_once`)."""

    phases: dict[str, Phase]
    """Per-phase peaks of the second of the two steps."""
    activations_after_forward: float
    weight_casts_bytes: float
    """16-bit weight copies autocast kept through forward (0 without autocast)."""
    allocator_reserve: float
    """Reserved beyond allocated in the second step, PyTorch's caching allocator replayed
    over the run's allocations (:class:`_AllocatorReplay`)."""


def _trace_once(
    config: dict[str, Any],
    spec: Any,
    family: str,
    layers: int | None,
    seq: int,
    batch: int,
    part: RankSlice | None = None,
    grads_persist: bool = False,
    in_flight: int = 1,
) -> _Traced:
    """Per-phase peaks of the second of two traced steps, the activations after forward, the
    bytes of 16-bit weight copies autocast kept through forward, and the caching allocator's
    reserve (:class:`_Traced`).

    ``in_flight`` micro-batches run their forwards one after another before the first
    backward (a pipeline stage's warm-up); the first reaches the head, then each runs its
    backward in turn, so the first backward runs with the others' activations held."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from gpuplan.estimate.fit import model_shape
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
    model = _build(config, layers, param_dtype, family, part, eager=spec.attention == "eager")
    cast = CudaAutocast(low[spec.compute_dtype]) if mixed else None
    if spec.activation_checkpointing != "none":
        if not model.supports_gradient_checkpointing:
            raise SpecError(
                f"--trace: the Hugging Face {type(model).__name__} has no activation "
                "checkpointing to trace",
                hint="drop --trace for the analytic estimate",
            )
        # transformers 5 renamed gradient_checkpointing_enable (deprecated) to activation_*
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if cast is not None:  # recompute under the same autocast rules as the forward
            kwargs["context_fn"] = cast.recompute_context
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if spec.method == "lora":
        _apply_lora(
            model,
            spec.lora.targets,
            spec.lora.rank,
            spec.lora.alpha,
            spec.lora.dropout,
            model_shape(spec.model),
        )
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = _optimizer(spec.optimizer, trainable)
    stage = part.stage if part is not None else None

    def micro_batch() -> tuple[Any, Any]:
        if family in ("cnn", "vit"):
            side = seq  # the image side for vision models
            images = torch.empty((batch, 3, side, side), device="meta", dtype=param_dtype)
            return images, torch.randint(0, int(model.config.num_labels), (batch,), device="meta")
        vocab = int(getattr(model.config, "vocab_size", 32000))
        ids = torch.randint(0, vocab, (batch, seq), device="meta")
        if stage != "last":
            return ids, ids
        # the last stage receives the previous stage's output, in the residual stream's dtype,
        # and sends its gradient back
        width = model.get_input_embeddings().embedding_dim
        hidden = torch.empty((batch, seq, width), device="meta", dtype=param_dtype)
        return hidden.requires_grad_(), ids

    replay = _AllocatorReplay(model)
    tracker = MemTracker()
    root = _Step(model, family, stage)  # the tracked module: its snapshots span the whole step
    tracker.track_external(root, opt)
    _name_modules_apart(tracker)

    class _NoHook:
        def remove(self) -> None:
            """Nothing to remove: frozen parameters get no gradient hook."""

    # MemTracker hooks every parameter's gradient; frozen (LoRA base) ones cannot take a hook
    for param in model.parameters():
        if not param.requires_grad:
            tracker._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())
    before_step: dict[Any, dict[str, int]] = {}
    with tracker, replay.mode, _FusedSdpa():
        for it in range(2):
            if it == 1:  # the caching allocator's segments: those the first step left, and more
                replay.allocator.reset_peaks()
            batches = [micro_batch() for _ in range(in_flight)]
            if cast is not None:
                cast.clear_cache()
            with cast if cast is not None else contextlib.nullcontext():
                outputs = root(batches)  # a head's whole output, held through backward
            if spec.hf_trainer:
                # Hugging Face's Trainer keeps the loss alone (compute_loss): the output and
                # its logits are gone before backward
                outputs = tuple(out.loss if hasattr(out, "loss") else out for out in outputs)
            for (x, _), out in zip(batches, outputs, strict=True):
                (out.loss if hasattr(out, "loss") else out).backward()
                x.grad = None  # the gradient sent to the previous stage
            # the loop's names too: the last output (its logits) would live on through the
            # optimizer step and into the next forward, which no training loop does
            del outputs, batches, x, out
            if it == 1:  # restart the peak: what follows is the optimizer phase's own peak
                before_step = tracker.get_tracker_snapshot("peak")
                tracker._peak_mem_snap = tracker.get_tracker_snapshot()
                tracker._peak_mem = {d: snap["Total"] for d, snap in tracker._peak_mem_snap.items()}
            opt.step()
            # with gradient accumulation the gradients live from the first micro-batch's
            # backward to the step, so the next forward/backward runs with them allocated
            opt.zero_grad(set_to_none=not grads_persist)
            if it == 0:
                tracker.reset_mod_stats()
    meta = torch.device("meta")
    phases: dict[str, Phase] = {}
    act_fw = 0.0
    for state, snaps in tracker.memory_tracking[root].snapshots.items():
        for snap in snaps if isinstance(snaps, list) else [snaps]:
            dev = snap.get(meta, {})
            total = float(dev.get("Total", 0.0))
            if "POST_FW" in str(state):
                act_fw = max(act_fw, float(sum(v for k, v in dev.items() if "ACT" in str(k))))
            key = str(state).split(".")[-1].lower()
            if key not in phases or total > phases[key][0]:
                phases[key] = (total, _categories(dev))
    for key, snapshot in (
        ("overall", before_step),
        ("optimizer step", tracker.get_tracker_snapshot("peak")),
    ):
        dev = snapshot.get(meta, {})
        phases[key] = (float(dev.get("Total", 0.0)), _categories(dev))
    return _Traced(
        phases=phases,
        activations_after_forward=act_fw,
        weight_casts_bytes=float(cast.weight_cast_bytes) if cast is not None else 0.0,
        allocator_reserve=replay.reserve,
    )


Phase = tuple[float, dict[str, float]]
"""(total bytes, bytes by MemTracker category) at one traced phase."""


def _categories(dev: dict[Any, Any]) -> dict[str, float]:
    return {str(k).split(".")[-1].lower(): float(v) for k, v in dev.items() if str(k) != "Total"}


def _peak(phases: dict[str, Phase]) -> Phase:
    return max(phases.values(), key=lambda phase: phase[0])


def _mix(terms: list[tuple[float, dict[str, Phase]]]) -> dict[str, Phase]:
    """A weighted sum of traced phases, phase by phase and category by category: traces with
    1 and 2 layers (or micro-batches in flight) grown linearly to ``1 + n`` are the weights
    ``1 - n`` and ``n`` (:func:`_line`), both at once their products.

    Phases are extrapolated one by one before the peak is taken: with few layers
    the peak may sit in backward (logits) and with many in the optimizer step.
    The overall peak is a maximum over phases, not linear, and is left out.
    """
    keys = set.intersection(*(set(phases) for _, phases in terms)) - {"overall"}
    out: dict[str, Phase] = {}
    for key in keys:
        cats: dict[str, float] = {}
        for w, phases in terms:
            for k, v in phases[key][1].items():
                cats[k] = cats.get(k, 0.0) + w * v
        out[key] = (sum(w * phases[key][0] for w, phases in terms), cats)
    return out


_EDGE_PHASES = frozenset({"post_fw", "pre_bw", "post_bw"})
"""MemTracker snapshots at the end of forward and the ends of backward, bounded by the
forward and backward peaks."""


def _line(points: tuple[int, ...], target: float) -> tuple[float, ...]:
    """Weights on traces at ``points`` (one point, or 1 and 2) that give ``target`` on the
    line through them."""
    if len(points) == 1:
        return (1.0,)
    return (2.0 - target, target - 1.0)


def trace_memory(
    spec: Any, part: RankSlice | None = None, *, grads_persist: bool = False
) -> TraceResult:
    """Trace the spec's model on meta and return the steady-state peak of one rank.

    Without ``part`` the whole model on one device; with it, one TP x PP rank's
    slice (:class:`RankSlice`). ``grads_persist`` traces gradient accumulation:
    gradients stay allocated through forward and backward.
    """
    require_torch()
    from gpuplan.estimate.fit import sequence_length, spec_shape

    shape = spec_shape(spec)
    if shape.family not in ("decoder", "encoder", "cnn", "vit"):
        raise SpecError(
            f"--trace: traces Hugging Face text and vision models; {shape.model_id} is a "
            f"{shape.family} model",
            hint="drop --trace for the analytic estimate",
        )
    if spec.method == "qlora":
        raise SpecError(
            "--trace: qlora needs bitsandbytes kernels, which are not traced",
            hint="drop --trace for the analytic estimate",
        )
    if spec.compute_dtype not in ("bf16", "fp16", "fp32", "tf32"):
        raise SpecError(
            f"--trace: {spec.precision} needs fp8 kernels (Transformer Engine, torchao), which "
            "are not traced",
            hint="drop --trace for the analytic estimate",
        )
    par = spec.parallelism
    if not isinstance(par, str) and par.ep > 1:
        raise SpecError(
            "--trace: expert parallelism (parallelism.ep) is not traced",
            hint="drop --trace for the analytic estimate",
        )
    for field, on in (
        ("paged_optimizer", spec.paged_optimizer),
        ("optimizer_in_backward", spec.optimizer_in_backward),
    ):
        if on:
            raise SpecError(
                f"--trace: {field} is not traced (the tracer runs a plain optimizer step)",
                hint="drop --trace for the analytic estimate",
            )
    config = hf_config_dict(spec.model)
    if shape.family in ("cnn", "vit"):
        seq = int(spec.image_size or shape.image_size or 224)  # the image side
    else:
        seq = sequence_length(spec, shape)
    tp = part.tp if part is not None else 1
    stage = (part.stage_layers if part is not None else None) or shape.layers
    rank_params = shape.params_total * stage / max(shape.layers, 1) / tp
    mb = spec.micro_batch_size
    in_flight = part.in_flight if part is not None else 1.0
    # a big stage is traced with 1 and 2 layers, several micro-batches in flight with 1 and 2,
    # and each grown linearly (bilinearly when both)
    small = rank_params <= MAX_TRACED_PARAMS or shape.family in ("cnn", "vit")
    layer_points: tuple[int, ...] = (stage,) if small else (1, 2)
    flight_points: tuple[int, ...] = (1,) if in_flight <= 1 else (1, 2)
    start = time.perf_counter()
    try:
        terms: list[tuple[float, dict[str, Phase]]] = []
        act = casts = reserve = 0.0
        for wl, n_layers in zip(_line(layer_points, stage), layer_points, strict=True):
            for wk, k in zip(_line(flight_points, in_flight), flight_points, strict=True):
                layers_arg = n_layers if n_layers != shape.layers else None
                run = _trace_once(
                    config, spec, shape.family, layers_arg, seq, mb, part, grads_persist, k
                )
                terms.append((wl * wk, run.phases))
                act += wl * wk * run.activations_after_forward
                casts += wl * wk * run.weight_casts_bytes
                reserve += wl * wk * run.allocator_reserve
        phases = terms[0][1] if len(terms) == 1 else _mix(terms)
        if len(flight_points) > 1:
            # the snapshots at the edges of forward and backward lie inside the peak windows
            # (peak_fw, peak_bw) but are the latest of several calls, which one moving with the
            # micro-batches held: they do not grow linearly, and the peaks bound them
            phases = {k: v for k, v in phases.items() if k not in _EDGE_PHASES}
        peak, cats = _peak(phases)
        extrapolated = len(layer_points) > 1
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
        phases={key: dict(phase[1]) for key, phase in phases.items()},
        activations_after_forward=act,
        weight_casts_bytes=casts,
        allocator_reserve=max(0.0, reserve),
        layers_traced=layer_points,
        extrapolated=extrapolated,
        in_flight_traced=flight_points,
        wall_s=time.perf_counter() - start,
    )


def _sharded_peak(
    traced: TraceResult, spec: Any, st: Any, pipeline_stage: PipelineStage = "first"
) -> tuple[dict[str, float], str]:
    """One rank's bytes by category at its peak phase, under the strategy's sharding, and
    what was done to the traced replica to get them ("" when nothing is sharded).

    The trace runs one unsharded replica. Phase by phase, each category is divided over the
    ranks the engine shards it across (the analytic model's layout: PyTorch ``zero2`` is FSDP
    SHARD_GRAD_OP, which shards the parameters too), and the peak is taken after that, as a
    sharded optimizer step is small enough for the peak to move to backward. Where the engine
    gathers each unit's weights for its forward and again for its backward (FSDP full
    sharding, ZeRO-3), the 16-bit weight copies that autocast keeps through the traced forward
    are not held; the analytic model's gathered units in flight are, in the non-optimizer
    phases. Under SHARD_GRAD_OP the copies the trace keeps are the gathered parameters kept
    from forward to backward, and stay.
    """
    from gpuplan.estimate import memory
    from gpuplan.estimate.fit import memory_job, spec_shape

    shape = spec_shape(spec)
    job = memory_job(spec, shape)
    lay = memory.layout_for(job, st)
    per_unit = lay.param_ranks > 1 and lay.gathered_layers > 0 and not lay.unsharded_compute_params
    held = 0.0
    if per_unit:
        stage = memory.stage_params(shape, st, pipeline_stage)
        tr = memory.trained(shape, job, st, stage, lay)
        w = memory.weight_bytes(shape, job, st, stage, lay, tr, [])
        held = w.gathered + w.compute_copies

    def shard(phase: str, raw: dict[str, float]) -> dict[str, float]:
        cats = dict(raw)
        cats["opt"] = cats.get("opt", 0.0) / lay.optimizer_ranks
        cats["grad"] = cats.get("grad", 0.0) / lay.grad_ranks
        cats["param"] = cats.get("param", 0.0) / lay.param_ranks
        if per_unit and phase != "optimizer step":
            cats["act"] = max(0.0, cats.get("act", 0.0) - traced.weight_casts_bytes)
            cats["param"] += held
        return cats

    note = ""
    if max(lay.param_ranks, lay.grad_ranks, lay.optimizer_ranks) > 1:
        note = (
            f"; one unsharded replica traced, then per phase parameters / {lay.param_ranks}, "
            f"gradients / {lay.grad_ranks}, optimizer state / {lay.optimizer_ranks} "
            f"({lay.engine} {lay.sharding})"
        )
        if per_unit:
            note += (
                ", the traced autocast weight copies replaced by the analytic gathered units "
                "in flight"
            )
    scaled = [shard(phase, raw) for phase, raw in traced.phases.items()]
    return max(scaled, key=lambda cats: sum(cats.values())), note


def trace_fit(spec: Any, analytic: Any) -> Any:
    """Replace an analytic FitResult's single-device numbers with traced ones.

    The traced peak is taken as the model part of ``peak_allocated``; sharding
    is applied by scaling params/grads/optimizer categories as the analytic
    model does, and the analytic runtime overheads are added on top. With pipeline
    parallelism the first and the last stage are traced apart, as the analytic model
    sizes them, and the estimate is the one that peaks higher.
    """
    import math

    from gpuplan.estimate.fit import PIPELINE_ENGINE, engine_spec, model_shape
    from gpuplan.estimate.frameworks import FRAMEWORKS

    st = analytic.strategy
    if engine_spec(spec) is not spec:
        raise SpecError(
            f"--trace: runs Transformers' model code, while the analytic estimate reads a spec "
            f"that states pipeline stages and no framework as {PIPELINE_ENGINE}'s",
            hint="state framework: hf (gpuplan.estimate.fit.pinned_framework)",
        )
    if not FRAMEWORKS[spec.framework].transformers_model:
        raise SpecError(
            f"--trace: traces Transformers' model code; framework {spec.framework} runs its own, "
            "which is estimated analytically only",
            hint="drop --trace, or set framework: hf if the job runs Transformers' models",
        )
    if spec.fused_kernels or spec.loss_kernel in ("fused", "fused-linear"):
        what = "fused_kernels" if spec.fused_kernels else f"loss_kernel {spec.loss_kernel}"
        raise SpecError(
            f"--trace: traces the model's own PyTorch code; {what} is estimated analytically only",
            hint="drop --trace, or the fused kernels",
        )
    engine = FRAMEWORKS[spec.framework].engine
    if engine != "pytorch" and st.sharding != "none" and st.dp > 1:
        raise SpecError(
            f"--trace: traces PyTorch autocast training; {spec.framework}'s {st.sharding} "
            "is estimated analytically only",
            hint="drop --trace, or set framework: hf",
        )
    shape = model_shape(spec.model)
    if st.tp <= 1 and st.pp <= 1:
        return _traced_estimate(spec, analytic, None)
    stage_layers = math.ceil(shape.layers / st.pp) if st.pp > 1 else None
    if st.pp <= 1 or shape.family in ("cnn", "vit"):
        # vision models are not cut at the ends: the whole stage, the first's micro-batches
        part = RankSlice(
            tp=st.tp, stage_layers=stage_layers, in_flight=pipeline.in_flight(st, "first")
        )
        return _traced_estimate(spec, analytic, part)
    results = [
        _traced_estimate(
            spec,
            analytic,
            RankSlice(
                tp=st.tp,
                stage_layers=pipeline.stage_layers(shape.layers, st, stage),
                stage=stage,
                # layer-micro-batches held over the stage's layers: its micro-batches in
                # flight, fewer where a chunk beside the embedding or loss has a layer fewer
                in_flight=pipeline.held_layers(shape.layers, st, stage)
                / pipeline.stage_layers(shape.layers, st, stage),
            ),
        )
        for stage in PIPELINE_STAGES
    ]
    peaks = tuple(
        StagePeak(
            stage=stage,
            peak_allocated_bytes=r.memory.peak_allocated_bytes,
            peak_reserved_bytes=r.memory.peak_reserved_bytes,
            device_used_bytes=r.memory.device_used_bytes,
        )
        for stage, r in zip(PIPELINE_STAGES, results, strict=True)
    )
    first, last = results
    worst, other = (
        (last, first)
        if peaks[1].device_used_bytes > peaks[0].device_used_bytes
        else (
            first,
            last,
        )
    )
    # the analytic estimate's line on its own stages gives way to the traced one
    kept = tuple(a for a in worst.memory.assumptions if not a.startswith("pipeline: the "))
    memory = dataclasses.replace(
        worst.memory,
        pipeline_stages=peaks,
        assumptions=(
            *kept,
            f"traced pipeline: the {worst.memory.pipeline_stage} stage peaks higher "
            f"({worst.memory.device_used_bytes / 2**30:.1f} GiB device used) than the "
            f"{other.memory.pipeline_stage} ({other.memory.device_used_bytes / 2**30:.1f} GiB); "
            + pipeline.describe(st, shape.layers),
        ),
    )
    return dataclasses.replace(worst, memory=memory)


def _traced_estimate(spec: Any, analytic: Any, part: RankSlice | None) -> Any:
    """The analytic FitResult with one traced rank's memory in place of its own."""
    from gpuplan.estimate import overheads as ovh
    from gpuplan.estimate.fit import memory_job, model_shape, spec_shape
    from gpuplan.estimate.memory import (
        gradients_through_forward,
        layout_for,
        reserve_note,
        restate_reserve,
        squeezed_reserve,
        workspace_bytes,
    )

    st = analytic.strategy
    stage = part.stage if part is not None else None
    job = memory_job(spec, spec_shape(spec))
    # as the analytic model: accumulation, zeroed (not freed) gradients, or an engine that
    # allocates them at init keep them through forward
    traced = trace_memory(
        spec, part, grads_persist=gradients_through_forward(job, st, layout_for(job, st))
    )
    cats, shard_note = _sharded_peak(traced, spec, st, stage or "first")
    model_bytes = sum(cats.values())
    m = analytic.memory
    cublas = workspace_bytes(job, analytic.gpu)
    allocated = model_bytes + cublas
    # the replayed allocator holds for the traced rank as it ran; a replica scaled to a
    # sharded layout allocates otherwise (gathers, flat buffers), so the fitted share stays
    replayed = not shard_note
    steady = (
        max(traced.allocator_reserve, float(ovh.ALLOCATOR_RESERVE_MIN_BYTES))
        if replayed
        else ovh.allocator_reserve_bytes(allocated)
    )
    extra = m.device_used_bytes - m.peak_reserved_bytes  # context + NCCL
    usable = m.capacity_bytes * (1 - m.safety_margin)
    reserve = squeezed_reserve(steady, allocated, extra, usable)
    used = allocated + reserve + extra
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
        + shard_note
    )
    if part is not None:
        decoder = model_shape(spec.model).family == "decoder"
        note += f"; one rank's slice: {_slice_note(part, st, decoder)}"
    if replayed:
        note += (
            f"; allocator reserve {steady / 2**30:.2f} GiB: PyTorch's caching allocator "
            "(c10/cuda/CUDACachingAllocator.cpp, default settings) replayed over the traced "
            "step's allocations (gpuplan.trace.allocator), in place of the analytic share"
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
        assumptions=restate_reserve(
            (*m.assumptions, note), reserve_note(steady, reserve, used, usable)
        ),
        basis="traced",
        steady_reserve_bytes=steady,
        pipeline_stage=stage,
        pipeline_stages=(),
    )
    return dataclasses.replace(analytic, memory=memory)


def _slice_note(part: RankSlice, st: Any, decoder: bool) -> str:
    """What the traced rank holds, for the estimate's assumptions."""
    note = ""
    if part.tp > 1:
        note = (
            f"linears sharded by tp={part.tp} (column-parallel QKV/gate/up, row-parallel "
            "out/down, vocab-parallel embedding and head), no sequence parallelism"
        )
        if st.sequence_parallel:
            note += (
                " (the layout's sequence parallelism is not traced: norm inputs and the "
                "column-parallel linears' inputs stay whole, so this peak is an upper bound; "
                "parallelism.sequence_parallel: false compares like with like)"
            )
    if part.stage_layers is not None:
        if part.stage is None:
            held = "the embedding and the head both (vision models are not cut at the ends)"
        elif part.stage == "first":
            held = "the embedding, no final norm or head"
        elif decoder:
            held = "the final norm, the LM head and the loss, no embedding"
        else:
            held = "no embedding (an encoder is traced without a pretraining head)"
        grown = (
            f"{part.in_flight:.2f} micro-batches in flight (traced at 1 and 2, grown linearly), "
            "each run forward before the first backward"
            + (", one reaching the head" if part.stage == "last" and decoder else "")
            if part.in_flight > 1
            else "1 micro-batch in flight"
        )
        note += (
            (", " if note else "")
            + f"pipeline stage {part.stage or '(whole)'}: {part.stage_layers} layers with "
            + f"{held}; {grown}"
        )
    return note
