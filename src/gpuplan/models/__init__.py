"""Model architectures: presets, Hugging Face config parsing, exact parameter counts.

::

    load_model("llama-3-8b")            -> ModelConfig   (preset, HF repo name or config.json path)
    from_hf_config(json_dict, id=...)   -> ModelConfig
    count_parameters(cfg)               -> ParamCounts   (exact, by component)
    layer_stats(cfg, image_size=224)    -> per-layer params / output elements / MACs (cnn, vit)

No torch or transformers import: everything is computed from the configuration.
"""

from gpuplan.models.config import CnnLayer, ModelConfig
from gpuplan.models.hf import PARSERS, from_hf_config
from gpuplan.models.params import ParamCounts, count_parameters
from gpuplan.models.presets import (
    PresetInfo,
    find_preset,
    list_presets,
    load_model,
    load_preset,
    preset_info,
)
from gpuplan.models.vision import LayerStats, forward_macs_per_image, layer_stats, resnet_layers

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(PARSERS)
"""Hugging Face ``model_type`` values :func:`from_hf_config` reads."""

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CnnLayer",
    "LayerStats",
    "ModelConfig",
    "ParamCounts",
    "PresetInfo",
    "count_parameters",
    "find_preset",
    "forward_macs_per_image",
    "from_hf_config",
    "layer_stats",
    "list_presets",
    "load_model",
    "load_preset",
    "preset_info",
    "resnet_layers",
]
