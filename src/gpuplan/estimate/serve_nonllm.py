"""Per-request work of non-LLM services: encoders (BERT), vision (ResNet, ViT), diffusion.

Each service reduces to a :class:`Workload`: FLOPs and activation bytes per
request, the weights read once per batch, and a default batch. Time of a batch
of ``b`` requests is a roofline: ``max(b x flops / (peak x e), weights /
(BW x e_bw)) + overhead``.

- encoder: ``2 x (params - embeddings) x seq + 4 x layers x seq^2 x hidden`` FLOPs
  (QK^T and attention x V), activations ``seq x (4 hidden + intermediate) x bytes``.
- vision: ``2 x forward MACs`` (:func:`gpuplan.models.vision.forward_macs_per_image`),
  activations: the three largest layer outputs alive at once.
- diffusion: :meth:`gpuplan.models.diffusion.DiffusionModel.request_flops`.
"""

from __future__ import annotations

import dataclasses

from gpuplan.errors import SpecError
from gpuplan.models.config import ModelConfig
from gpuplan.models.diffusion import DiffusionModel
from gpuplan.models.params import count_parameters
from gpuplan.models.vision import layer_stats

BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "nf4": 0.5}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One request's work and memory for a non-LLM service."""

    kind: str
    flops_per_request: float
    activation_bytes_per_request: float
    weights_bytes: float
    default_batch: int
    tokens_per_request: int
    description: str


def encoder_workload(cfg: ModelConfig, *, seq_len: int, weights: str) -> Workload:
    """A BERT-style encoder scoring one sequence of ``seq_len`` tokens."""
    if seq_len > max(cfg.max_position_embeddings, 1):
        raise SpecError(
            f"seq_len: {seq_len} exceeds {cfg.id}'s {cfg.max_position_embeddings} positions"
        )
    pc = count_parameters(cfg)
    dense = pc.total - pc.embeddings
    flops = 2.0 * dense * seq_len + 4.0 * cfg.num_layers * seq_len**2 * cfg.hidden_size
    act = seq_len * (4 * cfg.hidden_size + cfg.intermediate_size) * BYTES[weights] * 2
    act += cfg.num_attention_heads * seq_len**2 * BYTES[weights]
    return Workload(
        kind="encoder",
        flops_per_request=flops,
        activation_bytes_per_request=act,
        weights_bytes=pc.total * BYTES[weights],
        default_batch=32,
        tokens_per_request=seq_len,
        description=f"{cfg.id}, {seq_len} tokens per request",
    )


def vision_workload(cfg: ModelConfig, *, image_size: int, weights: str) -> Workload:
    """A CNN or ViT classifying one image of ``image_size`` pixels."""
    macs, largest, params = _vision_stats(cfg, image_size)
    return Workload(
        kind="vision",
        flops_per_request=2.0 * macs,
        activation_bytes_per_request=sum(largest) * BYTES[weights],
        weights_bytes=params * BYTES[weights],
        default_batch=32,
        tokens_per_request=0,
        description=f"{cfg.id}, {image_size} px images",
    )


_VISION_CACHE: dict[tuple[object, ...], tuple[int, list[int], int]] = {}


def _vision_stats(cfg: ModelConfig, image_size: int) -> tuple[int, list[int], int]:
    """(MACs, three largest outputs, params) per image, computed once per model and size."""
    key = (cfg.id, cfg.family, cfg.hidden_size, cfg.num_layers, len(cfg.cnn_layers), image_size)
    found = _VISION_CACHE.get(key)
    if found is None:
        stats = layer_stats(cfg, image_size=image_size)
        found = (
            sum(s.forward_macs_per_image for s in stats),
            sorted((s.output_elements_per_image for s in stats), reverse=True)[:3],
            sum(s.params for s in stats),
        )
        _VISION_CACHE[key] = found
    return found


def diffusion_workload(
    model: DiffusionModel, *, image_size: int, steps: int, weights: str
) -> Workload:
    """A text-to-image request: text encoder, ``steps`` guided UNet steps, VAE decode."""
    if image_size % (model.latent_downsample * 8):
        raise SpecError(
            f"image_size: {model.id} needs a multiple of {model.latent_downsample * 8} px, "
            f"got {image_size}"
        )
    return Workload(
        kind="diffusion",
        flops_per_request=model.request_flops(image_size=image_size, steps=steps),
        activation_bytes_per_request=model.activation_bytes(image_size=image_size, batch=1),
        weights_bytes=model.params * BYTES[weights],
        default_batch=1,
        tokens_per_request=0,
        description=f"{model.id}, {image_size} px, {steps} steps with guidance",
    )
