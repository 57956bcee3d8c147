"""How to launch one option's strategy: torchrun counts, script flags and config files.

Shared by both exports (:mod:`gpuplan.planner.export`). Pure formatting of
the strategy the planner chose; nothing is re-estimated.

* ZeRO stages give a DeepSpeed JSON config (deepspeed.ai "DeepSpeed
  Configuration JSON": ``train_batch_size`` = micro-batch x accumulation x
  data-parallel GPUs, ``bf16``/``fp16`` ``enabled`` (never both),
  ``zero_optimization.stage``, ``offload_optimizer`` for stages 1-3,
  ``offload_param`` for stage 3 only).
* FSDP gives an accelerate config (accelerate ``usage_guides/fsdp.md`` and
  ``commands/launch.py``: ``distributed_type: FSDP``, ``num_machines``,
  ``num_processes`` over all machines, ``fsdp_config.fsdp_sharding_strategy``,
  ``fsdp_activation_checkpointing``, ``fsdp_offload_params``).
* Tensor or pipeline parallelism gives Megatron-LM flags
  (``megatron/training/arguments.py``; ``--sequence-parallel`` where the estimate split the
  norm and dropout activations over the tensor-parallel ranks, which Megatron-LM leaves off
  by default; ``--account-for-embedding-in-pipeline-split`` and
  ``--account-for-loss-in-pipeline-split`` where the layers split over the pipeline chunks
  only with the embedding and the loss counted as one layer each; ``--overlap-grad-reduce``
  where the estimate hid the data-parallel reduction behind backward, which Megatron-LM does
  not do by default); with ZeRO, DeepSpeed's own
  ``--deepspeed --deepspeed_config`` (``deepspeed.add_config_arguments``), as
  Megatron-DeepSpeed reads them.
* Otherwise the flags are the transformers Trainer's
  (``--per_device_train_batch_size``, ``--deepspeed``, ``--fsdp``).
"""

from __future__ import annotations

import dataclasses
import json

from gpuplan.estimate.fit import model_shape
from gpuplan.estimate.frameworks import deepspeed_overlap_comm
from gpuplan.estimate.pipeline import counts_embedding_and_loss
from gpuplan.estimate.speed import tp_overlap_mode
from gpuplan.estimate.strategy import Strategy
from gpuplan.planner.model import Option
from gpuplan.spec import JobSpec, ParallelismSpec

MASTER_PORT = 29500
"""torchrun's default rendezvous port (``torch/distributed/run.py``)."""

SCRIPT_NOTE = (
    "train.py stands for your training script: flags follow the transformers Trainer "
    "(--per_device_train_batch_size, --deepspeed, --fsdp) or, with tensor/pipeline "
    "parallelism, Megatron-LM (--tensor-model-parallel-size ...); adapt them to your script"
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LaunchPlan:
    """What to launch: node and process counts, script flags, config files, notes."""

    nodes: int
    procs_per_node: int
    script_args: tuple[str, ...]
    files: tuple[tuple[str, str], ...]
    """(file name, content) pairs the script flags refer to."""
    notes: tuple[str, ...]
    accelerate_args: tuple[str, ...] = ()
    """Script flags for ``accelerate launch`` (FSDP only; the config carries the sharding)."""


def precision_mode(spec: JobSpec) -> str:
    """``bf16``, ``fp16`` or ``no``: the mixed-precision mode the launch configs use."""
    dtype = spec.compute_dtype
    if dtype in ("bf16", "fp8"):
        return "bf16"
    return "fp16" if dtype == "fp16" else "no"


def launch_plan(option: Option, spec: JobSpec) -> LaunchPlan:
    """Derive the launch (flags and config files) from the option's strategy."""
    st = option.configuration.strategy
    topo = option.configuration.topology
    prec = precision_mode(spec)
    files, notes = _files(st, option.nodes, topo.gpus_per_node, prec, _overlap_comm(spec, st))
    notes = [SCRIPT_NOTE, *_spec_notes(spec), *notes]
    accelerate_args: tuple[str, ...] = ()
    if st.sharding == "fsdp":
        accelerate_args = _hf_args(st, prec, deepspeed=None, fsdp=None)
    if st.tp > 1 or st.pp > 1:
        args = _megatron_args(
            st, prec, model_shape(spec.model).layers, overlap_grad_reduce=_overlap_grad(spec)
        )
        if st.sharding.startswith("zero"):
            notes.append(
                "tensor/pipeline parallel flags follow Megatron-LM; --deepspeed/--deepspeed_config "
                "follow Megatron-DeepSpeed (upstream Megatron-LM without DeepSpeed: use "
                "--use-distributed-optimizer for ZeRO-1)"
            )
        if st.sharding == "fsdp" and st.pp > 1:
            notes.append("Megatron's --use-torch-fsdp2 does not support pipeline parallelism yet")
        if st.tp > 1 and _tp_overlap(spec) == "pipelined":
            notes.append(
                "the estimate hides most tensor-parallel collectives under the GEMMs, as "
                "Transformer Engine's userbuffers do (Megatron's --tp-comm-overlap, which needs "
                "--sequence-parallel); without it Megatron overlaps only the backward's "
                "(estimate that with parallelism.tp_comm_overlap: backward)"
            )
        if st.activation_checkpointing == "selective-op":
            notes.append(
                "the estimate assumes torchtitan's per-op selective checkpointing "
                "(--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option "
                "op); Megatron has no equivalent, so the command recomputes full layers (less "
                "memory, more time than estimated)"
            )
    else:
        ds = "ds_config.json" if st.sharding.startswith("zero") else None
        fsdp = None
        if st.sharding == "fsdp":
            fsdp = "full_shard auto_wrap" + (" offload" if st.offload != "none" else "")
        args = _hf_args(st, prec, deepspeed=ds, fsdp=fsdp)
        if st.activation_checkpointing in ("selective", "selective-op"):
            notes.append(
                f"the estimate assumes {st.activation_checkpointing} activation checkpointing; "
                "the transformers Trainer only offers full (--gradient_checkpointing)"
            )
    if topo.compute_fraction < 1:
        notes.append(
            f"{option.instance_type} is a fractional GPU slice ({topo.compute_fraction:.3g} of a "
            f"{option.gpu}): one process"
        )
    return LaunchPlan(
        nodes=option.nodes,
        procs_per_node=topo.gpus_per_node,
        script_args=args,
        files=tuple(files),
        notes=tuple(notes),
        accelerate_args=accelerate_args,
    )


def _tp_overlap(spec: JobSpec) -> str:
    """The tensor-parallel overlap the estimate assumed for ``spec``."""
    par = spec.parallelism
    stated = par.tp_comm_overlap if isinstance(par, ParallelismSpec) else "auto"
    return tp_overlap_mode(stated, spec.framework)


def _spec_notes(spec: JobSpec) -> list[str]:
    notes = []
    if spec.compute_dtype == "fp8":
        notes.append(
            "fp8-mixed: the estimate assumes FP8 GEMMs (e.g. Transformer Engine); the configs "
            "set bf16 for everything else"
        )
    if spec.method in ("lora", "qlora"):
        rank = spec.lora.rank if spec.lora else "?"
        notes.append(
            f"{spec.method}: the estimate assumes PEFT adapters (rank {rank}); only adapter "
            "weights are trained"
        )
    return notes


def _overlap_comm(spec: JobSpec, st: Strategy) -> bool:
    """DeepSpeed's ``overlap_comm`` as the estimate assumed it: under framework deepspeed the
    spec's ``deepspeed.overlap_comm``, else DeepSpeed's default (on for ZeRO-3 only); the other
    frameworks' estimates hide the reduction behind backward, so their config turns it on."""
    if spec.framework != "deepspeed":
        return True
    # the config says what the spec says: a release that ignores the setting (ZeRO-1 before
    # 0.13.0) reads it harmlessly, and the estimate prices what that release does
    stated = spec.deepspeed.overlap_comm if spec.deepspeed is not None else None
    return deepspeed_overlap_comm(st.sharding, stated, None)


def _files(
    st: Strategy, nodes: int, per_node: int, prec: str, overlap_comm: bool = True
) -> tuple[list[tuple[str, str]], list[str]]:
    """Config files for the sharding, and notes on combinations to watch."""
    files: list[tuple[str, str]] = []
    notes: list[str] = []
    if st.sharding.startswith("zero"):
        stage = int(st.sharding[-1])
        files.append(("ds_config.json", deepspeed_config(st, stage, prec, overlap_comm)))
        if not overlap_comm:
            notes.append(
                "ds_config.json keeps overlap_comm off, as the estimate assumed (the spec's "
                "deepspeed.overlap_comm, or DeepSpeed's default below ZeRO-3): the gradient "
                "reduction is not hidden behind backward; "
                "set deepspeed: {overlap_comm: true} in the spec to estimate and launch it on"
            )
        if st.pp > 1 and stage > 1:
            notes.append(
                f"DeepSpeed's pipeline engine supports ZeRO stages 0-1 only; ZeRO-{stage} with "
                f"pp={st.pp} needs Megatron's own pipeline schedule"
            )
    elif st.sharding == "fsdp":
        files.append(("accelerate_fsdp.yaml", accelerate_config(st, nodes, per_node, prec)))
    return files, notes


def _hf_args(
    st: Strategy, prec: str, *, deepspeed: str | None, fsdp: str | None
) -> tuple[str, ...]:
    args = [
        "--per_device_train_batch_size",
        str(st.micro_batch_size),
        "--gradient_accumulation_steps",
        str(st.grad_accum),
    ]
    if prec != "no":
        args.append(f"--{prec}")
    if st.activation_checkpointing != "none":
        args.append("--gradient_checkpointing")
    if deepspeed:
        args += ["--deepspeed", deepspeed]
    if fsdp:
        args += ["--fsdp", fsdp]
    return tuple(args)


def _overlap_grad(spec: JobSpec) -> bool:
    """Whether the estimate ran the data-parallel reduction beside backward."""
    par = spec.parallelism
    return not (isinstance(par, ParallelismSpec) and par.overlap_grad_reduce is False)


def _megatron_args(
    st: Strategy, prec: str, layers: int, *, overlap_grad_reduce: bool = True
) -> tuple[str, ...]:
    global_batch = st.micro_batch_size * st.grad_accum * st.dp
    args = [
        "--tensor-model-parallel-size",
        str(st.tp),
        "--pipeline-model-parallel-size",
        str(st.pp),
    ]
    if st.tp > 1 and st.sequence_parallel:  # the activations the estimate split over tp
        args.append("--sequence-parallel")
    if st.pp > 1 and st.vp > 1:  # interleaved 1F1B: the bubble the estimate assumed
        args += ["--num-virtual-stages-per-pipeline-rank", str(st.vp)]
    if counts_embedding_and_loss(layers, st.pp, st.vp):  # the split the estimate sized
        args += [
            "--account-for-embedding-in-pipeline-split",
            "--account-for-loss-in-pipeline-split",
        ]
    if st.replicas > 1 and overlap_grad_reduce and st.sharding == "none":
        # the estimate hid the gradient reduction behind backward; Megatron-LM runs it after
        # backward unless asked (DistributedDataParallelConfig.overlap_grad_reduce is False)
        args.append("--overlap-grad-reduce")
    if st.cp > 1:
        args += ["--context-parallel-size", str(st.cp)]
    if st.ep > 1:  # each rank's experts and the all-to-alls the estimate priced
        args += ["--expert-model-parallel-size", str(st.ep)]
    args += [
        "--micro-batch-size",
        str(st.micro_batch_size),
        "--global-batch-size",
        str(global_batch),
    ]
    if prec != "no":
        args.append(f"--{prec}")
    if st.activation_checkpointing in ("full", "selective-op"):
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform"]
        args += ["--recompute-num-layers", "1"]
    elif st.activation_checkpointing == "selective":
        args += ["--recompute-granularity", "selective"]
    if st.sharding.startswith("zero"):  # Megatron-DeepSpeed: the ZeRO stage is in ds_config.json
        args += ["--deepspeed", "--deepspeed_config", "ds_config.json"]
    elif st.sharding == "fsdp":
        args.append("--use-torch-fsdp2")
    return tuple(args)


def deepspeed_config(st: Strategy, stage: int, prec: str, overlap_comm: bool = True) -> str:
    """The DeepSpeed JSON config of a ZeRO ``stage`` for this strategy's batch layout."""
    zero: dict[str, object] = {
        "stage": stage,
        "overlap_comm": overlap_comm,
        "contiguous_gradients": True,
    }
    if st.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if st.offload == "optimizer+params" and stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, object] = {
        "train_batch_size": st.micro_batch_size * st.grad_accum * st.dp,
        "train_micro_batch_size_per_gpu": st.micro_batch_size,
        "gradient_accumulation_steps": st.grad_accum,
        "gradient_clipping": 1.0,
    }
    if prec == "bf16":
        config["bf16"] = {"enabled": True}
    elif prec == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}
    config["zero_optimization"] = zero
    if st.tp > 1:  # only read by deepspeed.checkpointing (Megatron-DeepSpeed)
        config["activation_checkpointing"] = {
            "partition_activations": True,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
        }
    return json.dumps(config, indent=2) + "\n"


def accelerate_config(st: Strategy, nodes: int, per_node: int, prec: str) -> str:
    """The accelerate FSDP config (FULL_SHARD) for ``nodes`` x ``per_node`` processes."""
    import yaml

    config = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": prec,
        "num_machines": nodes,
        "num_processes": nodes * per_node,
        "machine_rank": 0,
        "main_process_port": MASTER_PORT,
        "rdzv_backend": "static",
        "same_network": True,
        "fsdp_config": {
            "fsdp_sharding_strategy": "FULL_SHARD",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_activation_checkpointing": st.activation_checkpointing != "none",
            "fsdp_offload_params": st.offload != "none",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_use_orig_params": True,
            "fsdp_sync_module_states": True,
            "fsdp_cpu_ram_efficient_loading": True,
        },
    }
    head = (
        "# machine_rank and main_process_ip are given per node on the command line:\n"
        "#   accelerate launch --config_file accelerate_fsdp.yaml --machine_rank $NODE_RANK "
        "--main_process_ip $MASTER_ADDR train.py ...\n"
    )
    return head + yaml.safe_dump(config, sort_keys=False)


def join_args(args: tuple[str, ...]) -> str:
    """Shell-join script flags (values with spaces double-quoted)."""
    return " ".join(f'"{a}"' if " " in a else a for a in args)


def torchrun_command(
    lp: LaunchPlan, *, nnodes: str, nproc: str, node_rank: str, master_addr: str
) -> str:
    """``torchrun ... train.py FLAGS`` with a line continuation before the script."""
    head = (
        f"torchrun --nnodes {nnodes} --nproc-per-node {nproc} --node-rank {node_rank} "
        f"--master-addr {master_addr} --master-port {MASTER_PORT}"
    )
    return head + " \\\n    train.py " + join_args(lp.script_args)
