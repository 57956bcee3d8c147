"""Catalog data model: GPUs, cloud offerings, prices, billing rules, FX rates.

Every model here crosses disk, so each is a frozen pydantic model that forbids
unknown fields. Units are in the field names. Every row carries ``source`` and
``as_of``: a fact without a source does not enter the catalog.

Prices belong to regions. An :class:`Offering` lists every region (or named
group of regions, such as ``china-mainland``) that sells it; each of its
:class:`Price` rows names the regions it applies to in ``regions``, and a price
without ``regions`` applies to all of the offering's regions (the format before
per-region prices, still read unchanged). One region has at most one price per
billing mode. Each price keeps the currency it was published in (Alibaba's
overseas regions on the China site are priced in CNY); amounts are converted
only for display or comparison, with the catalog's dated :class:`FxRates`.

Commitments are prices in the modes ``monthly``, ``reserved-1y`` and
``reserved-3y``, given as ``per_hour`` (an effective hourly rate),
``per_month`` or ``per_year``. Where a provider publishes only a rule (a
percentage off on-demand for a term), a :class:`CommitmentRule` derives the
price from the on-demand price of each region when the catalog is loaded; such
a price says so in ``derived``.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from gpuplan.schema_base import UserModel

SCHEMA_VERSION = "1"

UNKNOWN_DATE: Literal["unknown"] = "unknown"
"""``as_of`` of rows whose data date nobody recorded (e.g. a SkyPilot catalog imported
without ``--as-of``): kept, but the planner warns that their age is unknown."""

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
HOURS_PER_YEAR = 12 * HOURS_PER_MONTH
"""Hours in a billing year (8760)."""
CommitMode = Literal["monthly", "reserved-1y", "reserved-3y"]
"""Billing modes that commit to a term: a month, one year or three years.

``monthly`` is a one-month subscription (Alibaba/Tencent 包月, a Vast 1-month
term); ``reserved-1y``/``reserved-3y`` are any 1- or 3-year commitment: AWS
Reserved Instances and Savings Plans, Azure reservations, GCP committed use,
Alibaba/Tencent yearly subscriptions (包年).
"""
SourceKind = Literal["official", "third-party", "api-dump", "catalog", "api", "user"]
"""Where a fact comes from.

``official``: the provider's own page or document. ``third-party``: someone
else's transcription or report. ``api-dump``: a copy of the provider's own price
data (an API answer or price file) kept by someone else. ``catalog``: another
tool's catalog (SkyPilot). ``api``: fetched live from the provider's price API
(``gpuplan catalog fetch``). ``user``: declared by the user for their own account.
"""


class _Frozen(UserModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _check_measured_matmul(
    name: str,
    value: float | None,
    source_name: str,
    source: str | None,
    peak: float | None,
    peak_label: str,
    hint: str = "",
) -> None:
    """A measured matmul needs its source and a plausible share (0.3-1.2) of the datasheet peak
    it is compared with (a figure outside it was measured in another dtype)."""
    if value is None:
        return
    if not source:
        raise ValueError(f"{name} needs {source_name}")
    if not peak:
        raise ValueError(f"{name} needs a {peak_label} peak to compare with")
    if not 0.3 <= value / peak <= 1.2:
        raise ValueError(
            f"{name} {value} is {value / peak:.2f} x the {peak_label} peak; expected 0.3-1.2{hint}"
        )


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
        default=None,
        pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$",
        description="CUDA compute capability (NVIDIA only), major.minor, e.g. '9.0'.",
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
    matmul_tflops_measured: float | None = Field(
        default=None,
        gt=0,
        description="Best measured dense 16-bit matmul TFLOP/s (torch.matmul, the best of many "
        "shapes: 'maximum achievable matmul FLOPS'); None where no measurement is cited.",
    )
    matmul_measured_source: str | None = Field(
        default=None, description="Where matmul_tflops_measured was measured (and with what)."
    )
    fp32_matmul_tflops_measured: float | None = Field(
        default=None,
        gt=0,
        description="Best measured plain fp32 matmul TFLOP/s (torch.matmul with TF32 off: CUDA "
        "cores, no tensor cores); None where no measurement is cited.",
    )
    fp32_matmul_measured_source: str | None = Field(
        default=None, description="Where fp32_matmul_tflops_measured was measured."
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
    pcie_p2p: bool = Field(
        default=True,
        description="Whether NVIDIA's driver gives the GPU PCIe peer-to-peer: without it NCCL "
        "moves data between GPUs of a node through host memory.",
    )
    pcie_p2p_source: str | None = Field(
        default=None, description="Where pcie_p2p: false is stated (required then)."
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

    @model_validator(mode="after")
    def _p2p_sourced(self) -> GpuSpec:
        if not self.pcie_p2p and not self.pcie_p2p_source:
            raise ValueError("pcie_p2p: false needs pcie_p2p_source (where it is stated)")
        return self

    @model_validator(mode="after")
    def _matmul_sourced(self) -> GpuSpec:
        _check_measured_matmul(
            "matmul_tflops_measured",
            self.matmul_tflops_measured,
            "matmul_measured_source",
            self.matmul_measured_source,
            self._peak16,
            "16-bit",
        )
        _check_measured_matmul(
            "fp32_matmul_tflops_measured",
            self.fp32_matmul_tflops_measured,
            "fp32_matmul_measured_source",
            self.fp32_matmul_measured_source,
            self.peak_tflops_dense["fp32"],
            "fp32",
            " (TF32 left on?)",
        )
        return self

    @property
    def _peak16(self) -> float | None:
        return self.peak_tflops_dense.get("bf16") or self.peak_tflops_dense.get("fp16")

    @property
    def matmul_fraction(self) -> float | None:
        """Measured best 16-bit matmul over the dense 16-bit datasheet peak, where measured
        (the validator guarantees the peak)."""
        if self.matmul_tflops_measured is None or not self._peak16:
            return None
        return self.matmul_tflops_measured / self._peak16

    @property
    def fp32_matmul_fraction(self) -> float | None:
        """Measured best plain fp32 matmul over the fp32 datasheet peak, where measured."""
        if self.fp32_matmul_tflops_measured is None:
            return None
        return self.fp32_matmul_tflops_measured / self.peak_tflops_dense["fp32"]

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
    """One price of an offering in one billing mode, in some or all of its regions.

    Exactly one of ``per_hour`` (for the whole instance), ``per_month`` and
    ``per_year`` is set. ``regions`` names the offering's regions (or region
    groups) this price applies to; empty means every region of the offering.
    ``granularity_s`` / ``minimum_s`` left out are taken from the provider's
    billing rules (``billing.yaml``) when the catalog is loaded.

    For a commitment mode (``monthly``, ``reserved-1y``, ``reserved-3y``)
    ``per_hour`` is the effective hourly rate over the whole term, paid whether
    the instance is used or not.
    """

    mode: BillingMode
    per_hour: float | None = Field(default=None, gt=0, description="Price per instance-hour.")
    per_month: float | None = Field(default=None, gt=0, description="Price per instance-month.")
    per_year: float | None = Field(default=None, gt=0, description="Price per instance-year.")
    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO code, as published.")
    regions: tuple[str, ...] = Field(
        default=(),
        description="Regions or region groups (from the offering's regions) this price is "
        "for; empty = all of them.",
    )
    granularity_s: int | None = Field(default=None, ge=1, description="Billing increment, seconds.")
    minimum_s: int | None = Field(
        default=None, ge=0, description="Minimum billed duration, seconds."
    )
    source: str | None = Field(default=None, description="If different from the offering's source.")
    source_kind: SourceKind | None = Field(
        default=None, description="If different from the offering's source_kind."
    )
    as_of: dt.date | None = None
    derived: str | None = Field(
        default=None,
        description="How the amount was computed when it is not a listed price "
        "(e.g. from a published discount rule).",
    )

    @model_validator(mode="after")
    def _one_amount(self) -> Price:
        given = [a for a in (self.per_hour, self.per_month, self.per_year) if a is not None]
        if len(given) != 1:
            raise ValueError("a price needs exactly one of per_hour, per_month or per_year")
        if len(set(self.regions)) != len(self.regions):
            raise ValueError("regions: a region is listed twice")
        return self

    @property
    def hourly_equivalent(self) -> float:
        """Per-hour amount; monthly prices are spread over 730 h, yearly over 8760 h."""
        if self.per_hour is not None:
            return self.per_hour
        if self.per_month is not None:
            return self.per_month / HOURS_PER_MONTH
        assert self.per_year is not None
        return self.per_year / HOURS_PER_YEAR

    def applies_to(self, region: str) -> bool:
        """Whether this price is the one charged in ``region`` (exact region id)."""
        return not self.regions or region in self.regions


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
    compliance_references: dict[str, str] = Field(
        default_factory=dict,
        description="Evidence per compliance tag (a certificate or filing reference), "
        "filled from the user's compliance declarations.",
    )
    prices: tuple[Price, ...] = ()
    source: str = Field(min_length=3)
    source_kind: SourceKind | None = None
    as_of: dt.date | Literal["unknown"] = Field(
        description="Date the prices were read at the source, or `unknown` when nobody "
        "recorded it (the planner then warns that their age is unknown)."
    )
    notes: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """Identity used for override shadowing: (provider, instance_type)."""
        return (self.provider, self.instance_type.lower())

    def price_regions(self, price: Price) -> tuple[str, ...]:
        """The regions ``price`` applies to (all of the offering's when it names none)."""
        return price.regions or self.regions

    def price(self, mode: str, region: str | None = None) -> Price | None:
        """The price in billing ``mode``, or None if the catalog has none.

        Args:
            mode: billing mode.
            region: a region id; None = the cheapest price of ``mode`` in any region
                (compared in hourly equivalents of the published currency).
        """
        found = [p for p in self.prices if p.mode == mode]
        if region is not None:
            return next((p for p in found if p.applies_to(region)), None)
        return min(found, key=lambda p: p.hourly_equivalent, default=None)

    def region_prices(self, mode: str) -> tuple[tuple[str, Price], ...]:
        """(region, price) for every region with a price in ``mode``, in region order."""
        out = []
        for region in self.regions:
            price = self.price(mode, region)
            if price is not None:
                out.append((region, price))
        return tuple(out)


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


class CommitmentRule(_Frozen):
    """A published discount rule: a commitment of ``mode`` costs ``1 - discount`` of on-demand.

    Used only where the provider publishes a rule but no price per instance type.
    When the catalog is loaded, every matching offering without a ``mode`` price
    in a region gets one derived from that region's on-demand price (same
    currency, effective hourly rate), with the rule's source and
    ``derived: "<discount> off on-demand (rule)"``. A listed price always wins over
    a rule. "Up to N%" marketing maxima are not rules and do not belong here.
    """

    provider: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9-]*$")
    mode: CommitMode
    discount: float = Field(gt=0, lt=1, description="Fraction off on-demand, e.g. 0.3 = 30% off.")
    instance_types: tuple[str, ...] = Field(
        default=(),
        description="Shell-style patterns of instance types (fnmatch, case-insensitive); "
        "empty = every instance type of the provider.",
    )
    regions: tuple[str, ...] = Field(default=(), description="Regions it applies to; empty = all.")
    source: str = Field(min_length=3)
    source_kind: SourceKind
    as_of: dt.date
    notes: str = ""


class ComplianceDeclaration(_Frozen):
    """A compliance tag the user holds for their own deployment, with its evidence.

    gpuplan tags an offering only on an official source. Some certifications
    (China's MLPS 2.0 level 3, ``mlps-3``) are granted to *your* system, not to
    the IaaS platform, so you declare them in your overrides file with your
    certificate or filing reference; matching offerings then carry the tag and
    ``compliance_references[tag]`` says where it came from.
    """

    provider: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9-]*$")
    tag: str = Field(min_length=1, description="e.g. mlps-3.")
    reference: str = Field(
        min_length=3, description="Your certificate / filing number or document, as evidence."
    )
    instance_types: tuple[str, ...] = Field(
        default=(), description="Shell-style patterns; empty = every instance type."
    )
    regions: tuple[str, ...] = Field(
        default=(), description="Only offerings sold in one of these regions; empty = all."
    )
    as_of: dt.date


class CatalogFile(_Frozen):
    """The shape of any catalog file, shipped or user override; every section optional."""

    schema_version: str = SCHEMA_VERSION
    gpus: tuple[GpuSpec, ...] = ()
    offerings: tuple[Offering, ...] = ()
    billing: tuple[BillingRule, ...] = ()
    commitment_rules: tuple[CommitmentRule, ...] = ()
    compliance_declarations: tuple[ComplianceDeclaration, ...] = ()
    fx: FxRates | None = None
