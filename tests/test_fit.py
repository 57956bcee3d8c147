"""Fit: analytic memory model, the estimate JSON contract, and bad-spec errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan.catalog.loader import load_catalog
from gpuplan.errors import GpuPlanError
from gpuplan.estimate.activations import Numerics, Trainable, layer_items
from gpuplan.estimate.fit import fit, model_shape
from gpuplan.spec import parse_spec

EX = Path(__file__).resolve().parents[1] / "examples"
GIB = 2**30


@pytest.fixture(scope="module")
def cat():  # type: ignore[no-untyped-def]
    return load_catalog(use_user=False)


def spec(**kw: object):  # type: ignore[no-untyped-def]
    base: dict[str, object] = {"model": "llama-3-8b", "seq_len": 2048, "precision": "bf16-true"}
    base.update(kw)
    return parse_spec(base)


def test_llama3_8b_layer_activations_match_the_trace() -> None:
    """54 sbh bytes per layer: what a meta-device trace of the HF model keeps (bf16)."""
    shape = model_shape("llama-3-8b")
    items = layer_items(
        shape,
        Numerics(act_bytes=2, autocast=False),
        Trainable(full=True),
        seq=2048,
        fused_attention=True,
    )
    per_sbh = sum(i.bytes_per_token for i in items) / shape.hidden
    assert per_sbh == pytest.approx(54.0, abs=0.2)


def test_full_bf16_adamw_peaks_at_the_optimizer_step(cat) -> None:  # type: ignore[no-untyped-def]
    """8.03B params x (2 weights + 2 grads + 4 AdamW state + 2 foreach temp) bytes."""
    r = fit(spec(micro_batch_size=1), cat.gpu("H100-SXM"), 1)
    assert r.memory.peak_phase == "optimizer step"
    expected = 8_030_261_248 * 10
    model_part = r.memory.peak_allocated_bytes - r.memory.details["overhead: cuBLAS workspaces"]
    assert model_part == pytest.approx(expected, rel=1e-6)
    # 74.8 GiB allocated: its usual 8% allocator reserve would not fit in the 79.6 GiB the
    # driver reports, but PyTorch frees cached blocks before an OOM, so only the estimate fits
    assert r.memory.fits
    assert r.memory.device_used_bytes == pytest.approx(r.memory.capacity_bytes)
    assert r.verdict == "tight"
    # a card 2 GiB smaller than the allocated peak does not fit it, reserve or not
    small = fit(spec(micro_batch_size=1), cat.gpu("H100-SXM"), 1, capacity=73 * 2**30)
    assert not small.memory.fits


def test_zero3_divides_model_states(cat) -> None:  # type: ignore[no-untyped-def]
    one = fit(spec(parallelism={"sharding": "none"}), cat.gpu("H100"), 1).memory
    eight = fit(spec(parallelism={"sharding": "zero3"}), cat.gpu("H100"), 8).memory
    assert eight.details["optimizer: state"] == pytest.approx(one.details["optimizer: state"] / 8)
    assert eight.details["gradients"] == pytest.approx(one.details["gradients"] / 8)
    assert eight.device_used_bytes < one.device_used_bytes


def test_checkpointing_and_lora_reduce_memory(cat) -> None:  # type: ignore[no-untyped-def]
    gpu = cat.gpu("A100-80GB")
    base = fit(spec(micro_batch_size=4), gpu).memory.details["activations: saved for backward"]
    ckpt = fit(spec(micro_batch_size=4, activation_checkpointing="full"), gpu).memory
    assert ckpt.details["activations: saved for backward"] < base / 5
    lora = fit(spec(method="lora", micro_batch_size=4), gpu).memory
    qlora = fit(spec(method="qlora", micro_batch_size=4), gpu).memory
    assert qlora.breakdown["weights"] < lora.breakdown["weights"] / 2


def test_qlora_weights_use_nf4_with_double_quant(cat) -> None:  # type: ignore[no-untyped-def]
    r = fit(spec(method="qlora"), cat.gpu("A10"))
    shape = model_shape("llama-3-8b")
    linear = shape.params_linear_per_layer * shape.layers
    assert r.memory.details["weights: NF4 base linears"] == pytest.approx(linear * 4.127 / 8)


@settings(max_examples=30, deadline=None)
@given(mb=st.integers(1, 16), extra=st.integers(1, 16))
def test_memory_grows_with_micro_batch(mb: int, extra: int) -> None:
    gpu = load_catalog(use_user=False).gpu("H200")
    small = fit(spec(micro_batch_size=mb, method="lora"), gpu).memory.peak_allocated_bytes
    big = fit(spec(micro_batch_size=mb + extra, method="lora"), gpu).memory.peak_allocated_bytes
    assert big > small


def test_max_micro_batch_is_the_boundary(cat) -> None:  # type: ignore[no-untyped-def]
    gpu = cat.gpu("A100-80GB")
    r = fit(spec(method="lora", activation_checkpointing="full"), gpu)
    assert r.max_micro_batch >= 1
    at = fit(
        spec(method="lora", activation_checkpointing="full", micro_batch_size=r.max_micro_batch),
        gpu,
    )
    over = fit(
        spec(
            method="lora", activation_checkpointing="full", micro_batch_size=r.max_micro_batch + 1
        ),
        gpu,
    )
    assert at.memory.fits and not over.memory.fits


@pytest.mark.parametrize(
    ("kw", "gpu", "field"),
    [
        ({"precision": "fp8-mixed"}, "A100-80GB", "precision"),
        ({"precision": "bf16-mixed"}, "V100-16GB", "precision"),
        ({"seq_len": None}, "H100", "seq_len"),
        ({"lora": {"targets": ["nonexistent_proj"]}, "method": "lora"}, "H100", "lora.targets"),
        ({"parallelism": {"tp": 3}}, "H100", "parallelism"),
    ],
)
def test_bad_specs_give_one_line_errors(cat, kw, gpu, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(GpuPlanError) as info:
        fit(spec(**kw), cat.gpu(gpu), 8 if "parallelism" in kw else 1)
    assert info.value.one_line().startswith(field) or f"{field}:" in info.value.one_line()


def test_estimate_json_contract(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "estimate", str(EX / "llama3-8b-lora.yaml"), "--gpu", "A100-80GB", "--count", "8", "--json"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) >= {"gpu", "count", "strategy", "memory", "time"}
    assert data["gpu"] == "A100-80GB" and data["count"] == 8
    assert set(data["strategy"]) >= {
        "sharding",
        "tp",
        "pp",
        "micro_batch_size",
        "activation_checkpointing",
    }
    mem = data["memory"]
    for key in (
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "device_used_bytes",
        "capacity_bytes",
    ):
        assert isinstance(mem[key], int) and mem[key] > 0
    assert mem["peak_allocated_bytes"] <= mem["peak_reserved_bytes"] <= mem["device_used_bytes"]
    assert isinstance(mem["fits"], bool) and isinstance(mem["max_micro_batch"], int)
    assert set(mem["breakdown"]) == {"weights", "gradients", "optimizer", "activations", "overhead"}
    assert sum(mem["breakdown"].values()) == pytest.approx(mem["device_used_bytes"], abs=8)


def test_fit_table_lists_every_gpu(cli, cat) -> None:  # type: ignore[no-untyped-def]
    result = cli("fit", str(EX / "llama3-8b-lora.yaml"), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["gpu"] for r in rows} == {g.id for g in cat.gpus}
    by_gpu = {r["gpu"]: r for r in rows}
    assert by_gpu["H200"]["fits"] and not by_gpu["T4"]["fits"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("model: not-a-model\nseq_len: 128\n", "unknown"),
        ("model: llama-3-8b\nseq_len: 128\nmicro_batch_size: 0\n", "micro_batch_size"),
        ("model: llama-3-8b\nseq_len: 128\nprecision: fp8-mixed\n", "precision"),
        ("model: [llama\n", "malformed YAML"),
    ],
)
def test_cli_bad_spec_exit_2_one_line(cli, tmp_path, text, needle) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "s.yaml"
    path.write_text(text)
    result = cli("fit", str(path), "--gpu", "A100-80GB")
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.output


def test_zero_grad_zeros_keeps_gradients_through_backward(cat) -> None:  # type: ignore[no-untyped-def]
    """Before PyTorch 2.0 zero_grad() zeroed in place: the grads are there during forward too."""
    gpu = cat.gpu("A100-80GB")
    kw = {"model": "bert-large", "seq_len": 512, "precision": "fp32", "micro_batch_size": 4}
    freed = fit(spec(**kw), gpu).memory
    kept = fit(spec(**kw, zero_grad="zeros"), gpu).memory
    assert freed.peak_phase == kept.peak_phase == "forward/backward"
    grads = kept.details["gradients"]
    model = kept.peak_allocated_bytes - freed.peak_allocated_bytes
    assert model == pytest.approx(grads, rel=1e-6)


def test_loss_chunks_override_the_framework(cat) -> None:  # type: ignore[no-untyped-def]
    """torchtune without chunked CE keeps one fp32 logits tensor (4 B/vocab entry) instead of the
    chunked bf16 logits and fp32 log-softmax (2 + 4 B), but the whole fp32 and bf16 logits
    gradients (6 B) appear at once at the start of backward."""
    gpu = cat.gpu("A100-80GB")
    kw = {"model": "llama-3.2-3b", "seq_len": 4096, "micro_batch_size": 2, "framework": "torchtune"}
    chunked = fit(spec(**kw), gpu).memory
    whole = fit(spec(**kw, loss_chunks=1), gpu).memory
    tokens, vocab = 2 * 4096, model_shape("llama-3.2-3b").vocab
    saved = (
        whole.details["activations: saved for backward"]
        - chunked.details["activations: saved for backward"]
    )
    assert saved == pytest.approx(-tokens * vocab * 2, rel=1e-6)
    transient = whole.details["activations: loss/logits gradients (start of backward)"]
    # nll_loss's fp32 gradient and log-softmax backward's fp32 output (4 + 4 bytes a logit)
    assert transient == pytest.approx(tokens * vocab * 8, rel=1e-6)
    assert whole.peak_allocated_bytes > chunked.peak_allocated_bytes
    with pytest.raises(GpuPlanError, match="loss_chunks"):
        spec(loss_chunks=0)


def test_op_selective_checkpointing_sits_between_selective_and_full(cat) -> None:  # type: ignore[no-untyped-def]
    """torchtitan's op policy keeps the layer input, the attention output and logsumexp, and
    the outputs of every other matmul (q, v, gate, down in Llama's forward order)."""
    gpu = cat.gpu("H100-SXM")
    kw = {
        "model": "llama-3.1-8b",
        "seq_len": 4096,
        "micro_batch_size": 1,
        "precision": "bf16-mixed",
    }
    saved = {
        mode: fit(spec(**kw, activation_checkpointing=mode), gpu).memory.details[
            "activations: saved for backward"
        ]
        for mode in ("full", "selective-op", "selective")
    }
    assert saved["full"] < saved["selective-op"] < saved["selective"]
    h, kv, f, heads = 4096, 1024, 14336, 32
    per_token_layer = 2 * h + 2 * h + 4 * heads + 2 * (h + kv + f + h)
    extra = saved["selective-op"] - saved["full"]
    assert extra == pytest.approx(32 * 4096 * (per_token_layer - 2 * h), rel=1e-6)


def test_old_bitsandbytes_keeps_the_previous_steps_4bit_inputs_under_litgpt(cat) -> None:  # type: ignore[no-untyped-def]
    """bitsandbytes < 0.43.2 stores MatMul4Bit's input in ctx.tensors (PR #1270); LitGPT's
    loop holds the previous step's graph through the next forward, so those inputs add up:
    per token and layer the qkv, out-projection, MLP-in and down-projection inputs."""
    gpu = cat.gpu("A10G")
    kw: dict[str, object] = {"method": "qlora", "micro_batch_size": 2, "seq_len": 512}
    lora = {"rank": 16, "targets": ["q_proj", "v_proj"], "double_quant": False}

    def used(framework: str, version: str | None) -> float:
        lo = dict(lora, **({"bitsandbytes": version} if version else {}))
        return fit(spec(**kw, framework=framework, lora=lo), gpu).memory.peak_allocated_bytes

    shape = model_shape("llama-3-8b")
    per_token = shape.layers * (4096 + 4096 + 4096 + 14336) * 2 + 4096 * 2  # + untied head input
    tokens = 2 * 512
    assert used("litgpt", "0.42.0") - used("litgpt", None) == pytest.approx(per_token * tokens)
    assert used("litgpt", "0.43.2") == used("litgpt", None)
    # the HF Trainer returns a detached loss: nothing of the previous graph is referenced
    assert used("hf", "0.42.0") == used("hf", None)


def test_litgpt_qlora_dequantizes_from_fp16_under_bf16(cat) -> None:  # type: ignore[no-untyped-def]
    """Fabric quantizes from fp16: a bf16 forward holds the fp16 dequantized weight and its
    bf16 cast, 4 bytes per element of the largest 4-bit weight (the untied LM head)."""
    r = fit(spec(method="qlora", framework="litgpt"), cat.gpu("A10G")).memory
    shape = model_shape("llama-3-8b")
    assert r.details["weights: dequantized layer (transient)"] == 4 * shape.params_head


@pytest.mark.parametrize("version", ["latest", "0.42.0.1", "v0.42.0", "", "0.42.x"])
def test_bitsandbytes_version_must_be_a_release_number(version: str) -> None:
    with pytest.raises(GpuPlanError, match="bitsandbytes"):
        spec(method="qlora", lora={"bitsandbytes": version})


@pytest.mark.parametrize(
    ("autocast", "fp16", "per_element"),
    [(False, True, 2 + 4 + 2), (True, True, 4 + 4 + 2), (False, False, 2 + 2)],
)
def test_opt_eager_attention_keeps_clamped_scores_and_upcast_softmax(
    autocast: bool, fp16: bool, per_element: int
) -> None:
    """transformers' OPTAttention (2022-2023): the torch.max clamp keeps the masked scores,
    fp16 scores get softmax(dtype=float32) (kept) and a 16-bit copy (kept by the matmul);
    bf16 scores take the plain softmax, whose output both it and the matmul keep."""
    shape = model_shape("opt-1.3b")
    num = Numerics(act_bytes=2, autocast=autocast, fp16=fp16)
    items = layer_items(shape, num, Trainable(full=True), seq=512, fused_attention=False)
    sq = sum(i.bytes_per_token for i in items if "(s^2)" in i.name)
    assert sq == per_element * shape.heads * 512


def test_llmfoundry_keeps_less_than_the_hf_stack(cat) -> None:  # type: ignore[no-untyped-def]
    """llm-foundry's benchmark config: flash-attn's fused cross-entropy (16-bit logits and an
    fp32 logsumexp, a 16-bit gradient), 16-bit residual stream under FSDP mixed precision
    (low-precision LayerNorm inputs), and the flash output read as a view by the out-proj."""
    shape = model_shape("llama-3-8b")
    num = Numerics(
        act_bytes=2,
        autocast=True,
        residual_16bit=True,
        fused_loss=True,
        attention_output_shared=True,
    )
    tr = Trainable(full=True)
    from gpuplan.estimate.activations import backward_transient_per_token, head_items

    head = {i.name: i.bytes_per_token for i in head_items(shape, num, tr)}
    assert head["logits (fused loss input)"] == 2 * shape.vocab
    assert head["loss logsumexp (fp32)"] == 4
    assert not any("fp32" in n and "logits" in n for n in head)
    assert backward_transient_per_token(shape, num) == 2 * shape.vocab
    items = {i.name for i in layer_items(shape, num, tr, seq=2048, fused_attention=True)}
    assert not any("out-proj input" in n for n in items)
    spec_kw: dict[str, object] = {"precision": "bf16-mixed", "micro_batch_size": 4}
    gpu = cat.gpu("H100-SXM")
    lf = fit(spec(**spec_kw, framework="llmfoundry"), gpu).memory.peak_allocated_bytes
    hf = fit(spec(**spec_kw, framework="hf"), gpu).memory.peak_allocated_bytes
    assert lf < hf


def test_vit_tokens_follow_the_image_size() -> None:
    """A ViT-B/16 at 384 pixels sees (384 / 16)^2 + 1 = 577 tokens, not the preset's 197;
    an image size that is not a multiple of the patch is refused with the nearest valid ones."""
    from gpuplan.errors import SpecError
    from gpuplan.estimate.fit import model_shape, spec_shape
    from gpuplan.spec import parse_spec

    assert model_shape("vit-b-16").fixed_tokens == 197
    assert spec_shape(parse_spec({"model": "vit-b-16", "image_size": 384})).fixed_tokens == 577
    assert spec_shape(parse_spec({"model": "vit-b-16"})).fixed_tokens == 197
    with pytest.raises(SpecError, match="image_size: 100 is not a multiple"):
        spec_shape(parse_spec({"model": "vit-b-16", "image_size": 100}))
