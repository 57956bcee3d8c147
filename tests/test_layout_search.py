"""Layout search (issue 11, item 3): parallelism auto finds the layouts practitioners run.

Covers the engines' layout rules, the bounds (the pruned search must give what the
exhaustive one gives), the 180B-on-4,096-A100 regression case, Korthikanti et al.'s 530B
on 2,240 A100s, 70B on 64 and 128 H100s, interleaving's memory and the refusal message.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import pytest

import gpuplan.estimate.configure as configure_mod
from gpuplan.catalog.loader import load_catalog
from gpuplan.errors import InfeasibleError
from gpuplan.estimate.configure import configure, default_topology, search_space
from gpuplan.estimate.fit import explicit_strategy, memory_job, model_shape
from gpuplan.estimate.layout_search import layout_groups, search
from gpuplan.estimate.memory import estimate_memory
from gpuplan.estimate.pipeline import in_flight
from gpuplan.estimate.strategy import (
    pipeline_micro_batches_ok,
    pipeline_splits,
    tp_degrees,
    vp_degrees,
)
from gpuplan.spec import JobSpec, parse_spec


@pytest.fixture(scope="module")
def cat():  # type: ignore[no-untyped-def]
    return load_catalog(use_user=False)


def _spec(model: str, **kw: object) -> JobSpec:
    base: dict[str, object] = {
        "model": model,
        "precision": "bf16-mixed",
        "seq_len": 2048,
        "work": {"tokens": 10**9},
    }
    base.update(kw)
    return parse_spec(base)


def _pinned(spec: JobSpec, sharding: str, tp: int, pp: int, **kw: object) -> JobSpec:
    """``spec`` with an explicit layout (validated, unlike ``model_copy``)."""
    data = spec.model_dump(exclude_none=True)
    data.update(parallelism={"sharding": sharding, "tp": tp, "pp": pp}, **kw)
    return parse_spec(data)


def _per_sample(conf: configure_mod.Configuration) -> float:
    st = conf.strategy
    return conf.time.step_time_s / (st.micro_batch_size * st.grad_accum * st.dp)


# --- the engines' rules --------------------------------------------------------------


def test_tp_splits_heads_and_kv_groups_inside_a_node() -> None:
    assert tp_degrees(64, heads=64, kv_heads=8, gpus_per_node=8) == [1, 2, 4, 8]
    assert tp_degrees(64, heads=64, kv_heads=2, gpus_per_node=8) == [1, 2]  # GQA groups
    assert tp_degrees(64, heads=48, kv_heads=48, gpus_per_node=4) == [1, 2, 4]  # node size
    assert tp_degrees(12, heads=64, kv_heads=8, gpus_per_node=6) == [1, 2]  # 4 straddles nodes


def test_pipeline_splits_as_megatron_allows() -> None:
    # 126 layers (Llama-3.1-405B) on 8 or 16 stages: embedding and loss count as layers
    assert [pp for pp in (1, 2, 3, 4, 5, 8, 16, 32, 128) if pipeline_splits(126, pp)] == [
        1,
        2,
        3,
        4,
        8,
        16,
        32,
    ]
    assert not pipeline_splits(4, 8)  # more stages than layers
    assert vp_degrees(80, 8) == [1, 2, 5, 10]
    # 126 layers + the embedding and the loss as one each: 128 slots, 16 a stage
    assert vp_degrees(126, 8) == [1, 2, 4, 8, 16]
    assert vp_degrees(125, 8) == [1]  # no split Megatron allows
    assert vp_degrees(80, 1) == [1]


def test_pipelines_get_enough_micro_batches() -> None:
    assert not pipeline_micro_batches_ok(4, 8, 1, batch_given=True)
    assert pipeline_micro_batches_ok(8, 8, 1, batch_given=True)
    assert not pipeline_micro_batches_ok(12, 8, 2, batch_given=True)  # interleaved: groups of pp
    assert pipeline_micro_batches_ok(16, 8, 2, batch_given=True)
    assert pipeline_micro_batches_ok(1, 4, 1, batch_given=False)  # no batch given: as timed
    assert not pipeline_micro_batches_ok(1, 4, 2, batch_given=False)


@pytest.mark.parametrize(
    ("model", "count", "gbs"),
    [("llama-3-70b", 64, 512), ("falcon-180b", 4096, 2048), ("llama-3-8b", 24, 96)],
)
def test_every_candidate_keeps_the_batch_and_the_rules(model: str, count: int, gbs: int) -> None:
    spec = _spec(model, global_batch_size=gbs)
    shape = model_shape(model)
    groups = layout_groups(search_space(spec, shape, count, 8))
    assert groups
    for group in groups:
        mbs = [st.micro_batch_size for st in group]
        assert mbs == sorted(mbs)
        for st in group:
            assert st.gpus == count
            assert st.micro_batch_size * st.grad_accum * st.dp == gbs
            assert st.tp <= 8 and 8 % st.tp == 0
            assert shape.heads % st.tp == 0 and shape.kv_heads % st.tp == 0
            assert pipeline_splits(shape.layers, st.pp)
            if st.pp > 1:
                assert st.grad_accum >= st.pp
                assert st.sharding != "zero2"
            if st.vp > 1:
                assert st.grad_accum % st.pp == 0
                assert shape.layers % (st.pp * st.vp) == 0
            if st.dp == 1:
                assert st.sharding == "none"


def test_no_layout_keeps_an_indivisible_global_batch(cat) -> None:  # type: ignore[no-untyped-def]
    from gpuplan.errors import SpecError

    spec = parse_spec(
        {"model": "resnet-50", "image_size": 224, "global_batch_size": 3, "work": {"steps": 1}}
    )
    with pytest.raises(SpecError, match="global_batch_size"):
        configure(spec, cat.gpu("H100-SXM"), 8)


# --- the bounds do not change the answer ----------------------------------------------


@pytest.mark.parametrize(
    ("model", "method", "gpu_id", "count", "gbs"),
    [
        ("llama-3-8b", "lora", "H100-SXM", 8, 64),
        ("llama-3-8b", "full", "A100-40GB", 64, 512),
        ("llama-3-70b", "full", "H100-SXM", 256, 512),
        ("falcon-180b", "full", "A100-40GB", 512, 2048),
        ("gpt2", "full", "L4", 4, None),
        ("mixtral-8x7b", "full", "A100-40GB", 64, 256),
        ("qwen3-30b-a3b", "full", "H100-SXM", 32, 256),
    ],
)
def test_pruned_search_equals_exhaustive(  # type: ignore[no-untyped-def]
    cat, monkeypatch: pytest.MonkeyPatch, model, method, gpu_id, count, gbs
) -> None:
    kw: dict[str, object] = {"method": method}
    if gbs:
        kw["global_batch_size"] = gbs
    spec = _spec(model, **kw)
    gpu = cat.gpu(gpu_id)
    topo = default_topology(gpu, count, inter_node_gbps=400, fabric="efa")
    pruned = configure(spec, gpu, count, topo, with_scaling=False)
    monkeypatch.setattr(configure_mod, "search", functools.partial(search, prune=False))
    full = configure(spec, gpu, count, topo, with_scaling=False)
    assert pruned.strategy == full.strategy
    assert _per_sample(pruned) == pytest.approx(_per_sample(full), rel=1e-12)


def test_search_is_deterministic(cat) -> None:  # type: ignore[no-untyped-def]
    spec = _spec("llama-3-70b", global_batch_size=512, seq_len=4096)
    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, 64, inter_node_gbps=3200, fabric="infiniband")
    a = configure(spec, gpu, 64, topo, with_scaling=False)
    b = configure(spec, gpu, 64, topo, with_scaling=False)
    assert a.strategy == b.strategy
    assert a.time.as_contract() == b.time.as_contract()


# --- the practitioners' layouts -------------------------------------------------------

FALCON_GPU_HOURS = 7.0e6
"""Falcon-180B pretraining, about 7,000,000 A100 GPU-hours for 3.5T tokens on up to 4,096
A100 40GB (Hugging Face blog "Spread Your Wings: Falcon 180B is here", 2023-09-06; the
Falcon paper, Almazrouei et al. 2023, arXiv:2311.16867, reports TP8 PP8 DP64 with a
sharded optimizer over 400 Gbit/s EFA)."""


def _falcon_180b_on_4096(cat):  # type: ignore[no-untyped-def]
    spec = _spec("falcon-180b", global_batch_size=2048, work={"tokens": 3_500_000_000_000})
    gpu = cat.gpu("A100-40GB")
    topo = default_topology(gpu, 4096, inter_node_gbps=400, fabric="efa")
    return spec, gpu, topo


def test_180b_on_4096_a100_40gb_takes_tp_x_pp_with_a_sharded_optimizer(cat) -> None:  # type: ignore[no-untyped-def]
    """Issue 11's case: ZeRO-3 TP8 DP512 spent 79% of the step in exposed all-gathers
    (5.6x the published GPU-hours) because pipeline layouts were never tried."""
    spec, gpu, topo = _falcon_180b_on_4096(cat)
    conf = configure(spec, gpu, 4096, topo, with_scaling=False)
    st = conf.strategy
    assert conf.fit.memory.fits
    assert st.pp > 1 and st.tp == 8
    assert st.sharding in ("zero1", "zero2")  # the optimizer sharded, the weights not
    assert st.dp < 512
    assert conf.time.comm_fraction < 0.4
    assert conf.time.gpu_hours is not None
    assert conf.time.gpu_hours < 1.5 * FALCON_GPU_HOURS
    zero3 = configure(
        _pinned(spec, "zero3", 8, 1),
        gpu,
        4096,
        topo,
        with_scaling=False,
    )
    assert _per_sample(conf) < 0.5 * _per_sample(zero3)


def test_the_published_180b_layout_is_in_the_space_and_not_faster(cat) -> None:  # type: ignore[no-untyped-def]
    spec, gpu, topo = _falcon_180b_on_4096(cat)
    auto = configure(spec, gpu, 4096, topo, with_scaling=False)
    shape = model_shape(spec.model)
    published = explicit_strategy(_pinned(spec, "zero1", 8, 8), 4096, shape)
    groups = layout_groups(search_space(spec, shape, 4096, 8))
    assert any(published in group for group in groups)
    mem = estimate_memory(shape, memory_job(spec, shape), published, gpu)
    if mem.fits:  # where our memory model lets it run, auto is at least as fast
        pinned = configure(
            _pinned(spec, "zero1", 8, 8),
            gpu,
            4096,
            topo,
            with_scaling=False,
        )
        assert _per_sample(auto) <= _per_sample(pinned) * (1 + 1e-9)


def test_530b_on_2240_a100s_takes_the_papers_layout_class(cat) -> None:  # type: ignore[no-untyped-def]
    """Korthikanti et al. (arXiv:2205.05198, Sec. 6.3) ran the 530B GPT on 2,240 A100 80GB as
    TP 8 x PP 35 x DP 8 at 39.15 s a step (global batch 2,240, micro-batch 1, Selene's 8 x 200
    Gb/s HDR per node). Auto must find that class (TP 8 within the node, a deep pipeline, not
    ZeRO-3 over 280 replicas) at a step time near the measured one."""
    config = Path(__file__).resolve().parents[1] / "validation" / "training_configs"
    spec = _spec(
        str(config / "megatron-gpt-529p6b.json"),
        global_batch_size=2240,
        micro_batch_size=1,
        framework="megatron",
    )
    gpu = cat.gpu("A100-80GB")
    topo = default_topology(gpu, 2240, inter_node_gbps=1600, fabric="ib")
    conf = configure(spec, gpu, 2240, topo, with_scaling=False)
    st = conf.strategy
    assert st.tp == 8 and st.pp >= 8 and st.sharding != "zero3"
    assert conf.time.step_time_s == pytest.approx(39.15, rel=0.15)


@pytest.mark.parametrize("count", [64, 128])
def test_70b_on_h100s_is_at_least_as_fast_as_common_layouts(cat, count: int) -> None:  # type: ignore[no-untyped-def]
    spec = _spec("llama-3-70b", global_batch_size=512, seq_len=4096)
    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, count, inter_node_gbps=3200, fabric="infiniband")
    auto = configure(spec, gpu, count, topo, with_scaling=False)
    st = auto.strategy
    assert auto.fit.memory.fits
    assert st.tp <= topo.gpus_per_node and topo.gpus_per_node % st.tp == 0
    assert auto.time.mfu > 0.3
    assert auto.time.comm_fraction < 0.3
    # the layouts practitioners run for 70B (torchtitan FSDP+TP, Megatron TP x PP)
    for sharding, tp, pp in (("fsdp", 1, 1), ("fsdp", 8, 1), ("zero1", 8, 2), ("zero1", 4, 4)):
        pinned = _pinned(spec, sharding, tp, pp, micro_batch_size=st.micro_batch_size)
        try:
            other = configure(pinned, gpu, count, topo, with_scaling=False)
        except InfeasibleError:
            continue
        assert _per_sample(auto) <= _per_sample(other) * (1 + 1e-9), (sharding, tp, pp)


# --- interleaving and refusals --------------------------------------------------------


def test_interleaving_pays_its_warm_up_activations(cat) -> None:  # type: ignore[no-untyped-def]
    spec = _spec("llama-3-70b", global_batch_size=512, seq_len=4096)
    shape = model_shape(spec.model)
    job = memory_job(spec, shape)
    gpu = cat.gpu("H100-SXM")
    plain = explicit_strategy(_pinned(spec, "zero1", 8, 4), 64, shape)
    assert in_flight(plain, "first") == 4  # 1F1B: pp micro-batches on the first stage
    inter = dataclasses.replace(plain, vp=5)
    # 2 (pp-1) + (vp-1) pp warm-up chunks and one more: 23 chunks of 5 per micro-batch
    assert in_flight(inter, "first") == pytest.approx(4 * (1 + 3 / 20))
    base = estimate_memory(shape, job, plain, gpu)
    more = estimate_memory(shape, job, inter, gpu)
    assert base.pipeline_stage == more.pipeline_stage == "first"
    # the first stage's layers keep 3/20 more; its parameters and the rest do not change
    assert more.breakdown["activations"] > base.breakdown["activations"] * 1.1
    assert more.breakdown["weights"] == pytest.approx(base.breakdown["weights"])
    assert sum(more.breakdown.values()) == pytest.approx(more.device_used_bytes)
    assert any("interleaved 1F1B" in a for a in more.assumptions)


def test_interleaving_with_as_many_micro_batches_as_stages_keeps_what_1f1b_keeps() -> None:
    """Megatron-core's interleaved schedule caps the warm-up at the step's ``m vp`` chunk
    forwards (``get_pp_rank_microbatches``): with ``pp`` micro-batches the first stage runs
    every forward before its first backward and holds ``m`` micro-batches, 1F1B's count, not
    1 + (pp-1)/(pp vp) of it. The last stage warms up ``(vp - 1) pp`` chunks."""
    from gpuplan.estimate.strategy import Strategy

    def st(ga: int, vp: int = 8, pp: int = 16) -> Strategy:
        return Strategy(
            sharding="zero1", tp=8, pp=pp, dp=4, micro_batch_size=1, grad_accum=ga, vp=vp
        )

    assert in_flight(st(16), "first") == 16  # 128 chunk forwards, all held, = 16 x 8
    assert in_flight(st(32), "first") == pytest.approx(143 / 8)  # 2 (pp-1) + (vp-1) pp + 1
    assert in_flight(st(48), "first") == pytest.approx(143 / 8)
    assert in_flight(st(16), "last") == pytest.approx(113 / 8)  # (vp-1) pp + 1
    assert in_flight(st(16, vp=1), "last") == 1  # plain 1F1B: no warm-up on the last stage
    # pp 4, vp 4: the warm-up is 2*3 + 3*4 = 18 chunks, one more in flight, 19 of 16 1F1B chunks;
    # with 4 micro-batches only 16 chunk forwards exist
    assert in_flight(st(4, vp=4, pp=4), "first") == 4
    assert in_flight(st(8, vp=4, pp=4), "first") == pytest.approx(19 / 4)
    assert in_flight(st(5, vp=4, pp=4), "first") == pytest.approx(19 / 4)  # 20 chunks > 19


def test_interleaving_with_all_forwards_first_keeps_the_first_stage(cat) -> None:  # type: ignore[no-untyped-def]
    spec = _spec("llama-3-70b", global_batch_size=64, seq_len=4096, micro_batch_size=4)
    shape = model_shape(spec.model)
    job = memory_job(spec, shape)
    gpu = cat.gpu("H100-SXM")
    plain = explicit_strategy(_pinned(spec, "zero1", 8, 4), 128, shape)
    assert plain.grad_accum == plain.pp == 4  # 64 sequences over dp 4 at micro-batch 4
    inter = dataclasses.replace(plain, vp=5)
    base = {p.stage: p for p in estimate_memory(shape, job, plain, gpu).pipeline_stages}
    out = {p.stage: p for p in estimate_memory(shape, job, inter, gpu).pipeline_stages}
    assert out["first"].device_used_bytes == pytest.approx(base["first"].device_used_bytes)
    # the last stage warms up (vp - 1) pp chunks where plain 1F1B warms up none
    assert out["last"].device_used_bytes > base["last"].device_used_bytes


def test_refused_rows_count_the_interleaved_warm_up(tmp_path: Path) -> None:
    """A row that ran interleaved is judged on the memory `fit` reports for that layout, warm-up
    chunks included, not on plain 1F1B's."""
    from gpuplan.validation import refused_rows

    header = (
        "id,status,spec,gpu,count,gpus_per_node,intra_node,inter_node_gbps,fabric,metric,"
        "measured,unit,source,what_was_measured,notes\n"
    )
    row = (
        'inter,ok,"{model: llama-3-70b, method: full, precision: bf16-mixed, seq_len: 8192, '
        "global_batch_size: 64, micro_batch_size: 1, framework: hf, "
        'parallelism: {sharding: zero1, tp: 2, pp: 4, vp: 5}}",H100-SXM,8,8,nvswitch,,,'
        "tokens_per_s_per_gpu,10,tokens/s/gpu,test,test,test\n"
    )
    (tmp_path / "validation").mkdir()
    table = tmp_path / "validation" / "t.csv"
    table.write_text(header + row, encoding="utf-8")
    (got,) = refused_rows(table)
    cat = load_catalog(use_user=False)
    spec = parse_spec(
        {
            "model": "llama-3-70b",
            "precision": "bf16-mixed",
            "seq_len": 8192,
            "global_batch_size": 64,
            "micro_batch_size": 1,
            "framework": "hf",
            "parallelism": {"sharding": "zero1", "tp": 2, "pp": 4, "vp": 5},
        }
    )
    shape = model_shape(spec.model)
    st = explicit_strategy(spec, 8, shape)
    plain = estimate_memory(
        shape, memory_job(spec, shape), dataclasses.replace(st, vp=1), cat.gpu("H100-SXM")
    )
    assert got.strategy == st.label()
    assert got.device_used_bytes > plain.device_used_bytes


def test_refusal_names_the_closest_layout_and_the_miss(cat) -> None:  # type: ignore[no-untyped-def]
    spec = _spec("llama-3-70b", global_batch_size=64)
    with pytest.raises(InfeasibleError) as info:
        configure(spec, cat.gpu("A100-40GB"), 8)
    text = info.value.one_line()
    assert "closest: " in text
    # the least memory-hungry layout on one node: full sharding (16 bytes/param over 8) or TP8
    assert re.search(r"closest: (zero3 dp8|\S+ tp8)", text), text
    assert "GiB per GPU" in text and "GiB (" in text and "%) over the" in text


def test_cli_refusal_is_one_line_with_gib_and_percent(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "job.yaml"
    path.write_text(
        "model: llama-3-70b\nseq_len: 2048\nglobal_batch_size: 64\nwork: {tokens: 1000000}\n",
        encoding="utf-8",
    )
    result = cli("estimate", str(path), "--gpu", "A100-40GB", "--count", "8")
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert "closest:" in lines[0] and "GiB" in lines[0] and "%" in lines[0]


def test_refusal_hint_names_what_the_closest_layout_leaves(cat) -> None:  # type: ignore[no-untyped-def]
    """An explicit micro-batch of 16 without recompute: the hint names both, and lora/qlora for
    a full fine-tune; a job already at micro-batch 1 with full recompute is not told either."""
    big = parse_spec(
        {
            "model": "llama-3-8b",
            "seq_len": 8192,
            "micro_batch_size": 16,
            "parallelism": {"sharding": "zero3", "tp": 1, "pp": 1},
        }
    )
    with pytest.raises(InfeasibleError) as info:
        configure(big, cat.gpu("A100-40GB"), 8)
    hint = info.value.hint or ""
    assert "a micro_batch_size below 16" in hint
    assert "activation_checkpointing: full" in hint and "lora/qlora" in hint
    small = parse_spec(
        {
            "model": "llama-3-70b",
            "method": "lora",
            "seq_len": 2048,
            "activation_checkpointing": "full",
            "parallelism": {"sharding": "none", "tp": 1, "pp": 1},
        }
    )
    with pytest.raises(InfeasibleError) as info:
        configure(small, cat.gpu("L4"), 1)
    hint = info.value.hint or ""
    assert "micro_batch_size" not in hint and "checkpointing" not in hint
    assert hint.endswith("or qlora")
