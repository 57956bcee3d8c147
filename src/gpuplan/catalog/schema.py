"""Catalog data model: GPUs, cloud offerings, prices, billing rules, FX rates.

Every model here crosses disk, so each is a frozen pydantic model that forbids
unknown fields. Units are in the field names. Every row carries ``source`` and
``as_of``: a fact without a source does not enter the catalog.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = "1"

Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]
DTYPES: tuple[Dtype, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
IntraNode = Literal["nvswitch", "nvlink", "pcie", "infinity-fabric", "none"]
Fabric = Literal["infiniband", "roce", "efa", "ethernet", "none"]
Hosting = Literal["bare-metal", "virtualized", "vgpu-slice"]
BillingMode = Literal[
    "on-demand",
    "spot",
    "reserved-1y",
    "reserved-3y",
    "monthly",
    "capacity-block",
    "community",
]
BILLING_MODES: tuple[str, ...] = (
    "on-demand",
    "spot",
    "reserved-1y",
    "reserved-3y",
    "monthly",
    "capacity-block",
    "community",
)
HOURS_PER_MONTH = 730.0
"""Hours in a billing month as AWS, GCP and Azure price pages count them (8760 / 12)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuSpec(_Frozen):
    """One GPU model as its datasheet describes it.

    Peak TFLOPS are **dense** (datasheets often print sparse figures, twice as
    large; those are halved before they land here). A dtype missing from
    ``peak_tflops_dense`` is not supported by the GPU's tensor/vector units.
    """

    id: str = Field(description="Canonical id, e.g. H100-SXM.")
    aliases: tuple[str, ...] = Field(
        default=(), description="Other names, matched case-insensitively."
    )
    vendor: Literal["NVIDIA", "AMD", "Intel", "Huawei"]
    architecture: str = Field(description="Micro-architecture, e.g. Hopper, Ampere, CDNA3.")
    compute_capability: str | None = Field(
        default=None, description="CUDA compute capability (NVIDIA only), e.g. '9.0'."
    )
    form_factor: Literal["sxm", "pcie", "oam", "superchip"]
    memory_bytes: int = Field(gt=0, description="Device memory in bytes (GB on datasheets = 1e9).")
    memory_total_mib: int | None = Field(
        default=None,
        gt=0,
        description="Device memory as the driver reports it (nvidia-smi memory.total, MiB); what "
        "device-used bytes are compared with. None where no capture is cited.",
    )
    memory_total_source: str | None = Field(
        default=None, description="The capture memory_total_mib was read from (and its driver)."
    )
    memory_type: str
    memory_bandwidth_gb_per_s: float = Field(
        gt=0, description="Peak memory bandwidth, GB/s (1e9 B/s)."
    )
    peak_tflops_dense: dict[Dtype, float] = Field(
        description="Dense peak TFLOPS (TOPS for int8) per dtype; absent = unsupported."
    )
    nvlink_generation: int | None = Field(
        default=None, ge=1, description="NVLink generation, None if none."
    )
    nvlink_bandwidth_gb_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Per-GPU NVLink (or Infinity Fabric) bandwidth, GB/s, bidirectional.",
    )
    pcie_generation: int | None = Field(
        default=None,
        ge=3,
        le=6,
        description="Host PCIe generation; None for superchips on NVLink-C2C.",
    )
    tdp_w: float | None = Field(default=None, gt=0)
    mig_max_instances: int = Field(default=0, ge=0, description="Max MIG instances; 0 = no MIG.")
    source: str = Field(min_length=3)
    as_of: dt.date
    notes: str = ""

    @field_validator("peak_tflops_dense")
    @classmethod
    def _positive_peaks(cls, value: dict[str, float]) -> dict[str, float]:
        for dtype, tflops in value.items():
            if tflops <= 0:
                raise ValueError(f"peak_tflops_dense.{dtype} must be > 0 (omit unsupported dtypes)")
        if "fp32" not in value:
            raise ValueError("peak_tflops_dense.fp32 is required")
        return value

    @model_validator(mode="after")
    def _memory_total_sourced(self) -> GpuSpec:
        if self.memory_total_mib is not None:
            if not self.memory_total_source:
                raise ValueError(
                    "memory_total_mib needs memory_total_source (the capture it is from)"
                )
            ratio = self.memory_total_mib * 2**20 / self.memory_bytes
            if not 0.9 <= ratio <= 1.15:
                raise ValueError(
                    f"memory_total_mib {self.memory_total_mib} is {ratio:.2f} x memory_bytes; "
                    "expected the same device memory in MiB"
                )
        return self

    @property
    def capacity_bytes(self) -> int:
        """Memory the device reports (``memory.total``), else the datasheet figure."""
        if self.memory_total_mib is not None:
            return self.memory_total_mib * 2**20
        return self.memory_bytes

    @property
    def capacity_basis(self) -> str:
        """``device-reported`` when memory.total is known, else ``datasheet``."""
        return "device-reported" if self.memory_total_mib is not None else "datasheet"

    @property
    def precisions(self) -> tuple[str, ...]:
        """Dtypes this GPU computes in hardware, in a fixed order."""
        return tuple(d for d in DTYPES if d in self.peak_tflops_dense)

    def supports(self, dtype: str) -> bool:
        """Whether the GPU supports ``dtype`` natively."""
        return dtype in self.peak_tflops_dense


class Price(_Frozen):
    """One price of an offering in one billing mode.

    Exactly one of ``per_hour`` (for the whole instance) and ``per_month`` is set.
    ``granularity_s`` / ``minimum_s`` left out are taken from the provider's
    billing rules (``billing.yaml``) when the catalog is loaded.
    """

    mode: BillingMode
    per_hour: float | None = Field(default=None, gt=0, description="Price per instance-hour.")
    per_month: float | None = Field(default=None, gt=0, description="Price per instance-month.")
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    granularity_s: int | None = Field(default=None, ge=1, description="Billing increment, seconds.")
    minimum_s: int | None = Field(
        default=None, ge=0, description="Minimum billed duration, seconds."
    )
    source: str | None = Field(default=None, description="If different from the offering's source.")
    as_of: dt.date | None = None

    @model_validator(mode="after")
    def _one_amount(self) -> Price:
        if (self.per_hour is None) == (self.per_month is None):
            raise ValueError("a price needs exactly one of per_hour or per_month")
        return self

    @property
    def hourly_equivalent(self) -> float:
        """Per-hour amount; monthly prices are spread over 730 h."""
        if self.per_hour is not None:
            return self.per_hour
        assert self.per_month is not None
        return self.per_month / HOURS_PER_MONTH


class Offering(_Frozen):
    """One rentable instance type at one provider."""

    provider: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9-]*$")
    instance_type: str = Field(min_length=1)
    regions: tuple[str, ...] = Field(min_length=1)
    gpu: str = Field(description="GPU id from the GPU catalog.")
    gpu_count: float = Field(gt=0, description="GPUs per instance; < 1 for a fractional slice.")
    gpu_memory_bytes: int | None = Field(
        default=None, gt=0, description="Per-GPU memory when it is a slice (vGPU / MIG); else None."
    )
    vcpus: float | None = Field(default=None, gt=0)
    ram_gb: float | None = Field(default=None, gt=0)
    intra_node: IntraNode
    inter_node_gbps: float | None = Field(
        default=None, ge=0, description="Network per node, Gbit/s."
    )
    fabric: Fabric | None = None
    hosting: Hosting = "virtualized"
    compliance: tuple[str, ...] = Field(
        default=(), description="e.g. mlps-3, hipaa, soc2, iso27001."
    )
    cold_start: str | None = Field(
        default=None, description="Known provisioning / cold-start notes."
    )
    prices: tuple[Price, ...] = ()
    source: str = Field(min_length=3)
    as_of: dt.date
    notes: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """Identity used for override shadowing: (provider, instance_type)."""
        return (self.provider, self.instance_type.lower())

    def price(self, mode: str) -> Price | None:
        """The price in billing ``mode``, or None if the catalog has none."""
        return next((p for p in self.prices if p.mode == mode), None)


class BillingRule(_Frozen):
    """A provider's default billing increment and minimum for hourly modes."""

    provider: str
    granularity_s: int = Field(ge=1)
    minimum_s: int = Field(ge=0)
    egress_usd_per_gb: float | None = Field(default=None, ge=0)
    stopped_instance_billed: bool | None = None
    source: str = Field(min_length=3)
    as_of: dt.date
    notes: str = ""


class FxRates(_Frozen):
    """Currency conversion: units of each currency per 1 USD, dated."""

    base: Literal["USD"] = "USD"
    per_usd: dict[str, float]
    source: str = Field(min_length=3)
    as_of: dt.date

    @field_validator("per_usd")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        for cur, rate in value.items():
            if rate <= 0:
                raise ValueError(f"per_usd.{cur} must be > 0")
        return value


class CatalogFile(_Frozen):
    """The shape of any catalog file, shipped or user override; every section optional."""

    schema_version: str = SCHEMA_VERSION
    gpus: tuple[GpuSpec, ...] = ()
    offerings: tuple[Offering, ...] = ()
    billing: tuple[BillingRule, ...] = ()
    fx: FxRates | None = None
