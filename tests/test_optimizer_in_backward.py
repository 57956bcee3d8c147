"""The optimizer step fused into backward, and bitsandbytes' paged optimizers.

torchtune's ``optimizer_in_bwd`` (``torchtune/training/memory.py``,
``register_optim_in_bwd_hooks``) steps each parameter in its post-accumulate-grad hook and
frees its gradient, so gradients never all exist. bitsandbytes' paged optimizers keep the
moments in CUDA unified memory (``Optimizer8bit.get_state_buffer``: ``F.get_paged``), outside
PyTorch's allocator. torchtune's README measures both (Llama 3.1 8B full fine-tune on a 4090,
18.9 GiB; Llama 3.2 3B with the step in backward, 23.1 GiB): ``validation/memory.csv``.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import GpuPlanError, SpecError
from gpuplan.estimate.configure import configure, default_topology
from gpuplan.estimate.fit import fit, model_shape
from gpuplan.spec import parse_spec

GIB = 2**30


@pytest.fixture(scope="module")
def a100() -> GpuSpec:
    return load_catalog(use_user=False).gpu("A100-80GB")


def _spec(**kw: Any) -> Any:
    data: dict[str, Any] = {
        "model": "llama-3.2-3b",
        "method": "full",
        "precision": "bf16-true",
        "optimizer": "adamw",
        "micro_batch_size": 2,
        "seq_len": 4096,
        "activation_checkpointing": "full",
        "framework": "torchtune",
        "parallelism": {"sharding": "none"},
    }
    data.update(kw)
    return parse_spec(data)


def test_step_in_backward_keeps_one_gradient_and_no_step_phase(a100: GpuSpec) -> None:
    plain = fit(_spec(compile=True), a100).memory  # torchtune's README row: compiled
    fused = fit(_spec(compile=True, optimizer_in_backward=True), a100).memory
    shape = model_shape("llama-3.2-3b")
    largest = shape.vocab * shape.hidden  # the (tied) embedding is the largest tensor
    assert plain.peak_phase == "optimizer step"
    assert plain.details["gradients"] == pytest.approx(shape.params_total * 2, rel=0.01)
    assert fused.details["gradients"] == pytest.approx(largest * 2)
    # foreach AdamW's sqrt(v) buffer for one parameter, not for all of them
    assert fused.details["optimizer: step temporaries"] == pytest.approx(largest * 2)
    assert fused.details["optimizer: state"] == plain.details["optimizer: state"]
    assert fused.peak_phase == "forward/backward"
    saved = plain.peak_allocated_bytes - fused.peak_allocated_bytes
    # the gradients and step buffer of every parameter, less the activations now at the peak
    assert saved > shape.params_total * 2
    assert any("optimizer step in backward" in a for a in fused.assumptions)


def test_paged_moments_are_outside_the_allocator_and_never_refuse() -> None:
    """Llama 3.1 8B full fine-tune on a 24 GB card: 15 GiB of bf16 weights plus 15 GiB of 8-bit
    moments does not fit, but paged moments page out to the host, as torchtune runs it."""
    gpu = load_catalog(use_user=False).gpu("RTX-4090")
    base = {
        "model": "llama-3.1-8b",
        "optimizer": "adamw-8bit",
        "micro_batch_size": 2,
        "seq_len": 2048,
        "optimizer_in_backward": True,
        "compile": True,
    }
    resident = fit(_spec(**base), gpu).memory
    paged = fit(_spec(**base, paged_optimizer=True), gpu).memory
    moments = model_shape("llama-3.1-8b").params_total * (2 + 2 * 4 / 2048)
    assert resident.details["optimizer: state"] == pytest.approx(moments, rel=0.01)
    assert not resident.fits
    assert paged.details["optimizer: state"] == pytest.approx(0.0, abs=1.0)
    assert paged.peak_allocated_bytes == pytest.approx(
        resident.peak_allocated_bytes - moments, rel=0.01
    )
    assert paged.fits
    # nvidia-smi counts what stays resident: here the card is full
    resident_part = paged.details["optimizer: paged state resident on the GPU (unified memory)"]
    assert 0 <= resident_part < moments
    assert paged.device_used_bytes == pytest.approx(
        max(paged.capacity_bytes, paged.device_used_bytes - resident_part)
    )
    assert sum(paged.breakdown.values()) == pytest.approx(paged.device_used_bytes)
    assert any("paged optimizer" in a for a in paged.assumptions)


def test_paged_state_is_resident_where_the_card_has_room(a100: GpuSpec) -> None:
    mem = fit(_spec(optimizer="adamw-8bit", paged_optimizer=True), a100).memory
    moments = model_shape("llama-3.2-3b").params_total * (2 + 2 * 4 / 2048)
    resident = mem.details["optimizer: paged state resident on the GPU (unified memory)"]
    assert resident == pytest.approx(moments)
    assert mem.device_used_bytes > mem.peak_reserved_bytes + resident


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"paged_optimizer": True, "optimizer": "sgd"}, "paged_optimizer"),
        ({"paged_optimizer": True, "offload": "optimizer"}, "paged_optimizer"),
        ({"optimizer_in_backward": True, "framework": "deepspeed"}, "optimizer_in_backward"),
        ({"paged_optimizer": True, "framework": "megatron"}, "paged_optimizer"),
    ],
)
def test_combinations_no_engine_runs_are_refused(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(GpuPlanError, match=field):
        _spec(**kw)


def test_step_in_backward_takes_no_gradient_accumulation(a100: GpuSpec) -> None:
    spec = _spec(optimizer_in_backward=True, global_batch_size=16)
    with pytest.raises(SpecError, match="optimizer_in_backward.*accumulates 8 micro-batches"):
        fit(spec, a100)
    # the layout search keeps only layouts that cover the global batch in one step
    auto = _spec(optimizer_in_backward=True, global_batch_size=16, parallelism="auto")
    conf = configure(auto, a100, 8, default_topology(a100, 8), with_scaling=False)
    st = conf.strategy
    assert st.grad_accum == 1 and st.micro_batch_size * st.dp == 16
    with pytest.raises(SpecError, match="optimizer_in_backward: no layout"):
        configure(
            _spec(optimizer_in_backward=True, global_batch_size=4096, parallelism="auto"),
            a100,
            8,
            default_topology(a100, 8),
            with_scaling=False,
        )


def test_paged_state_yields_to_the_safety_margin_and_the_verdict() -> None:
    """The resident paged state fills the card only up to what the safety margin leaves, and
    neither the verdict nor the headroom counts it: the driver pages it out for the rest."""
    from gpuplan.estimate.fit import fit as fit_spec

    gpu = load_catalog(use_user=False).gpu("RTX-4090")
    spec = _spec(
        model="llama-3.1-8b",
        optimizer="adamw-8bit",
        micro_batch_size=2,
        seq_len=2048,
        optimizer_in_backward=True,
        compile=True,
        paged_optimizer=True,
    )
    plain = fit_spec(spec, gpu)
    kept = fit_spec(spec, gpu, margin=0.1)
    for res in (plain, kept):
        m = res.memory
        usable = m.capacity_bytes * (1 - m.safety_margin)
        assert m.fits and m.device_used_bytes <= usable + 1.0
        assert m.evictable_bytes > 0
        assert m.headroom_bytes == pytest.approx(usable - (m.device_used_bytes - m.evictable_bytes))
        assert res.verdict == "fits"
