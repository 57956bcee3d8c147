"""Kubernetes manifests for a serve plan (``gpuplan serve plan --export k8s``).

One Deployment per service, requesting the resources the GPU's device plugin
advertises for its placement:

- whole GPU: ``nvidia.com/gpu: <tp>`` (NVIDIA k8s-device-plugin);
- MIG: ``nvidia.com/mig-<profile>: 1`` (device plugin, ``mixed`` MIG strategy);
- time-slicing: ``nvidia.com/gpu: 1`` on a node whose device plugin runs the
  time-slicing ConfigMap emitted alongside (``sharing.timeSlicing.resources[].replicas``);
- MPS: ``nvidia.com/gpu: 1`` with the device plugin's ``sharing.mps`` ConfigMap;
- HAMi alternative for shares: ``nvidia.com/gpumem`` (MiB) and ``nvidia.com/gpucores``
  (percent) are written as annotations-free resource limits when ``hami=True``;
- vGPU instance types: ``nvidia.com/gpu: 1`` and a node selector on the instance type.

Images and commands are placeholders the user replaces (``image: REPLACE-ME``);
engine flags (vLLM's ``--gpu-memory-utilization``, ``--tensor-parallel-size``,
``--max-model-len``) are filled in from the plan.
"""

from __future__ import annotations

from typing import Any

from gpuplan.planner.serve_plan import ServePlan, ServicePlan
from gpuplan.serve.spec import ServeSpec

ENGINE_IMAGES = {
    "vllm": "vllm/vllm-openai:latest",
    "sglang": "lmsysorg/sglang:latest",
    "tgi": "ghcr.io/huggingface/text-generation-inference:latest",
    "tensorrt-llm": "nvcr.io/nvidia/tritonserver:REPLACE-ME-trtllm-python-py3",
}


def _resources(sp: ServicePlan, hami: bool) -> dict[str, str]:
    if sp.kind == "mig":
        return {sp.k8s_resource: "1"}
    if sp.kind in ("time-slicing", "mps") and hami:
        return {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem": str(max(1, int(sp.memory_bytes / 2**20))),
            "nvidia.com/gpucores": str(max(1, min(100, round((sp.share or 1.0) * 100)))),
        }
    if sp.kind == "whole":
        tp = int(sp.device.split("x ")[0]) if "x " in sp.device else 1
        return {"nvidia.com/gpu": str(tp)}
    return {"nvidia.com/gpu": "1"}


def _args(sp: ServicePlan, spec: ServeSpec) -> list[str]:
    svc = next(s for s in spec.services if s.name == sp.service)
    engine = svc.engine or "vllm"
    if engine != "vllm":
        return []
    args = ["--model", svc.model]
    if svc.max_model_len:
        args += ["--max-model-len", str(svc.max_model_len)]
    if sp.kind == "whole" and "x " in sp.device:
        args += ["--tensor-parallel-size", sp.device.split("x ")[0]]
    if sp.kind in ("time-slicing", "mps") and sp.memory_bytes:
        from gpuplan.catalog.loader import load_catalog
        from gpuplan.catalog.sharing import cuda_capacity_bytes

        cap = cuda_capacity_bytes(load_catalog(use_user=False).gpu(sp.gpu))
        args += ["--gpu-memory-utilization", f"{min(0.95, sp.memory_bytes / cap):.2f}"]
    return args


def deployment(sp: ServicePlan, spec: ServeSpec, *, hami: bool = False) -> dict[str, Any]:
    """The Deployment of one planned service (a plain dict in Kubernetes' JSON shape)."""
    svc = next(s for s in spec.services if s.name == sp.service)
    engine = svc.engine or "vllm"
    labels = {"app.kubernetes.io/name": sp.service, "gpuplan.dev/placement": sp.kind}
    container: dict[str, Any] = {
        "name": sp.service,
        "image": ENGINE_IMAGES.get(engine, "REPLACE-ME"),
        "resources": {"limits": _resources(sp, hami)},
        "ports": [{"containerPort": 8000, "name": "http"}],
    }
    args = _args(sp, spec)
    if args:
        container["args"] = args
    pod: dict[str, Any] = {"containers": [container]}
    selector = {"node.kubernetes.io/instance-type": sp.instance_type}
    if sp.kind == "mig":
        selector["nvidia.com/mig.config"] = "all-balanced"
    pod["nodeSelector"] = selector
    if sp.kind in ("time-slicing", "mps") and not hami:
        pod["nodeSelector"]["nvidia.com/device-plugin.config"] = f"gpuplan-{sp.kind}"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": sp.service,
            "labels": dict(labels),
            "annotations": {
                "gpuplan.dev/placement": sp.placement,
                "gpuplan.dev/cost-per-month": f"{sp.cost_per_month:.2f}",
            },
        },
        "spec": {
            "replicas": sp.replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": sp.service}},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


def sharing_configmap(plan: ServePlan) -> dict[str, Any] | None:
    """The NVIDIA device plugin's sharing config for the time-sliced / MPS GPUs, if any."""
    data: dict[str, str] = {}
    import yaml

    for mode, key in (("time-slicing", "timeSlicing"), ("mps", "mps")):
        gpus = [g for g in plan.shared_gpus if g.mode == mode]
        if not gpus:
            continue
        replicas = max(len(g.services) for g in gpus)
        config = {
            "version": "v1",
            "sharing": {key: {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}},
        }
        data[f"gpuplan-{mode}"] = yaml.safe_dump(config, sort_keys=False)
    if not data:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpuplan-device-plugin-sharing", "namespace": "nvidia-device-plugin"},
        "data": data,
    }


def manifests(plan: ServePlan, spec: ServeSpec, *, hami: bool = False) -> list[dict[str, Any]]:
    """Every manifest of the plan: the sharing ConfigMap (if any), then one Deployment per service."""
    out: list[dict[str, Any]] = []
    cm = None if hami else sharing_configmap(plan)
    if cm:
        out.append(cm)
    out.extend(deployment(sp, spec, hami=hami) for sp in plan.services)
    return out


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """A multi-document YAML stream."""
    import yaml

    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)
