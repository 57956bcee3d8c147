"""Efficiency parameters of the speed model (``efficiency.yaml``), loaded once."""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources
from typing import Any

import yaml

from gpuplan.catalog.schema import GpuSpec


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ArchEfficiency:
    """Achieved fractions of datasheet peaks for one GPU architecture."""

    architecture: str
    gemm: float
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


@functools.lru_cache(maxsize=1)
def efficiencies() -> Efficiencies:
    """Load ``efficiency.yaml`` shipped beside this module."""
    text = resources.files("gpuplan.estimate").joinpath("efficiency.yaml").read_text("utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    archs = {
        name: ArchEfficiency(
            architecture=name,
            gemm=float(v["gemm"]),
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
