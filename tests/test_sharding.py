"""Engine-true sharding: what DeepSpeed, Megatron, torchtitan and PyTorch keep per parameter."""

from __future__ import annotations

import dataclasses

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import GpuPlanError
from gpuplan.estimate import memory
from gpuplan.estimate.fit import fit, model_shape
from gpuplan.estimate.numerics import PRECISIONS
from gpuplan.estimate.sharding import DEEPSPEED_REDUCE_BUCKET_ELEMENTS, state_layout
from gpuplan.spec import parse_spec

BF16 = PRECISIONS["bf16-mixed"]


@pytest.fixture(scope="module")
def a100() -> GpuSpec:
    return load_catalog(use_user=False).gpu("A100-80GB")


def _per_param(framework: str, sharding: str, n: int) -> float:
    """Bytes per parameter of model state (params, grads, master, moments) on one rank."""
    lay = state_layout(framework, sharding, BF16, ranks=n, dp=n)
    return (
        lay.param_bytes / lay.param_ranks
        + lay.grad_bytes / lay.grad_ranks
        + (lay.master_bytes + 2 * lay.state_bytes) / lay.optimizer_ranks
    )


@pytest.mark.parametrize(
    ("framework", "sharding", "expected"),
    [
        # ZeRO paper (Rajbhandari et al. 2020): 2 + 2 + 12/N, 2 + (2 + 12)/N, (2 + 2 + 12)/N
        ("deepspeed", "none", 16),
        ("deepspeed", "zero1", 2 + 2 + 12 / 64),
        ("deepspeed", "zero2", 2 + (2 + 12) / 64),
        ("deepspeed", "zero3", 16 / 64),
        # Megatron distributed-optimizer guide: 18 without, 6 + 12/N with it
        ("megatron", "none", 18),
        ("megatron", "zero1", 6 + 12 / 64),
        # torchtitan FSDP2: fp32 shards, fp32 grads, fp32 moments
        ("torchtitan", "fsdp", 16 / 64),
        # PyTorch AMP: fp32 params and grads (the bf16 copy is counted separately)
        ("hf", "none", 16),
        ("hf", "zero1", 8 + 8 / 64),
        ("hf", "zero3", 16 / 64),
    ],
)
def test_bytes_per_parameter_are_the_engines(
    framework: str, sharding: str, expected: float
) -> None:
    assert _per_param(framework, sharding, 64) == pytest.approx(expected)


def test_hsdp_shards_within_the_node_only() -> None:
    lay = state_layout("hf", "hsdp", BF16, ranks=8, dp=64)
    assert lay.param_ranks == lay.grad_ranks == lay.optimizer_ranks == 8


def _full(framework: str, sharding: str, **kw: object):  # type: ignore[no-untyped-def]
    data: dict[str, object] = {
        "model": "llama-2-7b",
        "seq_len": 2048,
        "precision": "bf16-mixed",
        "micro_batch_size": 1,
        "activation_checkpointing": "full",
        "framework": framework,
        "parallelism": {"sharding": sharding},
    }
    data.update(kw)
    return parse_spec(data)


def test_deepspeed_zero1_is_about_half_of_pytorch_amp(a100: GpuSpec) -> None:
    """The issue's example: a 7B full fine-tune with zero1 on 64 A100-80GB."""
    amp = fit(_full("hf", "zero1"), a100, 64).memory
    ds = fit(_full("deepspeed", "zero1"), a100, 64).memory
    # the issue measured 70.6 GiB with an 8% allocator reserve; refitted to 12% on 2026-12-03
    # (73.2 GiB), to 9% on 2026-12-04 when the rows measured on an H200 joined (71.2 GiB), to 7%
    # on 2026-12-05 with the eager loss's backward at three fp32 copies of the logits
    assert amp.device_used_bytes / 2**30 == pytest.approx(70.0, abs=1.0)
    assert 0.4 < ds.device_used_bytes / amp.device_used_bytes < 0.55
    assert ds.details["gradients: reduction buckets"] == DEEPSPEED_REDUCE_BUCKET_ELEMENTS * 2
    params = model_shape("llama-2-7b").params_total
    assert ds.details["weights: parameters"] == pytest.approx(params * 2)


def test_deepspeed_zero1_with_overlap_comm_frees_gradients_as_stage_2_does(a100: GpuSpec) -> None:
    """From 0.13.0 ZeRO-1 honours ``overlap_comm``: its gradient hooks move each gradient
    into the reduction bucket on the accumulation boundary (``stage_1_and_2.py``,
    ``reduce_independent_p_g_buckets_and_remove_grads``), so with one micro-batch a step
    it keeps only its own partition, as stage 2 does. Measured (LSAIE, 4 GH200s, an 8B
    Llama-shaped model): ZeRO-1 and ZeRO-2 peak at the same allocated memory."""
    on = {"deepspeed": {"overlap_comm": True}, "global_batch_size": 8}
    z1 = fit(_full("deepspeed", "zero1", **on), a100, 8).memory
    z2 = fit(_full("deepspeed", "zero2", **on), a100, 8).memory
    assert z1.peak_allocated_bytes == pytest.approx(z2.peak_allocated_bytes)
    params = model_shape("llama-2-7b").params_total
    assert z1.details["gradients"] == pytest.approx(params * 2 / 8)
    assert "gradients: DeepSpeed contiguous copy of the own partition" not in z1.details
    whole = params * 2
    # accumulating micro-batches, overlap_comm off (the stage's default), or a release before
    # 0.13.0: the gradients stay whole until backward ends, beside the own partition's copy
    for kw in (
        {**on, "global_batch_size": 16},
        {"global_batch_size": 8},
        {"deepspeed": {"overlap_comm": True, "version": "0.12.6"}, "global_batch_size": 8},
    ):
        mem = fit(_full("deepspeed", "zero1", **kw), a100, 8).memory
        assert mem.details["gradients"] == pytest.approx(whole), kw
        assert mem.details["gradients: DeepSpeed contiguous copy of the own partition"] > 0
    # under ZeRO-Offload the hooks send the own partition to the host, as stage 2's do
    off = fit(_full("deepspeed", "zero1", offload="optimizer", **on), a100, 8).memory
    assert off.details["gradients"] == 0.0


def test_zero_offload_moves_stage_2_and_3_gradients_to_the_host(a100: GpuSpec) -> None:
    """DeepSpeed ZeRO-Offload (``stage_1_and_2.py``: ``copy_grads_in_partition`` copies each
    reduced gradient to the host fp32 buffer and frees it; ``stage3.py`` keeps its gradient
    partitions on the offload device): stages 2 and 3 hold no gradients on the GPU beyond the
    reduction bucket, stage 1 holds every 16-bit gradient until backward ends."""
    shape = model_shape("llama-2-7b")
    params = shape.params_total
    largest = shape.vocab * shape.hidden  # the embedding (and the untied head)
    got = {}
    for sharding in ("zero1", "zero2", "zero3"):
        on = fit(_full("deepspeed", sharding, offload="optimizer"), a100, 1).memory
        off = fit(_full("deepspeed", sharding), a100, 1).memory
        got[sharding] = on
        assert on.details["optimizer: state"] == 0.0
        assert on.details["gradients: reduction buckets"] == DEEPSPEED_REDUCE_BUCKET_ELEMENTS * 2
        assert on.device_used_bytes < off.device_used_bytes
        assert any("ZeRO-Offload" in a for a in on.assumptions)
    assert got["zero1"].details["gradients"] == pytest.approx(params * 2)
    for sharding in ("zero2", "zero3"):
        assert got[sharding].details["gradients"] == 0.0
    for sharding in ("zero1", "zero2"):  # temp_grad_buffer_for_gpu_offload
        key = "gradients: offload staging buffer (largest parameter)"
        assert got[sharding].details[key] == pytest.approx(largest * 2)
    assert "gradients: offload staging buffer (largest parameter)" not in got["zero3"].details
    # PyTorch's engines keep their gradients: only the optimizer moves
    hf = fit(_full("hf", "zero2", offload="optimizer"), a100, 1).memory
    assert hf.details["gradients"] > 0


def test_zero_offload_trains_13b_on_one_v100_32gb() -> None:
    """DeepSpeed's ZeRO-Offload tutorial (docs/_tutorials/zero-offload.md): "models with up to
    13 billion parameters" on a single 32 GB V100 with stage 2 and the optimizer on the CPU.
    Counting 16-bit gradients on the GPU put a 13B model at 50 GiB, a false refusal."""
    v100 = load_catalog(use_user=False).gpu("V100-32GB")
    spec = parse_spec(
        {
            "model": "llama-2-13b",
            "seq_len": 1024,
            "precision": "fp16-mixed",
            "micro_batch_size": 1,
            "activation_checkpointing": "full",
            "framework": "deepspeed",
            "offload": "optimizer",
            "parallelism": {"sharding": "zero2"},
        }
    )
    assert fit(spec, v100, 1).memory.fits


def test_megatron_distributed_optimizer_keeps_fp32_grads_whole(a100: GpuSpec) -> None:
    m = fit(_full("megatron", "zero1"), a100, 64).memory
    params = model_shape("llama-2-7b").params_total
    assert m.details["gradients"] == pytest.approx(params * 4)
    assert m.details["optimizer: state"] == pytest.approx(params * 12 / 64)


def test_apex_amp_o2_keeps_fp16_weights_and_an_fp32_master(a100: GpuSpec) -> None:
    """Apex amp O2 (DeepLearningExamples): fp16 model weights and gradients, fp32 master
    weights and moments, and no autocast, so the softmax probabilities are stored in fp16."""
    base = {
        "model": "bert-large",
        "seq_len": 384,
        "precision": "fp16-mixed",
        "micro_batch_size": 8,
        "attention": "eager",
    }
    apex = fit(parse_spec({**base, "framework": "apex"}), a100, 1).memory
    amp = fit(parse_spec(base), a100, 1).memory
    params = model_shape("bert-large").params_total
    assert apex.details["weights: parameters"] == pytest.approx(params * 2, rel=0.01)
    assert apex.details["gradients"] == pytest.approx(params * 2, rel=0.01)
    assert apex.details["optimizer: state"] == pytest.approx(params * 12, rel=0.01)
    softmax = {i.name: i.bytes_per_token for i in apex.activation_items}
    softmax_amp = {i.name: i.bytes_per_token for i in amp.activation_items}
    key = "attn softmax output (s^2)"
    assert softmax[key] * 2 == softmax_amp[key]  # fp16 against autocast's fp32 softmax
    assert (
        apex.details["activations: saved for backward"]
        < amp.details["activations: saved for backward"]
    )


def test_apex_is_data_parallel_only(a100: GpuSpec) -> None:
    with pytest.raises(GpuPlanError, match="apex has no zero1"):
        fit(_full("apex", "zero1", precision="fp16-mixed"), a100, 8)


def test_torchtitan_has_no_zero1(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "s.yaml"
    path.write_text(
        "model: llama-3-8b\nseq_len: 2048\nframework: torchtitan\nparallelism: {sharding: zero1}\n"
    )
    result = cli("fit", str(path), "--gpu", "H100-SXM", "--gpus", "8")
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "torchtitan has no zero1" in lines[0]


def test_auto_layouts_skip_shardings_the_engine_lacks(a100: GpuSpec) -> None:
    from gpuplan.estimate.fit import candidate_strategies

    spec = parse_spec({"model": "llama-3-8b", "seq_len": 2048, "framework": "torchtitan"})
    shardings = {st.sharding for st in candidate_strategies(spec, 8, model_shape("llama-3-8b"))}
    assert "zero1" not in shardings and "zero3" in shardings


def test_hsdp_on_one_node_equals_fsdp(a100: GpuSpec) -> None:
    fsdp = fit(_full("hf", "fsdp"), a100, 8).memory
    hsdp = fit(_full("hf", "hsdp"), a100, 8).memory
    assert hsdp.device_used_bytes == pytest.approx(fsdp.device_used_bytes)
    two_nodes = fit(_full("hf", "hsdp"), a100, 16).memory
    assert two_nodes.details["optimizer: state"] == pytest.approx(fsdp.details["optimizer: state"])


def test_a_renamed_display_label_changes_no_number(
    a100: GpuSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The totals come from typed fields; details labels are display only."""
    spec = _full("deepspeed", "zero2")
    before = fit(spec, a100, 8).memory
    real = memory.weight_bytes

    def renamed(*args, **kwargs):  # type: ignore[no-untyped-def]
        w = real(*args, **kwargs)
        return dataclasses.replace(w, lines=tuple((f"renamed {k}", v) for k, v in w.lines))

    monkeypatch.setattr(memory, "weight_bytes", renamed)
    memory.clear_caches()  # the estimate is memoised: recompute it with the patch
    after = fit(spec, a100, 8).memory
    memory.clear_caches()
    assert "renamed weights: parameters" in after.details
    assert after.device_used_bytes == before.device_used_bytes
    assert after.breakdown == before.breakdown


def test_unknown_framework_is_a_one_line_error() -> None:
    with pytest.raises(GpuPlanError, match="framework"):
        parse_spec({"model": "llama-3-8b", "framework": "jax"})


def test_a_compiled_loss_writes_the_logits_gradient_in_16_bits(a100: GpuSpec) -> None:
    """torch.compile fuses the upcast and log-softmax backward: no fp32 logits gradient."""
    kw = {"model": "llama-3.2-3b", "seq_len": 4096, "micro_batch_size": 2, "precision": "bf16-true"}
    eager = fit(parse_spec(kw), a100).memory
    compiled = fit(parse_spec({**kw, "compile": True}), a100).memory
    tokens, vocab = 2 * 4096, model_shape("llama-3.2-3b").vocab
    key = "activations: loss/logits gradients (start of backward)"
    assert eager.details[key] == pytest.approx(tokens * vocab * 8)  # two fp32 copies
    assert compiled.details[key] == pytest.approx(tokens * vocab * 2)


def test_transformer_engine_keeps_no_fp32_norm_copies_nor_repeated_kv() -> None:
    from gpuplan.estimate.activations import Numerics, Trainable, layer_items

    shape = model_shape("llama-3-8b")
    kw = {"seq": 2048, "fused_attention": True}
    hf = layer_items(shape, Numerics(act_bytes=2, autocast=False), Trainable(full=True), **kw)
    te = layer_items(
        shape, Numerics(act_bytes=2, autocast=False, fused_kernels=True), Trainable(full=True), **kw
    )
    assert any("rmsnorm fp32" in i.name for i in hf)
    assert not any("fp32" in i.name for i in te)
    qkv = {i.name: i.bytes_per_token for i in te}["attn q, k, v (SDPA inputs)"]
    assert qkv == 2 * (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    assert sum(i.bytes_per_token for i in te) < sum(i.bytes_per_token for i in hf)


@pytest.mark.parametrize(
    ("opts", "param", "grad", "state"),
    [
        ({}, 2, 4, 4),
        ({"fp8_params": True}, 1, 4, 4),
        ({"grad_reduce_in_fp32": False}, 2, 2, 4),
        ({"optimizer_bf16": True}, 2, 4, 2),
    ],
)
def test_megatron_options_change_the_bytes_per_parameter(
    opts: dict[str, bool], param: int, grad: int, state: int
) -> None:
    """fp8_params (TE Float8Tensor weights), grad_reduce_in_fp32 (the main_grad buffer dtype)
    and a bf16 optimizer (Apex DistributedFusedAdam dtype) as Megatron-Core keeps them."""
    from gpuplan.estimate.sharding import MegatronOptions

    lay = state_layout(
        "megatron",
        "zero1",
        PRECISIONS["fp8-mixed"],
        ranks=8,
        dp=8,
        megatron=MegatronOptions(**opts),
    )
    assert (lay.param_bytes, lay.grad_bytes, lay.state_bytes, lay.master_bytes) == (
        param,
        grad,
        state,
        state,
    )
    # fp8 weights leave no separate fp8 compute copy
    assert lay.compute_copy_bytes == (0 if opts.get("fp8_params") else 1)


def test_nemo_param_remainders_keep_two_bytes_of_each_main_parameter() -> None:
    """Apex DistributedFusedAdam(store_param_remainders=True), as NeMo 1.x sets it for a bf16
    model: the shard holds fp32 moments and the 16 bits the bf16 parameter lacks, 10 bytes
    per parameter instead of 12."""
    from gpuplan.estimate.sharding import MegatronOptions

    def opt_bytes(**opts: bool) -> float:
        lay = state_layout(
            "megatron",
            "zero1",
            PRECISIONS["bf16-mixed"],
            ranks=4,
            dp=4,
            megatron=MegatronOptions(**opts),
        )
        assert lay.optimizer_ranks == 4
        return lay.master_bytes + 2 * lay.state_bytes

    assert opt_bytes() == 12
    assert opt_bytes(param_remainders=True) == 10


def test_pipeline_checkpointing_rebuilds_one_layer_not_one_per_micro_batch(a100: GpuSpec) -> None:
    """Under a pipeline schedule each in-flight micro-batch keeps its checkpoints, and the one
    layer a checkpointed backward rebuilds exists once (one backward runs at a time): another
    micro-batch in flight adds its checkpoints only. (The first stage's: it holds the
    micro-batches in flight; the last holds one.)"""
    from gpuplan.estimate.fit import explicit_strategy, memory_job

    def saved(ckpt: str, global_batch: int) -> float:
        spec = parse_spec(
            {
                "model": "llama-3-8b",
                "seq_len": 4096,
                "precision": "bf16-mixed",
                "framework": "megatron",
                "activation_checkpointing": ckpt,
                "global_batch_size": global_batch,
                "parallelism": {"sharding": "zero1", "tp": 1, "pp": 4},
            }
        )
        shape = model_shape(spec.model)
        st = explicit_strategy(spec, 8, shape)
        first = memory.model_bytes(shape, memory_job(spec, shape), st, None, "first")
        return first.activations.saved

    # 8 GPUs at pp 4: dp 2, so global batch 2 is one micro-batch in flight and 4 is two
    one_layer = (saved("none", 4) - saved("none", 2)) / 8  # 8 layers a stage
    added = saved("full", 4) - saved("full", 2)
    # the checkpoints are the 8 layers' bf16 inputs (hidden 4096), less than one whole layer
    assert added == pytest.approx(8 * 4096 * 4096 * 2, rel=0.01)
    assert added < one_layer


def test_megatron_activation_offload_keeps_one_reloaded_layer(a100: GpuSpec) -> None:
    base = {
        "model": "llama-3-8b",
        "seq_len": 4096,
        "precision": "bf16-mixed",
        "framework": "megatron",
        "parallelism": {"sharding": "zero1"},
    }

    def saved(layers_off: int) -> float:
        spec = (
            {**base, "megatron": {"activation_offload_layers": layers_off}} if layers_off else base
        )
        return fit(parse_spec(spec), a100, 8).memory.details["activations: saved for backward"]

    # 32 layers: offloading 30 keeps 2 plus the 1 reloaded at the start of backward (29 fewer),
    # offloading 20 keeps 12 plus 1 (19 fewer): the saved bytes fall in that ratio
    full, off20, off30 = saved(0), saved(20), saved(30)
    assert off30 < off20 < full
    assert (full - off30) / (full - off20) == pytest.approx(29 / 19)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"megatron": {"fp8_params": True}}, "megatron: its settings apply to framework megatron"),
        (
            {"framework": "megatron", "megatron": {"fp8_params": True}},
            "megatron.fp8_params: needs precision fp8-mixed",
        ),
        ({"framework": "megatron", "megatron": {"optimizer_dtype": "fp16"}}, "optimizer_dtype"),
        (
            {"framework": "megatron", "megatron": {"fp8_dot_product_attention": True}},
            "megatron.fp8_dot_product_attention: needs precision fp8-mixed",
        ),
        (
            {
                "framework": "megatron",
                "megatron": {"param_remainders": True, "optimizer_dtype": "bf16"},
            },
            "megatron.param_remainders: needs optimizer_dtype fp32",
        ),
        (
            {
                "framework": "megatron",
                "precision": "fp16-mixed",
                "megatron": {"param_remainders": True},
            },
            "megatron.param_remainders: needs bf16 parameters",
        ),
    ],
)
def test_megatron_settings_are_checked(extra: dict[str, object], needle: str) -> None:
    with pytest.raises(GpuPlanError, match=needle):
        parse_spec({"model": "llama-3-8b", "seq_len": 2048, **extra})


def test_context_parallel_splits_the_sequence_and_shares_the_weights(a100: GpuSpec) -> None:
    """cp ranks hold seq_len / cp tokens each (activations / cp) and share the weights like
    data-parallel ranks: the distributed optimizer shards over data x context parallel."""
    base: dict[str, object] = {
        "model": "llama-3-8b",
        "seq_len": 8192,
        "precision": "bf16-mixed",
        "framework": "megatron",
        "global_batch_size": 64,
    }

    def mem(cp: int) -> memory.MemoryEstimate:
        par = {"sharding": "zero1", "cp": cp}
        return fit(parse_spec({**base, "parallelism": par}), a100, 8).memory

    one, two = mem(1), mem(2)
    acts = "activations: saved for backward"
    assert two.details[acts] == pytest.approx(one.details[acts] / 2, rel=0.01)
    # 8 ranks share the optimizer either way: 8 data-parallel, or 4 data x 2 context
    assert two.details["optimizer: state"] == pytest.approx(one.details["optimizer: state"])


def test_context_parallel_is_checked() -> None:
    from gpuplan.estimate.fit import explicit_strategy

    shape = model_shape("llama-3-8b")
    spec = parse_spec({"model": "llama-3-8b", "seq_len": 8190, "parallelism": {"cp": 2}})
    with pytest.raises(
        GpuPlanError, match=r"cp: 2 needs a text model whose seq_len divides by 2 x cp = 4"
    ):
        explicit_strategy(spec, 8, shape)
    spec = parse_spec({"model": "llama-3-8b", "seq_len": 8192, "parallelism": {"tp": 4, "cp": 4}})
    with pytest.raises(GpuPlanError, match="tp x pp x cp = 16 does not divide the GPU count 8"):
        explicit_strategy(spec, 8, shape)
    st = explicit_strategy(
        parse_spec({"model": "llama-3-8b", "seq_len": 8192, "parallelism": {"tp": 2, "cp": 2}}),
        8,
        shape,
    )
    assert (st.dp, st.cp, st.gpus, st.replicas) == (2, 2, 8, 4)
    assert "cp2" in st.label()


def _lora_70b(megatron: dict[str, object]):  # type: ignore[no-untyped-def]
    """MLPerf's Llama 2 70B LoRA on 8 B200s, one GPU a replica (NVIDIA's v5.0 config)."""
    spec = parse_spec(
        {
            "model": "llama-2-70b",
            "method": "lora",
            "lora": {"rank": 16, "alpha": 32, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
            "seq_len": 8192,
            "precision": "fp8-mixed",
            "micro_batch_size": 1,
            "attention": "cudnn",
            "framework": "megatron",
            "parallelism": {"sharding": "none", "tp": 1, "pp": 1},
            "megatron": megatron,
        }
    )
    b200 = load_catalog(use_user=False).gpu("B200")
    return fit(spec, b200, 8).memory


def test_fp8_attention_and_activation_store_keep_one_byte() -> None:
    """Transformer Engine's fp8 attention keeps q, k, v and its output as fp8 casts, and
    Megatron's activation_func_fp8_input_store keeps the SwiGLU input in fp8: those saved
    tensors halve, nothing else moves."""

    def items(**extra: bool) -> dict[str, float]:
        m = _lora_70b({"fp8_params": True, **extra})
        return {i.name.split(" (fp8)")[0]: i.bytes_per_token for i in m.activation_items}

    base = items()
    fp8 = items(fp8_dot_product_attention=True, activation_func_fp8_input_store=True)
    changed = {k for k in base if base[k] != fp8.get(k)}
    assert changed == {
        "attn q, k, v (SDPA inputs)",
        "attn SDPA output + logsumexp",
        "mlp gate and up outputs (fused SwiGLU input)",
    }
    assert fp8["attn q, k, v (SDPA inputs)"] == base["attn q, k, v (SDPA inputs)"] / 2
    heads = 64 * 4  # the fp32 softmax statistics stay
    assert (
        fp8["attn SDPA output + logsumexp"] - heads
        == (base["attn SDPA output + logsumexp"] - heads) / 2
    )
    swiglu = [k for k in fp8 if k.startswith("mlp gate and up outputs")]
    assert fp8[swiglu[0]] == base["mlp gate and up outputs (fused SwiGLU input)"] / 2


def test_fp8_params_keep_lora_adapters_in_16_bits() -> None:
    """fp8_params makes Transformer Engine's linears fp8; NeMo's adapters stay in the 16-bit
    model dtype: no fp32 adapters and no per-adapter input casts (the PEFT path)."""
    m16 = _lora_70b({})
    m8 = _lora_70b({"fp8_params": True})
    assert m8.details["weights: LoRA adapters"] == m16.details["weights: LoRA adapters"]
    assert not [i for i in m8.activation_items if "casts" in i.name]
    assert m8.details["weights: frozen base"] == pytest.approx(
        m16.details["weights: frozen base"] / 2
    )


def _items(spec) -> dict[str, float]:  # type: ignore[no-untyped-def]
    h100 = load_catalog(use_user=False).gpu("H100-SXM")
    m = fit(spec, h100, 8).memory
    return {i.name: i.bytes_per_token for i in m.activation_items}


def test_torchtitan_fsdp_computes_in_bf16_without_autocast() -> None:
    """torchtitan's ``maybe_enable_amp`` is a null context under FSDP: ``fully_shard`` computes
    with bf16 parameters, so q/k/v read one bf16 norm output and the normalised copy is bf16.
    Without FSDP (one GPU) autocast applies and each projection keeps its own cast."""
    base = {"model": "llama-3-8b", "seq_len": 2048, "precision": "bf16-mixed"}
    base["framework"] = "torchtitan"
    fsdp = _items(parse_spec({**base, "parallelism": {"sharding": "fsdp"}}))
    ddp = _items(parse_spec({**base, "parallelism": {"sharding": "none"}}))
    h = model_shape("llama-3-8b").hidden
    assert fsdp["attn qkv input (q/k/v)"] == 2 * h
    assert ddp["attn qkv input (q/k/v)"] == 3 * 2 * h
    assert fsdp["attn rmsnorm normalised (for weight grad)"] == 2 * h
    assert ddp["attn rmsnorm normalised (for weight grad)"] == 4 * h


def test_megatron_out_projection_keeps_a_view_of_the_attention_output() -> None:
    """TE's fused attention keeps its output and ``linear_proj`` keeps a view of it: counted
    once under bf16. An fp8 projection keeps its own fp8 cast (one byte per element)."""
    base = {
        "model": "llama-3-8b",
        "seq_len": 2048,
        "framework": "megatron",
        "attention": "cudnn",
        "parallelism": {"sharding": "zero1"},
    }
    bf16 = _items(parse_spec({**base, "precision": "bf16-mixed"}))
    fp8 = _items(parse_spec({**base, "precision": "fp8-mixed"}))
    width = model_shape("llama-3-8b").heads * model_shape("llama-3-8b").head_dim
    assert not any(k.startswith("attn out-proj input") for k in bf16)
    assert fp8["attn out-proj input (o) (fp8)"] == width
    assert "attn SDPA output + logsumexp" in bf16 and "attn SDPA output + logsumexp" in fp8


def test_llmfoundry_fp8_out_projection_keeps_its_fp8_cast() -> None:
    base = {"model": "llama-3-8b", "seq_len": 2048, "framework": "llmfoundry"}
    base["parallelism"] = {"sharding": "fsdp"}
    bf16 = _items(parse_spec({**base, "precision": "bf16-mixed"}))
    fp8 = _items(parse_spec({**base, "precision": "fp8-mixed"}))
    assert not any(k.startswith("attn out-proj input") for k in bf16)
    assert any(k.startswith("attn out-proj input") for k in fp8)


def test_hf_under_a_pipeline_says_which_engine_to_name() -> None:
    """A spec that states hf under a pipeline is estimated as hf, with the warning."""
    h100 = load_catalog(use_user=False).gpu("H100-SXM")
    base = {"model": "llama-2-70b", "seq_len": 4096, "precision": "bf16-mixed", "framework": "hf"}
    piped = fit(
        parse_spec({**base, "parallelism": {"sharding": "zero1", "tp": 4, "pp": 4}}), h100, 64
    )
    flat = fit(parse_spec({**base, "parallelism": {"sharding": "zero3"}}), h100, 64)
    assert any("no pipeline engine" in a for a in piped.memory.assumptions)
    assert not any("no pipeline engine" in a for a in flat.memory.assumptions)
    mega = parse_spec(
        {**base, "framework": "megatron", "parallelism": {"sharding": "zero1", "tp": 4, "pp": 4}}
    )
    assert not any("no pipeline engine" in a for a in fit(mega, h100, 64).memory.assumptions)


def test_unstated_framework_under_a_pipeline_reads_as_megatron() -> None:
    """Transformers has no pipeline engine: a pipeline-parallel spec that names no framework is
    estimated as Megatron-Core runs it, and says so; without pipeline stages it stays hf, and a
    stated framework is kept (gpuplan.estimate.fit.engine_spec)."""
    h100 = load_catalog(use_user=False).gpu("H100-SXM")
    base = {"model": "llama-2-70b", "seq_len": 4096, "precision": "bf16-mixed"}
    piped = {"sharding": "zero1", "tp": 4, "pp": 4}
    unstated = fit(parse_spec({**base, "parallelism": piped}), h100, 64)
    mega = fit(parse_spec({**base, "framework": "megatron", "parallelism": piped}), h100, 64)
    stated_hf = fit(parse_spec({**base, "framework": "hf", "parallelism": piped}), h100, 64)
    assert unstated.memory.device_used_bytes == mega.memory.device_used_bytes
    assert unstated.memory.device_used_bytes < stated_hf.memory.device_used_bytes
    assert any("framework not stated" in a for a in unstated.memory.assumptions)
    assert not any("framework not stated" in a for a in mega.memory.assumptions)
    flat = {"sharding": "zero1", "tp": 4}
    no_pp = fit(parse_spec({**base, "parallelism": flat}), h100, 64)
    no_pp_hf = fit(parse_spec({**base, "framework": "hf", "parallelism": flat}), h100, 64)
    assert no_pp.memory.device_used_bytes == no_pp_hf.memory.device_used_bytes
    # what only a PyTorch training loop has keeps hf
    loop = parse_spec({**base, "hf_trainer": True, "parallelism": piped})
    assert not any("framework not stated" in a for a in fit(loop, h100, 64).memory.assumptions)
    # the layout search compares its layouts under one engine: hf, stages or not
    auto = fit(parse_spec({**base, "global_batch_size": 64}), h100, 64)
    assert not any("framework not stated" in a for a in auto.memory.assumptions)


def test_trace_refuses_an_estimate_read_as_another_engine() -> None:
    """The tracer runs Transformers' model code: an analytic estimate that read the spec as
    Megatron's is not its like (``fit --trace`` states the framework first)."""
    pytest.importorskip("torch")
    from gpuplan.errors import SpecError
    from gpuplan.estimate.fit import pinned_framework
    from gpuplan.trace import trace_fit

    h100 = load_catalog(use_user=False).gpu("H100-SXM")
    spec = parse_spec(
        {
            "model": "llama-3.2-1b",
            "seq_len": 1024,
            "global_batch_size": 4,
            "parallelism": {"tp": 2, "pp": 2},
        }
    )
    with pytest.raises(SpecError, match="no framework"):
        trace_fit(spec, fit(spec, h100, 4))
    pinned = pinned_framework(spec)
    assert pinned.framework == "hf" and "framework" in pinned.model_fields_set
    assert not any("framework not stated" in a for a in fit(pinned, h100, 4).memory.assumptions)


def _loss_memory(a100: GpuSpec, **megatron: object) -> tuple[float, float]:
    """(saved, start-of-backward transient) bytes of a Megatron Llama 3 8B step, mb 2 x 4096."""
    spec = {
        "model": "llama-3-8b",
        "seq_len": 4096,
        "micro_batch_size": 2,
        "precision": "bf16-mixed",
        "framework": "megatron",
        "parallelism": {"sharding": "zero1"},
        **({"megatron": megatron} if megatron else {}),
    }
    d = fit(parse_spec(spec), a100, 8).memory.details
    return d["activations: saved for backward"], d[
        "activations: loss/logits gradients (start of backward)"
    ]


def test_megatron_loss_writes_its_gradient_into_the_saved_softmax(a100: GpuSpec) -> None:
    """vocab_parallel_cross_entropy: grad_input = softmax, mul_ in place; only the bf16 cast of
    that gradient (the upcast's backward) is new at the start of backward."""
    tokens, vocab = 2 * 4096, model_shape("llama-3-8b").vocab
    _, transient = _loss_memory(a100)
    assert transient == pytest.approx(tokens * vocab * 2)


def test_transformer_engine_loss_keeps_only_the_logits_holding_their_gradient(
    a100: GpuSpec,
) -> None:
    tokens, vocab = 2 * 4096, model_shape("llama-3-8b").vocab
    saved, _ = _loss_memory(a100)
    saved_te, transient_te = _loss_memory(a100, cross_entropy_fusion="te")
    # the fp32 softmax (4 B) becomes the bf16 logits holding the gradient (2 B); nothing is new
    assert saved - saved_te == pytest.approx(tokens * vocab * 2)
    assert transient_te == 0
    # native is Megatron's jit-fused loss: the same tensors as the unfused one
    assert _loss_memory(a100, cross_entropy_fusion="native") == (saved, _loss_memory(a100)[1])


def test_cross_entropy_fusion_is_checked() -> None:
    with pytest.raises(GpuPlanError, match="megatron.cross_entropy_fusion"):
        parse_spec(
            {
                "model": "llama-3-8b",
                "framework": "megatron",
                "megatron": {"cross_entropy_fusion": "triton"},
            }
        )


def test_pytorch_zero2_is_fsdp_shard_grad_op(a100: GpuSpec) -> None:
    """SHARD_GRAD_OP shards the fp32 parameters too and keeps the stage gathered in bf16
    from forward to backward; ZeroRedundancyOptimizer (zero1) keeps them whole."""
    base = {"model": "llama-3-8b", "seq_len": 2048, "precision": "bf16-mixed"}
    p = model_shape("llama-3-8b").params_total

    def details(sharding: str) -> dict[str, float]:
        spec = parse_spec({**base, "parallelism": {"sharding": sharding}})
        return fit(spec, a100, 8).memory.details

    z1, z2 = details("zero1"), details("zero2")
    assert z1["weights: parameters"] == pytest.approx(4 * p, rel=0.01)
    assert z2["weights: parameters"] == pytest.approx(4 * p / 8, rel=0.01)
    gathered = "weights: bf16 parameters kept gathered from forward to backward"
    assert z2[gathered] == pytest.approx(2 * p, rel=0.01)
    assert "weights: unsharded layers in flight (all-gather)" not in z2


def test_pytorch_zero2_keeps_a_lora_base_gathered_too(a100: GpuSpec) -> None:
    spec = {
        "model": "llama-3-8b",
        "method": "lora",
        "seq_len": 2048,
        "precision": "bf16-mixed",
    }
    z1 = fit(parse_spec({**spec, "parallelism": {"sharding": "zero1"}}), a100, 8).memory
    z2 = fit(parse_spec({**spec, "parallelism": {"sharding": "zero2"}}), a100, 8).memory
    base = z1.details["weights: frozen base"]
    assert z2.details["weights: frozen base"] == pytest.approx(base / 8)
    kept = z2.details["weights: frozen base kept gathered from forward to backward"]
    assert kept + z2.details["weights: frozen base"] == pytest.approx(base)


def test_deepspeed_zero3_keeps_its_gradient_partition_from_init(a100: GpuSpec) -> None:
    """DeepSpeed ZeRO-3 from 0.6.0 allocates ``grad_partitions_flat_buffer`` once, in the
    optimizer's init (``stage3.py``, #1453), so the 16-bit gradient partition is there at the
    start of backward and adds to the saved activations; before 0.6.0, under ZeRO-Offload
    (the buffer lives on the host) and in PyTorch's FSDP the gradients grow as activations
    are freed, and the peak is the larger of the two."""
    spec = _full("deepspeed", "zero3", activation_checkpointing="none")
    cur = fit(spec, a100, 8).memory
    old = fit(
        _full(
            "deepspeed", "zero3", activation_checkpointing="none", deepspeed={"version": "0.5.10"}
        ),
        a100,
        8,
    ).memory
    grads = model_shape("llama-2-7b").params_total * 2 / 8
    assert cur.details["gradients"] == pytest.approx(grads)
    assert cur.breakdown["gradients"] == pytest.approx(grads + DEEPSPEED_REDUCE_BUCKET_ELEMENTS * 2)
    assert cur.peak_allocated_bytes - old.peak_allocated_bytes == pytest.approx(
        grads + DEEPSPEED_REDUCE_BUCKET_ELEMENTS * 2
    )
    assert any("grad_partitions_flat_buffer" in a for a in cur.assumptions)
    assert not any("grad_partitions_flat_buffer" in a for a in old.assumptions)
    offload = fit(_full("deepspeed", "zero3", offload="optimizer"), a100, 8).memory
    assert not any("grad_partitions_flat_buffer" in a for a in offload.assumptions)
    assert state_layout("deepspeed", "zero3", BF16, ranks=8, dp=8).grads_persistent
    assert not state_layout("deepspeed", "zero2", BF16, ranks=8, dp=8).grads_persistent
    assert not state_layout("hf", "zero3", BF16, ranks=8, dp=8).grads_persistent


@pytest.mark.parametrize(
    ("framework", "extra", "expected"),
    [
        ("deepspeed", {}, True),  # grad_partitions_flat_buffer, allocated at init
        ("deepspeed", {"deepspeed": {"version": "0.5.10"}}, False),  # before #1453
        ("deepspeed", {"offload": "optimizer"}, False),  # the buffer lives on the host
        ("hf", {}, False),  # FSDP: gradients grow as activations are freed
        ("hf", {"global_batch_size": 16}, True),  # accumulation keeps them
        ("hf", {"zero_grad": "zeros"}, True),  # zeroed in place, not freed
    ],
)
def test_which_gradients_live_through_forward(
    framework: str, extra: dict[str, object], expected: bool
) -> None:
    from gpuplan.estimate.fit import explicit_strategy, memory_job, spec_shape

    spec = _full(framework, "zero3", **extra)
    shape = spec_shape(spec)
    job = memory_job(spec, shape)
    st = explicit_strategy(spec, 8, shape)
    assert memory.gradients_through_forward(job, st, memory.layout_for(job, st)) is expected


def test_the_traced_estimate_keeps_gradients_as_the_analytic_one(
    a100: GpuSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--trace`` traces a step with its gradients kept (``zero_grad(set_to_none=False)``)
    exactly where the analytic model keeps them through forward: DeepSpeed ZeRO-3 too."""
    pytest.importorskip("torch")
    from gpuplan.trace import run

    seen: list[bool] = []

    def fake_trace(spec: object, part: object = None, *, grads_persist: bool = False) -> None:
        seen.append(grads_persist)
        raise RuntimeError("stop")

    monkeypatch.setattr(run, "trace_memory", fake_trace)
    for framework, want in (("deepspeed", True), ("hf", False)):
        spec = _full(framework, "zero3")
        with pytest.raises(RuntimeError, match="stop"):
            run._traced_estimate(spec, fit(spec, a100, 8), None)
        assert seen[-1] is want


@pytest.mark.parametrize(
    ("sharding", "expected"), [("none", True), ("zero1", True), ("zero3", False)]
)
def test_megatron_keeps_its_main_gradient_buffer(
    a100: GpuSpec, sharding: str, expected: bool
) -> None:
    """Megatron-core's DDP allocates ``grad_data`` (every ``main_grad`` a view into it) with
    ``torch.zeros`` at init and zeroes it in place each step (``param_and_grad_buffer.py``), so
    with one micro-batch a step the fp32 gradients still add to the activations at the backward
    peak; Megatron-FSDP (``zero3``) shards them into its own buffers."""
    from gpuplan.estimate.fit import explicit_strategy, memory_job, spec_shape

    spec = _full("megatron", sharding, activation_checkpointing="none")
    shape = spec_shape(spec)
    job = memory_job(spec, shape)
    st = explicit_strategy(spec, 8, shape)
    assert st.grad_accum == 1
    lay = memory.layout_for(job, st)
    assert lay.grads_persistent is expected
    assert memory.gradients_through_forward(job, st, lay) is expected
    est = fit(spec, a100, 8).memory
    if expected:
        assert est.breakdown["gradients"] == pytest.approx(est.details["gradients"])
        assert any("main-gradient buffer" in a for a in est.assumptions)


def test_ddp_buckets_are_there_before_forward(a100: GpuSpec) -> None:
    """PyTorch DDP's ``Reducer::initialize_buckets`` allocates each bucket's flat ``gradients``
    tensor at construction (``gradient_as_bucket_view=False``, the default, keeps it beside
    the parameters' own ``.grad``): the bucket copy adds to the activations at the backward
    peak, while the ``.grad`` tensors grow as activations are freed."""
    spec = _full("hf", "none", activation_checkpointing="none", model="gpt2")
    est = fit(spec, a100, 8).memory
    assert est.peak_phase == "forward/backward"
    copy = est.details["gradients: DDP bucket copies"]
    grads = est.details["gradients"]
    act = est.breakdown["activations"]
    assert act > grads  # the .grad tensors fit in the activations freed before them
    assert est.breakdown["gradients"] == pytest.approx(copy)


def test_deepspeed_buffer_sizes_come_from_the_spec(a100: GpuSpec) -> None:
    """``deepspeed: {reduce_bucket_size, stage3_prefetch_bucket_size, stage3_max_live_parameters,
    sub_group_size}`` take DeepSpeed's own config names (elements) and replace its defaults."""
    ds = {
        "reduce_bucket_size": 5e7,
        "stage3_prefetch_bucket_size": 1e8,
        "stage3_max_live_parameters": 3e8,
        "sub_group_size": 1e12,
    }
    spec = _full("deepspeed", "zero3", deepspeed=ds)
    base = fit(_full("deepspeed", "zero3"), a100, 8).memory
    est = fit(spec, a100, 8).memory
    params = model_shape("llama-2-7b").params_total
    assert est.details["gradients: reduction buckets"] == pytest.approx(5e7 * 2)
    assert base.details["gradients: reduction buckets"] == DEEPSPEED_REDUCE_BUCKET_ELEMENTS * 2
    # one sub-group of 1e12 elements: the whole fp32 gradient partition at the step
    assert est.details["optimizer: fp32 gradient partition (step)"] == pytest.approx(params / 8 * 4)
    assert base.details["optimizer: fp32 gradient partition (step)"] == pytest.approx(
        min(params / 8, 1e9) * 4
    )
    assert any("reduce bucket 5e+07 elements" in a for a in est.assumptions)
    assert any("(default)" in a for a in base.assumptions if "reduce bucket" in a)
    for bad, why in ((0, "greater than 0"), (-5, "greater than 0"), ("lots", "valid number")):
        with pytest.raises(GpuPlanError, match=f"deepspeed.reduce_bucket_size: .*{why}"):
            _full("deepspeed", "zero3", deepspeed={"reduce_bucket_size": bad})
    with pytest.raises(GpuPlanError, match="deepspeed: its settings apply to framework deepspeed"):
        _full("hf", "zero3", deepspeed={"sub_group_size": 1e9})


def test_deepspeed_overlap_comm_double_buffers_stage_1_and_2(a100: GpuSpec) -> None:
    """With ``overlap_comm`` DeepSpeed's stages 1 and 2 keep two reduction buckets
    (``stage_1_and_2.py``: double buffers so the next bucket fills while one reduces); ZeRO-3
    keeps one, and stage 1 before 0.13.0 ignored ``overlap_comm``."""

    def buckets(sharding: str, **ds: object) -> float:
        spec = _full("deepspeed", sharding, deepspeed=ds or None)
        return fit(spec, a100, 8).memory.details["gradients: reduction buckets"]

    one = DEEPSPEED_REDUCE_BUCKET_ELEMENTS * 2
    for sharding in ("zero1", "zero2"):
        assert buckets(sharding) == one
        assert buckets(sharding, overlap_comm=True) == 2 * one
    assert buckets("zero3", overlap_comm=True) == one
    assert buckets("zero1", overlap_comm=True, version="0.12.6") == one
    assert buckets("zero2", overlap_comm=True, version="0.12.6") == 2 * one
    for bad in ("maybe", 3):
        with pytest.raises(GpuPlanError, match="deepspeed.overlap_comm"):
            _full("deepspeed", "zero2", deepspeed={"overlap_comm": bad})


def test_fused_kernels_keep_the_norm_input_and_the_swiglu_inputs() -> None:
    """``fused_kernels: true`` (Liger Kernel, flash-attn's norms, xformers' SwiGLU): a norm
    keeps its input in the residual stream's dtype, fp32 under autocast with fp32 parameters,
    plus the fp32 rstd; the gated MLP keeps its gate and up outputs; K/V are not repeated; each
    autocast linear still keeps its own bf16 cast of the fp32 norm output."""
    base = {"model": "llama-3-8b", "seq_len": 2048, "precision": "bf16-mixed"}
    shape = model_shape("llama-3-8b")
    h, f = shape.hidden, shape.ffn
    plain = _items(parse_spec(base))
    fused = _items(parse_spec({**base, "fused_kernels": True}))
    assert "attn rmsnorm fp32 input" in plain and "attn rmsnorm fp32 input" not in fused
    assert fused["attn norm input (fused)"] == 4 * h + 4
    assert fused["mlp gate and up outputs (fused SwiGLU input)"] == 2 * 2 * f
    assert "mlp activation output + up output" not in fused
    assert fused["attn qkv input (q/k/v)"] == plain["attn qkv input (q/k/v)"] == 3 * 2 * h
    kv = shape.kv_heads * shape.head_dim
    assert fused["attn q, k, v (SDPA inputs)"] == 2 * (shape.heads * shape.head_dim + 2 * kv)
    assert sum(fused.values()) < 0.75 * sum(plain.values())
    # under FSDP with 16-bit compute parameters (llm-foundry) the residual stream is bf16
    foundry = _items(
        parse_spec(
            {
                **base,
                "framework": "llmfoundry",
                "fused_kernels": True,
                "parallelism": {"sharding": "fsdp"},
            }
        )
    )
    assert foundry["attn norm input (fused)"] == 2 * h + 4


def test_a_fused_gelu_keeps_its_input() -> None:
    """GPT-2's gelu_new in Transformers is the tanh formula in Python, whose fp32 intermediates
    autograd keeps; a fused GELU (flash-attn's fused dense, a compiled or Triton kernel) keeps
    its input only."""
    base = {"model": "gpt2", "seq_len": 1024, "precision": "bf16-mixed"}
    plain = _items(parse_spec(base))
    fused = _items(parse_spec({**base, "fused_kernels": True}))
    f = model_shape("gpt2").ffn
    assert "mlp python gelu tanh, 1+tanh, 0.5x" in plain
    assert fused["mlp fc1 output (activation input)"] == 2 * f
    assert not any("python gelu" in k for k in fused)


def test_fused_kernels_are_megatron_s_own() -> None:
    from gpuplan.errors import SpecError

    base = {"model": "llama-3-8b", "seq_len": 2048, "framework": "megatron"}
    assert _items(parse_spec({**base, "fused_kernels": True})) == _items(parse_spec(base))
    with pytest.raises(SpecError, match="fused_kernels"):
        parse_spec({**base, "fused_kernels": False})
    with pytest.raises(SpecError, match="fused_kernels"):
        parse_spec({"model": "llama-3-8b", "seq_len": 2048, "fused_kernels": 2})


def test_trace_refuses_fused_kernels() -> None:
    """The tracer runs Transformers' own modules and loss: fused kernels are analytic only."""
    pytest.importorskip("torch")
    from gpuplan.errors import SpecError
    from gpuplan.trace import trace_fit

    h100 = load_catalog(use_user=False).gpu("H100-SXM")
    base = {"model": "llama-3.2-1b", "seq_len": 512}
    for extra, what in (
        ({"fused_kernels": True}, "fused_kernels"),
        ({"loss_kernel": "fused-linear"}, "loss_kernel"),
    ):
        spec = parse_spec({**base, **extra})
        with pytest.raises(SpecError, match=what):
            trace_fit(spec, fit(spec, h100, 1))


def _head(spec) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(saved activation bytes, loss/logits gradient bytes at the start of backward)."""
    h100 = load_catalog(use_user=False).gpu("H100-SXM")
    d = fit(spec, h100, 1).memory.details
    return (
        d["activations: saved for backward"],
        d.get("activations: loss/logits gradients (start of backward)", 0.0),
    )


def test_loss_kernels() -> None:
    """eager keeps the 16-bit logits and the fp32 log-softmax; fused (flash-attn's, Liger's
    cross-entropy) the 16-bit logits and an fp32 logsumexp; fused-linear (Liger's fused linear
    cross-entropy) no logits, only the hidden state's gradient, and no logits gradient at the
    start of backward. One micro-batch of 2,048 tokens."""
    from gpuplan.errors import SpecError

    base = {"model": "llama-3-8b", "seq_len": 2048, "precision": "bf16-mixed", "method": "lora"}
    shape = model_shape("llama-3-8b")
    v, h, tokens = shape.vocab, shape.hidden, 2048
    eager, eager_t = _head(parse_spec({**base, "loss_kernel": "eager"}))
    auto = _head(parse_spec(base))
    fused, fused_t = _head(parse_spec({**base, "loss_kernel": "fused"}))
    linear, linear_t = _head(parse_spec({**base, "loss_kernel": "fused-linear"}))
    assert auto == (eager, eager_t)
    assert eager - fused == pytest.approx(tokens * (4 * v - 4))
    assert fused - linear == pytest.approx(tokens * (2 * v + 4 - 2 * h))
    assert linear_t == 0.0 < fused_t < eager_t
    # llm-foundry runs flash-attn's fused loss; eager turns it off
    foundry = {**base, "framework": "llmfoundry"}
    assert _head(parse_spec(foundry))[0] < _head(parse_spec({**foundry, "loss_kernel": "eager"}))[0]
    with pytest.raises(SpecError, match="loss_kernel"):
        parse_spec({**base, "method": "full", "framework": "megatron", "loss_kernel": "fused"})


def test_megatron_fp16_keeps_16_bit_main_grads_and_copies_them_at_the_step() -> None:
    """Megatron's --accumulate-allreduce-grads-in-fp32 defaults off and --bf16 turns it on:
    under fp16 the main_grad buffer is 16-bit unless stated, and the optimizer step makes an
    fp32 copy of it (``.float()`` in ``_copy_model_grads_to_main_grads``), on the shard under
    the distributed optimizer. fp32 main grads need no copy (``.float()`` is the tensor)."""
    from gpuplan.estimate.fit import memory_job

    def layout(precision: str, sharding: str = "none", **megatron: object):  # type: ignore[no-untyped-def]
        spec = {
            "model": "gpt2-medium",
            "method": "full",
            "precision": precision,
            "seq_len": 1024,
            "framework": "megatron",
            "parallelism": {"sharding": sharding, "tp": 1, "pp": 1},
        }
        if megatron:
            spec["megatron"] = megatron
        job = memory_job(parse_spec(spec), model_shape("gpt2-medium"))
        return state_layout(
            "megatron",
            sharding,
            PRECISIONS[precision],
            ranks=8,
            dp=8,
            megatron=job.megatron,
        )

    fp16 = layout("fp16-mixed")
    assert (fp16.grad_bytes, fp16.step_grad_bytes, fp16.carried_grad_bytes) == (2, 4, 0)
    bf16 = layout("bf16-mixed")
    assert (bf16.grad_bytes, bf16.step_grad_bytes) == (4, 0)
    stated = layout("fp16-mixed", grad_reduce_in_fp32=True)
    assert (stated.grad_bytes, stated.step_grad_bytes) == (4, 0)
    assert layout("bf16-mixed", grad_reduce_in_fp32=False).step_grad_bytes == 4
    assert layout("fp16-mixed", "zero1").optimizer_ranks == 8  # the copy is of the shard
    # Megatron-LM v2 before July 2021: the previous step's 16-bit gradient and fp32 main
    # gradient stay through the next forward and backward; no copy on top at the step
    legacy = layout("fp16-mixed", legacy_local_ddp=True)
    assert (legacy.grad_bytes, legacy.step_grad_bytes, legacy.carried_grad_bytes) == (2, 0, 6)


def test_megatron_legacy_local_ddp_adds_six_bytes_a_parameter_through_backward() -> None:
    """The carried gradients are there through forward and backward: the peak rises by 6 bytes
    a parameter of the stage, no more."""

    gpu = load_catalog(use_user=False).gpu("V100-32GB")
    base = {
        "model": "gpt2-medium",
        "method": "full",
        "precision": "fp16-mixed",
        "micro_batch_size": 1,
        "global_batch_size": 4,
        "seq_len": 1024,
        "activation_checkpointing": "full",
        "framework": "megatron",
        "parallelism": {"sharding": "none", "tp": 2, "pp": 2},
    }
    now = fit(parse_spec(base), gpu, 4).memory
    v2 = fit(parse_spec({**base, "megatron": {"legacy_local_ddp": True}}), gpu, 4).memory
    carried = v2.details["gradients: previous step's, still referenced"]
    assert carried == pytest.approx(v2.details["gradients"] * 3)  # 6 bytes against 2
    # today's step copy (4 bytes) peaks at the step; v2's carried 6 bytes through backward
    assert v2.peak_allocated_bytes > now.peak_allocated_bytes
    assert any("Megatron-LM v2's local DDP" in a for a in v2.assumptions)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parallelism": {"sharding": "zero1", "tp": 1, "pp": 1}}, "sharding none"),
        ({"parallelism": "auto"}, "sharding none"),
        ({"precision": "bf16-mixed"}, "16-bit gradients"),
        ({"megatron": {"legacy_local_ddp": True, "grad_reduce_in_fp32": True}}, "16-bit"),
    ],
)
def test_megatron_legacy_local_ddp_needs_what_v2_had(
    change: dict[str, object], message: str
) -> None:
    spec = {
        "model": "gpt2",
        "precision": "fp16-mixed",
        "seq_len": 512,
        "framework": "megatron",
        "megatron": {"legacy_local_ddp": True},
        "parallelism": {"sharding": "none", "tp": 1, "pp": 1},
        **change,
    }
    with pytest.raises(GpuPlanError, match=message):
        parse_spec(spec)
