"""GEMM workspaces a rank allocates: PyTorch's cuBLAS handles and Transformer Engine's.

PyTorch sizes each cuBLAS handle's workspace in ``parseChosenWorkspaceSize``
(aten/src/ATen/cuda/CublasHandlePool.cpp): ``CUBLAS_WORKSPACE_CONFIG`` if set, else 32 MiB
from compute capability 9 and ``:4096:2:16:8`` before. Transformer Engine's linears allocate
one cuBLASLt workspace of their own (``get_cublas_workspace_size_bytes``: 32 MiB from
compute capability 9, 4 MiB before). Megatron's functional tests show the sum in their
steady allocation (validation/memory.csv, ``megatron-functest-toy-*``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate import overheads as ovh
from gpuplan.estimate.fit import fit, memory_job, spec_shape
from gpuplan.estimate.memory import workspace_bytes
from gpuplan.spec import parse_spec

MIB = 2**20


@pytest.mark.parametrize(
    ("gpu_id", "per_handle"),
    [
        ("V100-16GB", 8_519_680),
        ("A100-80GB", 8_519_680),
        ("RTX-4090", 8_519_680),  # compute capability 8.9: before 9
        ("H100-SXM", 32 * MIB),
        ("B200", 32 * MIB),
    ],
)
def test_pytorch_default_workspace_per_handle(gpu_id: str, per_handle: int) -> None:
    gpu = load_catalog(use_user=False).gpu(gpu_id)
    assert ovh.cublas_workspace_bytes(gpu) == 2 * per_handle


@pytest.mark.parametrize(
    ("config", "per_handle"),
    [(":4096:8", 32 * MIB), (":4096:2:16:8", 8_519_680), (":16:8", 128 * 1024)],
)
def test_cublas_workspace_config_is_parsed_as_pytorch_does(config: str, per_handle: int) -> None:
    assert ovh.cublas_config_bytes(config) == per_handle


@pytest.mark.parametrize(("gpu_id", "te"), [("A100-80GB", 4 * MIB), ("H100-SXM", 32 * MIB)])
def test_transformer_engine_adds_its_own_workspace_under_megatron(gpu_id: str, te: int) -> None:
    gpu = load_catalog(use_user=False).gpu(gpu_id)
    spec = parse_spec({"model": "llama-3-8b", "seq_len": 2048, "framework": "megatron"})
    job = memory_job(spec, spec_shape(spec))
    assert workspace_bytes(job, gpu) == ovh.cublas_workspace_bytes(gpu) + te
    hf = dataclasses.replace(job, framework="hf")
    assert workspace_bytes(hf, gpu) == ovh.cublas_workspace_bytes(gpu)


def test_the_spec_setting_reaches_the_estimate() -> None:
    gpu = load_catalog(use_user=False).gpu("A100-80GB")
    base = {"model": "llama-3-8b", "seq_len": 2048, "precision": "bf16-true"}
    plain = fit(parse_spec(base), gpu, 1).memory
    set_ = fit(parse_spec({**base, "cublas_workspace_config": ":4096:8"}), gpu, 1).memory
    grown = (
        set_.details["overhead: cuBLAS workspaces"] - plain.details["overhead: cuBLAS workspaces"]
    )
    assert grown == 2 * (32 * MIB - 8_519_680)
    assert set_.peak_allocated_bytes - plain.peak_allocated_bytes == pytest.approx(grown)


@pytest.mark.parametrize(
    "value", ["4096:8", ":4096", ":a:8", ":4096:8:", "", ":99999999:8", "x" * 300_000]
)
def test_a_malformed_config_is_one_line_naming_the_field(cli, tmp_path: Path, value: str) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "job.yaml"
    spec.write_text(f"model: llama-3-8b\nseq_len: 2048\ncublas_workspace_config: '{value}'\n")
    result = cli("fit", str(spec), "--gpu", "A100-80GB")
    assert result.exit_code == 2
    lines = [ln for ln in result.output.strip().splitlines() if ln]
    assert len(lines) == 1 and "cublas_workspace_config" in lines[0], result.output[:500]
    assert len(lines[0]) < 500  # a huge value is not echoed whole
