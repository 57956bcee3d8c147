"""What the data looks like: unpadded (mean_seq_len) and packed data, and global batches."""

from __future__ import annotations

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import GpuPlanError
from gpuplan.estimate.configure import Configuration, configure
from gpuplan.spec import nearest_multiples, parse_spec


@pytest.fixture(scope="module")
def h100() -> GpuSpec:
    return load_catalog(use_user=False).gpu("H100-SXM")


def _conf(gpu: GpuSpec, **kw: object) -> Configuration:
    data: dict[str, object] = {
        "model": "llama-3-8b",
        "method": "lora",
        "seq_len": 8192,
        "micro_batch_size": 1,
        "global_batch_size": 8,
        "activation_checkpointing": "full",
        "parallelism": {"sharding": "none"},
        "work": {"samples": 10000},
    }
    data.update(kw)
    return configure(parse_spec(data), gpu, 1, require_fit=False, with_scaling=False)


def test_unpadded_data_costs_time_by_its_mean_and_memory_by_its_maximum(h100: GpuSpec) -> None:
    full = _conf(h100)
    mean = _conf(h100, mean_seq_len=2048)
    assert mean.fit.memory.device_used_bytes == full.fit.memory.device_used_bytes
    # linear layers scale with tokens, attention with their square: well under a quarter
    assert mean.time.step_time_s < full.time.step_time_s / 4
    assert mean.time.time_to_train_s is not None and full.time.time_to_train_s is not None
    assert mean.time.time_to_train_s < full.time.time_to_train_s / 4
    assert any("memory sized by the longest sample" in a for a in mean.time.assumptions)


def test_packed_rows_are_full_but_attend_within_documents(h100: GpuSpec) -> None:
    full = _conf(h100)
    packed = _conf(h100, packing=True, mean_seq_len=1024)
    assert packed.fit.memory.device_used_bytes == full.fit.memory.device_used_bytes
    assert packed.time.tokens_per_s_per_gpu is not None
    # same tokens per row, less attention work: faster per token, but not 8x
    assert full.time.step_time_s / 3 < packed.time.step_time_s < full.time.step_time_s
    no_docs = _conf(h100, packing=True)
    assert no_docs.time.step_time_s == pytest.approx(full.time.step_time_s)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"mean_seq_len": 9000}, "exceeds seq_len"),
        ({"seq_len": None, "mean_seq_len": 100, "packing": True}, "give seq_len"),
        ({"global_batch_size": 10, "micro_batch_size": 4}, "nearest valid: 8, 12"),
    ],
)
def test_bad_data_shapes_are_one_line_errors(kw: dict[str, object], needle: str) -> None:
    data: dict[str, object] = {"model": "llama-3-8b", "seq_len": 8192}
    data.update(kw)
    with pytest.raises(GpuPlanError, match=needle):
        parse_spec(data)


def test_a_global_batch_that_does_not_divide_lists_the_nearest(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "s.yaml"
    path.write_text(
        "model: llama-3-8b\nseq_len: 2048\nmicro_batch_size: 4\nglobal_batch_size: 100\n"
        "parallelism: {sharding: zero3}\n"
    )
    result = cli("fit", str(path), "--gpu", "H100-SXM", "--gpus", "8")
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "nearest valid: 96, 128" in lines[0]
    # gpt2 (12 layers, 12 heads) on 10 GPUs: 28 samples divide over no layout of them
    auto = cli(
        "fit",
        str(path),
        "--gpu",
        "H100-SXM",
        "--gpus",
        "10",
        "--set",
        "parallelism=auto",
        "--set",
        "model=gpt2",
        "--set",
        "global_batch_size=28",
    )
    assert auto.exit_code == 2 and "nearest valid: 20, 40" in auto.stderr


def test_nearest_multiples() -> None:
    assert nearest_multiples(100, 32) == [96, 128]
    assert nearest_multiples(5, 8) == [8]
