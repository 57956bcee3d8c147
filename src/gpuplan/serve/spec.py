"""The service spec: inference services to size, price and pack (``gpuplan serve``).

A services file is YAML (or JSON), validated by :class:`ServeSpec`. Field names
are a contract (issue 13): extend, never rename.

Example::

    constraints: {regions: [china], currency: CNY}
    services:
      - name: chat
        model: qwen2.5-7b
        weights: bf16
        engine: vllm
        input_tokens: 512
        output_tokens: 256
        load: {qps: 2}
        slo: {ttft_p99: 2s, tpot_p99: 100ms}
      - name: classify
        model: bert-base
        seq_len: 128
        load: {qps: 20}
        slo: {latency_p99: 200ms}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuplan.errors import SpecError
from gpuplan.spec import ConstraintsSpec, _describe
from gpuplan.units import parse_duration_s
from gpuplan.userfile import path_kind

Weights = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4", "nf4"]
Engine = Literal["vllm", "tensorrt-llm", "sglang", "tgi", "hf", "onnxruntime"]
Sharing = Literal["whole", "mig", "vgpu", "time-slicing", "mps"]
SHARING_MODES: tuple[Sharing, ...] = ("whole", "mig", "vgpu", "time-slicing", "mps")

#: Non-LLM presets that ``model`` accepts besides the LLM presets and config.json files.
NON_LLM_PRESETS: tuple[str, ...] = ("bert-base", "bert-large", "resnet-50", "vit-b-16")
DIFFUSION_PRESETS: tuple[str, ...] = ("sd-1.5", "sdxl")


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LoadSpec(_Spec):
    """The load a service must carry: exactly one of offline, qps or concurrency."""

    offline: bool | None = Field(
        default=None, description="true: maximum throughput (the largest batch that fits)."
    )
    qps: float | None = Field(default=None, gt=0, description="Poisson arrivals, requests/s.")
    concurrency: int | None = Field(
        default=None, ge=1, description="Requests in flight at all times (a closed loop)."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> LoadSpec:
        given = [k for k in ("offline", "qps", "concurrency") if getattr(self, k) not in (None,)]
        if self.offline is False:
            given.remove("offline")
        if len(given) != 1:
            raise ValueError("give exactly one of {offline: true}, {qps: X}, {concurrency: N}")
        return self

    @property
    def kind(self) -> str:
        """``offline``, ``qps`` or ``concurrency``."""
        if self.offline:
            return "offline"
        return "qps" if self.qps is not None else "concurrency"


class SloSpec(_Spec):
    """Latency targets at the 99th percentile (durations such as 200ms or 2s)."""

    ttft_p99: float | None = Field(default=None, description="Time to first token (LLMs).")
    tpot_p99: float | None = Field(default=None, description="Time per output token (LLMs).")
    latency_p99: float | None = Field(
        default=None, description="End-to-end request latency (any model)."
    )

    @field_validator("ttft_p99", "tpot_p99", "latency_p99", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
        seconds = parse_duration_s(value, field="slo")
        if seconds <= 0:
            raise ValueError("a latency target must be > 0")
        return seconds


class ServeConstraints(ConstraintsSpec):
    """The job spec's constraints plus the ways a GPU may be shared."""

    sharing: tuple[Sharing, ...] = Field(
        default=SHARING_MODES,
        min_length=1,
        description="Allowed placements: whole GPUs, MIG slices, vGPU instances, "
        "time-slicing, MPS.",
    )


class ServiceSpec(_Spec):
    """One inference service."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Service name (a Kubernetes DNS label: lower case, digits, '-').",
    )
    model: str = Field(
        description="An LLM preset (`gpuplan models`), a config.json path, or one of "
        "bert-base, bert-large, resnet-50, vit-b-16, sd-1.5, sdxl."
    )
    weights: Weights | None = Field(
        default=None,
        description="Weight format: fp32, bf16, fp16, fp8, int8, int4 (AWQ/GPTQ, group 128) or "
        "nf4 (bitsandbytes, block 64). Default: bf16 for LLMs, fp16 for the others.",
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        default="auto", description="KV-cache dtype: auto (the activation dtype) or fp8."
    )
    engine: Engine | None = Field(
        default=None,
        description="Serving engine; default vllm for LLMs, hf for diffusion, onnxruntime "
        "for encoders and vision models.",
    )
    input_tokens: int = Field(default=512, ge=1, description="Prompt tokens per request (LLMs).")
    output_tokens: int = Field(
        default=256, ge=1, description="Generated tokens per request (LLMs)."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, description="Context the engine is started with (default: model's)."
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Share of GPU memory the engine may take "
        "(default: the engine's own, e.g. vLLM 0.9).",
    )
    seq_len: int | None = Field(default=None, ge=1, le=8192, description="Tokens (encoders).")
    image_size: int | None = Field(
        default=None, ge=32, le=4096, description="Image side in pixels (vision, diffusion)."
    )
    steps: int | None = Field(default=None, ge=1, le=1000, description="Denoising steps.")
    batch: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Largest batch the server forms (LLMs: max_num_seqs; default the engine's).",
    )
    engine_version: str | None = Field(
        default=None,
        pattern=r"^\d+(\.\d+){0,2}",
        description="Engine release when it matters, e.g. 0.6.3: vLLM before 0.8 profiles "
        "max_model_len tokens (no chunked prefill), before 0.21 it leaves CUDA graphs out of "
        "the KV budget. Default: current behaviour.",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=16,
        description="LLMs: tokens per engine step (prefill chunk); default the engine's.",
    )
    load: LoadSpec = Field(description="{offline: true}, {qps: X} or {concurrency: N}.")
    slo: SloSpec = Field(default_factory=SloSpec, description="p99 latency targets.")
    constraints: ServeConstraints | None = Field(
        default=None, description="Overrides the file's top-level constraints for this service."
    )

    @model_validator(mode="after")
    def _consistent(self) -> ServiceSpec:
        if self.max_model_len is not None and self.max_model_len < self.input_tokens + 1:
            raise ValueError(
                f"max_model_len {self.max_model_len} is shorter than input_tokens + 1 "
                f"({self.input_tokens + 1})"
            )
        return self

    @property
    def model_kind(self) -> str:
        """``diffusion`` for sd-1.5/sdxl, else ``transformer`` (decided on load)."""
        return "diffusion" if self.model.lower() in DIFFUSION_PRESETS else "transformer"


class ServeSpec(_Spec):
    """A services file: the services and the constraints they share."""

    services: tuple[ServiceSpec, ...] = Field(min_length=1, description="The services.")
    constraints: ServeConstraints = Field(
        default_factory=ServeConstraints, description="Defaults for every service."
    )

    @model_validator(mode="after")
    def _unique(self) -> ServeSpec:
        seen: set[str] = set()
        for svc in self.services:
            if svc.name in seen:
                raise ValueError(f"service name {svc.name!r} is used twice")
            seen.add(svc.name)
        return self

    def service(self, name: str | None) -> ServiceSpec:
        """The service called ``name`` (the only one when None)."""
        from gpuplan.errors import UnknownNameError

        if name is None:
            if len(self.services) == 1:
                return self.services[0]
            raise SpecError(
                f"--service: this file has {len(self.services)} services; name one",
                hint="--service " + self.services[0].name,
            )
        for svc in self.services:
            if svc.name == name:
                return svc
        raise UnknownNameError("service", name, (s.name for s in self.services), field="--service")

    def constraints_of(self, svc: ServiceSpec) -> ServeConstraints:
        """The constraints that apply to ``svc`` (its own, else the file's)."""
        return svc.constraints or self.constraints


def parse_serve_spec(
    data: Any, *, origin: str = "services", base_dir: Path | None = None
) -> ServeSpec:
    """Validate raw services data; errors become one-line SpecErrors naming the field."""
    if not isinstance(data, dict):
        raise SpecError(
            f"{origin}: expected a mapping with a `services` list, got {type(data).__name__}",
            hint="see `gpuplan serve schema`",
        )
    services = data.get("services")
    if isinstance(services, list) and base_dir is not None:
        fixed = []
        for svc in services:
            model = svc.get("model") if isinstance(svc, dict) else None
            if isinstance(model, str) and model.endswith(".json"):
                path = Path(model)
                if not path.is_absolute() and path_kind(base_dir / path) is not None:
                    svc = {**svc, "model": str(base_dir / path)}
            fixed.append(svc)
        data = {**data, "services": fixed}
    try:
        return ServeSpec.model_validate(data)
    except ValidationError as exc:
        message = _describe(exc)
        names = [s.get("name") for s in services] if isinstance(services, list) else []
        parts = message.split(".", 2)
        if len(parts) >= 2 and parts[0] == "services" and parts[1].split(":")[0].isdigit():
            index = int(parts[1].split(":")[0])
            if index < len(names) and isinstance(names[index], str):
                message = message.replace(f"services.{index}", f"services[{names[index]}]", 1)
        raise SpecError(f"{origin}: {message}", hint="see `gpuplan serve schema`") from exc


def load_serve_spec(path: Path) -> ServeSpec:
    """Read a services file (YAML or JSON) through :func:`gpuplan.userfile.read_yaml`: a missing
    file, a directory, non-UTF-8 bytes, an empty or oversized file, aliases, deep nesting and
    duplicate keys are one-line errors, as for every user file."""
    from gpuplan.userfile import read_yaml

    data = read_yaml(path, what="services", error=SpecError)
    return parse_serve_spec(data, origin=str(path), base_dir=path.parent)


def serve_spec_from_text(
    text: str, *, origin: str = "services", base_dir: Path | None = None
) -> ServeSpec:
    """Parse services-file text (YAML or JSON), e.g. a web request body.

    Reads through :func:`gpuplan.userfile.parse_yaml`, so aliases, deep nesting and
    duplicate keys are refused with the same one-line errors as every user file.
    """
    from gpuplan.userfile import parse_yaml

    data = parse_yaml(text, what=origin, path=None, error=SpecError)
    return parse_serve_spec(data, origin=origin, base_dir=base_dir)


def serve_json_schema() -> dict[str, Any]:
    """The JSON schema of a services file (``gpuplan serve schema``)."""
    return ServeSpec.model_json_schema()
