"""Efficiency parameters of the speed model (``efficiency.yaml``), loaded once.

The file is validated by a strict model (:class:`EfficiencyFile`): every parameter of
every architecture is stated in the file with its basis; nothing is defaulted in code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import CatalogError

ATTENTION_PRIOR = 0.75
"""Fused attention relative to a large GEMM where no fit exists (FlashAttention-2 reaches
50-73% of A100 peak vs about 70-80% for cuBLAS GEMMs; Dao, arXiv:2307.08691). Used by the
fp32 attention path; ``efficiency.yaml`` states each architecture's attention values."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ArchEfficiency:
    """Achieved fractions of datasheet peaks for one GPU architecture."""

    architecture: str
    gemm: float
    """Large-GEMM efficiency on tensor cores (16-bit and tf32)."""
    gemm_fp8: float
    """Large-GEMM efficiency against the fp8 dense peak (fp8 training also pays for casts and scales)."""
    gemm_fp32: float
    """Large-GEMM efficiency in plain fp32 (CUDA cores, no tensor cores)."""
    attention: float
    """Fused (flash) attention efficiency against the 16-bit dense peak, FLOPs counted with
    causal blocks skipped; fp8 recipes keep attention in 16 bits. This is the FlashAttention-2
    class (PyTorch SDPA, flash-attn 2), which on Hopper reaches about 35% of peak."""
    attention_cudnn: float
    """The same for cuDNN / FlashAttention-3-class kernels (Transformer Engine in NeMo and
    Megatron): Hopper-native, 1.5-2x FlashAttention-2 on H100 (Shah et al., arXiv:2407.08608)."""
    hbm: float
    kernel_overhead_s: float
    gemm_half_size: float
    step_overhead: float
    basis: str
    matmul_reference: float | None = None
    """The measured best-matmul fraction of the GPU the architecture's tensor-core values refer
    to (:attr:`GpuSpec.matmul_fraction`); None where no GPU of the architecture has one."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LinkEfficiency:
    """Achieved bus-bandwidth fraction and per-step latency of one link type."""

    efficiency: float
    latency_s: float


CODE_PATHS = ("cnn", "compiled")
"""Code paths with a step overhead of their own (:attr:`Efficiencies.cnn`,
:attr:`Efficiencies.compiled`; flattened names ``<path>.step_overhead``)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Efficiencies:
    """All efficiency parameters (see ``efficiency.yaml`` for sources)."""

    archs: dict[str, ArchEfficiency]
    links: dict[str, LinkEfficiency]
    pcie_gb_per_s: dict[int, float]
    overlap: dict[str, float]
    virtualization: dict[str, float]
    cnn: dict[str, float]
    """Convolutional networks' own values (``step_overhead``: the share of a CNN step outside
    its priced kernels, in place of the architecture's, which stands for a transformer's
    unpriced element-wise work)."""
    compiled: dict[str, float]
    """``torch.compile``d models' own values (``step_overhead``, in place of the
    architecture's where that is larger: Inductor fuses the element-wise work it stands for)."""
    fp32_gemm_by_compute_capability: dict[str, float]
    """Plain fp32 GEMM fraction of the fp32 peak for a GPU without its own measurement, by
    compute capability: the median of the measured cards of that capability (one SM design,
    one share of its fp32 rate an SGEMM can use; ``efficiency.yaml``)."""

    def arch(self, gpu: GpuSpec) -> ArchEfficiency:
        """Parameters for the GPU's architecture (falls back to Hopper's, stated as prior),
        scaled to the GPU by its measured best matmul (:func:`for_gpu`)."""
        eff = self.archs.get(gpu.architecture) or dataclasses.replace(
            self.archs["Hopper"],
            architecture=gpu.architecture,
            basis=f"no parameters for {gpu.architecture}: Hopper's used as a prior",
        )
        cc = gpu.compute_capability
        return for_gpu(eff, gpu, self.fp32_gemm_by_compute_capability.get(cc) if cc else None)


def for_gpu(eff: ArchEfficiency, gpu: GpuSpec, fp32_prior: float | None = None) -> ArchEfficiency:
    """``eff`` for one GPU of its architecture: tensor-core efficiencies scaled by how much of its
    datasheet peak the GPU reaches in a measured best matmul against the architecture's
    reference GPU (``matmul_reference``).

    GPUs of one architecture reach different fractions of their datasheet peaks: the peak is
    quoted at the boost clock, and a card with less power to spend per SM holds a lower clock
    under tensor-core load (A100 PCIe 79% against A100 SXM 85%), while GeForce cards hold clocks
    above their rated boost (RTX 3090: 108% of its FP32-accumulate peak). Training steps
    run the same kernels, so their GEMMs and fused attention scale alike. Memory bandwidth is
    left as it is; plain fp32 (CUDA cores) takes the GPU's own measured SGEMM fraction where one
    is cited, else ``fp32_prior``, its compute capability's (:func:`_with_fp32`). Where a figure
    is missing, its values are left unchanged. No scaled value goes above the datasheet peak or
    the card's own measured fraction of it, whichever is higher: the RTX 3090's GEMMs run at
    108% of the peak its datasheet quotes at the rated boost clock, which a ceiling of 1.0
    clipped to 100% (before 2026-12-04; docs/accuracy.md, "GeForce GEMMs above the datasheet
    peak").
    """
    frac = gpu.matmul_fraction
    if frac is not None and eff.matmul_reference is not None:
        eff = _scaled(eff, gpu.id, frac, eff.matmul_reference)
    fp32 = gpu.fp32_matmul_fraction
    if fp32 is not None:
        eff = _with_fp32(eff, f"{gpu.id}'s measured SGEMM", fp32)
    elif fp32_prior is not None:
        eff = _with_fp32(
            eff,
            f"the median measured SGEMM of compute capability {gpu.compute_capability} cards",
            fp32_prior,
        )
    return eff


@functools.lru_cache(maxsize=256)
def _with_fp32(eff: ArchEfficiency, whose: str, fp32: float) -> ArchEfficiency:
    """``eff`` with plain fp32 GEMMs at the GPU's own measured fraction of its fp32 peak.

    The architecture's ``gemm_fp32`` is a prior (0.90); CUDA-core SGEMM reaches very different
    shares of the fp32 peak across cards of one architecture: the A100's 98%, but the RTX 3090's
    70% and the RTX 4090's 66%, whose datasheet fp32 rate counts the second FP32 pipe that an
    SGEMM rarely fills (``gpus.yaml`` ``fp32_matmul_tflops_measured``, sourced there). A
    measurement, where one is cited, replaces the prior; a card without one takes the median
    of its compute capability's measured cards (the same SM design). Tensor-core values are
    untouched.
    """
    return dataclasses.replace(
        eff,
        gemm_fp32=fp32,
        basis=f"{eff.basis}; plain fp32 GEMMs at {fp32:.1%} of the fp32 peak, {whose}",
    )


@functools.lru_cache(maxsize=256)
def _scaled(eff: ArchEfficiency, gpu_id: str, frac: float, reference: float) -> ArchEfficiency:
    """:func:`for_gpu`'s result, one object per (parameters, GPU): estimates ask for it twice
    a step, and the compute cache keys on it."""
    r = frac / reference
    if abs(r - 1.0) < 0.005:  # the reference GPU itself (its fraction is stated to 3 digits)
        return eff
    ceiling = max(1.0, frac)
    return dataclasses.replace(
        eff,
        gemm=min(ceiling, eff.gemm * r),
        gemm_fp8=min(ceiling, eff.gemm_fp8 * r),
        attention=min(ceiling, eff.attention * r),
        attention_cudnn=min(ceiling, eff.attention_cudnn * r),
        basis=f"{eff.basis}; tensor-core values x {r:.3f} for {gpu_id}, whose measured best "
        f"matmul reaches {frac:.1%} of its 16-bit peak against {reference:.1%} for "
        "the architecture's reference GPU",
    )


def efficiencies() -> Efficiencies:
    """The efficiency parameters in force (``efficiency.yaml`` unless overridden)."""
    return _OVERRIDE[0] if _OVERRIDE else _load()


class _File(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _ArchFile(_File):
    """One architecture in ``efficiency.yaml``: every parameter stated, none defaulted."""

    gemm: float = Field(gt=0, le=1)
    gemm_fp8: float = Field(gt=0, le=1)
    gemm_fp32: float = Field(gt=0, le=1)
    attention: float = Field(gt=0, le=1)
    attention_cudnn: float = Field(gt=0, le=1)
    hbm: float = Field(gt=0, le=1)
    kernel_overhead_us: float = Field(ge=0)
    gemm_half_size: float = Field(gt=0)
    step_overhead: float = Field(ge=0, lt=1)
    matmul_reference: float | None = Field(gt=0, le=1.2)
    """Stated for every architecture (null where none of its GPUs has a measured matmul)."""
    basis: str = Field(min_length=10)


class _LinkFile(_File):
    efficiency: float = Field(gt=0, le=1)
    latency_us: float = Field(ge=0)


class _OverlapFile(_File):
    data_parallel: float = Field(ge=0, le=1)
    fsdp: float = Field(ge=0, le=1)
    tensor_parallel: float = Field(ge=0, le=1)
    pipeline_p2p: float = Field(ge=0, le=1)


class _PathFile(_File):
    """A code path's own step overhead (``cnn``, ``compiled``)."""

    step_overhead: float = Field(ge=0, lt=1)


class _VirtualizationFile(_File):
    vgpu_slice: float = Field(gt=0, le=1, alias="vgpu-slice")
    virtualized: float = Field(gt=0, le=1)
    bare_metal: float = Field(gt=0, le=1, alias="bare-metal")


class EfficiencyFile(_File):
    """``efficiency.yaml`` as validated: unknown or missing keys are errors."""

    schema_version: str
    architectures: dict[str, _ArchFile] = Field(min_length=1)
    links: dict[str, _LinkFile] = Field(min_length=1)
    pcie_gb_per_s_per_direction: dict[int, float]
    overlap: _OverlapFile
    virtualization: _VirtualizationFile
    cnn: _PathFile
    compiled: _PathFile
    fp32_gemm_by_compute_capability: dict[str, float]

    @field_validator("fp32_gemm_by_compute_capability")
    @classmethod
    def _fractions(cls, value: dict[str, float]) -> dict[str, float]:
        for cc, frac in value.items():
            if not 0.3 <= frac <= 1.2:
                raise ValueError(f"{cc}: {frac} is not a fraction of the fp32 peak (0.3-1.2)")
        return value

    @field_validator("architectures")
    @classmethod
    def _hopper_present(cls, value: dict[str, _ArchFile]) -> dict[str, _ArchFile]:
        if "Hopper" not in value:
            raise ValueError("Hopper is required: it is the prior for unlisted architectures")
        return value


def parse_efficiency_file(data: Any, origin: str = "efficiency.yaml") -> Efficiencies:
    """Validate raw ``efficiency.yaml`` data into :class:`Efficiencies` (CatalogError if bad)."""
    try:
        f = EfficiencyFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise CatalogError(f"{origin}: {where}: {err['msg']}") from exc
    archs = {
        name: ArchEfficiency(
            architecture=name,
            gemm=v.gemm,
            gemm_fp8=v.gemm_fp8,
            gemm_fp32=v.gemm_fp32,
            attention=v.attention,
            attention_cudnn=v.attention_cudnn,
            hbm=v.hbm,
            kernel_overhead_s=v.kernel_overhead_us * 1e-6,
            gemm_half_size=v.gemm_half_size,
            step_overhead=v.step_overhead,
            basis=" ".join(v.basis.split()),
            matmul_reference=v.matmul_reference,
        )
        for name, v in f.architectures.items()
    }
    links = {
        name: LinkEfficiency(efficiency=v.efficiency, latency_s=v.latency_us * 1e-6)
        for name, v in f.links.items()
    }
    return Efficiencies(
        archs=archs,
        links=links,
        pcie_gb_per_s=dict(f.pcie_gb_per_s_per_direction),
        overlap=f.overlap.model_dump(),
        virtualization=f.virtualization.model_dump(by_alias=True),
        cnn=f.cnn.model_dump(),
        compiled=f.compiled.model_dump(),
        fp32_gemm_by_compute_capability=dict(f.fp32_gemm_by_compute_capability),
    )


@functools.lru_cache(maxsize=1)
def _load() -> Efficiencies:
    """Load ``efficiency.yaml`` shipped beside this module."""
    text = resources.files("gpuplan.estimate").joinpath("efficiency.yaml").read_text("utf-8")
    return parse_efficiency_file(yaml.safe_load(text))


def for_dtype(eff: ArchEfficiency, dtype: str) -> ArchEfficiency:
    """The parameters with ``gemm`` set for the compute dtype."""
    if dtype == "fp8":
        return dataclasses.replace(eff, gemm=eff.gemm_fp8)
    if dtype == "fp32":
        return dataclasses.replace(eff, gemm=eff.gemm_fp32)
    return eff


_OVERRIDE: list[Efficiencies] = []


def use_efficiencies(effs: Efficiencies | None) -> None:
    """Replace the loaded parameters (for the fitting script and tests); None restores the file."""
    _OVERRIDE.clear()
    if effs is not None:
        _OVERRIDE.append(effs)


@contextlib.contextmanager
def efficiencies_in_use(effs: Efficiencies) -> Iterator[None]:
    """Use ``effs`` for the duration, then put back whatever was in use before."""
    before = list(_OVERRIDE)
    use_efficiencies(effs)
    try:
        yield
    finally:
        _OVERRIDE[:] = before
