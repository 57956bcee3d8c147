"""plan --export: SkyPilot task YAML and torchrun launch (+ DeepSpeed / accelerate / Megatron)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplan.catalog.loader import load_catalog
from gpuplan.errors import GpuPlanError, UnknownNameError
from gpuplan.planner import Option, Plan, PlanSettings, plan
from gpuplan.planner.export import (
    SKYPILOT_CLOUDS,
    ExportError,
    export,
    sections,
    skypilot_accelerator,
)
from gpuplan.report.launch import launch_plan
from gpuplan.spec import DeepSpeedSpec, JobSpec, ParallelismSpec, load_spec

EX = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def spec() -> JobSpec:
    return load_spec(EX / "llama3-8b-lora.yaml")


@pytest.fixture(scope="module")
def full(spec: JobSpec) -> Plan:
    """Every feasible option of the LoRA example (top large enough to keep them all)."""
    return plan(spec, load_catalog(use_user=False), PlanSettings(top=5000))


def pick(p: Plan, pred: Callable[[Option], bool]) -> Option:
    return next(o for o in p.options if pred(o))


def with_strategy(o: Option, **changes: Any) -> Option:
    """``o`` with its strategy fields replaced (the rest of the estimate kept)."""
    conf = o.configuration
    st = dataclasses.replace(conf.strategy, **changes)
    conf = dataclasses.replace(conf, fit=dataclasses.replace(conf.fit, strategy=st))
    return dataclasses.replace(o, configuration=conf)


def with_model_parallel(p: Plan, *, tp: int, pp: int) -> Option:
    """An option of ``p`` with tp x pp model parallelism: the plan's own when it has one, else a
    data-parallel option whose GPUs are regrouped into tp x pp x dp (the LoRA example's plan may
    have none, since the layout search finds data parallelism faster wherever it fits)."""
    for o in p.options:
        st = o.configuration.strategy
        if launchable(o) and (tp == 1 or st.tp > 1) and (pp == 1 or st.pp > 1):
            return o
    base = pick(p, lambda o: launchable(o) and o.configuration.strategy.dp % (tp * pp) == 0)
    dp = base.configuration.strategy.dp // (tp * pp)
    return with_strategy(base, tp=tp, pp=pp, dp=dp)


def with_topology(o: Option, **changes: Any) -> Option:
    conf = o.configuration
    topo = dataclasses.replace(conf.topology, **changes)
    return dataclasses.replace(o, configuration=dataclasses.replace(conf, topology=topo))


def torchrun_args(text: str) -> list[str]:
    """The torchrun command of an export (first ``torchrun`` line plus continuations)."""
    launch = text.replace("\\\n", " ")
    line = next(ln for ln in launch.splitlines() if ln.strip().startswith("torchrun "))
    return shlex.split(line)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def launchable(o: Option) -> bool:
    return o.provider in SKYPILOT_CLOUDS and o.provider != "runpod"


# --- SkyPilot ----------------------------------------------------------------------------


def test_skypilot_spot_multi_node(full: Plan, spec: JobSpec) -> None:
    o = pick(
        full,
        lambda o: (
            o.provider == "aws"
            and o.gpu == "H100-SXM"
            and o.nodes == 2
            and o.billing_mode == "spot"
        ),
    )
    task = yaml.safe_load(export(o, spec, "skypilot"))
    res = task["resources"]
    assert res["accelerators"] == "H100:8"
    assert res["cloud"] == "aws"
    assert res["region"] == o.region
    assert res["instance_type"] == "p5.48xlarge"
    assert res["use_spot"] is True
    assert res["autostop"] == {"idle_minutes": 10, "down": True}
    assert task["num_nodes"] == 2
    for var in (
        "SKYPILOT_NODE_RANK",
        "SKYPILOT_NUM_NODES",
        "SKYPILOT_NODE_IPS",
        "SKYPILOT_NUM_GPUS_PER_NODE",
    ):
        assert f"${var}" in task["run"]
    args = torchrun_args(task["run"])
    assert flag(args, "--nnodes") == "$SKYPILOT_NUM_NODES"
    assert flag(args, "--node-rank") == "$SKYPILOT_NODE_RANK"
    assert flag(args, "--master-addr") == "$MASTER_ADDR"


@pytest.mark.parametrize("mode", ["spot", "on-demand"])
def test_skypilot_use_spot_matches_billing_mode(full: Plan, spec: JobSpec, mode: str) -> None:
    for o in [o for o in full.options if o.billing_mode == mode and launchable(o)][:25]:
        task = yaml.safe_load(export(o, spec, "skypilot"))
        assert task["resources"]["use_spot"] is (mode == "spot")
        assert task["num_nodes"] == o.nodes
        name, count = task["resources"]["accelerators"].split(":")
        assert name == skypilot_accelerator(o)
        assert int(count) == o.configuration.topology.gpus_per_node
        assert task["resources"]["cloud"] == o.provider


def test_skypilot_header_states_the_estimate(full: Plan, spec: JobSpec) -> None:
    o = pick(full, launchable)
    text = export(o, spec, "skypilot")
    head = text.split("name:")[0]
    assert f"{o.cost_total:,.2f} USD" in head
    assert o.configuration.strategy.label() in head
    assert all(line.startswith("#") for line in head.strip().splitlines())


def test_skypilot_run_writes_the_config_it_uses(full: Plan, spec: JobSpec) -> None:
    # the LoRA example's plan has no ZeRO-3 option (the layout search finds ZeRO-1 faster
    # wherever both fit), so a launchable data-parallel option is switched to ZeRO-3
    o = pick(full, lambda o: launchable(o) and o.configuration.strategy.dp > 1)
    o = with_strategy(o, sharding="zero3")
    run = yaml.safe_load(export(o, spec, "skypilot"))["run"]
    body = re.search(r"cat > ds_config.json <<'GPUPLAN_EOF'\n(.*?)\nGPUPLAN_EOF", run, re.S)
    assert body is not None
    assert json.loads(body.group(1))["zero_optimization"]["stage"] == 3
    assert "--deepspeed ds_config.json" in run
    assert "deepspeed" in yaml.safe_load(export(o, spec, "skypilot"))["setup"]


def test_skypilot_commitment_modes_launch_on_demand(full: Plan, spec: JobSpec) -> None:
    o = pick(full, lambda o: launchable(o) and o.billing_mode in ("monthly", "capacity-block"))
    text = export(o, spec, "skypilot")
    assert yaml.safe_load(text)["resources"]["use_spot"] is False
    assert f"billing mode {o.billing_mode}" in text


@pytest.mark.parametrize(
    ("provider", "instance", "gpu", "expected"),
    [
        ("aws", "p4d.24xlarge", "A100-40GB", "A100"),
        ("aws", "p4de.24xlarge", "A100-80GB", "A100-80GB"),
        ("aws", "g5.xlarge", "A10G", "A10G"),
        ("gcp", "a3-megagpu-8g", "H100-SXM", "H100-MEGA"),
        ("lambda", "gpu_1x_a6000", "RTX-A6000", "A6000"),
        ("vast", "2x-RTX_A6000-32-65536", "RTX-A6000", "RTXA6000"),
        ("verda", "1V100.6V", "V100-16GB", "Tesla-V100"),
        ("verda", "8A100.176V", "A100-80GB", "A100-80GB-640GB"),
        ("runpod", "H100 SXM", "H100-SXM", "H100-SXM"),
        ("azure", "Standard_NC40ads_H100_v5", "H100-NVL", "H100"),
    ],
)
def test_accelerator_names(
    full: Plan, provider: str, instance: str, gpu: str, expected: str
) -> None:
    o = dataclasses.replace(full.options[0], provider=provider, instance_type=instance, gpu=gpu)
    assert skypilot_accelerator(o) == expected


def test_gcp_attached_gpus_and_fractional_slices(full: Plan, spec: JobSpec) -> None:
    base = full.options[0]
    gcp = with_topology(
        dataclasses.replace(
            base,
            provider="gcp",
            instance_type="n1-highmem-8+T4:2",
            gpu="T4",
            region="us-central1",
            nodes=1,
        ),
        gpus=2,
        gpus_per_node=2,
    )
    res = yaml.safe_load(export(gcp, spec, "skypilot"))["resources"]
    assert res["instance_type"] == "n1-highmem-8"
    assert res["accelerators"] == "T4:2"
    az = with_topology(
        dataclasses.replace(
            base,
            provider="azure",
            instance_type="Standard_NV12ads_A10_v5",
            gpu="A10",
            region="eastus",
            nodes=1,
        ),
        gpus=1,
        gpus_per_node=1,
        compute_fraction=0.3333,
    )
    text = export(az, spec, "skypilot")
    assert yaml.safe_load(text)["resources"]["accelerators"] == "A10:0.333"
    assert "fractional GPU slice" in text


def test_runpod_has_no_instance_type(full: Plan, spec: JobSpec) -> None:
    o = dataclasses.replace(
        full.options[0],
        provider="runpod",
        instance_type="H100 SXM",
        gpu="H100-SXM",
        region="global",
    )
    res = yaml.safe_load(export(o, spec, "skypilot"))["resources"]
    assert "instance_type" not in res
    assert "region" not in res
    assert res["cloud"] == "runpod"


@pytest.mark.parametrize(
    "provider", ["alibaba", "tencent", "huawei", "ucloud", "coreweave", "hyperstack"]
)
def test_unsupported_provider_is_a_one_line_error(full: Plan, spec: JobSpec, provider: str) -> None:
    o = dataclasses.replace(full.options[0], provider=provider)
    with pytest.raises(ExportError) as info:
        export(o, spec, "skypilot")
    err = info.value
    assert isinstance(err, GpuPlanError)
    assert "\n" not in str(err)
    assert repr(provider) in err.message
    assert "allowed: " in err.message and "aws" in err.message
    assert err.hint


def test_unmapped_gpu_is_an_error(full: Plan, spec: JobSpec) -> None:
    o = dataclasses.replace(full.options[0], provider="aws", gpu="H20")
    with pytest.raises(ExportError, match="no SkyPilot accelerator name is known for GPU 'H20'"):
        export(o, spec, "skypilot")


def test_unknown_kind(full: Plan, spec: JobSpec) -> None:
    with pytest.raises(UnknownNameError, match="did you mean skypilot"):
        export(full.options[0], spec, "skypilt")


# --- torchrun ----------------------------------------------------------------------------


def test_torchrun_multi_node_counts(full: Plan, spec: JobSpec) -> None:
    o = pick(full, lambda o: o.nodes > 1 and o.configuration.topology.gpus_per_node == 8)
    text = export(o, spec, "torchrun")
    args = torchrun_args(text)
    assert args[0] == "torchrun"
    assert flag(args, "--nnodes") == str(o.nodes)
    assert flag(args, "--nproc-per-node") == "8"
    assert flag(args, "--node-rank") == "$NODE_RANK"
    assert flag(args, "--master-addr") == "$MASTER_ADDR"
    assert flag(args, "--master-port") == "29500"
    assert int(flag(args, "--nnodes")) * int(flag(args, "--nproc-per-node")) == o.gpus


def test_torchrun_single_node(full: Plan, spec: JobSpec) -> None:
    o = pick(full, lambda o: o.nodes == 1 and o.gpus == 1)
    args = torchrun_args(export(o, spec, "torchrun"))
    assert flag(args, "--nnodes") == "1"
    assert flag(args, "--nproc-per-node") == "1"
    assert flag(args, "--node-rank") == "0"
    assert "--deepspeed" not in args
    assert set(sections(export(o, spec, "torchrun"))) == {"launch"}


def _zero_option(full: Plan, stage: int) -> Option:
    """A one-node, 8-GPU data-parallel option of the plan under ZeRO ``stage`` (micro-batch 2,
    4 accumulation steps)."""
    base = pick(
        full,
        lambda o: (
            o.gpus == 8
            and o.nodes == 1
            and o.configuration.strategy.tp == 1
            and o.configuration.strategy.pp == 1
        ),
    )
    return with_strategy(base, sharding=f"zero{stage}", dp=8, micro_batch_size=2, grad_accum=4)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_config(full: Plan, spec: JobSpec, stage: int) -> None:
    o = _zero_option(full, stage)
    parts = sections(export(o, spec, "torchrun"))
    ds = json.loads(parts["ds_config.json"])
    assert ds["zero_optimization"]["stage"] == stage
    assert ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["gradient_accumulation_steps"] == 4
    assert ds["train_batch_size"] == 2 * 4 * 8
    assert ds["bf16"] == {"enabled": True}
    assert "fp16" not in ds
    args = torchrun_args(parts["launch"])
    assert flag(args, "--deepspeed") == "ds_config.json"
    assert flag(args, "--per_device_train_batch_size") == "2"
    assert flag(args, "--gradient_accumulation_steps") == "4"
    assert "--gradient_checkpointing" in args  # the example uses full checkpointing


def test_deepspeed_offload_and_fp16(full: Plan, spec: JobSpec) -> None:
    o = with_strategy(full.options[0], sharding="zero3", offload="optimizer+params")
    fp16 = spec.model_copy(update={"precision": "fp16-mixed"})
    ds = json.loads(sections(export(o, fp16, "torchrun"))["ds_config.json"])
    assert ds["fp16"]["enabled"] is True
    assert "bf16" not in ds
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"


def test_fsdp_accelerate_config(full: Plan, spec: JobSpec) -> None:
    base = pick(
        full,
        lambda o: (
            o.nodes == 2
            and o.configuration.topology.gpus_per_node == 8
            and o.configuration.strategy.tp == 1
            and o.configuration.strategy.pp == 1
        ),
    )
    o = with_strategy(base, sharding="fsdp")
    text = export(o, spec, "torchrun")
    cfg = yaml.safe_load(sections(text)["accelerate_fsdp.yaml"])
    assert cfg["distributed_type"] == "FSDP"
    assert cfg["mixed_precision"] == "bf16"
    assert cfg["num_machines"] == 2
    assert cfg["num_processes"] == 16
    fsdp = cfg["fsdp_config"]
    assert fsdp["fsdp_sharding_strategy"] == "FULL_SHARD"
    assert fsdp["fsdp_activation_checkpointing"] is True
    assert fsdp["fsdp_offload_params"] is False
    args = torchrun_args(text)
    assert flag(args, "--fsdp") == "full_shard auto_wrap"
    assert "accelerate launch --config_file accelerate_fsdp.yaml" in text


def test_megatron_flags_for_tensor_and_pipeline_parallel(full: Plan, spec: JobSpec) -> None:
    o = with_model_parallel(full, tp=2, pp=1)
    st = o.configuration.strategy
    args = torchrun_args(export(o, spec, "torchrun"))
    assert flag(args, "--tensor-model-parallel-size") == str(st.tp)
    assert flag(args, "--pipeline-model-parallel-size") == str(st.pp)
    assert flag(args, "--micro-batch-size") == str(st.micro_batch_size)
    assert flag(args, "--global-batch-size") == str(st.micro_batch_size * st.grad_accum * st.dp)
    assert flag(args, "--recompute-granularity") == "full"
    # the estimate split the norm and dropout activations over tp: Megatron-LM needs the flag
    assert st.sequence_parallel and "--sequence-parallel" in args
    pp = with_model_parallel(full, tp=1, pp=2)
    args = torchrun_args(export(pp, spec, "torchrun"))
    assert flag(args, "--pipeline-model-parallel-size") == str(pp.configuration.strategy.pp)
    assert "--sequence-parallel" not in args
    conf = o.configuration
    off = dataclasses.replace(conf.strategy, sequence_parallel=False)
    o_off = dataclasses.replace(
        o, configuration=dataclasses.replace(conf, fit=dataclasses.replace(conf.fit, strategy=off))
    )
    assert "--sequence-parallel" not in torchrun_args(export(o_off, spec, "torchrun"))


def test_megatron_interleaved_pipeline_flag(full: Plan, spec: JobSpec) -> None:
    """The export asks Megatron for the interleaved schedule the estimate assumed (vp > 1)."""
    # the search may itself pick interleaving: start from the plain 1F1B schedule
    o = with_strategy(with_model_parallel(full, tp=1, pp=2), vp=1)
    plain = torchrun_args(export(o, spec, "torchrun"))
    assert "--num-virtual-stages-per-pipeline-rank" not in plain
    conf = o.configuration
    st = dataclasses.replace(conf.strategy, vp=4)
    fit4 = dataclasses.replace(conf.fit, strategy=st)
    o4 = dataclasses.replace(o, configuration=dataclasses.replace(conf, fit=fit4))
    args = torchrun_args(export(o4, spec, "torchrun"))
    assert flag(args, "--num-virtual-stages-per-pipeline-rank") == "4"


def test_megatron_overlaps_the_gradient_reduction_as_the_estimate_did(
    full: Plan, spec: JobSpec
) -> None:
    """Megatron-LM reduces gradients after backward unless --overlap-grad-reduce is given; the
    estimate hides most of it behind backward, so the export asks for it, and leaves it out
    where the spec said the reduction runs after backward."""
    o = with_strategy(with_model_parallel(full, tp=2, pp=1), sharding="none", dp=4)
    assert "--overlap-grad-reduce" in torchrun_args(export(o, spec, "torchrun"))
    par = ParallelismSpec(sharding="none", tp=2, pp=1, overlap_grad_reduce=False)
    after = spec.model_copy(update={"parallelism": par})
    assert "--overlap-grad-reduce" not in torchrun_args(export(o, after, "torchrun"))


def test_megatron_counts_the_embedding_and_loss_as_layers_where_the_estimate_did(
    full: Plan, spec: JobSpec
) -> None:
    """126 layers split over 16 x 8 chunks only with the embedding and the loss as a layer
    each: the export asks Megatron for that split, which the memory estimate sized; 32 layers
    over 2 x 4 chunks split evenly and get no such flag."""
    flags = ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    o = with_strategy(with_model_parallel(full, tp=1, pp=2), vp=4)
    even = torchrun_args(export(o, spec, "torchrun"))
    assert not set(flags) & set(even)
    big = spec.model_copy(update={"model": "llama-3.1-405b"})
    o405 = with_strategy(o, pp=16, vp=8, dp=1)
    args = torchrun_args(export(o405, big, "torchrun"))
    assert all(f in args for f in flags)


@pytest.mark.parametrize(
    ("field", "option"),
    [("cp", "--context-parallel-size"), ("ep", "--expert-model-parallel-size")],
)
def test_megatron_parallel_size_flags(full: Plan, spec: JobSpec, field: str, option: str) -> None:
    """A context- or expert-parallel layout (cp, ep > 1) is exported with Megatron's own flag."""
    o = with_strategy(with_model_parallel(full, tp=2, pp=1), vp=1)
    assert option not in torchrun_args(export(o, spec, "torchrun"))
    conf = o.configuration
    st = dataclasses.replace(conf.strategy, **{field: 2})
    fit2 = dataclasses.replace(conf.fit, strategy=st)
    o2 = dataclasses.replace(o, configuration=dataclasses.replace(conf, fit=fit2))
    assert flag(torchrun_args(export(o2, spec, "torchrun")), option) == "2"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_config_keeps_the_overlap_the_estimate_assumed(
    full: Plan, spec: JobSpec, stage: int
) -> None:
    """Under framework deepspeed the config carries the overlap_comm the estimate priced: the
    spec's, else DeepSpeed's default (on for ZeRO-3 only), with a note when it is off."""
    o = _zero_option(full, stage)

    def exported(**ds: bool) -> tuple[bool, str]:
        settings = DeepSpeedSpec(**ds) if ds else None
        ds_spec = spec.model_copy(update={"framework": "deepspeed", "deepspeed": settings})
        text = export(o, ds_spec, "torchrun")
        parts = sections(text)
        return json.loads(parts["ds_config.json"])["zero_optimization"]["overlap_comm"], text

    on, text = exported()
    assert on is (stage == 3)
    assert ("keeps overlap_comm off" in text) is (stage != 3)
    assert exported(overlap_comm=True)[0] is True
    assert exported(overlap_comm=False)[0] is False
    # the other frameworks' estimates hide the reduction: their config turns it on
    parts = sections(export(o, spec, "torchrun"))
    assert json.loads(parts["ds_config.json"])["zero_optimization"]["overlap_comm"] is True


def test_megatron_with_zero_uses_deepspeed_config(full: Plan, spec: JobSpec) -> None:
    o = with_strategy(with_model_parallel(full, tp=2, pp=1), sharding="zero1")
    parts = sections(export(o, spec, "torchrun"))
    args = torchrun_args(parts["launch"])
    assert flag(args, "--deepspeed_config") == "ds_config.json"
    ds = json.loads(parts["ds_config.json"])
    st = o.configuration.strategy
    assert ds["zero_optimization"]["stage"] == 1
    assert ds["train_batch_size"] == st.micro_batch_size * st.grad_accum * st.dp


def test_exports_are_deterministic(full: Plan, spec: JobSpec) -> None:
    o = pick(full, lambda o: launchable(o) and o.nodes > 1)
    for kind in ("skypilot", "torchrun"):
        assert export(o, spec, kind) == export(o, spec, kind)


def test_launch_plan_matches_strategy(full: Plan, spec: JobSpec) -> None:
    for o in full.options[:50]:
        lp = launch_plan(o, spec)
        assert lp.nodes * lp.procs_per_node == o.gpus


def test_megatron_note_on_the_tensor_parallel_overlap_assumed(full: Plan, spec: JobSpec) -> None:
    """Under auto the estimate hides the TP collectives as Transformer Engine's userbuffers do:
    the launch says which Megatron flag that needs; a stated backward overlap needs none."""
    o = with_model_parallel(full, tp=2, pp=1)
    notes = launch_plan(o, spec).notes
    assert any("--tp-comm-overlap" in n for n in notes)
    stated = spec.model_copy(
        update={"parallelism": ParallelismSpec(tp=2, tp_comm_overlap="backward")}
    )
    assert not any("--tp-comm-overlap" in n for n in launch_plan(o, stated).notes)
