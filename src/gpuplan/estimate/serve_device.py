"""The device a service runs on: a whole GPU (or TP group), a MIG slice, a vGPU instance or a share.

A :class:`Device` says how much of one GPU model a service sees: memory bytes,
the share of SMs (compute) and of memory bandwidth, and what sharing costs
(throughput and p99-latency factors from ``catalog/sharing.yaml``).

- whole: everything; ``count`` GPUs in tensor parallelism.
- mig: the profile's memory, ``g/7`` of the SMs and ``memory/total`` of the
  bandwidth (MIG partitions memory controllers with the memory slices).
- vgpu: a provider's vGPU instance type (``gpu_count`` < 1): its framebuffer and
  ``gpu_count`` of the time-shared GPU (under contention; the best-effort
  scheduler may give more when neighbours are idle).
- time-slicing / mps: memory is shared without isolation; the service gets the
  share it is given and pays the measured interference.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from gpuplan.catalog.loader import Catalog
from gpuplan.catalog.schema import GpuSpec, Offering
from gpuplan.catalog.sharing import (
    cuda_capacity_bytes,
    interference,
    mig_memory_bytes,
    mig_profile,
    sharing_data,
)
from gpuplan.errors import SpecError, UnknownNameError

DeviceKind = Literal["whole", "mig", "vgpu", "time-slicing", "mps"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """What one service replica sees of the hardware.

    Attributes:
        gpu: the GPU model.
        count: GPUs in tensor parallelism (1 for any slice or share).
        kind: whole, mig, vgpu, time-slicing or mps.
        slice: MIG profile or vGPU instance type; None for whole GPUs and shares.
        memory_bytes: memory the engine sees on each GPU, bytes.
        compute_fraction: share of the GPU's SMs (0-1].
        bandwidth_fraction: share of its memory bandwidth (0-1].
        throughput_factor: capacity lost to interference (1 = none).
        latency_p99_factor: p99 latency inflation from interference (1 = none).
        k8s_resource: the Kubernetes extended resource a pod requests.
        basis: where the slice's numbers come from.
    """

    gpu: GpuSpec
    count: int = 1
    kind: DeviceKind = "whole"
    slice: str | None = None
    memory_bytes: int
    compute_fraction: float = 1.0
    bandwidth_fraction: float = 1.0
    throughput_factor: float = 1.0
    latency_p99_factor: float = 1.0
    k8s_resource: str = "nvidia.com/gpu"
    basis: str = ""

    @property
    def label(self) -> str:
        """Short human label: ``H100-SXM``, ``2x H100-SXM``, ``H100-SXM 1g.10gb``..."""
        if self.kind == "whole":
            return self.gpu.id if self.count == 1 else f"{self.count}x {self.gpu.id}"
        if self.kind in ("mig", "vgpu"):
            return f"{self.gpu.id} {self.slice}"
        return f"{self.gpu.id} {self.kind} {self.compute_fraction:.0%}"


def whole_gpu(gpu: GpuSpec, count: int = 1) -> Device:
    """``count`` whole GPUs in tensor parallelism."""
    if count < 1:
        raise SpecError(f"--count: must be >= 1, got {count}")
    return Device(
        gpu=gpu,
        count=count,
        memory_bytes=cuda_capacity_bytes(gpu),
        basis=sharing_data().cuda_capacity_source,
    )


def mig_device(gpu: GpuSpec, profile: str) -> Device:
    """One MIG instance of ``profile`` on ``gpu``."""
    prof = mig_profile(gpu.id, profile)
    mem = mig_memory_bytes(prof)
    total = cuda_capacity_bytes(gpu)
    return Device(
        gpu=gpu,
        kind="mig",
        slice=prof.profile,
        memory_bytes=mem,
        compute_fraction=prof.compute_fraction,
        bandwidth_fraction=min(1.0, mem / total),
        k8s_resource=prof.k8s_resource,
        basis=prof.source,
    )


def vgpu_device(gpu: GpuSpec, offering: Offering) -> Device:
    """A provider's vGPU instance type (an offering with ``gpu_count`` < 1)."""
    if offering.gpu_count >= 1:
        raise SpecError(
            f"--slice: {offering.instance_type} has {offering.gpu_count:g} whole GPUs; "
            "it is not a vGPU slice"
        )
    mem = offering.gpu_memory_bytes or int(gpu.memory_bytes * offering.gpu_count)
    return Device(
        gpu=gpu,
        kind="vgpu",
        slice=offering.instance_type,
        memory_bytes=int(mem * sharing_data().cuda_capacity_factor),
        compute_fraction=offering.gpu_count,
        bandwidth_fraction=offering.gpu_count,
        basis=offering.source,
    )


def shared_device(gpu: GpuSpec, mode: DeviceKind, share: float) -> Device:
    """A ``share`` of ``gpu`` under time-slicing or MPS (memory is not isolated)."""
    if mode not in ("time-slicing", "mps"):
        raise SpecError(f"sharing: {mode} is not a software-sharing mode")
    if not 0 < share <= 1:
        raise SpecError(f"sharing: share must be in (0, 1], got {share}")
    factors = interference(mode)
    return Device(
        gpu=gpu,
        kind=mode,
        memory_bytes=int(cuda_capacity_bytes(gpu) * share),
        compute_fraction=share,
        bandwidth_fraction=share,
        throughput_factor=factors.throughput_factor,
        latency_p99_factor=factors.latency_p99_factor,
        basis=factors.source,
    )


def resolve_device(
    cat: Catalog, gpu_id: str, *, count: int = 1, slice: str | None = None
) -> Device:
    """The device of ``--gpu ID [--count N] [--slice PROFILE|INSTANCE-TYPE]``.

    Raises:
        UnknownNameError: unknown GPU, MIG profile or vGPU instance type.
        SpecError: ``--count`` with a slice, or a slice of another GPU.
    """
    gpu = cat.gpu(gpu_id, field="--gpu")
    if slice is None:
        return whole_gpu(gpu, count)
    if count != 1:
        raise SpecError("--count: a slice runs on one GPU; drop --count or --slice")
    if "g." in slice and slice[0].isdigit():
        return mig_device(gpu, slice)
    slices = [o for o in cat.offerings if o.gpu_count < 1]
    for off in slices:
        if off.instance_type.lower() == slice.strip().lower():
            if off.gpu != gpu.id:
                raise SpecError(
                    f"--slice: {off.instance_type} is a slice of {off.gpu}, not {gpu.id}",
                    hint=f"--gpu {off.gpu}",
                )
            return vgpu_device(gpu, off)
    raise UnknownNameError(
        "MIG profile or vGPU instance type",
        slice,
        [o.instance_type for o in slices if o.gpu == gpu.id] or [o.instance_type for o in slices],
        field="--slice",
    )
