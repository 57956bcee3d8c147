"""Kernel launches per layer are counted from the engines' eager models, not assumed.

``compute.EAGER_KERNELS_PER_LAYER`` comes from ``scripts/count_eager_kernels.py``: a training step
of a 2-layer Hugging Face model less a 1-layer one, under a TorchDispatchMode. The counts move a
little with transformers releases, so the check allows 15%.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate.compute import (
    EAGER_KERNELS_PER_LAYER,
    EAGER_KERNELS_PER_LAYER_AUTOCAST,
    KERNELS_PER_LAYER,
)
from gpuplan.estimate.configure import configure, default_topology
from gpuplan.estimate.fit import model_shape
from gpuplan.estimate.speed import _kernels_per_layer
from gpuplan.spec import parse_spec

REPO = Path(__file__).resolve().parents[1]


def _job(framework: str, compile_: bool = False, precision: str = "bf16-true"):  # type: ignore[no-untyped-def]
    from gpuplan.estimate.fit import memory_job

    spec = parse_spec(
        {
            "model": "llama-3.1-8b",
            "method": "full",
            "precision": precision,
            "seq_len": 1024,
            "micro_batch_size": 1,
            "global_batch_size": 1,
            "framework": framework,
            "compile": compile_,
        }
    )
    return memory_job(spec, model_shape("llama-3.1-8b"))


def test_eager_engines_get_the_counted_launches() -> None:
    llama, gpt2, bert = (model_shape(m) for m in ("llama-3.1-8b", "gpt2", "bert-large"))
    assert _kernels_per_layer(_job("hf"), llama) == EAGER_KERNELS_PER_LAYER["llama"]
    assert _kernels_per_layer(_job("hf"), gpt2) == EAGER_KERNELS_PER_LAYER["gpt2"]
    assert _kernels_per_layer(_job("deepspeed"), bert) == EAGER_KERNELS_PER_LAYER["bert"]
    # fused engines and compiled models keep the prior
    assert _kernels_per_layer(_job("megatron"), llama) == KERNELS_PER_LAYER
    assert _kernels_per_layer(_job("hf", compile_=True), llama) == KERNELS_PER_LAYER


def test_autocast_adds_its_casts_to_the_launches() -> None:
    """torch autocast (a ``*-mixed`` precision under a PyTorch engine) casts each linear's weight
    and fp32 input and the fp32-list ops' inputs, and backward casts the gradients back: kernels
    of their own. DeepSpeed's fp16/bf16 engine casts the model instead, so it keeps the plain
    count, as does a model cast to 16 bits (``*-true``)."""
    llama, gpt2, bert = (model_shape(m) for m in ("llama-3.1-8b", "gpt2", "bert-large"))
    mixed = _job("hf", precision="bf16-mixed")
    assert _kernels_per_layer(mixed, llama) == EAGER_KERNELS_PER_LAYER_AUTOCAST["llama"]
    assert _kernels_per_layer(mixed, gpt2) == EAGER_KERNELS_PER_LAYER_AUTOCAST["gpt2"]
    assert _kernels_per_layer(mixed, bert) == EAGER_KERNELS_PER_LAYER_AUTOCAST["bert"]
    assert (
        _kernels_per_layer(_job("hf", precision="fp32"), llama) == EAGER_KERNELS_PER_LAYER["llama"]
    )
    ds = _job("deepspeed", precision="fp16-mixed")
    assert _kernels_per_layer(ds, gpt2) == EAGER_KERNELS_PER_LAYER["gpt2"]
    for arch in ("llama", "gpt2", "bert"):
        assert EAGER_KERNELS_PER_LAYER_AUTOCAST[arch] > EAGER_KERNELS_PER_LAYER[arch]


def test_launches_are_a_part_of_the_step() -> None:
    spec = parse_spec(
        {
            "model": "llama-3.2-3b",
            "method": "full",
            "precision": "bf16-true",
            "seq_len": 256,
            "micro_batch_size": 1,
            "global_batch_size": 1,
            "framework": "hf",
        }
    )
    gpu = load_catalog(use_user=False).gpu("L40S")
    t = configure(spec, gpu, 1, default_topology(gpu, 1), require_fit=False).time
    eff_us = t.parts["kernel launches"] / (model_shape("llama-3.2-3b").layers * 113) * 1e6
    assert 1 < eff_us < 10  # one launch overhead per counted op


def _script():  # type: ignore[no-untyped-def]
    """``scripts/count_eager_kernels.py`` as a module."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import count_eager_kernels as script
    finally:
        sys.path.pop(0)
    return script


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs the trace extra"
)
def test_the_counts_match_the_counting_script() -> None:
    script = _script()
    import torch
    import transformers as tf

    def llama(n: int):  # type: ignore[no-untyped-def]
        cfg = tf.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=n,
            vocab_size=100,
        )
        cfg._attn_implementation = "sdpa"
        return tf.LlamaForCausalLM(cfg).to(torch.bfloat16)

    counted = sum(script.layer_ops(llama).values())
    assert counted == pytest.approx(EAGER_KERNELS_PER_LAYER["llama"], rel=0.15)


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs the trace extra"
)
def test_the_autocast_counts_match_the_counting_script() -> None:
    script = _script()
    import transformers as tf

    llama, gpt2, bert = script.builders(tf, hidden=64, ffn=128, head_dim=16, kv_heads=2)
    for name, build in (("llama", llama), ("gpt2", gpt2), ("bert", bert)):
        ops = script.layer_ops(build, autocast=True)
        assert ops["_to_copy"] > 20  # the casts are counted
        assert sum(ops.values()) == pytest.approx(EAGER_KERNELS_PER_LAYER_AUTOCAST[name], rel=0.15)


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs the trace extra"
)
def test_the_byte_count_matches_swiglu_counted_by_hand() -> None:
    """``--bytes`` (docs/accuracy.md, "Eager element-wise traffic counted"): in 16 bits, a
    SwiGLU's forward reads and writes the gate for SiLU (4 bytes per unit) and reads two and
    writes one for the product (6): 10; its backward runs two products (12) and SiLU's
    backward (6): 28 in all. Autocast's fp32 norms and casts move more on the hidden width
    than the module cast to 16 bits."""
    script = _script()
    import transformers as tf

    w = script.WIDTHS
    llama, _, _ = script.builders(
        tf, hidden=w["hidden"], ffn=w["ffn"], head_dim=w["kv"], kv_heads=1
    )

    classes = {w["hidden"]: "hidden", w["ffn"]: "ffn", 1: "scalar"}
    step16, fwd16 = script.layer_bytes(llama, "cast16", classes)
    assert step16["ffn"] / w["ffn"] == 28
    assert fwd16["ffn"] / w["ffn"] == 10
    step_ac, _ = script.layer_bytes(llama, "autocast", classes)
    assert step_ac["hidden"] > 1.2 * step16["hidden"]
