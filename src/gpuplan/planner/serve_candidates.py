"""Where each service could run and what that costs a month: the plan's candidates.

For every service and every priced offering of the catalog that its
constraints allow:

- whole GPUs: an instance of ``n`` GPUs hosts ``n / tp`` replicas of tensor
  parallelism ``tp`` (tp in 1, 2, 4, 8 dividing n); instances = replicas needed /
  replicas per instance, rounded up;
- vGPU instances (``gpu_count`` < 1): one replica per instance;
- shares of one GPU (time-slicing, MPS, MIG) are *bins* for the packer
  (:mod:`gpuplan.planner.serve_pack`): a single-GPU offering whose GPU several
  services share.

Estimates are cached per (service, GPU model, device shape): offerings of the
same GPU share them. Prices are read in one place, :func:`monthly_price`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from gpuplan.catalog.loader import Catalog
from gpuplan.catalog.schema import HOURS_PER_MONTH, GpuSpec, Offering
from gpuplan.catalog.sharing import mig_profiles
from gpuplan.estimate.serve import ServeEstimate, estimate_service
from gpuplan.estimate.serve_device import Device, mig_device, shared_device, vgpu_device, whole_gpu
from gpuplan.serve.spec import ServeConstraints, ServeSpec, ServiceSpec

SERVING_BILLING = ("on-demand", "monthly", "reserved-1y", "reserved-3y")
"""Billing modes a long-running service may use (spot and capacity blocks are left out)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """An offering's monthly price in the plan's currency."""

    per_month: float
    mode: str
    currency: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One way to run one service alone (no sharing with other services)."""

    service: str
    offering: Offering
    region: str
    device: Device
    estimate: ServeEstimate
    replicas: int
    instances: int
    cost_per_month: float
    billing: str

    @property
    def label(self) -> str:
        """``provider:instance_type (device)``."""
        return f"{self.offering.provider}:{self.offering.instance_type} ({self.device.label})"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    """A placement that was considered and dropped, and why."""

    service: str
    placement: str
    reason: str


def monthly_price(
    cat: Catalog, off: Offering, currency: str, modes: tuple[str, ...] = ()
) -> Price | None:
    """The cheapest monthly price of ``off`` among ``modes`` (default: serving modes).

    The one place the planner reads prices: hourly prices run 730 hours a month.
    """
    best: Price | None = None
    for mode in modes or SERVING_BILLING:
        price = off.price(mode)
        if price is None:
            continue
        amount = cat.convert(price.hourly_equivalent * HOURS_PER_MONTH, price.currency, currency)
        if best is None or amount < best.per_month:
            best = Price(per_month=amount, mode=mode, currency=currency)
    return best


def allowed(off: Offering, c: ServeConstraints) -> str | None:
    """Why an offering breaks a service's constraints, or None."""
    if c.providers and off.provider not in c.providers:
        return f"provider {off.provider} not in constraints.providers"
    if c.regions and not any(w.lower() in r.lower() for w in c.regions for r in off.regions):
        return f"no region matching constraints.regions {list(c.regions)}"
    missing = [t for t in c.compliance if t not in off.compliance]
    if missing:
        return f"lacks compliance {', '.join(missing)}"
    if c.bare_metal_only and off.hosting != "bare-metal":
        return "not bare metal"
    return None


def region_of(off: Offering, c: ServeConstraints) -> str:
    """The first of the offering's regions that the constraints allow."""
    for r in off.regions:
        if not c.regions or any(w.lower() in r.lower() for w in c.regions):
            return r
    return off.regions[0]


class EstimateCache:
    """Estimates per (service, device shape), shared by every offering of a GPU model."""

    def __init__(self) -> None:
        self._cache: dict[tuple[object, ...], ServeEstimate] = {}

    def get(self, svc: ServiceSpec, device: Device) -> ServeEstimate:
        """The estimate of ``svc`` on ``device`` (computed once)."""
        key = (
            svc.name,
            device.gpu.id,
            device.kind,
            device.count,
            device.slice,
            round(device.compute_fraction, 4),
            device.memory_bytes,
        )
        found = self._cache.get(key)
        if found is None:
            found = estimate_service(svc, device)
            self._cache[key] = found
        return found


def load_rps(svc: ServiceSpec) -> float | None:
    """The request rate a service must carry (None for offline / concurrency loads)."""
    return svc.load.qps


def replicas_needed(svc: ServiceSpec, est: ServeEstimate) -> int | None:
    """Replicas of ``est``'s device that carry the service's load within its SLO, or None."""
    if not est.fits:
        return None
    if svc.load.offline:
        return 1
    if svc.load.concurrency is not None:
        batch = max(1, int(est.throughput.get("batch") or 1))
        return math.ceil(svc.load.concurrency / batch)
    per = est.max_qps_within_slo
    if per <= 0:
        return None
    return math.ceil((svc.load.qps or 0.0) / per - 1e-9)


def _tp_options(off: Offering) -> list[int]:
    n = int(off.gpu_count)
    return [tp for tp in (1, 2, 4, 8) if tp <= n and n % tp == 0]


def dedicated_candidates(
    spec: ServeSpec,
    cat: Catalog,
    cache: EstimateCache,
    currency: str,
    on_reject: Callable[[Rejected], None],
) -> dict[str, list[Candidate]]:
    """Every way to run each service on its own, cheapest first."""
    out: dict[str, list[Candidate]] = {s.name: [] for s in spec.services}
    gpus = {g.id: g for g in cat.gpus}
    for svc in spec.services:
        c = spec.constraints_of(svc)
        for off in cat.offerings:
            where = f"{off.provider}:{off.instance_type}"
            why = allowed(off, c)
            if why:
                on_reject(Rejected(service=svc.name, placement=where, reason=why))
                continue
            price = monthly_price(cat, off, currency, c.billing)
            if price is None:
                reason = "no price in the catalog for the serving billing modes"
                on_reject(Rejected(service=svc.name, placement=where, reason=reason))
                continue
            gpu = gpus.get(off.gpu)
            if gpu is None:
                continue
            single_fits = False
            for device, per_instance in _devices(off, gpu, c):
                if device.count > 1 and single_fits:
                    break  # n replicas of one GPU beat tensor parallelism over n for cost
                est = cache.get(svc, device)
                n = replicas_needed(svc, est)
                single_fits = device.count == 1 and n is not None
                where = f"{off.provider}:{off.instance_type} ({device.label})"
                if n is None:
                    reason = est.reason or "cannot meet the latency targets at any load"
                    on_reject(Rejected(service=svc.name, placement=where, reason=reason))
                    continue
                if c.max_gpus is not None and n * device.count > c.max_gpus:
                    on_reject(
                        Rejected(service=svc.name, placement=where, reason="exceeds max_gpus")
                    )
                    continue
                instances = math.ceil(n / per_instance)
                out[svc.name].append(
                    Candidate(
                        service=svc.name,
                        offering=off,
                        region=region_of(off, c),
                        device=device,
                        estimate=est,
                        replicas=n,
                        instances=instances,
                        cost_per_month=instances * price.per_month,
                        billing=price.mode,
                    )
                )
        out[svc.name].sort(key=lambda k: (k.cost_per_month, k.offering.provider, k.label))
    return out


def _devices(off: Offering, gpu: GpuSpec, c: ServeConstraints) -> list[tuple[Device, int]]:
    """Device shapes one instance of ``off`` offers a service alone, with replicas per instance."""
    if off.gpu_count < 1:
        return [(vgpu_device(gpu, off), 1)] if "vgpu" in c.sharing else []
    if "whole" not in c.sharing:
        return []
    n = int(off.gpu_count)
    return [(whole_gpu(gpu, tp), n // tp) for tp in _tp_options(off)]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BinType:
    """A single-GPU offering whose GPU several services may share in one mode."""

    offering: Offering
    gpu: GpuSpec
    mode: str
    price: Price
    capacity: tuple[float, ...]
    """Per resource: time-slicing/MPS (compute share 1.0, memory bytes); MIG (7 compute
    slices, 8 memory slices)."""

    @property
    def label(self) -> str:
        """``provider:instance_type (GPU, mode)``."""
        return f"{self.offering.provider}:{self.offering.instance_type} ({self.gpu.id} {self.mode})"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """What one service takes of one bin type (one replica)."""

    service: str
    use: tuple[float, ...]
    device: Device
    estimate: ServeEstimate
    share: float
    """Compute share of the GPU the service needs (time-slicing / MPS) or its profile's."""


def bin_types(spec: ServeSpec, cat: Catalog, currency: str, *, per_gpu: int = 1) -> list[BinType]:
    """Single-GPU offerings to share: the ``per_gpu`` cheapest per GPU model and mode."""
    modes = sorted(
        {m for s in spec.services for m in spec.constraints_of(s).sharing} - {"whole", "vgpu"}
    )
    gpus = {g.id: g for g in cat.gpus}
    by_gpu: dict[str, list[tuple[float, Offering, Price]]] = {}
    for off in cat.offerings:
        if off.gpu_count != 1 or off.gpu not in gpus:
            continue
        if all(allowed(off, spec.constraints_of(s)) for s in spec.services):
            continue
        price = monthly_price(cat, off, currency, spec.constraints.billing)
        if price is None:
            continue
        by_gpu.setdefault(off.gpu, []).append((price.per_month, off, price))
    out = []
    for gpu_id in sorted(by_gpu):
        gpu = gpus[gpu_id]
        rows = sorted(by_gpu[gpu_id], key=lambda r: (r[0], r[1].provider, r[1].instance_type))
        for _, off, price in rows[:per_gpu]:
            for mode in modes:
                if mode == "mig":
                    if not mig_profiles(gpu.id):
                        continue
                    cap: tuple[float, ...] = (7.0, 8.0)
                else:
                    cap = (1.0, float(whole_gpu(gpu).memory_bytes))
                out.append(BinType(offering=off, gpu=gpu, mode=mode, price=price, capacity=cap))
    return out


def demand(svc: ServiceSpec, bt: BinType, cache: EstimateCache) -> Demand | None:
    """What one replica of ``svc`` needs of a bin of type ``bt``, or None if it cannot share."""
    if svc.load.qps is None:
        return None  # offline and closed-loop services want whole devices
    if bt.mode == "mig":
        total = whole_gpu(bt.gpu).memory_bytes
        for prof in sorted(mig_profiles(bt.gpu.id), key=lambda p: (p.compute_slices, p.memory_gb)):
            if prof.compute_slices >= 7:
                continue
            dev = mig_device(bt.gpu, prof.profile)
            est = cache.get(svc, dev)
            if est.fits and est.max_qps_within_slo >= svc.load.qps:
                mem_slices = max(1.0, round(dev.memory_bytes / total * 8))
                return Demand(
                    service=svc.name,
                    use=(float(prof.compute_slices), mem_slices),
                    device=dev,
                    estimate=est,
                    share=prof.compute_fraction,
                )
        return None
    full = shared_device(bt.gpu, bt.mode, 1.0)  # type: ignore[arg-type]
    est = cache.get(svc, full)
    if not est.fits or est.max_qps_within_slo <= 0:
        return None
    share = svc.load.qps / est.max_qps_within_slo
    if share > 1:
        return None
    memory = _shared_memory_bytes(svc, est)
    if memory > full.memory_bytes:
        return None
    dev = shared_device(bt.gpu, bt.mode, max(share, 0.01))  # type: ignore[arg-type]
    return Demand(service=svc.name, use=(share, memory), device=dev, estimate=est, share=share)


def _shared_memory_bytes(svc: ServiceSpec, est: ServeEstimate) -> float:
    """Memory one service needs on a shared GPU: its own, not the engine's default grab.

    LLMs get weights, activations, overhead and the KV cache of the requests in
    flight at the load (with 50% headroom, at least one ``max_model_len`` request):
    set the engine's gpu_memory_utilization to this share.
    """
    m = est.memory
    fixed = float(m["weights_bytes"] + m["activation_bytes"] + m["overhead_bytes"])
    if est.kind != "llm":
        return float(m["total_bytes"])
    per_token = float(m["kv_bytes_per_token"])
    qps = svc.load.qps or 0.0
    lat = est.latency.get("latency_s") or 0.0
    in_flight = max(1.0, qps * lat * 1.5)
    tokens = max(in_flight * (svc.input_tokens + svc.output_tokens), float(m["max_model_len"]))
    return fixed + tokens * per_token
