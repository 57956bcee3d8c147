"""Latent-diffusion presets (``sd-1.5``, ``sdxl``): component sizes and a FLOP model.

A diffusion pipeline is not one transformer, so it has its own small data files
in ``models/data/diffusion/<id>.yaml``: per component (UNet, text encoder, VAE
decoder, VAE encoder) the parameter count, the multiply-accumulates of one
forward pass for one sample at a reference image size, and an activation pool.
Every file names its source; derived numbers say how they were derived.

FLOP model of one text-to-image request at ``image_size`` with ``steps``
denoising steps and classifier-free guidance (two UNet samples per step)::

    flops = 2 x [2 x text_encoder + steps x 2 x unet(area) + vae_decoder(area)]

where ``unet(area)`` and ``vae_decoder(area)`` scale the reference MACs by
``(image_size / at_image_size) ** 2``.
"""

from __future__ import annotations

import datetime as dt
import functools
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuplan.errors import CatalogError, UnknownNameError

DIFFUSION_IDS: tuple[str, ...] = ("sd-1.5", "sdxl")
CFG_SAMPLES = 2
"""UNet samples per step with classifier-free guidance (conditional + unconditional)."""


class Component(BaseModel):
    """One network of the pipeline."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: int = Field(ge=0)
    macs_per_sample: int = Field(ge=0, description="MACs of one forward for one sample.")
    at_image_size: int | None = Field(
        description="Image side the MACs were counted at; None: independent of the image."
    )
    activation_bytes_per_sample: int = Field(ge=0, description="Live activations, one sample.")

    def scale(self, image_size: int) -> float:
        """Area factor from the reference image size to ``image_size``."""
        if self.at_image_size is None:
            return 1.0
        return (image_size / self.at_image_size) ** 2


class DiffusionModel(BaseModel):
    """A latent-diffusion pipeline preset."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    hf_repo: str
    default_image_size: int
    default_steps: int
    latent_downsample: int
    components: dict[str, Component]
    source: str
    as_of: dt.date
    notes: str = ""

    @property
    def params(self) -> int:
        """Parameters of every component the pipeline loads."""
        return sum(c.params for c in self.components.values())

    def request_flops(self, *, image_size: int, steps: int) -> float:
        """FLOPs (2 x MACs) of one text-to-image request with guidance."""
        c = self.components
        macs = (
            CFG_SAMPLES * c["text_encoder"].macs_per_sample
            + steps * CFG_SAMPLES * c["unet"].macs_per_sample * c["unet"].scale(image_size)
            + c["vae_decoder"].macs_per_sample * c["vae_decoder"].scale(image_size)
        )
        return 2.0 * macs

    def activation_bytes(self, *, image_size: int, batch: int) -> float:
        """Peak live activations: the largest component's pool for ``batch`` requests."""
        peaks = [
            comp.activation_bytes_per_sample
            * comp.scale(image_size)
            * batch
            * (CFG_SAMPLES if name == "unet" else 1)
            for name, comp in self.components.items()
        ]
        return max(peaks)


def is_diffusion(name: str) -> bool:
    """Whether ``name`` is a diffusion preset id."""
    return name.strip().lower() in DIFFUSION_IDS


@functools.cache
def load_diffusion(name: str) -> DiffusionModel:
    """The diffusion preset called ``name``.

    Raises:
        UnknownNameError: not a diffusion preset.
        CatalogError: the shipped file is malformed (a packaging bug).
    """
    key = name.strip().lower()
    if key not in DIFFUSION_IDS:
        raise UnknownNameError("diffusion preset", name, DIFFUSION_IDS, field="model")
    text = (
        resources.files("gpuplan.models")
        .joinpath("data", "diffusion", f"{key}.yaml")
        .read_text(encoding="utf-8")
    )
    try:
        return DiffusionModel.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValidationError) as exc:
        raise CatalogError(f"models/data/diffusion/{key}.yaml is malformed: {exc}") from exc
