"""Checks on the shipped catalog data: gpus.yaml, fx.yaml, billing.yaml.

Every rule is a small function that returns a list of problems, so each rule is
run twice: on the shipped data (no problems expected) and on a deliberately
broken copy (problems expected). A rule that cannot fail is itself a failure.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from pathlib import Path

import pytest

from gpuplan.catalog import loader
from gpuplan.catalog.schema import BillingRule, CatalogFile, GpuSpec

REQUIRED_IDS = (
    "T4", "A10", "A10G", "L4", "L40S", "V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB",
    "A100-80GB-PCIE", "H100-SXM", "H100-PCIE", "H100-NVL", "H200", "H20", "B200", "GB200",
    "MI300X", "MI325X", "RTX-4090", "RTX-3090", "RTX-A6000",
)  # fmt: skip
BF16_ARCHS = frozenset({"Ampere", "Ada Lovelace", "Hopper", "Blackwell", "CDNA3"})
FP8_ARCHS = frozenset({"Ada Lovelace", "Hopper", "Blackwell", "CDNA3"})
KNOWN_ARCHS = BF16_ARCHS | {"Turing", "Volta"}
PROVIDERS = frozenset(
    {"aws", "gcp", "azure", "alibaba", "tencent", "lambda", "runpod", "ucloud", "huawei",
     "coreweave", "nebius", "vast"}
)  # fmt: skip
TODAY = dt.date.today()
Rule = Callable[[Sequence[GpuSpec]], list[str]]

# (GPU name or alias, expected id). The first two are fixed by the issue; "A100"
# is SkyPilot's name for the 40 GB part and deliberately does NOT map to 40 GB here.
ALIASES = (
    ("h100", "H100-SXM"),
    ("a100", "A100-80GB"),
    ("A100", "A100-80GB"),
    ("H100 SXM 80GB", "H100-SXM"),
    ("h100-80gb", "H100-SXM"),
    ("H100-MEGA", "H100-SXM"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("v100", "V100-16GB"),
    ("V100-32GB", "V100-32GB"),
    ("4090", "RTX-4090"),
    ("RTX4090", "RTX-4090"),
    ("a6000", "RTX-A6000"),
    ("RTXA6000", "RTX-A6000"),
    ("mi300x", "MI300X"),
    ("H200-SXM", "H200"),
    ("NVIDIA A10G", "A10G"),
    ("A100-80GB-SXM", "A100-80GB"),
    ("A100-80G-PCIe", "A100-80GB-PCIE"),
    ("H100-NVL", "H100-NVL"),
    ("l40s", "L40S"),
    ("  T4 ", "T4"),
)

# (id, dtype, low, high) inclusive, TFLOPS dense; plus memory/bandwidth below.
SPOT_TFLOPS = (
    ("H100-SXM", "bf16", 989.4, 989.5),
    ("A100-80GB", "bf16", 312.0, 312.0),
    ("H200", "bf16", 989.4, 989.5),
    ("MI300X", "bf16", 1307.4, 1307.4),
    ("T4", "fp16", 65.0, 65.0),
)
SPOT_FIELDS = (
    ("H100-SXM", "memory_bytes", 80 * 10**9),
    ("H100-SXM", "memory_bandwidth_gb_per_s", 3350),
    ("H100-SXM", "nvlink_bandwidth_gb_per_s", 900),
    ("A100-80GB", "memory_bytes", 80 * 10**9),
    ("H200", "memory_bytes", 141 * 10**9),
)


def _data_file(name: str) -> CatalogFile:
    text = resources.files("gpuplan.catalog.data").joinpath(name).read_text(encoding="utf-8")
    return loader.parse_catalog_file(text, origin=f"builtin:{name}")


GPU_FILE = _data_file("gpus.yaml")
FX_FILE = _data_file("fx.yaml")
BILLING_FILE = _data_file("billing.yaml")
GPUS = {g.id: g for g in GPU_FILE.gpus}


def _catalog(gpus: Iterable[GpuSpec] = GPU_FILE.gpus) -> loader.Catalog:
    gpu_file = CatalogFile(gpus=tuple(gpus))
    return loader._merge([("gpus", gpu_file), ("fx", FX_FILE), ("billing", BILLING_FILE)])


def _resolve(gpus: Iterable[GpuSpec], name: str) -> str | None:
    """Case-insensitive id/alias lookup, the rule ``Catalog.gpu`` documents."""
    index = {n.lower(): g.id for g in gpus for n in (g.id, *g.aliases)}
    return index.get(name.strip().lower())


def _with(gpu_id: str, **update: object) -> list[GpuSpec]:
    return [g.model_copy(update=update) if g.id == gpu_id else g for g in GPU_FILE.gpus]


def _with_peaks(gpu_id: str, **peaks: float | None) -> list[GpuSpec]:
    new = {k: v for k, v in {**GPUS[gpu_id].peak_tflops_dense, **peaks}.items() if v is not None}
    return _with(gpu_id, peak_tflops_dense=new)


# ----------------------------------------------------------------- the rules


def missing_ids(gpus: Sequence[GpuSpec]) -> list[str]:
    """Every required id present, no id twice."""
    ids = [g.id for g in gpus]
    problems = [f"duplicate id {i}" for i in sorted(set(ids)) if ids.count(i) > 1]
    return problems + [f"missing id {i}" for i in REQUIRED_IDS if i not in ids]


def dtype_problems(gpus: Sequence[GpuSpec]) -> list[str]:
    """bf16/tf32 exactly on Ampere and later, fp8 exactly on Ada/Hopper/Blackwell/CDNA3."""
    problems = []
    for g in gpus:
        if g.architecture not in KNOWN_ARCHS:
            problems.append(f"{g.id}: unknown architecture {g.architecture!r}")
        for dtype in ("bf16", "tf32"):
            if g.supports(dtype) != (g.architecture in BF16_ARCHS):
                problems.append(f"{g.id}: {dtype} present={g.supports(dtype)} on {g.architecture}")
        if g.supports("fp8") != (g.architecture in FP8_ARCHS):
            problems.append(f"{g.id}: fp8 present={g.supports('fp8')} on {g.architecture}")
        if not g.supports("fp16"):
            problems.append(f"{g.id}: every catalogued part has fp16 tensor math")
    return problems


def ratio_problems(gpus: Sequence[GpuSpec]) -> list[str]:
    """Internal consistency of dense peaks; catches one sparse figure among dense ones."""
    problems = []
    for g in gpus:
        p = g.peak_tflops_dense
        checks = []
        if "bf16" in p:
            checks.append(("fp16/bf16", p["fp16"] / p["bf16"], 1.0))
        if "tf32" in p and "bf16" in p:
            checks.append(("tf32/bf16", p["tf32"] / p["bf16"], 0.5))
        if "fp8" in p:
            checks.append(("fp8/bf16", p["fp8"] / p["bf16"], 2.0))
        checks.append(("fp16/fp32 (tensor gain)", p["fp16"] / p["fp32"], None))
        for label, got, want in checks:
            if want is None:
                if not 1.9 <= got <= 35:  # tensor FP16: 2x FP32 (GeForce) to ~31x (GB200)
                    problems.append(f"{g.id}: {label} = {got:.2f} outside 1.9-35")
            elif abs(got - want) > 0.03 * want:
                problems.append(f"{g.id}: {label} = {got:.3f}, expected ~{want}")
    return problems


def spot_problems(gpus: Sequence[GpuSpec]) -> list[str]:
    """Hand-checked datasheet values for a few parts."""
    by_id = {g.id: g for g in gpus}
    problems = []
    for gpu_id, dtype, low, high in SPOT_TFLOPS:
        got = by_id[gpu_id].peak_tflops_dense.get(dtype)
        if got is None or not low <= got <= high:
            problems.append(f"{gpu_id}.{dtype} = {got}, expected {low}-{high}")
    for gpu_id, field, want in SPOT_FIELDS:
        got = getattr(by_id[gpu_id], field)
        if got != want:
            problems.append(f"{gpu_id}.{field} = {got}, expected {want}")
    return problems


def provenance_problems(gpus: Sequence[GpuSpec]) -> list[str]:
    """Dates, notes, vendor-specific fields, MIG and memory units."""
    problems = []
    for g in gpus:
        if g.as_of > TODAY:
            problems.append(f"{g.id}: as_of {g.as_of} is in the future")
        if len(g.notes) < 40:
            problems.append(f"{g.id}: notes must say where the figures come from")
        if g.vendor == "NVIDIA" and g.compute_capability is None:
            problems.append(f"{g.id}: NVIDIA part without compute capability")
        if g.vendor != "NVIDIA" and g.compute_capability is not None:
            problems.append(f"{g.id}: compute capability is NVIDIA-only")
        if g.nvlink_generation is not None and g.nvlink_bandwidth_gb_per_s is None:
            problems.append(f"{g.id}: NVLink generation without bandwidth")
        if g.mig_max_instances not in (0, 7):
            problems.append(f"{g.id}: MIG instances {g.mig_max_instances} (NVIDIA max is 7)")
        if g.mig_max_instances and g.architecture not in {"Ampere", "Hopper", "Blackwell"}:
            problems.append(f"{g.id}: MIG on {g.architecture}")
        if g.memory_bytes % 10**9:
            problems.append(f"{g.id}: memory_bytes is not a whole number of datasheet GB")
    return problems


def billing_problems(rules: Sequence[BillingRule]) -> list[str]:
    """Lowercase known provider ids, once each, facts marked [O] or [3]."""
    names = [r.provider for r in rules]
    problems = [f"duplicate provider {p}" for p in sorted(set(names)) if names.count(p) > 1]
    for r in rules:
        if r.provider not in PROVIDERS:
            problems.append(f"{r.provider}: not a known provider id (lowercase)")
        if "[O" not in r.notes and "[3" not in r.notes:
            problems.append(f"{r.provider}: notes must mark facts [O] or [3]")
        if r.as_of > TODAY:
            problems.append(f"{r.provider}: as_of in the future")
    return problems


# ------------------------------------------------------------ shipped data


@pytest.mark.parametrize(
    ("cat_file", "section"), [(GPU_FILE, "gpus"), (FX_FILE, "fx"), (BILLING_FILE, "billing")]
)
def test_each_file_holds_only_its_own_section(cat_file: CatalogFile, section: str) -> None:
    filled = {name for name in ("gpus", "offerings", "billing", "fx") if getattr(cat_file, name)}
    assert filled == {section}


@pytest.mark.parametrize(
    "rule", [missing_ids, dtype_problems, ratio_problems, spot_problems, provenance_problems]
)
def test_shipped_gpus_pass(rule: Rule) -> None:
    assert len(GPU_FILE.gpus) >= len(REQUIRED_IDS)
    assert rule(GPU_FILE.gpus) == []


def test_cross_references_and_unique_aliases() -> None:
    cat = _catalog()
    assert loader.check_catalog(cat, today=TODAY) == []
    assert len(cat.gpus) == len(GPU_FILE.gpus)


@pytest.mark.parametrize(("name", "gpu_id"), ALIASES)
def test_alias_resolves(name: str, gpu_id: str) -> None:
    assert _resolve(GPU_FILE.gpus, name) == gpu_id


def test_skypilot_quadro_rtx6000_is_not_the_a6000() -> None:
    # SkyPilot's "RTX6000" (Lambda, Seeweb) is the 24 GB Turing Quadro RTX 6000.
    assert _resolve(GPU_FILE.gpus, "RTX6000") is None
    assert _resolve(GPU_FILE.gpus, "NVIDIA-H200-NVL") is None


def test_catalog_gpu_lookup() -> None:
    cat = _catalog()
    assert cat.gpu("h100").id == "H100-SXM"
    assert cat.gpu("A100").id == "A100-80GB"


def test_fx_and_billing() -> None:
    fx = FX_FILE.fx
    assert fx is not None
    assert {"CNY", "EUR"} <= set(fx.per_usd)
    assert 5.0 < fx.per_usd["CNY"] < 9.0
    assert 0.6 < fx.per_usd["EUR"] < 1.2
    assert fx.as_of <= TODAY
    assert billing_problems(BILLING_FILE.billing) == []
    aws = {r.provider: r for r in BILLING_FILE.billing}["aws"]
    assert (aws.granularity_s, aws.minimum_s) == (1, 60)
    # 100 CNY through the loaded catalog lands near 100 / per_usd["CNY"] dollars.
    assert _catalog().convert(100, "CNY", "USD") == pytest.approx(100 / fx.per_usd["CNY"])


# ------------------------------------------------ the rules can fail at all


BROKEN = (
    (missing_ids, lambda: [g for g in GPU_FILE.gpus if g.id != "H20"]),
    (missing_ids, lambda: [*GPU_FILE.gpus, GPUS["T4"]]),
    (dtype_problems, lambda: _with_peaks("V100-16GB", bf16=125.0)),
    (dtype_problems, lambda: _with_peaks("A100-80GB", fp8=624.0)),
    (dtype_problems, lambda: _with_peaks("H100-SXM", fp8=None)),
    (dtype_problems, lambda: _with("B200", architecture="Hoper")),
    (ratio_problems, lambda: _with_peaks("L40S", bf16=733.0)),  # sparse bf16 slipped in
    (ratio_problems, lambda: _with_peaks("MI325X", tf32=1307.4)),
    (spot_problems, lambda: _with_peaks("H100-SXM", bf16=1979.0, fp16=1979.0)),
    (spot_problems, lambda: _with("H100-SXM", memory_bytes=80 * 2**30)),
    (provenance_problems, lambda: _with("A10G", as_of=TODAY + dt.timedelta(days=1))),
    (provenance_problems, lambda: _with("MI300X", compute_capability="9.4")),
    (provenance_problems, lambda: _with("L4", mig_max_instances=7)),
)


@pytest.mark.parametrize(("rule", "make_broken"), BROKEN)
def test_rule_catches_broken_data(rule: Rule, make_broken: Callable[[], list[GpuSpec]]) -> None:
    assert rule(make_broken()) != []


def test_alias_collision_is_reported() -> None:
    broken = _with("A100-40GB", aliases=(*GPUS["A100-40GB"].aliases, "A100"))
    assert loader.check_catalog(_catalog(broken), today=TODAY) != []
    assert _resolve(_with("A100-80GB", aliases=()), "a100") is None


def test_billing_rule_catches_bad_rows() -> None:
    aws = BILLING_FILE.billing[0]
    assert billing_problems([aws.model_copy(update={"provider": "AWS"})]) != []
    assert billing_problems([aws, aws]) != []
    assert billing_problems([aws.model_copy(update={"notes": "per second"})]) != []


# ------------------------------------------- against the shared reference CSV

SHARED = Path(__file__).parents[2] / "shared"
SPECS_CSV = SHARED / "reference" / "gpu_specs.csv"

# gpu_specs.csv "gpu" column -> catalog id; None = deliberately not catalogued.
CSV_TO_ID: dict[str, str | None] = {
    "T4": "T4",
    "A10": "A10",
    "A10G": "A10G",
    "L4": "L4",
    "L40S": "L40S",
    "V100 SXM2 16GB": "V100-16GB",
    "V100 SXM2 32GB": "V100-32GB",
    "A100 SXM 40GB": "A100-40GB",
    "A100 SXM 80GB": "A100-80GB",
    "A100 PCIe 40GB": "A100-40GB-PCIE",
    "A100 PCIe 80GB": "A100-80GB-PCIE",
    "H100 SXM 80GB": "H100-SXM",
    "H100 PCIe 80GB": "H100-PCIE",
    "H100 NVL 94GB": "H100-NVL",
    "H200 SXM 141GB": "H200",
    "B200 (HGX/DGX B200, per GPU)": "B200",
    "GB200 (NVL72, per Blackwell GPU)": "GB200",
    "GeForce RTX 4090": "RTX-4090",
    "GeForce RTX 3090": "RTX-3090",
    "Instinct MI300X": "MI300X",
    "Instinct MI325X": "MI325X",
    "Gaudi 2 (HL-225H)": None,  # no FP32 figure in the CSV; GpuSpec requires one
    "Gaudi 3 (HL-325L)": None,
    "Ascend 910B": None,  # every numeric cell blank: sources conflict
}
# CSV column -> (GpuSpec attribute or dtype, scale to catalog units)
CSV_COLUMNS = {
    "fp16_bf16_tflops_dense": ("fp16", 1.0),
    "fp32_tflops": ("fp32", 1.0),
    "tf32_tflops_dense": ("tf32", 1.0),
    "fp8_tflops_dense": ("fp8", 1.0),
    "memory_gb": ("memory_bytes", 1e9),
    "memory_bw_gbs": ("memory_bandwidth_gb_per_s", 1.0),
}


def _csv_rows() -> list[dict[str, str]]:
    if not SPECS_CSV.is_file():
        pytest.skip(f"{SPECS_CSV} not present (shared reference data is optional)")
    with SPECS_CSV.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_every_reference_row_is_mapped() -> None:
    names = {row["gpu"] for row in _csv_rows()}
    assert names == set(CSV_TO_ID), "new or renamed rows in gpu_specs.csv: update CSV_TO_ID"


def test_dense_peaks_match_reference_csv() -> None:
    compared = 0
    mismatches = []
    for row in _csv_rows():
        gpu_id = CSV_TO_ID.get(row["gpu"])
        if gpu_id is None:
            continue
        gpu = GPUS[gpu_id]
        for column, (field, scale) in CSV_COLUMNS.items():
            if not row[column].strip():
                continue
            want = float(row[column]) * scale
            if field in ("fp16", "fp32", "tf32", "fp8"):
                targets = {field: gpu.peak_tflops_dense.get(field)}
                if field == "fp16" and gpu.supports("bf16"):
                    targets["bf16"] = gpu.peak_tflops_dense["bf16"]
            else:
                targets = {field: getattr(gpu, field)}
            for name, got in targets.items():
                compared += 1
                if got is None or got != pytest.approx(want, rel=1e-3):
                    mismatches.append(f"{gpu_id}.{name}: catalog {got}, reference {want}")
    assert mismatches == []
    assert compared > 80  # the comparison really ran over the mapped rows
