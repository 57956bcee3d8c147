"""Runtime and engine memory read from the engines' code: NCCL's buffers by link, FSDP's root
unit, LoRA adapters sharded with the base (docs/accuracy.md, 2026-12-05)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.catalog.schema import GpuSpec
from gpuplan.estimate import overheads as ovh
from gpuplan.estimate.fit import fit, model_shape
from gpuplan.spec import parse_spec

MIB = 2**20


def _gpu(gpu_id: str) -> GpuSpec:
    return load_catalog(use_user=False).gpu(gpu_id)


def _details(spec: dict[str, Any], gpu: str, count: int, **kw: Any) -> dict[str, float]:
    return fit(parse_spec(spec), _gpu(gpu), count, **kw).memory.details


# --- NCCL ---------------------------------------------------------------------------------


def test_pcie_buffers_follow_nccls_source() -> None:
    """Two channels of ring buffers (10 MiB receive + 2 MiB send a channel, in 2 MiB granules)
    with P2P, none in device memory over SHM; bookkeeping 4 + 6 MiB a channel; kernels 82 MiB."""
    assert ovh.nccl_bytes((2,), "pcie-shm") == (82 + 4 + 2 * 6) * MIB
    assert ovh.nccl_bytes((2,), "pcie-p2p") == (82 + 4 + 2 * 6 + 2 * 12) * MIB
    # beyond two ranks: 4 channels, and an intra-node tree adds one more connection of each
    assert ovh.nccl_bytes((4,), "pcie-p2p") == (82 + 4 + 4 * 6 + 4 * 2 * 12) * MIB
    # a second communicator brings its own buffers, not a second copy of the kernels
    assert ovh.nccl_bytes((2, 2), "pcie-shm") == (82 + 2 * (4 + 2 * 6)) * MIB


def test_nvlink_uses_the_measured_a100_communicators() -> None:
    """NVIDIA/nccl#964: 544 MB a 2-GPU communicator, 688 MB a larger one, on A100 NVLink."""
    assert ovh.nccl_bytes((2,), "nvlink") == 82 * MIB + 544e6
    assert ovh.nccl_bytes((8,), "nvlink") == 82 * MIB + 688e6
    assert ovh.nccl_bytes((8, 2), "nvlink") == 82 * MIB + 688e6 + 544e6
    # NVLink SHARP needs more than two GPUs: a Hopper pair on NVSwitch is plain NVLink
    assert ovh.nccl_bytes((2,), "nvls") == ovh.nccl_bytes((2,), "nvlink")


def test_nvls_and_other_links_keep_the_issue_figure() -> None:
    """NVIDIA/nccl#864: about 1.6 GB for one communicator, about 6 GB at most."""
    assert ovh.nccl_bytes((8,), "nvls") == 1.6e9
    assert ovh.nccl_bytes((8,), "other") == 1.6e9
    assert ovh.nccl_bytes((8, 2), "other") == 1.6e9 + 2.2e9
    assert ovh.nccl_bytes((8, 4, 2, 2), "other") == 6e9
    assert ovh.nccl_bytes((), "other") == ovh.nccl_bytes((), "pcie-p2p") == 0.0


@pytest.mark.parametrize(
    ("gpu", "intra", "multi", "link"),
    [
        ("RTX-4090", None, False, "pcie-shm"),  # GeForce 40: no PCIe P2P (catalog, sourced)
        ("A100-80GB", None, False, "nvlink"),  # SXM: NVSwitch, no NVLink SHARP before Hopper
        ("H100-SXM", None, False, "nvls"),
        ("H100-SXM", None, True, "other"),  # across nodes: network buffers
        ("H100-SXM", "pcie", False, "pcie-p2p"),  # the link stated wins over the board
    ],
)
def test_the_link_comes_from_the_board_or_the_topology(
    gpu: str, intra: str | None, multi: bool, link: str
) -> None:
    assert ovh.nccl_link(_gpu(gpu), intra, multi_node=multi) == link


def test_a_geforce_pair_pays_tens_of_mib_not_a_gigabyte() -> None:
    spec = {
        "model": "llama-2-7b",
        "method": "qlora",
        "seq_len": 2048,
        "micro_batch_size": 4,
        "parallelism": {"sharding": "fsdp"},
    }
    pair = _details(spec, "RTX-4090", 2)["overhead: NCCL buffers"]
    assert pair == ovh.nccl_bytes((2,), "pcie-shm") < 128 * MIB
    eight = _details(spec, "H100-SXM", 8)["overhead: NCCL buffers"]
    assert eight == 1.6e9
    # a stated topology decides: 16 GPUs over two nodes take the network's figure
    two_nodes = _details(spec, "A100-80GB", 16, gpus_per_node=8)["overhead: NCCL buffers"]
    assert two_nodes == 1.6e9
    one_node = _details(spec, "A100-80GB", 16, gpus_per_node=16)["overhead: NCCL buffers"]
    assert one_node == 82 * MIB + 688e6


# --- FSDP's root unit ------------------------------------------------------------------------

ROOT = "weights: FSDP root unit gathered through forward and backward"


def test_the_root_unit_holds_embedding_and_head_gathered() -> None:
    """FSDP1 never reshards the root after forward, nor FSDP2 before PyTorch 2.8: the embedding,
    the final norm and the LM head stay whole from the root's pre-forward to its post-backward."""
    shape = model_shape("llama-3-8b")
    spec = {
        "model": "llama-3-8b",
        "seq_len": 2048,
        "precision": "bf16-mixed",
        "parallelism": {"sharding": "fsdp"},
    }
    details = _details(spec, "H100-SXM", 8)
    other = shape.params_total - shape.layers * shape.params_per_layer  # embedding, norm, head
    assert details[ROOT] == pytest.approx(other * 2, rel=1e-6)  # gathered in bf16


def test_torchtitan_gives_the_embedding_a_unit_of_its_own() -> None:
    """torchtitan #1094 (PyTorch 2.9 builds on): the embedding reshards after its forward; only
    the norm and the head stay with the root."""
    shape = model_shape("llama-3-8b")
    base = {
        "model": "llama-3-8b",
        "seq_len": 2048,
        "precision": "bf16-mixed",
        "framework": "torchtitan",
        "parallelism": {"sharding": "fsdp"},
    }
    old = _details({**base, "pytorch_version": "2.7.0"}, "H100-SXM", 8)[ROOT]
    new = _details(base, "H100-SXM", 8)[ROOT]
    assert old - new == pytest.approx(shape.params_embedding * 2, rel=1e-6)


def test_deepspeed_and_replicated_jobs_have_no_root_unit() -> None:
    spec = {"model": "llama-3-8b", "seq_len": 2048, "precision": "bf16-mixed"}
    z3 = {**spec, "framework": "deepspeed", "parallelism": {"sharding": "zero3"}}
    assert ROOT not in _details(z3, "H100-SXM", 8)
    ddp = {**spec, "parallelism": {"sharding": "none"}}
    assert ROOT not in _details(ddp, "H100-SXM", 8)


# --- LoRA adapters sharded with the base ----------------------------------------------------


def test_fsdp_shards_the_adapters_with_the_base() -> None:
    spec = {
        "model": "llama-3-8b",
        "method": "lora",
        "seq_len": 2048,
        "precision": "bf16-true",
        "parallelism": {"sharding": "fsdp"},
    }
    one = _details(spec, "H100-SXM", 1)["weights: LoRA adapters"]
    eight = _details(spec, "H100-SXM", 8)["weights: LoRA adapters"]
    assert eight == pytest.approx(one / 8)
    # DDP keeps every adapter on every rank
    ddp = {**spec, "parallelism": {"sharding": "none"}}
    assert _details(ddp, "H100-SXM", 8)["weights: LoRA adapters"] == pytest.approx(one)


def test_the_note_names_the_figure_that_priced_it() -> None:
    """A Hopper NVSwitch pair has no NVLink SHARP: it is priced, and explained, as NVLink."""
    spec = {"model": "llama-3-8b", "seq_len": 2048, "parallelism": {"sharding": "fsdp"}}
    m = fit(parse_spec(spec), _gpu("H100-SXM"), 2).memory
    note = next(a for a in m.assumptions if a.startswith("NCCL buffers"))
    assert m.details["overhead: NCCL buffers"] == ovh.nccl_bytes((2,), "nvlink")
    assert "nccl#964" in note and "nccl#864" not in note
