"""Expert parallelism (``parallelism.ep``): what a rank holds, what it shards, what it sends.

Megatron-Core's semantics: a rank holds num_experts / ep of every MoE layer's experts; the
experts' gradients are reduced, and the distributed optimizer's state split, over the
``dp x cp / ep`` ranks that hold the same experts; the routed tokens go to the experts' ranks
and back by all-to-all.
"""

from __future__ import annotations

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.errors import SpecError
from gpuplan.estimate.comm import Link, all_to_all_time
from gpuplan.estimate.configure import configure, default_topology
from gpuplan.estimate.fit import explicit_strategy, memory_job, model_shape
from gpuplan.estimate.memory import estimate_memory, expert_params_per_layer, split_over
from gpuplan.spec import parse_spec

CAT = load_catalog(use_user=False)
H100 = CAT.gpu("H100-SXM")


def _spec(ep: int, sharding: str = "zero1", **extra: object):  # type: ignore[no-untyped-def]
    return parse_spec(
        {
            "model": "qwen3-30b-a3b",
            "precision": "bf16-mixed",
            "framework": "megatron",
            "seq_len": 2048,
            "micro_batch_size": 1,
            "global_batch_size": 64,
            "parallelism": {"sharding": sharding, "ep": ep},
            **extra,
        }
    )


def _memory(ep: int, sharding: str = "zero1", count: int = 16):  # type: ignore[no-untyped-def]
    spec = _spec(ep, sharding)
    shape = model_shape(spec.model)
    st = explicit_strategy(spec, count, shape)
    return estimate_memory(shape, memory_job(spec, shape), st, H100), shape, st


def test_split_over_holds_sharded_state_equal_and_whole_state_smaller() -> None:
    # held whole (ranks 1): the experts shrink by ep; sharded over all the replicas: as without ep
    assert split_over(10.0, 80.0, 8, 1) == 10.0 + 10.0
    assert split_over(10.0, 80.0, 8, 16) == pytest.approx((10.0 + 80.0) / 16)
    assert split_over(10.0, 80.0, 1, 16) == split_over(10.0, 80.0, 8, 16)


def test_a_rank_holds_its_own_experts_and_shards_the_state_as_before() -> None:
    plain, shape, _ = _memory(1)
    ep8, _, st = _memory(8)
    d1, d8 = plain.details, ep8.details
    experts = shape.layers * expert_params_per_layer(shape)
    # parameters (16-bit under Megatron) and gradients, held whole under the distributed
    # optimizer, lose 7/8 of the experts
    assert d1["weights: parameters"] - d8["weights: parameters"] == pytest.approx(
        experts * 7 / 8 * 2, rel=1e-6
    )
    assert d1["gradients"] > d8["gradients"]
    # the optimizer's state is split over dp (16) without ep and over dp / ep (2) with it
    assert d8["optimizer: state"] == pytest.approx(d1["optimizer: state"], rel=1e-9)
    assert st.expert_replicas == 2
    assert ep8.device_used_bytes < plain.device_used_bytes


def test_fsdp_stores_the_same_shard_and_gathers_only_its_experts() -> None:
    plain, _, _ = _memory(1, "fsdp")
    ep8, _, _ = _memory(8, "fsdp")
    stored = "weights: parameters"
    assert ep8.details[stored] == pytest.approx(plain.details[stored], rel=1e-9)
    gathered = "weights: unsharded layers in flight (all-gather)"
    assert ep8.details[gathered] < plain.details[gathered]


def test_the_routed_tokens_cost_all_to_alls_and_more_across_nodes() -> None:
    spec = _spec(8)
    topo = default_topology(H100, 16, inter_node_gbps=3200, fabric="ib")
    t = configure(spec, H100, 16, topo, with_scaling=False, require_fit=False).time
    a2a = t.parts["ep all-to-all exposed"]
    assert a2a > 0
    assert any("expert parallelism 8" in a for a in t.assumptions)
    plain = configure(_spec(1), H100, 16, topo, with_scaling=False, require_fit=False).time
    assert plain.parts["ep all-to-all exposed"] == 0
    nvl = Link(bandwidth=300e9, latency=5e-6, name="nvswitch")
    ib = Link(bandwidth=40e9, latency=10e-6, name="ib")
    inside = all_to_all_time(1e9, 8, 8, nvl, ib)
    across = all_to_all_time(1e9, 16, 8, nvl, ib)
    assert inside == pytest.approx(7 / 8 * 1e9 / 300e9 + 7 * 5e-6)
    assert across > 3 * inside  # half of each rank's tokens leave the node


@pytest.mark.parametrize(
    ("model", "ep", "count", "match"),
    [
        ("llama-3.1-8b", 2, 8, "mixture-of-experts"),
        ("qwen3-30b-a3b", 3, 6, "does not divide the 128 experts"),
        ("qwen3-30b-a3b", 16, 8, "data x context parallel ranks"),
    ],
)
def test_impossible_expert_parallelism_is_an_error_naming_the_field(
    model: str, ep: int, count: int, match: str
) -> None:
    spec = parse_spec(
        {"model": model, "seq_len": 1024, "parallelism": {"sharding": "zero1", "ep": ep}}
    )
    with pytest.raises(SpecError, match=match) as err:
        explicit_strategy(spec, count, model_shape(model))
    assert "parallelism.ep" in str(err.value)


def test_qlora_with_expert_parallelism_is_refused() -> None:
    spec = parse_spec(
        {
            "model": "qwen3-30b-a3b",
            "method": "qlora",
            "seq_len": 1024,
            "parallelism": {"sharding": "none", "ep": 8},
        }
    )
    with pytest.raises(SpecError, match="qlora"):
        explicit_strategy(spec, 8, model_shape("qwen3-30b-a3b"))


def test_the_strategy_names_its_expert_parallelism() -> None:
    spec = _spec(8)
    st = explicit_strategy(spec, 16, model_shape(spec.model))
    assert "ep8" in st.label()
    assert st.as_contract()["ep"] == 8


def test_fp8_experts_keep_their_fp8_input_cast() -> None:
    """Under an fp8 recipe the experts' first linear keeps the fp8 cast of its input (1 byte a
    routed token copy and hidden unit), as Transformer Engine's dense linears do; bf16 keeps 2."""
    shape = model_shape("qwen3-30b-a3b")
    k, h = shape.experts_per_token, shape.hidden
    for precision, width in (("fp8-mixed", 1), ("bf16-mixed", 2)):
        spec = _spec(8, precision=precision)
        st = explicit_strategy(spec, 16, shape)
        m = estimate_memory(shape, memory_job(spec, shape), st, H100)
        items = {i.name: i.bytes_per_token for i in m.activation_items}
        name = "moe gathered expert inputs" + (" (fp8)" if width == 1 else "")
        assert items[name] == k * h * width
