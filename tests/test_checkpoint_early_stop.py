"""Full activation checkpointing under torch's non-reentrant implementation stops recomputing
a layer once every tensor its backward saved is back (PyTorch 2.1 on): in a pre-norm decoder
layer the last projection's GEMM is not run again (frameworks.Framework.checkpoint_early_stop,
compute.recompute_skips_last_linear). Megatron's, DeepSpeed's and Hugging Face's reentrant
checkpointing recompute the whole forward."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate.activations import Trainable
from gpuplan.estimate.compute import recompute_skips_last_linear
from gpuplan.estimate.configure import configure, default_topology
from gpuplan.estimate.frameworks import FRAMEWORKS
from gpuplan.estimate.shape import shape_of
from gpuplan.models.presets import load_model
from gpuplan.spec import parse_spec


def _time(**extra: object):  # type: ignore[no-untyped-def]
    gpu = load_catalog(use_user=False).gpu("H100-SXM")
    spec = parse_spec(
        {
            "model": "llama-3-8b",
            "precision": "bf16-mixed",
            "seq_len": 4096,
            "micro_batch_size": 2,
            "global_batch_size": 16,
            "activation_checkpointing": "full",
            "parallelism": {"sharding": "fsdp"},
            **extra,
        }
    )
    return configure(spec, gpu, 8, default_topology(gpu, 8)).time


def test_the_installed_torch_stops_before_the_last_projection() -> None:
    """Counted, not assumed: a checkpointed pre-norm block's backward reruns all its forward
    matmuls under the reentrant implementation and all but the last without it."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    nn, fn = torch.nn, torch.nn.functional
    matmuls = {"addmm.default", "mm.default", "bmm.default"}

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.n += str(func.__name__) in matmuls
            return func(*args, **(kwargs or {}))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(32), nn.LayerNorm(32)
            self.qkv, self.o = nn.Linear(32, 96), nn.Linear(32, 32)
            self.up, self.down = nn.Linear(32, 128), nn.Linear(128, 32)

        def forward(self, x):  # type: ignore[no-untyped-def]
            q, k, v = self.qkv(self.n1(x)).chunk(3, -1)
            x = x + self.o(fn.scaled_dot_product_attention(q, k, v, is_causal=True))
            return x + self.down(fn.gelu(self.up(self.n2(x))))

    torch.manual_seed(0)
    block, x = Block(), torch.randn(2, 8, 32, requires_grad=True)

    def backward_matmuls(out) -> int:  # type: ignore[no-untyped-def]
        with Count() as c:
            out.sum().backward()
        return c.n

    with Count() as fwd:
        block(x)
    plain = backward_matmuls(block(x))
    reentrant = backward_matmuls(checkpoint(block, x, use_reentrant=True))
    early = backward_matmuls(checkpoint(block, x, use_reentrant=False))
    assert reentrant - plain == fwd.n
    assert early - plain == fwd.n - 1


def test_the_recompute_leaves_out_the_down_projection() -> None:
    """Llama 3 8B's down projection is 27% of a layer's linear FLOPs; under torchtitan the
    recompute drops its forward GEMM, so the step saves that share of the forward GEMMs."""
    old = _time(framework="torchtitan", pytorch_version="2.0.1")
    new = _time(framework="torchtitan")
    gemm_fwd = old.parts["gemm"] / 3  # forward, input and weight gradients: one third each
    saved = old.parts["recompute"] - new.parts["recompute"]
    h, f, kv = 4096, 14336, 1024
    share = h * f / (2 * h * h + 2 * h * kv + 3 * h * f)
    assert saved / gemm_fwd == pytest.approx(share, rel=0.1)
    assert new.step_time_s < old.step_time_s
    assert any(a.startswith("recompute: torchtitan's non-reentrant") for a in new.assumptions)
    assert not any(a.startswith("recompute:") for a in old.assumptions)


@pytest.mark.parametrize("framework", ["hf", "megatron", "deepspeed"])
def test_reentrant_engines_recompute_everything(framework: str) -> None:
    assert not FRAMEWORKS[framework].checkpoint_early_stop
    a = _time(framework=framework)
    b = _time(framework=framework, pytorch_version="2.0.1")
    assert a.parts["recompute"] == b.parts["recompute"]


def test_the_frameworks_that_stop_early() -> None:
    assert {n for n, f in FRAMEWORKS.items() if f.checkpoint_early_stop} == {
        "torchtune",
        "torchtitan",
        "llmfoundry",
    }


def test_where_the_last_projection_still_runs() -> None:
    """A LoRA branch on the last projection, a 4-bit base, experts, a residual dropout or a
    post-norm encoder keep its GEMM in the recompute."""
    llama = shape_of(load_model("llama-3-8b"))
    full = Trainable(full=True)
    assert recompute_skips_last_linear(llama, full)
    assert recompute_skips_last_linear(
        llama, Trainable(full=False, lora_roles=frozenset({"q", "v"}), lora_rank=8)
    )
    assert not recompute_skips_last_linear(
        llama, Trainable(full=False, lora_roles=frozenset({"down"}), lora_rank=8)
    )
    assert not recompute_skips_last_linear(
        llama, Trainable(full=False, lora_roles=frozenset({"q"}), quantized_base=True)
    )
    assert not recompute_skips_last_linear(shape_of(load_model("mixtral-8x7b")), full)
    assert not recompute_skips_last_linear(shape_of(load_model("bert-large")), full)
    assert not recompute_skips_last_linear(shape_of(load_model("gpt2")), full)  # resid dropout


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("pytorch_version: two", "pytorch_version", "pytorch_version"),
        ("pytorch_version: 2.10", "pytorch_version", "quoted"),
        ("framework: deepspeed\ndeepspeed: {version: 0.5}", "deepspeed.version", "quoted"),
    ],
)
def test_a_release_is_checked(cli, tmp_path: Path, text: str, field: str, says: str) -> None:  # type: ignore[no-untyped-def]
    """A release must be a quoted dotted number: an unquoted YAML 2.10 would read as 2.1."""
    spec = tmp_path / "job.yaml"
    spec.write_text(f"model: gpt2\n{text}\n")
    result = cli("estimate", str(spec), "--gpu", "H100-SXM", "--json")
    assert result.exit_code == 2
    assert field in result.output and says in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 2


def test_a_quoted_release_is_taken() -> None:
    assert parse_spec({"model": "gpt2", "pytorch_version": "2.10"}).pytorch_version == "2.10"
