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
* NCCL: about 1.6 GB for one communicator after an all-reduce, about 6 GB
  with three or more (NVIDIA/nccl#864, #2363); allocated outside torch.
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
  peak is the loss's own tensors). It was 0.09 from 2026-12-04 (when the 42 reserved and
  device-used rows measured on an H200 by scripts/gpu-memory-check.py joined: plain PyTorch
  loops on one GPU reserve 1-11% above what they allocate), 0.12 from 2026-12-03 (26 rows:
  answer.ai's FSDP rows at batch 1 with their PEFT release's 16-bit adapters reserve 20-50%
  above what they allocate), 0.08 from 2026-12-01, 0.07 before. Some runs fragment far more
  (FSDP at tiny batches: 20-50%).
"""

from __future__ import annotations

import dataclasses

from gpuplan.catalog.schema import GpuSpec

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


def nccl_bytes(communicators: int) -> float:
    """NCCL buffers for this many communicators (0 on one GPU)."""
    if communicators <= 0:
        return 0.0
    extra = (NCCL_MAX_BYTES - NCCL_FIRST_COMMUNICATOR_BYTES) / 2 * (communicators - 1)
    return min(NCCL_MAX_BYTES, NCCL_FIRST_COMMUNICATOR_BYTES + extra)


def allocator_reserve_bytes(allocated: float, fraction: float | None = None) -> float:
    """Bytes the caching allocator holds beyond the allocated peak (``fraction`` defaults to
    :data:`ALLOCATOR_RESERVE_FRACTION`)."""
    f = ALLOCATOR_RESERVE_FRACTION if fraction is None else fraction
    return max(ALLOCATOR_RESERVE_MIN_BYTES, f * allocated)
