"""Serving constants: engine defaults and fitted efficiencies (``serve_efficiency.yaml``)."""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuplan.errors import CatalogError

KvBudget = Literal["total", "static", "free", "dynamic"]


class EngineDefaults(BaseModel):
    """What an engine does when the user does not say."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_memory_utilization: float = Field(gt=0, le=1)
    kv_budget: KvBudget = Field(
        description="total: util x total - everything else (vLLM); static: util x total - "
        "weights (SGLang); free: util x (free after loading) (TensorRT-LLM); dynamic: grows."
    )
    block_tokens: int = Field(ge=1, description="KV-cache block (page) size in tokens.")
    max_num_seqs: int = Field(ge=1, description="Most requests batched per step.")
    max_num_batched_tokens: int = Field(ge=1, description="Tokens per step (prefill chunk).")
    cuda_graphs: bool = Field(description="Captures CUDA graphs (memory outside the KV cache).")
    source: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Fitted:
    """Efficiencies and overheads fitted on ``validation/inference.csv``."""

    prefill_efficiency: float
    decode_bandwidth_efficiency: float
    decode_compute_efficiency: float
    step_overhead_s: float
    tp_overhead_per_gpu: float
    nonllm_compute_efficiency: float
    diffusion_compute_efficiency: float
    activation_factor: float
    non_torch_bytes: int
    cuda_graph_bytes: int
    framework_overhead_bytes: int

    def replace(self, **changes: Any) -> Fitted:
        """A copy with some values changed (leave-one-source-out refits)."""
        return dataclasses.replace(self, **changes)


@functools.cache
def _raw() -> dict[str, Any]:
    text = (
        resources.files("gpuplan.estimate")
        .joinpath("serve_efficiency.yaml")
        .read_text(encoding="utf-8")
    )
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise CatalogError("estimate/serve_efficiency.yaml is malformed")
    return data


@functools.cache
def engine_defaults(engine: str) -> EngineDefaults:
    """Defaults of ``engine`` (vllm, sglang, tensorrt-llm, tgi, hf, onnxruntime)."""
    try:
        return EngineDefaults.model_validate(_raw()["engines"][engine])
    except (KeyError, ValidationError) as exc:
        raise CatalogError(f"estimate/serve_efficiency.yaml: engine {engine}: {exc}") from exc


@functools.cache
def fitted() -> Fitted:
    """The shipped fitted constants."""
    try:
        return Fitted(**_raw()["fitted"])
    except (KeyError, TypeError) as exc:
        raise CatalogError(f"estimate/serve_efficiency.yaml: fitted: {exc}") from exc
