#!/usr/bin/env python3
"""Measure GEMM TFLOP/s, HBM copy bandwidth and training step time; write table rows.

Three sections, each timed after warm-up with CUDA events between
``torch.cuda.synchronize()`` calls, on random (never all-zero) data:

* ``gemm``: ``torch.matmul`` TFLOP/s in bf16, fp16, tf32 and fp32 at 8192^3,
  4096^3, 2048^3, 1024^3 and a skinny 16384 x 1024 x 4096 (M x N x K), with the
  fraction of the dense peak in ``src/gpuplan/catalog/data/gpus.yaml``;
* ``hbm``: device-to-device copy bandwidth (bytes read plus bytes written);
* ``train``: step time of GPT-2 small, BERT-base, ResNet-50 and Llama-3.2-1B
  (built from the shipped presets, random weights and data) in bf16-mixed
  with foreach AdamW, at three micro-batch sizes each, as tokens/s (images/s
  for ResNet-50); then ResNet-50 as DeepLearningExamples' ConvNets runs it in
  the tables Lambda publishes (NCHW, SGD with momentum) in TF32 and in fp16 AMP,
  each with one profiled step: the share of kernel time in cuDNN's NCHW/NHWC
  layout conversions says whether TF32 convolutions pay them.

Writes ``OUT/training.csv`` (the columns of ``validation/training.csv``),
``OUT/gemm.csv``, ``OUT/hbm.csv`` and ``OUT/speed-check.json`` (environment,
clocks, per-step times), and prints a summary. About 1-2 minutes on an H200.

Exit codes: 0 written (failed items are listed), 1 nothing measured,
3 no CUDA device (use ``--cpu-smoke`` for a CPU dry run), 4 torch/transformers missing.

Over the house 500-line soft limit: one unattended script holds three
measurements and their row writers, so a GPU loan needs one file and one command.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_common as common  # noqa: E402

SCRIPT = "gpu-speed-check.py"

GEMM_COLUMNS = (
    "gpu",
    "shape",
    "m",
    "n",
    "k",
    "dtype",
    "tflops",
    "dense_peak_tflops",
    "fraction_of_dense_peak",
    "time_s",
    "timing",
    "tflops_eager",
    "reps",
    "source",
    "layer",
)
"""``tflops`` is from CUDA-graph replay (kernel throughput) where capture works, else
eager; ``tflops_eager`` is back-to-back eager ``torch.matmul`` calls (launch overhead
included, which is what small GEMMs in an eager training step see)."""
HBM_COLUMNS = (
    "gpu",
    "test",
    "size_bytes",
    "bytes_moved_per_rep",
    "gb_per_s",
    "peak_gb_per_s",
    "fraction_of_peak",
    "time_s",
    "reps",
    "source",
)

GEMM_SHAPES = {
    "full": [
        (8192, 8192, 8192),
        (4096, 4096, 4096),
        (2048, 2048, 2048),
        (1024, 1024, 1024),
        (16384, 1024, 4096),
    ],
    "smoke": [(64, 64, 64), (128, 32, 64)],
}
GEMM_DTYPES = ("bf16", "fp16", "tf32", "fp32")
#: The forward GEMMs of transformer layers at 16,384 tokens (M x N x K), timed in bf16 only:
#: the same FLOPs reach less of the peak as the reduction K shortens, which the speed model
#: charges as each output tile's store after its reduction (``compute._gemm_time``); these
#: rows measure that, from GPT-2 small's K 768 to Llama 3 70B's K 8192. The GPT-2 LM head
#: pairs (vocabulary 50257 against 50304, nanoGPT's padding "for efficiency") measure what a
#: dimension that is not a multiple of 8 costs: the speed model prices every GEMM as aligned,
#: and GPT-2's rows (DeepSpeedExamples on V100s) run slower than it predicts.
GEMM_LAYER_SHAPES: dict[str, list[tuple[str, int, int, int]]] = {
    "full": [
        ("gpt2 lm head, vocab 50257", 16384, 50257, 768),
        ("gpt2 lm head, vocab 50304", 16384, 50304, 768),
        ("gpt2 lm head input grad, K 50257", 16384, 768, 50257),
        ("gpt2 lm head input grad, K 50304", 16384, 768, 50304),
        ("gpt2 attn qkv", 16384, 2304, 768),
        ("gpt2 mlp down", 16384, 768, 3072),
        ("gpt2 mlp up", 16384, 3072, 768),
        ("llama-3-8b qkv", 16384, 6144, 4096),
        ("llama-3-8b gate+up", 16384, 28672, 4096),
        ("llama-3-8b down", 16384, 4096, 14336),
        ("llama-3-70b qkv", 16384, 10240, 8192),
        ("llama-3-70b down", 16384, 8192, 28672),
    ],
    "smoke": [("tiny", 64, 96, 32)],
}
HBM_SIZES = {"full": [2**30, 4 * 2**30], "quick": [2**30], "smoke": [2**20]}

#: (model, seq_len or image side, micro-batch sizes) per run size.
TRAIN: dict[str, list[tuple[str, int, tuple[int, ...]]]] = {
    "full": [
        ("gpt2", 1024, (8, 16, 32)),
        ("bert-base", 512, (16, 32, 64)),
        ("resnet-50", 224, (64, 128, 256)),
        ("llama-3.2-1b", 2048, (1, 2, 4)),
    ],
    "quick": [
        ("gpt2", 1024, (16,)),
        ("bert-base", 512, (32,)),
        ("resnet-50", 224, (128,)),
        ("llama-3.2-1b", 2048, (2,)),
    ],
    "smoke": [
        ("gpt2", 32, (2,)),
        ("bert-base", 32, (2,)),
        ("resnet-50", 32, (2,)),
        ("llama-3.2-1b", 32, (2,)),
    ],
}
#: ResNet-50 in PyTorch's default NCHW layout with SGD + momentum, the pair Lambda's
#: deeplearning-benchmark tables time (fp32 column = TF32 on Ampere and later, fp16 = AMP):
#: (image side, micro-batch) per run size.
NCHW_PAIR: dict[str, tuple[int, int]] = {"full": (224, 256), "quick": (224, 128), "smoke": (32, 2)}
NCHW_PRECISIONS = ("tf32", "fp16-mixed")
LAYOUT_KERNELS = ("nchwtonhwc", "nhwctonchw")
"""Lower-case name fragments of cuDNN's layout-conversion kernels (``nchwToNhwcKernel``)."""
CONV_KERNELS = ("fprop", "dgrad", "wgrad", "convolve", "conv2d", "implicit_gemm")
"""Lower-case name fragments of cuDNN's and CUTLASS's convolution kernels."""
BATCHNORM_KERNELS = ("bn_", "batch_norm", "batchnorm")
"""Lower-case name fragments of batch-norm kernels (cuDNN's ``bn_fw_tr_1C11_kernel_NCHW``,
ATen's ``batch_norm_*``)."""
WARMUP_STEPS = 3
TIMED_STEPS = {"full": 10, "quick": 5, "smoke": 2}
TARGET_S = {"full": 0.25, "quick": 0.1, "smoke": 0.005}
"""Seconds each timed GEMM / copy measurement aims to run."""

RESNET50_TRAIN_FLOP_224 = 3 * 2 * 4.089e9
"""Approximate training FLOP per 224 px image: 3 x forward (torchvision's 4.089 GMAC)."""


class Timer:
    """Elapsed seconds of ``reps`` calls: CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, torch: Any, device: Any) -> None:
        """Bind to ``device``."""
        self.torch = torch
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        """``torch.cuda.synchronize()`` (no-op on CPU)."""
        if self.cuda:
            self.torch.cuda.synchronize()

    def time(self, fn: Callable[[], Any], reps: int) -> float:
        """Seconds for ``reps`` back-to-back calls of ``fn``."""
        self.sync()
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return time.perf_counter() - t0
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3

    def calibrated(
        self, fn: Callable[[], Any], target_s: float, warmup: int = 3
    ) -> tuple[float, int]:
        """(seconds per call, reps): warm up, time one call, then enough calls for ``target_s``."""
        for _ in range(warmup):
            fn()
        one = self.time(fn, 1)
        reps = max(3, min(2000, int(target_s / max(one, 1e-7))))
        return self.time(fn, reps) / reps, reps

    def graphed(self, fn: Callable[[], Any], target_s: float, per_call_s: float) -> float | None:
        """Seconds per call of ``fn`` replayed from a CUDA graph (no launch overhead).

        ``fn`` is captured ``inner`` times (about 1 ms of work) into one graph that is
        replayed for ``target_s``. None on CPU or if capture fails.
        """
        if not self.cuda:
            return None
        torch = self.torch
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm up on the capture stream (cuBLAS workspace)
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            inner = max(1, min(50, int(1e-3 / max(per_call_s, 1e-7))))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                for _ in range(inner):
                    fn()
            graph.replay()
            one = self.time(graph.replay, 1)
            reps = max(3, min(2000, int(target_s / max(one, 1e-7))))
            per_call = self.time(graph.replay, reps) / (reps * inner)
            del graph
            return per_call
        except Exception:  # noqa: BLE001 - graphs are an extra: fall back to the eager timing
            return None


def _dtype(torch: Any, name: str) -> Any:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name, torch.float32)


def run_gemm(torch: Any, device: Any, size: str, peaks: dict[str, float]) -> list[dict[str, Any]]:
    """TFLOP/s of ``torch.matmul(a, b, out=c)`` per shape and dtype (2*M*N*K FLOP per call)."""
    timer = Timer(torch, device)
    shapes = GEMM_SHAPES["smoke" if size == "smoke" else "full"]
    torch.manual_seed(0)
    if device.type == "cuda":  # bring the clocks up before the first timed shape
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        t_end = time.perf_counter() + (1.0 if size == "full" else 0.3)
        while time.perf_counter() < t_end:
            torch.matmul(a, a)
            timer.sync()
        del a
    out: list[dict[str, Any]] = []
    layers = GEMM_LAYER_SHAPES["smoke" if size == "smoke" else "full"]
    sweep = [(dtype, "", m, n, k) for dtype in GEMM_DTYPES for m, n, k in shapes]
    sweep += [("bf16", name, m, n, k) for name, m, n, k in layers]
    try:
        for dtype, layer, m, n, k in sweep:
            torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
            a = torch.randn(m, k, device=device, dtype=_dtype(torch, dtype))
            b = torch.randn(k, n, device=device, dtype=_dtype(torch, dtype))
            c = torch.empty(m, n, device=device, dtype=_dtype(torch, dtype))

            def call(a: Any = a, b: Any = b, c: Any = c) -> Any:
                return torch.matmul(a, b, out=c)

            eager_s, reps = timer.calibrated(call, TARGET_S[size])
            graph_s = timer.graphed(call, TARGET_S[size], eager_s)
            per_call = graph_s if graph_s is not None else eager_s
            flop = 2.0 * m * n * k
            tflops = flop / per_call / 1e12
            peak = peaks.get(dtype)
            out.append(
                {
                    "shape": f"{m}x{n}x{k}",
                    "m": m,
                    "n": n,
                    "k": k,
                    "dtype": dtype,
                    "tflops": round(tflops, 2),
                    "dense_peak_tflops": peak,
                    "fraction_of_dense_peak": round(tflops / peak, 4) if peak else None,
                    "time_s": per_call,
                    "timing": "cuda-graph" if graph_s else "eager",
                    "tflops_eager": round(flop / eager_s / 1e12, 2),
                    "reps": reps,
                    "layer": layer,
                }
            )
            del a, b, c
    finally:
        torch.set_float32_matmul_precision("highest")
    return out


def run_hbm(torch: Any, device: Any, size: str, peak_gb_s: float | None) -> list[dict[str, Any]]:
    """Device-to-device ``dst.copy_(src)`` bandwidth, counting bytes read plus written."""
    timer = Timer(torch, device)
    out: list[dict[str, Any]] = []
    for nbytes in HBM_SIZES[size]:
        src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 256)
        dst = torch.empty_like(src)
        per_call, reps = timer.calibrated(lambda s=src, d=dst: d.copy_(s), TARGET_S[size])
        gb_s = 2 * nbytes / per_call / 1e9
        out.append(
            {
                "test": "device-to-device copy (torch Tensor.copy_)",
                "size_bytes": nbytes,
                "bytes_moved_per_rep": 2 * nbytes,
                "gb_per_s": round(gb_s, 1),
                "peak_gb_per_s": peak_gb_s,
                "fraction_of_peak": round(gb_s / peak_gb_s, 4) if peak_gb_s else None,
                "time_s": per_call,
                "reps": reps,
            }
        )
        del src, dst
    return out


def model_flop_per_step(model: Any, work: common.Workload) -> float | None:
    """Approximate training FLOP of one step: 6 x matmul parameters x tokens + attention.

    Matmul parameters exclude embedding lookups (counted back when tied to the LM
    head); attention adds 12 x layers x hidden x seq per token (forward + backward,
    the causal mask not halved). ResNet-50: 3 x torchvision's 4.089 GMAC x 2 per image.
    """
    from torch import nn

    if work.family == "cnn":
        side = work.image_size or 224
        return RESNET50_TRAIN_FLOP_224 * (side / 224) ** 2 * work.micro_batch_size
    cfg = model.config
    total = sum(p.numel() for p in model.parameters())
    emb = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding))
    if work.family == "decoder" and getattr(cfg, "tie_word_embeddings", False):
        emb -= cfg.vocab_size * cfg.hidden_size
    layers = int(getattr(cfg, "num_hidden_layers", 0) or getattr(cfg, "n_layer", 0))
    hidden = int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 0))
    tokens = work.tokens
    return 6.0 * (total - emb) * tokens + 12.0 * layers * hidden * (work.seq_len or 0) * tokens


def run_train_one(torch: Any, device: Any, work: common.Workload, *, size: str) -> dict[str, Any]:
    """Step time of one workload: 3 warm-up steps, then timed steps (wall + per-step events)."""
    timer = Timer(torch, device)
    torch.manual_seed(0)
    smoke = size == "smoke"
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    if work.precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        return _train_one(torch, device, work, size=size, smoke=smoke, timer=timer)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _train_one(
    torch: Any, device: Any, work: common.Workload, *, size: str, smoke: bool, timer: Any
) -> dict[str, Any]:
    model, cls = common.build_model(work, dtype=torch.float32, device=device, smoke=smoke)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = common.make_optimizer(torch, work.optimizer, params)
    batch = common.make_batch(torch, work, model, device, smoke)
    step = common.make_step(torch, model, opt, batch, precision=work.precision, device=device)
    for _ in range(WARMUP_STEPS):
        loss = step()
    timer.sync()
    n = TIMED_STEPS[size]
    per_step = [timer.time(step, 1) for _ in range(n)]  # each bracketed by synchronize
    timer.sync()
    t0 = time.perf_counter()
    for _ in range(n):
        loss = step()
    timer.sync()
    step_s = (time.perf_counter() - t0) / n
    if not math.isfinite(float(loss)):
        raise FloatingPointError(f"non-finite loss {float(loss)}")
    flop = model_flop_per_step(model, work)
    layout = layout_profile(torch, step) if work.nchw else None
    result = {
        "model_class": cls,
        "params_total": sum(p.numel() for p in model.parameters()),
        "step_time_s": step_s,
        "per_step_s": per_step,
        "per_step_median_s": statistics.median(per_step),
        "samples_per_s": work.micro_batch_size / step_s,
        "tokens_per_s": work.tokens / step_s if work.tokens else None,
        "approx_model_tflops": flop / step_s / 1e12 if flop else None,
        "peak_allocated_bytes": (
            int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
        ),
        "layout_kernels": layout,
    }
    return result


def layout_profile(torch: Any, step: Callable[[], Any]) -> dict[str, Any]:
    """One profiled step: kernel time in total and in cuDNN's NCHW/NHWC conversions.

    Also counts the convolution kernels whose names carry an NCHW layout (cuDNN's native
    NCHW implicit-GEMM kernels, which need no conversion). On a CPU smoke run the profile
    has no CUDA kernels and every figure is 0.
    """
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    events = [
        (
            ev.key,
            float(
                getattr(ev, "self_device_time_total", None)
                or getattr(ev, "self_cuda_time_total", 0.0)
                or 0.0
            ),
            int(ev.count),
        )
        for ev in prof.key_averages()
    ]
    return classify_kernels(events)


def classify_kernels(events: list[tuple[str, float, int]]) -> dict[str, Any]:
    """Kernel time and calls by class from (name, self device microseconds, calls) rows.

    Self time: an operator's own row carries its kernels' time as children, so only the
    kernels themselves count (the total counted both before 2026-12-04).
    """
    total = layout_s = bn_s = 0.0
    nchw_convs = layout_calls = conv_calls = 0
    for key, device_us, count in events:
        if device_us <= 0:
            continue
        name = key.lower()
        total += device_us
        if any(k in name for k in LAYOUT_KERNELS):
            layout_s += device_us
            layout_calls += count
            continue
        if any(k in name for k in BATCHNORM_KERNELS):
            bn_s += device_us
        elif any(k in name for k in CONV_KERNELS):
            conv_calls += count
        if "nchw" in name:
            nchw_convs += count
    return {
        "kernel_time_s": total / 1e6,
        "layout_conversion_s": layout_s / 1e6,
        "layout_conversion_share": layout_s / total if total else 0.0,
        "nchw_named_kernel_calls": nchw_convs,
        # transposes per convolution call: the model's NCHW_TRANSPOSE_PASSES assumes each
        # call converts its input and its output; kernels named *_nchw write NCHW themselves
        "layout_conversion_calls": layout_calls,
        "convolution_kernel_calls": conv_calls,
        # batch norm's kernel time, against the bytes compute.EAGER_PASSES prices, gives the
        # bandwidth those kernels reach (HBM or SM-bound: docs/gpu-checks.md)
        "batchnorm_s": bn_s / 1e6,
    }


def train_spec(work: common.Workload, attention: str = "fused") -> dict[str, Any]:
    """The job spec of a timed workload (its precision and foreach optimizer, one GPU, no
    sharding; a CNN's layout as ``cnn_kernels``);
    ``attention`` is the kernel class SDPA was seen to run (``fused`` or ``cudnn``)."""
    text = work.family != "cnn"
    spec: dict[str, Any] = {
        "model": work.model,
        "method": "full",
        "precision": work.precision,
        "optimizer": work.optimizer,
        "optimizer_impl": "foreach",
        "micro_batch_size": work.micro_batch_size,
    }
    if text:
        spec["seq_len"] = work.seq_len
    else:
        spec["image_size"] = work.image_size
        spec["cnn_kernels"] = "channels-last" if work.channels_last else "eager"
    spec["activation_checkpointing"] = "none"
    if text:
        spec["attention"] = attention
    spec["parallelism"] = {"sharding": "none"}
    return spec


def workloads(size: str) -> list[common.Workload]:
    """The timed workloads of a run size (full, quick or smoke), the NCHW pair last."""
    side, mb = NCHW_PAIR[size]
    return [
        common.Workload(
            model=model,
            micro_batch_size=mb,
            seq_len=None if model == "resnet-50" else length,
            image_size=length if model == "resnet-50" else None,
        )
        for model, length, batches in TRAIN[size]
        for mb in batches
    ] + [
        common.Workload(
            model="resnet-50",
            micro_batch_size=mb,
            image_size=side,
            precision=precision,
            channels_last=False,
            optimizer="sgd-momentum",
        )
        for precision in NCHW_PRECISIONS
    ]


def train_row(
    work: common.Workload,
    res: dict[str, Any],
    *,
    gpu: str,
    source: str,
    stamp: str,
    smoke: bool,
    env: dict[str, Any],
    bf16_peak: float | None,
    n_steps: int,
) -> dict[str, Any]:
    """The training.csv row of one measured workload."""
    spec = train_spec(work, env.get("sdpa_attention", "fused"))
    text = work.family != "cnn"
    mfu = (
        f"; approx model {res['approx_model_tflops']:.1f} TFLOP/s"
        + (
            f" = {res['approx_model_tflops'] / bf16_peak:.1%} of the bf16 dense peak"
            if bf16_peak
            else ""
        )
        if res["approx_model_tflops"]
        else ""
    )
    built = (
        f"{res['model_class']} from src/gpuplan/models/data/{work.model}.json, transformers "
        f"{env.get('transformers')}, attn_implementation=sdpa ({env.get('sdpa_attention_basis')}), "
        "use_cache=False"
        if text
        else f"{res['model_class']}, "
        f"{'channels_last' if work.channels_last else 'NCHW (contiguous_format)'}, "
        "cross-entropy over 1000 classes"
    )
    numerics = {
        "bf16-mixed": "fp32 weights, torch.autocast(bfloat16) around forward and loss",
        "fp16-mixed": "fp32 weights, torch.autocast(float16) around forward and loss, "
        "torch.amp.GradScaler",
        "tf32": "fp32 weights, no autocast, TF32 on for cuDNN and matmul",
    }[work.precision]
    optimizer = {
        "adamw": "AdamW(lr=1e-4, foreach=True)",
        "sgd-momentum": "SGD(lr=1e-3, momentum=0.875, foreach=True)",
    }[work.optimizer]
    lay = res.get("layout_kernels")
    layout = (
        f"; one profiled step: {lay['kernel_time_s']:.6f} s of kernels, "
        f"{lay['layout_conversion_share']:.1%} of it in cuDNN NCHW/NHWC conversions, "
        f"{lay['nchw_named_kernel_calls']} calls of NCHW-named kernels, "
        f"{lay['layout_conversion_calls']} conversions for "
        f"{lay['convolution_kernel_calls']} convolution kernel calls, "
        f"{lay['batchnorm_s']:.6f} s in batch norm"
        if lay
        else ""
    )
    notes = (
        f"{built}; random weights and random inputs resident on the GPU (no data loading); "
        f"{numerics}; {optimizer}; eager (no torch.compile). "
        f"Step time {res['step_time_s']:.6f} s (mean of {n_steps} steps, wall clock between "
        f"synchronize calls); per-step median {res['per_step_median_s']:.6f} s, "
        f"min {min(res['per_step_s']):.6f}, max {max(res['per_step_s']):.6f}{mfu}"
        + (
            f"; peak allocated {res['peak_allocated_bytes']} B"
            if res["peak_allocated_bytes"] is not None
            else ""
        )
        + f"{layout}."
    )
    if smoke:
        notes = f"{common.SMOKE_NOTE} {notes}"
    what = (
        f"{'tokens' if text else 'images'} per second on one GPU: micro_batch_size"
        f"{' x seq_len' if text else ''} / mean step time over {n_steps} timed steps after "
        f"{WARMUP_STEPS} warm-up steps; a step is forward, loss, backward, optimizer step, "
        "zero_grad"
    )
    shape = f"s{work.seq_len}" if text else f"img{work.image_size}"
    return {
        "id": f"{common.slug(gpu)}-speedcheck-{stamp}-{work.model}-{work.precision}-"
        f"{work.optimizer}-mb{work.micro_batch_size}-{shape}" + ("-nchw" if work.nchw else ""),
        "status": "excluded" if smoke else "ok",
        "spec": common.flow_yaml(spec),
        "gpu": gpu,
        "count": 1,
        "gpus_per_node": 1,
        "intra_node": "none",
        "inter_node_gbps": "",
        "fabric": "",
        "metric": "tokens_per_s_per_gpu" if text else "samples_per_s",
        "measured": round(res["tokens_per_s"] if text else res["samples_per_s"], 1),
        "unit": "tokens/s/gpu" if text else "samples/s",
        "source": source,
        "what_was_measured": what,
        "notes": notes,
    }


def clocks(device: Any, uuid: str | None) -> dict[str, Any] | None:
    """SM/memory clocks, power and temperature now (nvidia-smi), or None."""
    if device.type != "cuda":
        return None
    now = common.smi_query(["clocks.sm", "clocks.mem", "power.draw", "temperature.gpu"], uuid)
    why = common.smi_query(["clocks_throttle_reasons.active"], uuid)
    return {**(now or {}), **(why or {})} or None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="exit codes: 0 written, 1 nothing measured, 3 no CUDA device, 4 missing package",
    )
    ap.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for training.csv, gemm.csv, hbm.csv and speed-check.json",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="one micro-batch per model, fewer steps, shorter timings",
    )
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny shapes and 2-layer models on CPU: tests the script, measures nothing",
    )
    ap.add_argument(
        "--sections",
        default="gemm,hbm,train",
        help="comma list of gemm, hbm, train (default: %(default)s)",
    )
    ap.add_argument(
        "--budget-s", type=float, default=240.0, help="skip remaining items after this many seconds"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the sections, write the CSVs and JSON, print the summary."""
    args = parse_args(argv)
    started = time.perf_counter()
    torch = common.import_torch(SCRIPT)
    device = common.pick_device(torch, SCRIPT, cpu_smoke=args.cpu_smoke)
    common.import_transformers(SCRIPT)
    gc.freeze()  # imported modules never need collecting: keeps each gc.collect() short
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if not sections or sections - {"gemm", "hbm", "train"}:
        common.fail(
            SCRIPT, f"--sections: use a comma list of gemm, hbm, train; got {args.sections!r}", 2
        )
    size = "smoke" if args.cpu_smoke else ("quick" if args.quick else "full")
    torch.zeros(1, device=device)
    env = common.environment(torch, device, script=SCRIPT)
    env["fp16_reduced_precision_reduction"] = (
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    )
    env["sdpa_attention"], env["sdpa_attention_basis"] = common.sdpa_attention(torch, device)
    gpu, entry = common.gpu_label(env)
    peaks = {k: float(v) for k, v in (entry or {}).get("peak_tflops_dense", {}).items()}
    hbm_peak = float(entry["memory_bandwidth_gb_per_s"]) if entry else None
    source = common.source_text(SCRIPT, gpu, env)
    stamp = common.today().replace("-", "")
    uuid = env.get("gpu_uuid") and f"GPU-{env['gpu_uuid']}"
    print(
        f"{SCRIPT}: {size} run on {env['gpu_name']} ({gpu}), torch {env['torch']}, "
        f"driver {env['driver']}" + ("" if entry else "; GPU not in the catalog: no peaks"),
        flush=True,
    )
    report: dict[str, Any] = {"environment": env, "size": size, "clocks": {}, "errors": []}

    def over_budget(what: str) -> bool:
        if time.perf_counter() - started <= args.budget_s:
            return False
        report["errors"].append(f"{what}: skipped, time budget of {args.budget_s:.0f} s spent")
        return True

    gemm: list[dict[str, Any]] = []
    if "gemm" in sections and not over_budget("gemm"):
        try:
            gemm = run_gemm(torch, device, size, peaks)
        except Exception as exc:  # noqa: BLE001 - report and go on to the other sections
            report["errors"].append(f"gemm: {type(exc).__name__}: {exc}")
        report["clocks"]["after_gemm"] = clocks(device, uuid)
    hbm: list[dict[str, Any]] = []
    if "hbm" in sections and not over_budget("hbm"):
        try:
            hbm = run_hbm(torch, device, size, hbm_peak)
        except Exception as exc:  # noqa: BLE001 - report and go on to the other sections
            report["errors"].append(f"hbm: {type(exc).__name__}: {exc}")
    train: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    if "train" in sections:
        for work in workloads(size):
            length = work.seq_len or work.image_size
            key = f"{work.model} mb{work.micro_batch_size}" + (
                f" nchw {work.precision}" if work.nchw else ""
            )
            if over_budget(key):
                continue
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            try:
                res = run_train_one(torch, device, work, size=size)
            except Exception as exc:  # noqa: BLE001 - one failed workload must not stop the run
                report["errors"].append(f"{key}: {type(exc).__name__}: {str(exc)[:300]}")
                res = None
            common.MemoryProbe(torch, device).release()
            if res is None:
                print(f"  FAILED {key}: {report['errors'][-1]}", flush=True)
                continue
            train.append(
                {
                    "model": work.model,
                    "micro_batch_size": work.micro_batch_size,
                    "length": length,
                    "precision": work.precision,
                    "channels_last": work.channels_last,
                }
                | res
            )
            rows.append(
                train_row(
                    work,
                    res,
                    gpu=gpu,
                    source=source,
                    stamp=stamp,
                    smoke=args.cpu_smoke,
                    env=env,
                    bf16_peak=peaks.get("bf16"),
                    n_steps=TIMED_STEPS[size],
                )
            )
            print(f"  {key:<30} step {res['step_time_s'] * 1e3:8.1f} ms", flush=True)
        report["clocks"]["after_train"] = clocks(device, uuid)

    out = args.out
    base = {"gpu": gpu, "source": source}
    common.write_csv(out / "gemm.csv", GEMM_COLUMNS, [base | g for g in gemm])
    common.write_csv(out / "hbm.csv", HBM_COLUMNS, [base | h for h in hbm])
    common.write_csv(out / "training.csv", common.TRAINING_COLUMNS, rows)
    report |= {"gemm": gemm, "hbm": hbm, "train": train, "wall_s": time.perf_counter() - started}
    common.write_json(out / "speed-check.json", report)
    _summary(report, gpu, out)
    return 0 if (gemm or hbm or train) else common.EXIT_PARTIAL


def _summary(report: dict[str, Any], gpu: str, out: Path) -> None:
    if report["gemm"]:
        print(f"\nGEMM on {gpu} (torch.matmul, random data)")
        common.print_table(
            ["shape MxNxK", "dtype", "TFLOP/s", "of dense peak", "ms/call"],
            [
                [
                    g["shape"],
                    g["dtype"],
                    f"{g['tflops']:.1f}",
                    "-"
                    if g["fraction_of_dense_peak"] is None
                    else f"{g['fraction_of_dense_peak']:.0%}",
                    f"{g['time_s'] * 1e3:.3f}",
                ]
                for g in report["gemm"]
            ],
        )
    if report["hbm"]:
        print("\nHBM device-to-device copy (bytes read + written)")
        common.print_table(
            ["size GiB", "GB/s", "of peak"],
            [
                [
                    f"{h['size_bytes'] / 2**30:g}",
                    f"{h['gb_per_s']:.0f}",
                    "-" if h["fraction_of_peak"] is None else f"{h['fraction_of_peak']:.0%}",
                ]
                for h in report["hbm"]
            ],
        )
    if report["train"]:
        print("\nTraining step, one GPU (bf16-mixed AdamW; the NCHW ResNet pair: SGD + momentum)")
        common.print_table(
            [
                "model",
                "precision",
                "mb",
                "seq/img",
                "step ms",
                "tokens/s",
                "samples/s",
                "~model TFLOP/s",
                "peak alloc GiB",
            ],
            [
                [
                    t["model"],
                    t["precision"] + ("" if t["channels_last"] else " NCHW"),
                    t["micro_batch_size"],
                    t["length"],
                    f"{t['step_time_s'] * 1e3:.1f}",
                    "-" if t["tokens_per_s"] is None else f"{t['tokens_per_s']:.0f}",
                    f"{t['samples_per_s']:.1f}",
                    "-" if t["approx_model_tflops"] is None else f"{t['approx_model_tflops']:.1f}",
                    common.fmt_bytes(t["peak_allocated_bytes"]),
                ]
                for t in report["train"]
            ],
        )
    for err in report["errors"]:
        print(f"  {err}")
    print(
        f"\n{len(report['train'])} rows -> {out / 'training.csv'}; GEMM -> {out / 'gemm.csv'}; "
        f"HBM -> {out / 'hbm.csv'}; details -> {out / 'speed-check.json'}; "
        f"{report['wall_s']:.1f} s in all"
    )


if __name__ == "__main__":
    sys.exit(main())
