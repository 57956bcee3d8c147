"""Runtime memory outside the model: CUDA context, cuBLAS workspaces, NCCL, allocator.

Numbers and their sources (``reference/estimators.md``, section 6):

* CUDA context: about 300 MB with lazy module loading (CUDA >= 11.7), reported
  at 300-700 MB; it grows with SM count (pytorch/pytorch#107667, #20532,
  ggml-org/llama.cpp#23604). We take 500 MiB unless a source for the setup
  says otherwise. It appears in nvidia-smi, not in torch's counters.
* cuBLAS workspace: PyTorch's ``parseChosenWorkspaceSize``
  (aten/src/ATen/cuda/CublasHandlePool.cpp) sizes each handle's workspace from
  ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT`` pairs, SIZE in KiB) or, unset, 32 MiB on
  compute capability 9.x and later (pytorch/pytorch#120925) and ``:4096:2:16:8``
  (8.125 MiB) before; forward and the autograd thread each hold a handle. Allocated through
  the caching allocator. Transformer Engine's linears run their GEMMs on a cuBLASLt
  workspace of their own, one tensor allocated through the same allocator
  (transformer_engine/pytorch/module/base.py ``get_workspace``, sized by
  ``get_cublas_workspace_size_bytes``: 32 MiB on compute capability 9 and later, 4 MiB
  before). Megatron's functional tests show the sum: their allocated bytes after a step
  exceed the model states by 2 x 32 MiB + 32 MiB on an H100 and 2 x 32 MiB (their
  ``CUBLAS_WORKSPACE_CONFIG=:4096:8``) + 4 MiB on an A100, to within a MB.
* NCCL: allocated by NCCL itself (cudaMalloc / cuMem), outside torch's counters, and
  "linearly tied to the number of channels" (NCCL's maintainer, NVIDIA/nccl#864, quoted in
  #986), which the link decides (:func:`nccl_bytes`, :func:`nccl_link`):

  - two or more GPUs on PCIe: NCCL picks 2 channels for 2 GPUs and 4 for more (``NCCL INFO``
    logs: hiyouga/LlamaFactory#8036, NVIDIA/nccl-tests#117). Each channel's receive
    connection holds LL 0.5 MiB, LL128 4.69 MiB and Simple 4 MiB buffers (``src/init.cc``
    ``DEFAULT_LL_BUFFSIZE``/``DEFAULT_LL128_BUFFSIZE``/``DEFAULT_BUFFSIZE``) plus a 4 KiB
    header in 2 MiB granules, 10 MiB, and each send connection one 2 MiB granule
    (``src/transport/p2p.cc``, ``p2pRecvSetup``/``p2pSendSetup``); a ring connects one of each
    a channel, an intra-node tree of more than two ranks one more of each. Where the cards have
    no PCIe P2P (GeForce 40-series: ``pcie_p2p`` in the catalog) NCCL uses its SHM transport,
    whose buffers are host memory (``src/transport/shm.cc``). Each channel also holds three
    bookkeeping allocations (``src/channel.cc`` ``initChannel``, 6 MiB in granules) and the
    communicator 4 MiB; the first communicator of a process loads NCCL's kernels, 82 MiB
    (sgl-project/sglang#35538, RTX 3060: the first group 470 MiB, each further one 388 MiB,
    10 MiB with one channel: the bookkeeping above, exactly). Derived from NCCL's source, not
    measured on a PCIe pair: 2 GPUs 122 MiB with P2P, 98 MiB without.
  - NVLink or NVSwitch without NVLink SHARP: measured on 4 A100s over NVLink through PyTorch,
    544 MB a 2-GPU communicator, 688 MB one of more GPUs (NVIDIA/nccl#964); each
    communicator its own (#986: "More communicators = more memory used").
  - NVSwitch with NVLink SHARP (Hopper and later, more than 2 GPUs: NCCL adds NVLS buffers
    of 0.25 to 2.3 GiB by release, ``src/transport/nvls.cc``), several nodes (network buffers
    in device memory with GPUDirect RDMA, ``src/transport/net.cc``) and other links: about
    1.6 GB for one communicator after an all-reduce, about 6 GB with three or more
    (NVIDIA/nccl#864, hardware not stated; #2363).
* Caching allocator: segments are rounded and fragment; reserved exceeds
  allocated. The reserve is ``max(256 MiB, f x allocated)``. f is fitted on the
  reserved and device-used rows of ``validation/memory.csv`` (the rows it moves):
  on the grid 0 to 0.25 in steps of 0.01, the lowest median |log error| among the
  values that leave at most 1 row in 10 predicted more than 10% low (a false
  "fits" costs a failed run). ``gpuplan.holdout.memory_loso`` applies the rule and
  re-fits f without each source; ``gpuplan validate memory`` lists it and
  ``scripts/fit_bounds.py --check`` fails when this value is stale. f = 0.07
  (2026-12-05, when the eager loss's backward was priced at its three fp32 copies of the
  logits and torchtitan's eleven December 2024 reserved rows joined: more of the reserved
  peak is the loss's own tensors; it stayed 0.07 when NCCL's buffers by link, FSDP's root unit and
  sharded adapters were priced the same day, 0.06 with the root unit alone), 0.09 from
  2026-12-04 (when the 42 reserved and device-used rows measured on an H200 by
  scripts/gpu-memory-check.py joined: plain PyTorch loops on one GPU reserve 1-11% above
  what they allocate), 0.12 from 2026-12-03 (26 rows: answer.ai's FSDP rows at batch 1 with
  their PEFT release's 16-bit adapters reserve 20-50% above what they allocate), 0.08 from
  2026-12-01, 0.07 before. Some runs fragment far more (FSDP at tiny batches: 20-50%).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from gpuplan.catalog.schema import GpuSpec
from gpuplan.estimate.comm import usual_intra_node

MIB = 2**20
CUDA_CONTEXT_BYTES = 500 * MIB
ALLOCATOR_RESERVE_FRACTION = 0.07
ALLOCATOR_RESERVE_MIN_BYTES = 256 * MIB
NCCL_FIRST_COMMUNICATOR_BYTES = 1.6e9
NCCL_MAX_BYTES = 6.0e9


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Overheads:
    """Runtime overheads of one GPU process, bytes."""

    cublas_workspace: float
    allocator_reserve: float
    cuda_context: float
    nccl: float


TORCH_CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
"""PyTorch's default cuBLAS workspace per handle before compute capability 9 (``:4096:2:16:8``)."""
TORCH_CUBLAS_WORKSPACE_BYTES_SM90 = 4096 * 1024 * 8
"""PyTorch's default on compute capability 9.x and later (32 MiB)."""
TE_WORKSPACE_BYTES = 4 * MIB
"""Transformer Engine's cuBLASLt workspace before compute capability 9."""
TE_WORKSPACE_BYTES_SM90 = 32 * MIB
"""Transformer Engine's cuBLASLt workspace from compute capability 9."""


def cublas_config_bytes(config: str) -> float:
    """Bytes per handle that a ``CUBLAS_WORKSPACE_CONFIG`` value asks for: the sum of
    SIZE KiB x COUNT over its ``:SIZE:COUNT`` pairs (PyTorch's parser)."""
    values = [int(v) for v in config.split(":")[1:]]
    return float(
        sum(size * 1024 * count for size, count in zip(values[::2], values[1::2], strict=True))
    )


def _major(gpu: GpuSpec | None) -> int:
    cc = gpu.compute_capability if gpu and gpu.compute_capability else "8.0"
    return int(str(cc).split(".")[0])


def cublas_workspace_bytes(
    gpu: GpuSpec | None, per_handle: float | None = None, *, te: bool = False
) -> float:
    """Two PyTorch cuBLAS workspaces (forward stream and autograd thread) of ``per_handle``
    bytes each (default: PyTorch's for the GPU), plus Transformer Engine's own workspace
    where its linears run (``te``)."""
    major = _major(gpu)
    if per_handle is None:
        per_handle = (
            TORCH_CUBLAS_WORKSPACE_BYTES_SM90 if major >= 9 else TORCH_CUBLAS_WORKSPACE_BYTES
        )
    te_bytes = (TE_WORKSPACE_BYTES_SM90 if major >= 9 else TE_WORKSPACE_BYTES) if te else 0
    return 2 * per_handle + te_bytes


NcclLink = Literal["pcie-p2p", "pcie-shm", "nvlink", "nvls", "other"]
"""How a job's NCCL communicators connect its ranks, as far as their memory goes."""
NCCL_LINK_NOTES: dict[str, str] = {
    "pcie-p2p": "PCIe with P2P, 2 channels (4 beyond 2 GPUs) of ring (and tree) buffers in "
    "device memory, from NCCL's source (not measured on a PCIe pair)",
    "pcie-shm": "PCIe without P2P: NCCL's SHM transport keeps its buffers in host memory; "
    "kernels and bookkeeping only, from NCCL's source (not measured on a PCIe pair)",
    "nvlink": "NVLink without NVLink SHARP, 544 MB a 2-GPU communicator and 688 MB a larger "
    "one, as measured on A100s (NVIDIA/nccl#964)",
    "nvls": "NVSwitch with NVLink SHARP buffers, about 1.6 GB the first communicator "
    "(NVIDIA/nccl#864)",
    "other": "about 1.6 GB the first communicator and 6 GB at most (NVIDIA/nccl#864; across "
    "nodes, or a link not modelled apart)",
}
"""What each link's NCCL figure rests on (an estimate's assumption)."""
NCCL_NVLINK_PAIR_BYTES = 544e6
"""A 2-GPU communicator on A100s over NVLink, measured through PyTorch (NVIDIA/nccl#964)."""
NCCL_NVLINK_GROUP_BYTES = 688e6
"""A communicator of 3 or 4 of the same A100s (NVIDIA/nccl#964)."""
NCCL_MODULE_BYTES = 82 * MIB
"""The first communicator of a process loads NCCL's kernels (sgl-project/sglang#35538)."""
NCCL_RECV_CONNECTION_BYTES = 10 * MIB
"""LL + LL128 + Simple buffers and a 4 KiB header, in 2 MiB granules (``p2pRecvSetup``)."""
NCCL_SEND_CONNECTION_BYTES = 2 * MIB
"""A send connection's 4 KiB header in one 2 MiB granule (``p2pSendSetup``)."""
NCCL_CHANNEL_BOOKKEEPING_BYTES = 6 * MIB
"""Three device allocations a channel (``initChannel``), 2 MiB granules each."""
NCCL_COMM_BOOKKEEPING_BYTES = 4 * MIB
"""A communicator's own device structures (``devCommAndChans``, ``rankToLocalRank``)."""


def nccl_link(gpu: GpuSpec | None, intra_node: str | None, *, multi_node: bool) -> NcclLink:
    """The link whose NCCL memory a job's communicators take (``intra_node`` None: the GPU's
    usual board, SXM parts on NVSwitch and PCIe cards on PCIe)."""
    if multi_node or gpu is None:
        return "other"
    # NCCL runs between GPUs of one node: the board of a node of more than one
    link = intra_node or usual_intra_node(gpu, gpus_per_node=2)
    if link == "pcie":
        return "pcie-p2p" if gpu.pcie_p2p else "pcie-shm"
    if link == "nvswitch" and _major(gpu) >= 9:
        return "nvls"
    return "nvlink" if link in ("nvswitch", "nvlink") else "other"


def _pcie_communicator_bytes(ranks: int, p2p: bool) -> float:
    """One communicator's device bytes on PCIe (its ring, and tree beyond two ranks)."""
    channels = 2 if ranks <= 2 else 4
    connections = channels * (1 if ranks <= 2 else 2) if p2p else 0
    return (
        NCCL_COMM_BOOKKEEPING_BYTES
        + channels * NCCL_CHANNEL_BOOKKEEPING_BYTES
        + connections * (NCCL_RECV_CONNECTION_BYTES + NCCL_SEND_CONNECTION_BYTES)
    )


def priced_link(groups: tuple[int, ...], link: NcclLink) -> NcclLink:
    """The link whose figure prices ``groups``: NVLink SHARP needs more than two GPUs, so a
    Hopper NVSwitch job whose communicators are all pairs is priced as plain NVLink."""
    return "nvlink" if link == "nvls" and groups and max(groups) <= 2 else link


def nccl_bytes(groups: tuple[int, ...], link: NcclLink = "other") -> float:
    """NCCL's device bytes on one rank, which is in one communicator of each size in
    ``groups`` (the degrees above 1 of its parallel dimensions; none on one GPU)."""
    if not groups:
        return 0.0
    if link in ("pcie-p2p", "pcie-shm"):
        return NCCL_MODULE_BYTES + sum(
            _pcie_communicator_bytes(g, link == "pcie-p2p") for g in groups
        )
    link = priced_link(groups, link)
    if link == "nvlink":
        per = sum(NCCL_NVLINK_PAIR_BYTES if g <= 2 else NCCL_NVLINK_GROUP_BYTES for g in groups)
        return min(NCCL_MAX_BYTES, NCCL_MODULE_BYTES + per)
    extra = (NCCL_MAX_BYTES - NCCL_FIRST_COMMUNICATOR_BYTES) / 2 * (len(groups) - 1)
    return min(NCCL_MAX_BYTES, NCCL_FIRST_COMMUNICATOR_BYTES + extra)


def allocator_reserve_bytes(allocated: float, fraction: float | None = None) -> float:
    """Bytes the caching allocator holds beyond the allocated peak (``fraction`` defaults to
    :data:`ALLOCATOR_RESERVE_FRACTION`)."""
    f = ALLOCATOR_RESERVE_FRACTION if fraction is None else fraction
    return max(ALLOCATOR_RESERVE_MIN_BYTES, f * allocated)
