"""Export a chosen option as something to run: a SkyPilot task, or a torchrun launch.

``export(option, spec, "skypilot")`` gives a SkyPilot task YAML (resources,
``num_nodes``, autostop, and a ``run`` that starts ``torchrun`` from
SkyPilot's environment variables). ``export(option, spec, "torchrun")`` gives
the ``torchrun`` command for every node plus, depending on the strategy, the
DeepSpeed JSON config (ZeRO stages), the accelerate FSDP config (FSDP) and
Megatron-LM parallel flags (tensor/pipeline parallel). The text is one
document; each file is a section headed ``# --- file: NAME ---`` (see
:func:`sections`).

Key names were checked against the tools' own documentation and code:

* SkyPilot task YAML (``sky/utils/schemas.py`` and docs.skypilot.co
  "SkyPilot YAML", "Autostop and Autodown", "Distributed Multi-Node Jobs"):
  ``num_nodes``; ``resources.cloud``, ``region``, ``instance_type``,
  ``accelerators`` (``NAME:COUNT`` per node), ``use_spot``,
  ``autostop: {idle_minutes, down}``; ``SKYPILOT_NODE_RANK``,
  ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NODE_IPS`` (head node first),
  ``SKYPILOT_NUM_GPUS_PER_NODE``.
* torchrun (``torch/distributed/run.py``): ``--nnodes``, ``--nproc-per-node``,
  ``--node-rank``, ``--master-addr``, ``--master-port`` (default 29500).
* DeepSpeed, accelerate and Megatron-LM keys: see :mod:`gpuplan.report.launch`.
"""

from __future__ import annotations

import json
import re

from gpuplan.errors import GpuPlanError, UnknownNameError
from gpuplan.planner.model import Option
from gpuplan.report.launch import LaunchPlan, join_args, launch_plan, torchrun_command
from gpuplan.spec import JobSpec
from gpuplan.units import format_duration

KINDS = ("skypilot", "torchrun")
AUTOSTOP_IDLE_MINUTES = 10
_FILE_MARK = "# --- file: {} ---"


class ExportError(GpuPlanError):
    """The chosen option cannot be written in the asked export format."""


#: SkyPilot clouds (``resources.cloud``), from ``ALL_CLOUDS`` in SkyPilot's
#: ``sky/skylet/constants.py`` (catalog schema v8); gpuplan provider ids match them.
# fmt: off
SKYPILOT_CLOUDS: frozenset[str] = frozenset((
    "aws", "azure", "gcp", "ibm", "lambda", "scp", "oci", "runpod", "vast", "cudo", "fluidstack",
    "paperspace", "primeintellect", "do", "nebius", "hyperbolic", "seeweb", "shadeform", "yotta",
    "mithril", "verda",
))
# fmt: on

#: Why a provider SkyPilot cannot launch on is missing (shown in the error).
_UNSUPPORTED_WHY: dict[str, str] = {
    "coreweave": "SkyPilot reaches CoreWeave only through its kubernetes cloud on a CKS cluster",
    "hyperstack": "SkyPilot has a Hyperstack catalog but no Hyperstack cloud",
}

#: gpuplan GPU id -> SkyPilot ``AcceleratorName`` as the AWS, GCP, Azure, Lambda
#: and Nebius catalogs spell it (SkyPilot's "A100" is the 40 GB part).
SKYPILOT_ACCELERATORS: dict[str, str] = {
    "T4": "T4",
    "V100-16GB": "V100",
    "V100-32GB": "V100-32GB",
    "A10": "A10",
    "A10G": "A10G",
    "A100-40GB": "A100",
    "A100-40GB-PCIE": "A100",
    "A100-80GB": "A100-80GB",
    "A100-80GB-PCIE": "A100-80GB",
    "L4": "L4",
    "L40S": "L40S",
    "RTX-3090": "RTX3090",
    "RTX-4090": "RTX4090",
    "RTX-A6000": "RTXA6000",
    "H100-SXM": "H100",
    "H100-PCIE": "H100",
    "H100-NVL": "H100",
    "H200": "H200",
    "GH200": "GH200",
    "B200": "B200",
    "MI300X": "MI300X",
}

#: Providers whose SkyPilot catalog names a GPU differently (skypilot-catalog v8
#: vms.csv of each cloud; RunPod names from SkyPilot's ``fetch_runpod.py``).
_PROVIDER_ACCELERATORS: dict[str, dict[str, str]] = {
    "lambda": {"RTX-A6000": "A6000"},
    "runpod": {
        "A100-80GB": "A100-80GB-SXM",
        "A100-80GB-PCIE": "A100-80GB",
        "H100-SXM": "H100-SXM",
        "H100-PCIE": "H100",
        "H100-NVL": "H100-NVL",
        "H200": "H200-SXM",
    },
    "vast": {"A100-80GB": "A100", "A100-80GB-PCIE": "A100"},
    "verda": {"A100-40GB": "A100-40GB", "RTX-A6000": "RTX-A6000", "V100-16GB": "Tesla-V100"},
}

#: Instance types whose catalog row names the accelerator specially.
_INSTANCE_ACCELERATORS: dict[tuple[str, str], str] = {
    ("gcp", "a3-megagpu-8g"): "H100-MEGA",
    ("verda", "2A100.44V"): "A100-80GB-160GB",
    ("verda", "4A100.88V"): "A100-80GB-320GB",
    ("verda", "8A100.176V"): "A100-80GB-640GB",
    ("verda", "8A100.40S.176V"): "A100-40GB-320GB",
}

#: Providers whose gpuplan instance names are not SkyPilot instance types or
#: regions (RunPod prices come from its pricing page, not SkyPilot's catalog).
_NO_INSTANCE_TYPE = frozenset({"runpod"})


def export(option: Option, spec: JobSpec, kind: str) -> str:
    """Write ``option`` (planned for ``spec``) in export format ``kind``.

    Args:
        option: a ranked option of a plan (usually ``plan.options[0]``).
        spec: the job spec the plan was made for.
        kind: ``skypilot`` (task YAML) or ``torchrun`` (launch command + configs).

    Raises:
        UnknownNameError: ``kind`` is not an export format.
        ExportError: SkyPilot cannot launch on the option's provider or GPU.
    """
    if kind == "skypilot":
        return skypilot_yaml(option, spec)
    if kind == "torchrun":
        return torchrun_launch(option, spec)
    raise UnknownNameError("export format", kind, KINDS, field="--export")


def sections(text: str) -> dict[str, str]:
    """Split an export into ``{"launch": ..., "ds_config.json": ...}`` by its file marks.

    Text before the first mark is the ``launch`` section (header comments and,
    for torchrun, the command); each ``# --- file: NAME ---`` section runs to
    the next mark.
    """
    out: dict[str, str] = {}
    name = "launch"
    lines: list[str] = []
    for line in text.splitlines():
        m = re.fullmatch(r"# --- file: (.+) ---", line)
        if m:
            out[name] = "\n".join(lines).strip("\n") + "\n"
            name, lines = m.group(1), []
        else:
            lines.append(line)
    out[name] = "\n".join(lines).strip("\n") + "\n"
    return out


# --- torchrun ----------------------------------------------------------------------------


def _header(option: Option, spec: JobSpec, kind: str) -> list[str]:
    from gpuplan import __version__

    st = option.configuration.strategy
    mem = option.configuration.fit.memory
    per_m = option.cost_per_million_tokens
    bound = " (a lower bound: some parts have no catalog rate)" if not option.cost.complete else ""
    lines = [
        f"# gpuplan {__version__} export ({kind}): {spec.model}, {spec.method}, {spec.precision}",
        f"# option: {option.label()} in {option.region}",
        f"# strategy: {st.label()} (sharding {st.sharding}, tp {st.tp}, pp {st.pp}, dp {st.dp}, "
        f"micro-batch {st.micro_batch_size}, grad-accum {st.grad_accum}, "
        f"checkpointing {st.activation_checkpointing}, offload {st.offload})",
        f"# gpuplan estimated: {format_duration(option.time_s)} wall clock incl. startup, "
        f"{option.cost_total:,.2f} {option.cost.currency} total{bound}"
        + (f", {per_m:.3f} {option.cost.currency} per 1M tokens" if per_m else ""),
        f"# per-GPU memory: {mem.device_used_bytes / 2**30:.1f} of {mem.capacity_bytes / 2**30:.1f} GiB "
        f"(headroom {mem.headroom_bytes / 2**30:.1f} GiB); price as of {option.price_as_of}",
    ]
    return lines


def torchrun_launch(option: Option, spec: JobSpec) -> str:
    """The torchrun command for every node, then the config files it refers to."""
    lp = launch_plan(option, spec)
    multi = lp.nodes > 1
    lines = _header(option, spec, "torchrun")
    lines += [f"# note: {n}" for n in lp.notes]
    where = (
        f"run on each of the {lp.nodes} nodes with NODE_RANK=0..{lp.nodes - 1} and MASTER_ADDR = "
        "node 0's address"
        if multi
        else "single node"
    )
    lines.append(f"# --- launch ({where}) ---")
    lines.append(
        torchrun_command(
            lp,
            nnodes=str(lp.nodes),
            nproc=str(lp.procs_per_node),
            node_rank="$NODE_RANK" if multi else "0",
            master_addr="$MASTER_ADDR" if multi else "127.0.0.1",
        )
    )
    if lp.accelerate_args:
        lines.append(
            "# or, with accelerate reading accelerate_fsdp.yaml (FSDP settings from the file):"
        )
        lines.append(
            "# accelerate launch --config_file accelerate_fsdp.yaml --machine_rank "
            f"{'$NODE_RANK' if multi else '0'} --main_process_ip "
            f"{'$MASTER_ADDR' if multi else '127.0.0.1'} train.py {join_args(lp.accelerate_args)}"
        )
    for name, content in lp.files:
        lines.append(_FILE_MARK.format(name))
        lines.append(content.rstrip("\n"))
    return "\n".join(lines) + "\n"


# --- SkyPilot ---------------------------------------------------------------------------


def skypilot_accelerator(option: Option) -> str:
    """SkyPilot's accelerator name for the option's GPU on its provider.

    Raises:
        ExportError: no SkyPilot name is known for this GPU.
    """
    special = _INSTANCE_ACCELERATORS.get((option.provider, option.instance_type))
    if special:
        return special
    by_provider = _PROVIDER_ACCELERATORS.get(option.provider, {})
    name = by_provider.get(option.gpu) or SKYPILOT_ACCELERATORS.get(option.gpu)
    if name is None:
        raise ExportError(
            f"--export skypilot: no SkyPilot accelerator name is known for GPU {option.gpu!r}; "
            f"known: {', '.join(sorted(SKYPILOT_ACCELERATORS))}",
            hint="use --export torchrun, or pick an option with a listed GPU",
        )
    return name


def _skypilot_cloud(provider: str) -> str:
    if provider not in SKYPILOT_CLOUDS:
        why = _UNSUPPORTED_WHY.get(provider, "not a SkyPilot cloud")
        raise ExportError(
            f"--export skypilot: provider {provider!r} cannot be launched by SkyPilot ({why}); "
            f"allowed: {', '.join(sorted(SKYPILOT_CLOUDS))}",
            hint="plan with --set 'constraints.providers=[aws,gcp,azure,lambda,nebius]' "
            "or use --export torchrun",
        )
    return provider


def _q(value: str) -> str:
    """A YAML double-quoted scalar (JSON string syntax is valid YAML)."""
    return json.dumps(value)


def _block(text: str, indent: str = "  ") -> list[str]:
    return [indent + line if line else "" for line in text.rstrip("\n").split("\n")]


def skypilot_yaml(option: Option, spec: JobSpec) -> str:
    """A SkyPilot task YAML that launches ``option`` and runs torchrun on every node."""
    cloud = _skypilot_cloud(option.provider)
    accelerator = skypilot_accelerator(option)
    lp = launch_plan(option, spec)
    topo = option.configuration.topology
    count = (
        f"{round(topo.compute_fraction, 3):g}"
        if topo.compute_fraction < 1
        else str(topo.gpus_per_node)
    )
    lines = _header(option, spec, "skypilot")
    lines += [f"# note: {n}" for n in lp.notes]
    if option.billing_mode not in ("on-demand", "spot"):
        lines.append(
            f"# note: billing mode {option.billing_mode}: SkyPilot launches on-demand capacity "
            "(use_spot false); buy the commitment/reservation with the provider first"
        )
    lines.append("# launch: sky launch -c gpuplan task.yaml   (workdir . holds train.py)")
    slug = re.sub(r"[^a-z0-9-]+", "-", spec.model.lower()).strip("-")[:40] or "job"
    lines += [
        f"name: gpuplan-{slug}",
        "workdir: .",
        f"num_nodes: {option.nodes}",
        "resources:",
        f"  cloud: {_q(cloud)}",
    ]
    if option.provider not in _NO_INSTANCE_TYPE:
        instance = option.instance_type.split("+")[0]  # gcp: host VM + attached GPUs
        lines += [f"  region: {_q(option.region)}", f"  instance_type: {_q(instance)}"]
    lines += [
        f"  accelerators: {_q(f'{accelerator}:{count}')}",
        f"  use_spot: {'true' if option.billing_mode == 'spot' else 'false'}",
        "  autostop:",
        f"    idle_minutes: {AUTOSTOP_IDLE_MINUTES}",
        "    down: true",
    ]
    lines += ["setup: |", *_block(_setup(spec, lp)), "run: |", *_block(_run(lp))]
    return "\n".join(lines) + "\n"


def _setup(spec: JobSpec, lp: LaunchPlan) -> str:
    pkgs = ["torch", "transformers", "accelerate"]
    names = {name for name, _ in lp.files}
    if "ds_config.json" in names:
        pkgs.append("deepspeed")
    if spec.method in ("lora", "qlora"):
        pkgs.append("peft")
    if spec.method == "qlora":
        pkgs.append("bitsandbytes")
    return (
        "# replace with your environment (e.g. pip install -r requirements.txt)\npip install "
        + " ".join(pkgs)
    )


def _run(lp: LaunchPlan) -> str:
    out = []
    for name, content in lp.files:
        out += [f"cat > {name} <<'GPUPLAN_EOF'", content.rstrip("\n"), "GPUPLAN_EOF"]
    nproc = "$SKYPILOT_NUM_GPUS_PER_NODE" if lp.procs_per_node > 1 else "1"
    out.append('MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)')
    out.append(
        torchrun_command(
            lp,
            nnodes="$SKYPILOT_NUM_NODES",
            nproc=nproc,
            node_rank="$SKYPILOT_NODE_RANK",
            master_addr="$MASTER_ADDR",
        )
    )
    return "\n".join(out)
