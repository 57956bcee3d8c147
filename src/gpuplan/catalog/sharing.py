"""How a GPU can be shared: MIG profiles, time-slicing/MPS interference, CUDA capacity.

The facts live in ``catalog/sharing.yaml`` (each with its source). This module
only loads and looks them up; it is outside ``catalog/data`` so the offering
loader does not read it as a catalog file.
"""

from __future__ import annotations

import functools
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import CatalogError, UnknownNameError


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MigProfile(_Frozen):
    """One MIG GPU-instance profile of one GPU model."""

    gpu: str = Field(description="GPU id of the catalog.")
    profile: str = Field(description="Profile name, e.g. 1g.10gb.")
    memory_gb: float = Field(gt=0, description="Nominal memory (the profile's 'gb', GiB).")
    compute_fraction: float = Field(gt=0, le=1, description="Share of the GPU's SMs (g / 7).")
    max_instances: int = Field(ge=1, description="Most instances of this profile per GPU.")
    k8s_resource: str = Field(description="NVIDIA device plugin resource (mixed strategy).")
    source: str

    @property
    def compute_slices(self) -> int:
        """Compute slices ``g`` of the profile name (``3g.40gb`` -> 3)."""
        return int(self.profile.split("g.", 1)[0])


class Interference(_Frozen):
    """What sharing one GPU between processes costs each of them (no MIG isolation)."""

    mode: str
    throughput_factor: float = Field(gt=0, le=1)
    latency_p99_factor: float = Field(ge=1)
    source: str
    notes: str = ""


class SharingData(_Frozen):
    """The whole ``sharing.yaml``."""

    schema_version: str
    mig_profiles: tuple[MigProfile, ...]
    mig_memory_factor: float = Field(gt=0, le=1)
    mig_memory_factor_source: str
    interference: tuple[Interference, ...]
    cuda_capacity_factor: float = Field(gt=0, le=1)
    cuda_capacity_source: str


@functools.cache
def sharing_data() -> SharingData:
    """The shipped sharing facts (parsed once).

    Raises:
        CatalogError: the shipped file is malformed (a packaging bug).
    """
    text = resources.files("gpuplan.catalog").joinpath("sharing.yaml").read_text(encoding="utf-8")
    try:
        return SharingData.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValidationError) as exc:
        raise CatalogError(f"catalog/sharing.yaml is malformed: {exc}") from exc


def mig_profiles(gpu_id: str) -> tuple[MigProfile, ...]:
    """MIG profiles of ``gpu_id`` (empty when the GPU has no MIG)."""
    return tuple(p for p in sharing_data().mig_profiles if p.gpu == gpu_id)


def mig_profile(gpu_id: str, name: str) -> MigProfile:
    """One MIG profile of ``gpu_id`` by name (``1g.10gb``).

    Raises:
        UnknownNameError: the GPU has no such profile (lists the ones it has).
    """
    for prof in mig_profiles(gpu_id):
        if prof.profile == name.strip().lower():
            return prof
    known = [p.profile for p in mig_profiles(gpu_id)] or ["(none: this GPU has no MIG)"]
    raise UnknownNameError(f"MIG profile of {gpu_id}", name, known, field="--slice")


def mig_memory_bytes(prof: MigProfile) -> int:
    """Usable memory of a MIG instance: nominal GiB x the measured factor."""
    return int(prof.memory_gb * 2**30 * sharing_data().mig_memory_factor)


def interference(mode: str) -> Interference:
    """The interference factors of ``time-slicing`` or ``mps``."""
    for item in sharing_data().interference:
        if item.mode == mode:
            return item
    raise UnknownNameError(
        "sharing mode", mode, (i.mode for i in sharing_data().interference), field="sharing"
    )


def cuda_capacity_bytes(gpu: GpuSpec) -> int:
    """Memory CUDA reports as the device total, as engines see it.

    HBM and GeForce GDDR6X datasheets' "GB" are GiB (H100: 81,559 MiB; RTX 3090:
    24,576 MiB); data-center GDDR6 datasheets' are decimal GB (A10: 23,028 MiB;
    L40S: 46,068 MiB); the driver keeps ~1% (``cuda_capacity_factor``).

    >>> from gpuplan.catalog.loader import load_catalog
    >>> round(cuda_capacity_bytes(load_catalog(use_user=False).gpu("H100-SXM")) / 2**30, 2)
    79.19
    """
    return _capacity(gpu.memory_bytes, gpu.memory_type)


@functools.lru_cache(maxsize=256)
def _capacity(memory_bytes: int, memory_type: str) -> int:
    nominal = memory_bytes
    kind = memory_type.upper()
    if kind.startswith("HBM") or kind.startswith("GDDR6X"):
        nominal = int(memory_bytes / 1e9 * 2**30)
    return int(nominal * sharing_data().cuda_capacity_factor)
