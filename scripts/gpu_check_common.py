"""Shared helpers of ``scripts/gpu-memory-check.py`` and ``scripts/gpu-speed-check.py``.

Standalone on purpose: the GPU machines these checks run on carry torch,
transformers and pyyaml but not gpuplan's own dependencies (pydantic), so
nothing here imports :mod:`gpuplan`. The repository's data files (model presets,
the GPU catalog) are read directly by path.

What lives here:

* exit codes and one-line failures (no CUDA device -> exit 3, missing package -> 4);
* the column layouts of ``validation/memory.csv`` and ``validation/training.csv``
  and a writer for them, plus a YAML flow-mapping emitter for the ``spec`` column;
* model builders from the shipped presets (GPT-2 small, BERT-base, Llama-3.2-1B,
  ResNet-50), shrunk for ``--cpu-smoke``; LoRA in PEFT's layout;
* one training step (forward, loss, backward, ``optimizer.step``, ``zero_grad``)
  for every precision mode the checks use;
* environment capture (torch/CUDA/driver versions, GPU, ``nvidia-smi -q``).

Longer than the house 500-line soft limit on purpose: the scripts run on
machines without gpuplan installed, so what they share travels in this one file
beside them.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parents[1]
MODEL_DATA = REPO / "src" / "gpuplan" / "models" / "data"
GPU_CATALOG = REPO / "src" / "gpuplan" / "catalog" / "data" / "gpus.yaml"

EXIT_PARTIAL = 1
"""Every configuration failed (nothing measured)."""
EXIT_NO_CUDA = 3
"""No CUDA device and no ``--cpu-smoke``."""
EXIT_MISSING_PACKAGE = 4
"""torch (or transformers) is not importable."""

# fmt: off
MEMORY_COLUMNS: tuple[str, ...] = (
    "id", "status", "spec", "gpu", "count", "metric", "measured", "unit", "cuda_context_mib",
    "memory_total_mib", "source", "what_was_measured", "notes",
)
# fmt: on
"""Header of ``validation/memory.csv`` (tests check it against the file)."""

# fmt: off
TRAINING_COLUMNS: tuple[str, ...] = (
    "id", "status", "spec", "gpu", "count", "gpus_per_node", "intra_node", "inter_node_gbps",
    "fabric", "metric", "measured", "unit", "source", "what_was_measured", "notes",
)
# fmt: on
"""Header of ``validation/training.csv`` (tests check it against the file)."""

SMOKE_NOTE = (
    "EXCLUDED: --cpu-smoke run on CPU with shrunken models (2 layers, width 64, vocabulary "
    "256); exercises the script, not a measurement."
)

TEXT_MODELS = ("gpt2", "bert-base", "llama-3.2-1b")
"""Preset ids of the text models the checks build from ``src/gpuplan/models/data``."""


# --------------------------------------------------------------------------- failures


def fail(script: str, message: str, code: int) -> NoReturn:
    """Print ``script: message`` as one line on stderr and exit with ``code``."""
    print(f"{script}: {message}", file=sys.stderr)
    raise SystemExit(code)


def import_torch(script: str) -> Any:
    """Import torch, or exit 4 with an install hint."""
    try:
        import torch
    except ImportError:
        fail(script, "torch is not importable; pip install torch", EXIT_MISSING_PACKAGE)
    return torch


def import_transformers(script: str) -> Any:
    """Import transformers with its logging quietened, or exit 4 with an install hint.

    Called after :func:`pick_device`, so that a machine without CUDA fails fast.
    """
    try:
        import transformers
    except ImportError:
        fail(
            script, "transformers is not importable; pip install transformers", EXIT_MISSING_PACKAGE
        )
    transformers.logging.set_verbosity_error()
    for name in ("GPT2LMHeadModel", "BertForSequenceClassification", "LlamaForCausalLM"):
        getattr(transformers, name)  # import the modeling modules now, not inside a timing
    return transformers


def pick_device(torch: Any, script: str, *, cpu_smoke: bool) -> Any:
    """``cuda:0``, or ``cpu`` under ``--cpu-smoke``; exit 3 when there is no CUDA device.

    The smoke run uses one CPU thread: its tensors are tiny, and intra-op threads
    on a busy 2-core CI runner made single steps up to 100 times slower.
    """
    if cpu_smoke:
        torch.set_num_threads(1)
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = torch.version.cuda or "none (CPU build)"
        fail(
            script,
            f"no CUDA device (torch {torch.__version__}, CUDA build {build}); "
            "run on a GPU machine, or pass --cpu-smoke for a tiny CPU dry run",
            EXIT_NO_CUDA,
        )
    return torch.device("cuda", 0)


# --------------------------------------------------------------------------- CSV + spec


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if not text or any(c in text for c in ",:{}[]#&*!|>'\"%@`") or text.strip() != text:
        return json.dumps(text)
    try:
        import yaml

        plain = yaml.safe_load(text) == text  # "on", "null", "1e3" would not stay strings
    except (ImportError, ValueError):
        plain = text.replace("-", "").replace("_", "").replace(".", "").isalnum()
    return text if plain else json.dumps(text)


def flow_yaml(value: Any) -> str:
    """A YAML flow rendering of ``value`` in the style of the validation tables.

    >>> flow_yaml({"model": "gpt2", "lora": {"targets": ["q_proj", "v_proj"]}, "seq_len": 8})
    '{model: gpt2, lora: {targets: [q_proj, v_proj]}, seq_len: 8}'
    """
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {flow_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(flow_yaml(v) for v in value) + "]"
    return _scalar(value)


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> int:
    """Write ``rows`` with exactly ``columns`` (csv module dialect, as the tables use)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: "" if row.get(c) is None else row.get(c) for c in columns})
            count += 1
    return count


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON (non-JSON values become strings)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def today() -> str:
    """UTC date, ISO format."""
    return _dt.datetime.now(_dt.timezone.utc).date().isoformat()


def slug(text: str) -> str:
    """Lower-case id fragment: letters, digits and dashes."""
    out = "".join(c if c.isalnum() else "-" for c in text.lower())
    return "-".join(p for p in out.split("-") if p)


# --------------------------------------------------------------------------- catalog + presets


def catalog_gpu(device_name: str) -> dict[str, Any] | None:
    """The ``gpus.yaml`` entry whose id or alias equals ``device_name`` (case-insensitive)."""
    try:
        import yaml

        data = yaml.safe_load(GPU_CATALOG.read_text(encoding="utf-8"))
    except (ImportError, OSError, ValueError):
        return None
    wanted = device_name.strip().lower()
    for entry in data.get("gpus", []) if isinstance(data, dict) else []:
        names = [entry.get("id", ""), *entry.get("aliases", [])]
        if any(str(n).strip().lower() == wanted for n in names):
            return dict(entry)
    return None


def preset_config(model_id: str) -> dict[str, Any]:
    """The shipped Hugging Face config of a preset, minus keys that name no shape."""
    data: dict[str, Any] = json.loads((MODEL_DATA / f"{model_id}.json").read_text("utf-8"))
    for key in ("architectures", "torch_dtype", "dtype", "transformers_version", "_name_or_path"):
        data.pop(key, None)
    return data


_SMOKE_SHAPES: dict[str, dict[str, Any]] = {
    "gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "n_positions": 64},
    "bert-base": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 256,
        "max_position_embeddings": 64,
    },
    "llama-3.2-1b": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 256,
    },
}

_TEXT_CLASSES = {
    "gpt2": "AutoModelForCausalLM",
    "llama-3.2-1b": "AutoModelForCausalLM",
    "bert-base": "AutoModelForSequenceClassification",
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One model at one size: what a training step runs on."""

    model: str
    """Preset id (gpt2, bert-base, llama-3.2-1b, resnet-50)."""
    micro_batch_size: int
    seq_len: int | None = None
    """Tokens per sample (text models)."""
    image_size: int | None = None
    """Image side in pixels (ResNet-50)."""
    precision: str = "bf16-mixed"
    """Training precision of the speed check's step (bf16-mixed, fp16-mixed or tf32)."""
    channels_last: bool = True
    """ResNet-50 tensors in NHWC (``torch.channels_last``); False: PyTorch's NCHW default."""
    optimizer: str = "adamw"
    """The speed check's optimizer: adamw, or sgd-momentum (DeepLearningExamples' ResNet)."""

    @property
    def family(self) -> str:
        """decoder, encoder or cnn."""
        if self.model == "resnet-50":
            return "cnn"
        return "encoder" if self.model == "bert-base" else "decoder"

    @property
    def nchw(self) -> bool:
        """A CNN in PyTorch's default NCHW layout (the speed check's conversion-profiled pair)."""
        return self.family == "cnn" and not self.channels_last

    @property
    def tokens(self) -> int:
        """Tokens per step (0 for images)."""
        return self.micro_batch_size * (self.seq_len or 0)


def build_model(work: Workload, *, dtype: Any, device: Any, smoke: bool) -> tuple[Any, str]:
    """The workload's model, randomly initialised on ``device``; returns (model, class name)."""
    import torch

    if work.family == "cnn":
        model, name = build_resnet50(smoke=smoke)
        layout = torch.channels_last if work.channels_last else torch.contiguous_format
        model = model.to(device=device, dtype=dtype, memory_format=layout)
        return model.train(), name
    import transformers

    cfg = preset_config(work.model)
    model_type = cfg.pop("model_type")
    if smoke:
        cfg.update(_SMOKE_SHAPES[work.model])
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    if work.family == "decoder":
        config.use_cache = False  # training: no KV cache in the outputs
    else:
        config.num_labels = 2
    auto = getattr(transformers, _TEXT_CLASSES[work.model])
    with torch.device(device):  # initialise on the GPU: a 1B model inits in well under 1 s
        model = auto.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.train(), type(model).__name__


def build_resnet50(*, smoke: bool) -> tuple[Any, str]:
    """torchvision's ResNet-50 when importable, else the same network defined inline.

    ``smoke``: a one-block-per-stage, width-8 inline ResNet with 10 classes.
    """
    if smoke:
        return inline_resnet50(layers=(1, 1, 1, 1), width=8, num_classes=10), "inline ResNet"
    try:
        import torchvision
    except ImportError:
        return inline_resnet50(), "inline ResNet-50 (torchvision layout, v1.5)"
    return torchvision.models.resnet50(), f"torchvision {torchvision.__version__} resnet50"


def inline_resnet50(
    layers: tuple[int, int, int, int] = (3, 4, 6, 3), width: int = 64, num_classes: int = 1000
) -> Any:
    """ResNet-50 v1.5 exactly as torchvision builds it (25,557,032 parameters at defaults)."""
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, planes: int, stride: int) -> None:
            super().__init__()
            cout = planes * 4
            self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample: nn.Module | None = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x: Any) -> Any:
            idt = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + idt)

    stages: list[nn.Module] = []
    cin = width
    for i, blocks in enumerate(layers):
        planes = width * 2**i
        for b in range(blocks):
            stages.append(Bottleneck(cin, planes, 2 if (b == 0 and i > 0) else 1))
            cin = planes * 4
    return nn.Sequential(
        nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
        *stages,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(cin, num_classes),
    )


# --------------------------------------------------------------------------- LoRA


def apply_lora(
    model: Any, *, targets: Sequence[str], rank: int, alpha: float, use_peft: bool = True
) -> tuple[Any, str]:
    """Freeze ``model`` and add LoRA adapters to the ``targets`` linears.

    PEFT (when importable and ``use_peft``) with its defaults: adapters in fp32
    over a 16-bit base (``autocast_adapter_dtype``), the input cast to the
    adapter dtype. Otherwise an inline module with the same layout and forward.
    Returns the (possibly wrapped) model and a description of the implementation.
    """
    if use_peft:
        try:
            import peft
        except ImportError:
            peft = None
        if peft is not None:
            cfg = peft.LoraConfig(
                r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets)
            )
            return peft.get_peft_model(model, cfg), f"peft {peft.__version__}"
    _inline_lora(model, targets, rank, alpha)
    return model, "inline LoRA (PEFT layout: fp32 adapters, input cast)"


def _inline_lora(model: Any, targets: Sequence[str], rank: int, alpha: float) -> None:
    from torch import nn

    class LoraLinear(nn.Module):
        """PEFT's ``lora.Linear`` forward: base(x) + B(A(x.to(fp32))) * scale, cast back."""

        def __init__(self, base: nn.Linear) -> None:
            super().__init__()
            self.base_layer = base
            dev = base.weight.device
            self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=dev)
            self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=dev)
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B.weight)
            self.scaling = alpha / rank

        def forward(self, x: Any) -> Any:
            result = self.base_layer(x)
            dtype = result.dtype
            lora_x = x.to(self.lora_A.weight.dtype)
            result = result + self.lora_B(self.lora_A(lora_x)) * self.scaling
            return result.to(dtype)

    for p in model.parameters():
        p.requires_grad_(False)
    names = set(targets)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and name in names:
                setattr(parent, name, LoraLinear(child))
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"LoRA: no linear named {sorted(names)} in {type(model).__name__}")


# --------------------------------------------------------------------------- one training step


def param_dtype(torch: Any, precision: str, method: str = "full") -> Any:
    """Parameter dtype: fp32 for fp32 and *-mixed full training, bf16 otherwise.

    LoRA keeps a frozen bf16 base under bf16-mixed too (as PEFT users load it).
    """
    if precision == "bf16-true" or (method == "lora" and precision == "bf16-mixed"):
        return torch.bfloat16
    return torch.float32


def make_optimizer(torch: Any, name: str, params: list[Any]) -> Any:
    """AdamW or plain SGD with the foreach implementation (torch's CUDA default)."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.875, foreach=True)
    raise ValueError(f"optimizer {name!r}: use adamw, sgd or sgd-momentum")


def make_batch(torch: Any, work: Workload, model: Any, device: Any, smoke: bool) -> dict[str, Any]:
    """Random inputs and labels for one micro-batch (never zeros)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    b = work.micro_batch_size
    if work.family == "cnn":
        size = work.image_size or 224
        images = torch.randn(b, 3, size, size, generator=gen)
        classes = 10 if smoke else 1000
        return {
            "x": images.to(device).contiguous(
                memory_format=torch.channels_last if work.channels_last else torch.contiguous_format
            ),
            "y": torch.randint(0, classes, (b,), generator=gen).to(device),
        }
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (b, work.seq_len or 1), generator=gen).to(device)
    if work.family == "encoder":
        return {"input_ids": ids, "labels": torch.randint(0, 2, (b,), generator=gen).to(device)}
    return {"input_ids": ids, "labels": ids}


def make_step(
    torch: Any, model: Any, opt: Any, batch: dict[str, Any], *, precision: str, device: Any
) -> Callable[[], Any]:
    """One training step as a closure; returns the detached loss (no synchronisation).

    The model outputs (logits included) stay referenced until after backward,
    as in the plain PyTorch loop of the transformers docs
    (``outputs = model(**batch); loss = outputs.loss; loss.backward()``).
    ``fp16-mixed`` runs under fp16 autocast with a ``GradScaler`` (scale, unscale and the
    inf check each step, as DeepLearningExamples' ResNet does with ``--amp``); ``tf32`` and
    ``fp32`` run without autocast (the caller sets the TF32 switches).
    """
    import contextlib

    half = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16-mixed" else None

    def autocast() -> Any:
        if half is not None:
            return torch.autocast(device_type=device.type, dtype=half)
        return contextlib.nullcontext()

    def finish(loss: Any, held: list[Any]) -> None:
        # the outputs in ``held`` stay referenced until backward has run
        (loss if scaler is None else scaler.scale(loss)).backward()
        held.clear()
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)

    if "x" in batch:
        loss_fn = torch.nn.functional.cross_entropy

        def step() -> Any:
            with autocast():
                held = [model(batch["x"])]
                loss = loss_fn(held[0].float(), batch["y"])
            finish(loss, held)
            return loss.detach()

    else:

        def step() -> Any:
            with autocast():
                held = [model(**batch)]
                loss = held[0].loss
            finish(loss, held)
            return loss.detach()

    return step


def enable_checkpointing(model: Any) -> None:
    """Hugging Face activation checkpointing, non-reentrant (no input-grad hook needed).

    ``activation_checkpointing_enable`` where transformers has it (the newer name),
    else ``gradient_checkpointing_enable``; both wrap each decoder/encoder layer.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


# --------------------------------------------------------------------------- environment


def run_cmd(args: Sequence[str], timeout_s: float = 20.0) -> str | None:
    """stdout of a command, or None if it is missing, fails or times out."""
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            list(args), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def smi_query(fields: Sequence[str], gpu_uuid: str | None) -> dict[str, str] | None:
    """``nvidia-smi --query-gpu=FIELDS`` for one GPU (by UUID when known)."""
    args = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    out = run_cmd([*args, "-i", gpu_uuid]) if gpu_uuid else None
    if out is None:
        out = run_cmd(args)
        if out is None or len(out.strip().splitlines()) != 1:
            return None
    values = [v.strip() for v in out.strip().splitlines()[0].split(",")]
    return dict(zip(fields, values, strict=False)) if len(values) == len(fields) else None


class MemoryProbe:
    """Memory readings: the CUDA caching allocator and nvidia-smi, or RSS on CPU.

    On CUDA, ``allocated``/``reserved`` are ``torch.cuda.max_memory_allocated`` /
    ``max_memory_reserved`` since the last :meth:`reset`, and :meth:`device_used_mib`
    is ``nvidia-smi --query-gpu=memory.used`` (MiB, what nvidia-smi shows), falling
    back to NVML's ``nvmlDeviceGetMemoryInfo().used``. Under ``--cpu-smoke`` all
    three are the process's peak resident set size, so the row code still runs.
    """

    def __init__(self, torch: Any, device: Any) -> None:
        """Bind to ``device`` (``cuda:N`` or ``cpu``)."""
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.gpu_uuid: str | None = None
        self.used_source = "ru_maxrss (cpu smoke)"
        if self.cuda:
            uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
            self.gpu_uuid = f"GPU-{uuid}" if uuid is not None else None
            self.used_source = "nvidia-smi memory.used"

    def reset(self) -> None:
        """Start a new peak window (``torch.cuda.reset_peak_memory_stats``)."""
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def peaks(self) -> tuple[int, int]:
        """(peak allocated, peak reserved) bytes since :meth:`reset`."""
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            return (
                int(self.torch.cuda.max_memory_allocated(self.device)),
                int(self.torch.cuda.max_memory_reserved(self.device)),
            )
        rss = _max_rss_bytes()
        return rss, rss

    def current(self) -> tuple[int, int]:
        """(allocated, reserved) bytes now."""
        if self.cuda:
            return (
                int(self.torch.cuda.memory_allocated(self.device)),
                int(self.torch.cuda.memory_reserved(self.device)),
            )
        rss = _max_rss_bytes()
        return rss, rss

    def device_used_mib(self) -> int | None:
        """Device memory in use, MiB, as nvidia-smi shows it (None if unreadable)."""
        if not self.cuda:
            return _max_rss_bytes() // 2**20
        got = smi_query(["memory.used"], self.gpu_uuid)
        if got is not None and got["memory.used"].isdigit():
            self.used_source = "nvidia-smi memory.used"
            return int(got["memory.used"])
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = (
                pynvml.nvmlDeviceGetHandleByUUID(self.gpu_uuid)
                if self.gpu_uuid
                else pynvml.nvmlDeviceGetHandleByIndex(self.device.index or 0)
            )
            used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) // 2**20
        except Exception:  # noqa: BLE001 - NVML is optional: any failure means "unknown"
            return None
        self.used_source = "NVML nvmlDeviceGetMemoryInfo().used"
        return used

    def release(self) -> None:
        """Free cached blocks so the next configuration starts clean."""
        import gc

        gc.collect()
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.empty_cache()


def _max_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def environment(torch: Any, device: Any, *, script: str) -> dict[str, Any]:
    """Versions, GPU and driver facts, ``nvidia-smi -q`` (first 40,000 characters)."""
    env: dict[str, Any] = {
        "script": script,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
        "device": str(device),
        "env": {
            k: os.environ.get(k)
            for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG")
        },
    }
    for pkg in ("transformers", "peft", "torchvision"):
        try:
            env[pkg] = __import__(pkg).__version__
        except ImportError:
            env[pkg] = None
    env["driver"] = "n/a"
    if device.type != "cuda":
        env["gpu_name"] = "cpu"
        return env
    props = torch.cuda.get_device_properties(device)
    env.update(
        gpu_name=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        multiprocessors=props.multi_processor_count,
        total_memory_bytes=int(props.total_memory),
        l2_cache_bytes=getattr(props, "L2_cache_size", None),
        gpu_uuid=str(getattr(props, "uuid", "")),
        cudnn=torch.backends.cudnn.version(),
    )
    smi = smi_query(
        ["driver_version", "name", "memory.total", "memory.used", "clocks.max.sm", "power.limit"],
        f"GPU-{props.uuid}" if getattr(props, "uuid", None) is not None else None,
    )
    if smi is not None:
        env["driver"] = smi["driver_version"]
        env["nvidia_smi"] = smi
    else:
        try:
            import pynvml

            pynvml.nvmlInit()
            drv = pynvml.nvmlSystemGetDriverVersion()
            env["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
        except Exception:  # noqa: BLE001 - optional: the driver version stays "n/a"
            pass
    full = run_cmd(["nvidia-smi", "-q"], timeout_s=30)
    env["nvidia_smi_q"] = full[:40_000] if full else None
    return env


def attention_class(kernel_names: Iterable[str]) -> str | None:
    """The spec's ``attention`` value for the kernels one SDPA call ran, or None if unknown.

    cuDNN's fused attention kernels carry "cudnn" in their names; FlashAttention and the
    memory-efficient kernels carry "flash", "fmha" or "efficient" (FlashAttention-2 class).
    """
    names = [n.lower() for n in kernel_names]
    if any("cudnn" in n for n in names):
        return "cudnn"
    if any(k in n for n in names for k in ("flash", "fmha", "efficient")):
        return "fused"
    return None


def sdpa_attention(torch: Any, device: Any) -> tuple[str, str]:
    """Which kernel class PyTorch's SDPA runs here, found by profiling one forward and backward
    at a training shape (bf16, causal, head dim 128); ("fused", why) where it cannot tell.

    The rows the checks write name it, because the speed model keeps one efficiency per
    class and SDPA's choice depends on the PyTorch and cuDNN versions.
    """
    if device.type != "cuda":
        return "fused", "not profiled on CPU"
    try:
        from torch.profiler import ProfilerActivity, profile

        q, k, v = (
            torch.randn(2, 16, 2048, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.sum().backward()
            torch.cuda.synchronize(device)
        names = [e.key for e in prof.key_averages()]
    except Exception as exc:  # noqa: BLE001 - the label falls back, the run goes on
        return "fused", f"profiling SDPA failed ({type(exc).__name__}: {exc})"
    found = attention_class(names)
    if found is None:
        return "fused", "no fused-attention kernel recognised: " + ", ".join(names[:8])
    return found, "SDPA kernels: " + ", ".join(n for n in names if attention_class([n]))[:300]


def gpu_label(env: Mapping[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(catalog id or device name, catalog entry or None) for the measured device."""
    name = str(env.get("gpu_name", "cpu"))
    if name == "cpu":
        return "cpu", None
    entry = catalog_gpu(name)
    return (str(entry["id"]) if entry else name), entry


def source_text(script: str, gpu: str, env: Mapping[str, Any]) -> str:
    """The ``source`` column: who measured, with what, when."""
    return (
        f"measured on {gpu} by scripts/{script}, {today()}, torch {env['torch']}, "
        f"driver {env['driver']}"
    )


def fmt_bytes(n: float | None) -> str:
    """GiB with two decimals (``-`` for None)."""
    return "-" if n is None else f"{n / 2**30:.2f}"


def print_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain fixed-width table on stdout."""
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for n, row in enumerate(cells):
        parts = [
            c.rjust(w) if n and i else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(parts))
        if n == 0:
            print("  ".join("-" * w for w in widths))
