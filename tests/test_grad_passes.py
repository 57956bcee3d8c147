"""The gradient passes outside the update: DDP's bucket copies, the loss scaler's unscale,
clipping and zeroing in place, each a streaming pass over the gradients a rank holds."""

from __future__ import annotations

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate.calibration import efficiencies
from gpuplan.estimate.configure import configure, default_topology
from gpuplan.estimate.grad_passes import GradPasses, default_clipping, grad_passes_s
from gpuplan.spec import parse_spec

GPT2_LARGE = 774_027_520
"""gpt2-large's parameters as the preset counts them (the head tied to the embedding)."""


@pytest.fixture(scope="module")
def cat():  # type: ignore[no-untyped-def]
    return load_catalog(use_user=False)


def test_each_pass_counts_its_bytes() -> None:
    assert GradPasses().passes == 0
    assert GradPasses(ddp_bucket_copies=True).passes == 4
    assert GradPasses(unscale=True).passes == 2
    assert GradPasses(clip=True).passes == 3
    assert GradPasses(zero_fill=True).passes == 1
    every = GradPasses(ddp_bucket_copies=True, unscale=True, clip=True, zero_fill=True)
    assert every.passes == 10
    assert len(every.names()) == 4
    assert GradPasses(clip=True).names() == ("clipping by the global norm (norm, then scale)",)
    assert grad_passes_s(every, 4e9, 1e12) == pytest.approx(0.04)


@pytest.mark.parametrize(
    ("framework", "hf_trainer", "clips"),
    [
        ("hf", True, True),  # TrainingArguments.max_grad_norm = 1.0
        ("hf", False, False),  # a plain loop clips where it says so
        ("deepspeed", True, False),  # gradient_clipping 0, filled only from "auto"
        ("megatron", False, True),  # --clip-grad 1.0
        ("torchtitan", False, True),  # training.max_norm 1.0
        ("torchtune", False, False),
        ("llmfoundry", False, False),
    ],
)
def test_default_clipping_per_framework(framework: str, hf_trainer: bool, clips: bool) -> None:
    assert default_clipping(framework, hf_trainer) is clips


GPT2_DDP = {
    "model": "gpt2-large",
    "method": "full",
    "precision": "fp16-mixed",
    "micro_batch_size": 1,
    "seq_len": 1024,
    "framework": "hf",
    "parallelism": {"sharding": "none", "tp": 1, "pp": 1},
}
"""GPT-2 large under torch autocast, fp16, one micro-batch a step, replicated."""


def _passes(cat, gpus: int, **kw: object) -> tuple[float, tuple[str, ...]]:  # type: ignore[no-untyped-def]
    gpu = cat.gpu("A100-80GB")
    spec = parse_spec({**GPT2_DDP, **kw})
    est = configure(spec, gpu, gpus, default_topology(gpu, gpus), require_fit=False)
    named = tuple(a for a in est.time.assumptions if a.startswith("gradient passes"))
    return est.time.parts["gradient passes"], named


def test_ddp_under_the_trainer_runs_every_pass(cat) -> None:  # type: ignore[no-untyped-def]
    """Vanilla Hugging Face on 8 GPUs, fp16 autocast, before PyTorch 2.0: DDP's copies (4),
    the unscale (2), the Trainer's clipping (3) and zero_grad in place (1) over fp32 grads."""
    gpu = cat.gpu("A100-80GB")
    hbm = gpu.memory_bandwidth_gb_per_s * 1e9 * efficiencies().arch(gpu).hbm
    t, named = _passes(cat, 8, hf_trainer=True, zero_grad="zeros")
    assert t == pytest.approx(10 * GPT2_LARGE * 4 / hbm, rel=0.01)
    assert "DDP's bucket copies" in named[0] and "zero_grad in place" in named[0]
    # one GPU has no DDP; bf16 has no loss scaler; a plain loop does not clip unless told
    assert _passes(cat, 1, hf_trainer=True, zero_grad="zeros")[0] == pytest.approx(6 / 10 * t)
    assert _passes(cat, 8, hf_trainer=True, zero_grad="zeros", precision="bf16-mixed")[
        0
    ] == pytest.approx(8 / 10 * t)
    assert _passes(cat, 8, zero_grad="zeros")[0] == pytest.approx(7 / 10 * t)
    assert _passes(cat, 8, gradient_clipping=True, zero_grad="zeros")[0] == pytest.approx(t)
    assert _passes(cat, 8, hf_trainer=True, gradient_clipping=False, zero_grad="zeros")[
        0
    ] == pytest.approx(7 / 10 * t)


def test_sharded_gradients_pass_over_the_shard_only(cat) -> None:  # type: ignore[no-untyped-def]
    """FSDP keeps 1/N of the gradients and has no DDP buckets: the unscale and the clipping
    run over the shard. DeepSpeed does not clip by default, even under the Trainer."""
    full, _ = _passes(cat, 8, hf_trainer=True)
    sharded, _ = _passes(cat, 8, hf_trainer=True, parallelism={"sharding": "fsdp"})
    assert sharded == pytest.approx(full * (2 + 3) / (4 + 2 + 3) / 8, rel=0.01)
    ds, named = _passes(
        cat, 8, hf_trainer=True, framework="deepspeed", parallelism={"sharding": "zero1"}
    )
    assert ds == 0.0 and not named


def test_the_passes_are_in_the_step(cat) -> None:  # type: ignore[no-untyped-def]
    """The passes add to the step (they run on the compute stream, after backward)."""
    gpu = cat.gpu("A100-80GB")
    topo = default_topology(gpu, 8)
    plain = configure(parse_spec(GPT2_DDP), gpu, 8, topo, require_fit=False).time
    clipped = configure(
        parse_spec({**GPT2_DDP, "gradient_clipping": True}), gpu, 8, topo, require_fit=False
    ).time
    overhead = 1 + efficiencies().arch(gpu).step_overhead
    added = clipped.parts["gradient passes"] - plain.parts["gradient passes"]
    assert added > 0
    assert clipped.step_time_s - plain.step_time_s == pytest.approx(added * overhead, rel=1e-6)
