"""Efficiency parameters of the speed model (``efficiency.yaml``), loaded once."""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources
from typing import Any

import yaml

from gpuplan.catalog.schema import GpuSpec

ATTENTION_PRIOR = 0.75
"""Fused attention relative to a large GEMM where no fit exists (FlashAttention-2 reaches
50-73% of A100 peak vs about 70-80% for cuBLAS GEMMs; Dao, arXiv:2307.08691)."""


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


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LinkEfficiency:
    """Achieved bus-bandwidth fraction and per-step latency of one link type."""

    efficiency: float
    latency_s: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Efficiencies:
    """All efficiency parameters (see ``efficiency.yaml`` for sources)."""

    archs: dict[str, ArchEfficiency]
    links: dict[str, LinkEfficiency]
    pcie_gb_per_s: dict[int, float]
    overlap: dict[str, float]
    virtualization: dict[str, float]

    def arch(self, gpu: GpuSpec) -> ArchEfficiency:
        """Parameters for the GPU's architecture (falls back to Hopper's, stated as prior)."""
        return self.archs.get(gpu.architecture) or dataclasses.replace(
            self.archs["Hopper"],
            architecture=gpu.architecture,
            basis=f"no parameters for {gpu.architecture}: Hopper's used as a prior",
        )


def efficiencies() -> Efficiencies:
    """The efficiency parameters in force (``efficiency.yaml`` unless overridden)."""
    return _OVERRIDE[0] if _OVERRIDE else _load()


@functools.lru_cache(maxsize=1)
def _load() -> Efficiencies:
    """Load ``efficiency.yaml`` shipped beside this module."""
    text = resources.files("gpuplan.estimate").joinpath("efficiency.yaml").read_text("utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    archs = {
        name: ArchEfficiency(
            architecture=name,
            gemm=float(v["gemm"]),
            gemm_fp8=float(v.get("gemm_fp8", v["gemm"])),
            gemm_fp32=float(v.get("gemm_fp32", 0.9)),
            attention=float(v.get("attention", ATTENTION_PRIOR * float(v["gemm"]))),
            attention_cudnn=float(
                v.get("attention_cudnn", v.get("attention", ATTENTION_PRIOR * float(v["gemm"])))
            ),
            hbm=float(v["hbm"]),
            kernel_overhead_s=float(v["kernel_overhead_us"]) * 1e-6,
            gemm_half_size=float(v["gemm_half_size"]),
            step_overhead=float(v["step_overhead"]),
            basis=" ".join(str(v["basis"]).split()),
        )
        for name, v in data["architectures"].items()
    }
    links = {
        name: LinkEfficiency(
            efficiency=float(v["efficiency"]), latency_s=float(v["latency_us"]) * 1e-6
        )
        for name, v in data["links"].items()
    }
    return Efficiencies(
        archs=archs,
        links=links,
        pcie_gb_per_s={int(k): float(v) for k, v in data["pcie_gb_per_s_per_direction"].items()},
        overlap={k: float(v) for k, v in data["overlap"].items()},
        virtualization={k: float(v) for k, v in data["virtualization"].items()},
    )


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
