"""Builders shared by the watch tests (imported as a plain module)."""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpuplan.monitor.actions import ActionContext, ActionResult
from gpuplan.monitor.policy import Decision, IdlePolicy
from gpuplan.monitor.readings import GpuSample, Observation

DATA = Path(__file__).resolve().parent / "data"
SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "reference" / "nvidia-smi-samples"


def uuid(i: int) -> str:
    """UUID of test GPU ``i`` (same family as data/gpu_8x_*.csv)."""
    return f"GPU-1c0e5a3b-0000-4000-8000-{i:012d}"


def gpu_csv(utils: Sequence[float | str], mem_mib: Sequence[float] | None = None) -> str:
    """Raw ``--query-gpu`` stdout (6 fields, noheader, nounits) for GPUs 0..n-1."""
    rows = []
    for i, u in enumerate(utils):
        mem = 0 if mem_mib is None else mem_mib[i]
        rows.append(f"{i}, {uuid(i)}, {u}, {mem}, 81559, 70.00")
    return "\n".join(rows) + "\n"


def apps_csv(procs: Iterable[tuple[int, int]]) -> str:
    """Raw ``--query-compute-apps`` stdout for (gpu index, pid) pairs."""
    return "".join(f"{uuid(g)}, {pid}, 1500\n" for g, pid in procs)


def line(
    t: float,
    utils: Sequence[float | str] | None,
    procs: Iterable[tuple[int, int]] = (),
    *,
    gpu_exit: int = 0,
    apps: str | None = "",
    apps_exit: int = 0,
) -> dict[str, object]:
    """One replay input line; ``utils=None`` means the GPU query timed out."""
    gpu = None if utils is None else gpu_csv(utils)
    app_text = apps_csv(procs) if procs else apps
    return {"t": t, "gpu": gpu, "gpu_exit": gpu_exit, "apps": app_text, "apps_exit": apps_exit}


def drive(policy: IdlePolicy, observations: Iterable[Observation]) -> list[Decision]:
    """Run the policy like replay does: every due action is recorded at once."""
    state = policy.initial_state()
    out = []
    for obs in observations:
        state, decision = policy.step(state, obs)
        if decision.action is not None:
            state = policy.record_action(state, obs.t_s)
        out.append(decision)
    return out


def series(t0: float, t1: float, step: float, sample: GpuSample) -> list[Observation]:
    """Observations of one sample every ``step`` seconds in ``[t0, t1)``."""
    out = []
    t = t0
    while t < t1:
        out.append(Observation(t_s=t, sample=sample))
        t += step
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Recorder:
    """Requests received by a loopback HTTP server."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []


def serve(
    handler_factory: Callable[[Recorder], type[BaseHTTPRequestHandler]],
) -> tuple[ThreadingHTTPServer, Recorder]:
    """Start a threading HTTP server on 127.0.0.1 with a fresh recorder."""
    rec = Recorder()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_factory(rec))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, rec


class CountingAction:
    """An action that only counts its calls."""

    name = "count"

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        self.calls.append((ctx.reason, execute))
        return ActionResult(action=self.name, executed=execute, ok=True, detail="counted")


# --- AWS (moto) helpers ----------------------------------------------------------------

REGION = "us-east-1"
AMI = "ami-12c6146b"  # one of moto's built-in AMIs (describe_images takes seconds)


@functools.cache
def client(endpoint: str, service: str) -> Any:
    """A cached boto3 client for the moto server."""
    import boto3

    return boto3.session.Session(region_name=REGION).client(service, endpoint_url=endpoint)


def launch(endpoint: str) -> str:
    """Start one instance; return its id."""
    resp = client(endpoint, "ec2").run_instances(
        ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="g5.xlarge"
    )
    return str(resp["Instances"][0]["InstanceId"])


def state_of(endpoint: str, iid: str) -> str:
    """The EC2 state name of an instance."""
    desc = client(endpoint, "ec2").describe_instances(InstanceIds=[iid])
    return str(desc["Reservations"][0]["Instances"][0]["State"]["Name"])


def make_group(endpoint: str, *, desired: int, min_size: int = 0) -> list[str]:
    """Create Auto Scaling group ``gpu-pool``; return its instance ids."""
    ec2, asg = client(endpoint, "ec2"), client(endpoint, "autoscaling")
    ec2.create_launch_template(
        LaunchTemplateName="gpu", LaunchTemplateData={"ImageId": AMI, "InstanceType": "g5.xlarge"}
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName="gpu-pool",
        LaunchTemplate={"LaunchTemplateName": "gpu"},
        MinSize=min_size,
        MaxSize=10,
        DesiredCapacity=desired,
        AvailabilityZones=[f"{REGION}a"],
    )
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu-pool"])[
        "AutoScalingGroups"
    ][0]
    return sorted(i["InstanceId"] for i in group["Instances"])


def desired(endpoint: str) -> int:
    """Desired capacity of ``gpu-pool``."""
    groups = client(endpoint, "autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=["gpu-pool"]
    )
    return int(groups["AutoScalingGroups"][0]["DesiredCapacity"])
