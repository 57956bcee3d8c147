#!/usr/bin/env python3
"""Measure the peak GPU memory of real training steps and write ``validation/memory.csv`` rows.

Trains three steps (forward, loss, backward, ``optimizer.step``, ``zero_grad``)
of GPT-2 small, BERT-base and Llama-3.2-1B, each built from the shipped preset
config (``src/gpuplan/models/data``; random weights, no downloads, SDPA
attention) in several configurations: fp32 / bf16-mixed / bf16-true, AdamW /
SGD (foreach), activation checkpointing off / on, and LoRA on q_proj, v_proj.
Peak statistics are reset after step 1 (optimizer state then exists), so the
numbers are the steady state of steps 2-3:

* ``allocated``: ``torch.cuda.max_memory_allocated()``, bytes;
* ``reserved``: ``torch.cuda.max_memory_reserved()``, bytes;
* ``device_used``: ``nvidia-smi`` memory.used after step 3, MiB, with
  ``cuda_context_mib`` = that minus ``torch.cuda.memory_reserved()``.

Writes ``OUT/memory.csv`` (the columns of ``validation/memory.csv``, one row per
configuration and metric) and ``OUT/memory-check.json`` (environment, raw
readings, failures), and prints a summary. About 1-2 minutes on an H200.

Exit codes: 0 written (failed configurations are listed), 1 nothing measured,
3 no CUDA device (use ``--cpu-smoke`` for a CPU dry run), 4 torch/transformers missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_common as common  # noqa: E402

SCRIPT = "gpu-memory-check.py"
LORA_RANK = 16
LORA_ALPHA = 32
LORA_TARGETS = ("q_proj", "v_proj")

#: (seq_len, micro-batch, larger micro-batch) per model: full run, --quick, --cpu-smoke.
SIZES: dict[str, dict[str, tuple[int, int, int]]] = {
    "full": {"gpt2": (1024, 8, 16), "bert-base": (512, 16, 32), "llama-3.2-1b": (1024, 4, 8)},
    "quick": {"gpt2": (1024, 4, 8), "bert-base": (512, 8, 16), "llama-3.2-1b": (1024, 2, 4)},
    "smoke": {"gpt2": (32, 2, 4), "bert-base": (32, 2, 4), "llama-3.2-1b": (32, 2, 4)},
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """One measured configuration."""

    work: common.Workload
    precision: str
    """fp32, bf16-mixed or bf16-true (job-spec values)."""
    optimizer: str = "adamw"
    checkpointing: bool = False
    lora: bool = False

    @property
    def method(self) -> str:
        """Job-spec method: lora or full."""
        return "lora" if self.lora else "full"

    def spec(self) -> dict[str, Any]:
        """The job spec that reproduces this configuration (field order as the tables)."""
        spec: dict[str, Any] = {"model": self.work.model, "method": self.method}
        if self.lora:
            spec["lora"] = {
                "rank": LORA_RANK,
                "alpha": LORA_ALPHA,
                "targets": list(LORA_TARGETS),
                "dropout": 0.0,
            }
        spec |= {
            "precision": self.precision,
            "optimizer": self.optimizer,
            "optimizer_impl": "foreach",
            "micro_batch_size": self.work.micro_batch_size,
            "seq_len": self.work.seq_len,
            "activation_checkpointing": "full" if self.checkpointing else "none",
            "attention": "fused",
            "parallelism": {"sharding": "none"},
        }
        return spec

    def key(self) -> str:
        """Id fragment, e.g. ``llama-3.2-1b-lora-bf16-true-adamw-ckpt-mb4-s1024``."""
        parts = [self.work.model, self.method, self.precision, self.optimizer]
        if self.checkpointing:
            parts.append("ckpt")
        parts += [f"mb{self.work.micro_batch_size}", f"s{self.work.seq_len}"]
        return "-".join(parts)


def configs(size: str, models: list[str]) -> list[Config]:
    """The configurations of a run; ``quick`` drops the variants that repeat a factor."""
    out: list[Config] = []
    full = size != "quick"
    for model in models:
        seq, mb, mb2 = SIZES[size][model]
        work = common.Workload(model=model, micro_batch_size=mb, seq_len=seq)
        out.append(Config(work=work, precision="fp32"))
        out.append(Config(work=work, precision="bf16-mixed"))
        if full:
            out.append(
                Config(work=dataclasses.replace(work, micro_batch_size=mb2), precision="bf16-mixed")
            )
            out.append(Config(work=work, precision="bf16-true"))
            out.append(Config(work=work, precision="bf16-mixed", optimizer="sgd"))
        out.append(Config(work=work, precision="bf16-mixed", checkpointing=True))
        if model == "llama-3.2-1b":
            out.append(Config(work=work, precision="bf16-true", lora=True))
            if full:
                out.append(Config(work=work, precision="bf16-mixed", lora=True))
                out.append(Config(work=work, precision="bf16-true", lora=True, checkpointing=True))
    return out


def measure(
    torch: Any,
    cfg: Config,
    device: Any,
    probe: common.MemoryProbe,
    *,
    smoke: bool,
    use_peft: bool,
) -> dict[str, Any]:
    """Build, train three steps, read the steady-state peaks of steps 2-3."""
    before_alloc, _ = probe.current()
    torch.manual_seed(0)
    dtype = common.param_dtype(torch, cfg.precision, cfg.method)
    t_build = time.perf_counter()
    model, cls = common.build_model(cfg.work, dtype=dtype, device=device, smoke=smoke)
    if cfg.checkpointing:
        common.enable_checkpointing(model)
    lora_impl = None
    if cfg.lora:
        model, lora_impl = common.apply_lora(
            model, targets=LORA_TARGETS, rank=LORA_RANK, alpha=LORA_ALPHA, use_peft=use_peft
        )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = common.make_optimizer(torch, cfg.optimizer, params)
    batch = common.make_batch(torch, cfg.work, model, device, smoke)
    step = common.make_step(torch, model, opt, batch, precision=cfg.precision, device=device)
    build_s = time.perf_counter() - t_build
    first = float(step())  # step 1: optimizer state appears
    rest_alloc, rest_reserved = probe.current()
    probe.reset()
    t0 = time.perf_counter()
    losses = [float(step()), float(step())]
    peak_alloc, peak_reserved = probe.peaks()
    steps_s = time.perf_counter() - t0
    used_mib = probe.device_used_mib()
    _, reserved_now = probe.current()
    if not all(math.isfinite(x) for x in (first, *losses)):
        raise FloatingPointError(f"non-finite loss {first}, {losses}")
    return {
        "model_class": cls,
        "lora_impl": lora_impl,
        "params_total": sum(p.numel() for p in model.parameters()),
        "params_trainable": sum(p.numel() for p in params),
        "allocated_before_build_bytes": before_alloc,
        "allocated_at_rest_after_step1_bytes": rest_alloc,
        "reserved_at_rest_after_step1_bytes": rest_reserved,
        "peak_allocated_bytes": peak_alloc,
        "peak_reserved_bytes": peak_reserved,
        "device_used_mib": used_mib,
        "device_used_source": probe.used_source,
        "reserved_after_step3_bytes": reserved_now,
        "cuda_context_mib": None if used_mib is None else used_mib - reserved_now // 2**20,
        "build_s": build_s,
        "steps_2_3_s": steps_s,
        "losses": [first, *losses],
    }


#: The configuration whose caching-allocator reserve the squeeze check takes away.
SQUEEZE_KEY_PREFIX = "llama-3.2-1b-full-bf16-mixed-adamw"
#: Room left beside the job's peak allocation: half its usual reserve, then the 256 MiB
#: fragmentation floor the estimator keeps (``gpuplan.estimate.memory.squeezed_reserve``).
SQUEEZE_LEVELS = (("half of the usual reserve", 0.5, 0), ("256 MiB", 0.0, 256 * 2**20))


def squeeze(
    torch: Any,
    cfg: Config,
    base: dict[str, Any],
    device: Any,
    probe: common.MemoryProbe,
    *,
    use_peft: bool,
) -> list[dict[str, Any]]:
    """Run ``cfg`` again on a card filled so that its usual reserve does not fit.

    The estimator assumes PyTorch's caching allocator frees cached blocks before it raises
    OOM, so a job whose allocated peak fits runs with less than its usual reserve. A ballast
    tensor leaves room for the measured peak allocation plus each level's share of the
    measured reserve; each level records whether three steps ran, the allocator's retries
    (``num_alloc_retries``) and the reserve it kept.
    """
    reserve = base["peak_reserved_bytes"] - base["peak_allocated_bytes"]
    out: list[dict[str, Any]] = []
    for label, share, fixed in SQUEEZE_LEVELS:
        record: dict[str, Any] = {"room_beside_peak": label, "usual_reserve_bytes": reserve}
        probe.release()
        free, _ = torch.cuda.mem_get_info(device)
        room = int(base["peak_allocated_bytes"] + share * reserve + fixed)
        ballast_bytes = free - room
        record["room_bytes"] = room
        if ballast_bytes <= 0:
            record["skipped"] = "the card has no memory to fill beside the job"
            out.append(record)
            continue
        ballast = None
        try:
            ballast = torch.empty(ballast_bytes, dtype=torch.uint8, device=device)
            torch.cuda.reset_accumulated_memory_stats(device)
            got = measure(torch, cfg, device, probe, smoke=False, use_peft=use_peft)
            stats = torch.cuda.memory_stats(device)
            record |= {
                "ran": True,
                "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
                "num_ooms": int(stats.get("num_ooms", 0)),
                "peak_allocated_bytes": got["peak_allocated_bytes"] - ballast_bytes,
                "reserve_kept_bytes": got["peak_reserved_bytes"] - got["peak_allocated_bytes"],
                "steps_2_3_s": got["steps_2_3_s"],
            }
        except torch.cuda.OutOfMemoryError as exc:
            record |= {"ran": False, "error": f"OutOfMemoryError: {str(exc).splitlines()[0][:300]}"}
        except Exception as exc:  # noqa: BLE001 - a failed check must not stop the run
            record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        finally:
            del ballast
            probe.release()
        out.append(record)
    return out


def _precision_text(cfg: Config) -> str:
    if cfg.lora:
        cast = "torch.autocast(bfloat16)" if cfg.precision == "bf16-mixed" else "no autocast"
        return f"frozen bf16 base weights, fp32 LoRA adapters (r {LORA_RANK}), {cast}"
    return {
        "fp32": "fp32 weights and compute (TF32 off, the torch default)",
        "bf16-mixed": "fp32 weights, torch.autocast(bfloat16) around forward and loss",
        "bf16-true": "bf16 weights, gradients and optimizer state, no autocast",
    }[cfg.precision]


def rows_for(
    cfg: Config,
    res: dict[str, Any],
    *,
    gpu: str,
    source: str,
    stamp: str,
    smoke: bool,
    env: dict[str, Any],
) -> list[dict[str, Any]]:
    """The memory.csv rows (allocated, reserved, device_used) of one result."""
    loss = (
        "cross-entropy on random labels (2-way classifier on the pooled output)"
        if cfg.work.family == "encoder"
        else "causal-LM loss on labels = input_ids (transformers upcasts logits to fp32)"
    )
    opt = "AdamW(lr=1e-4, foreach=True)" if cfg.optimizer == "adamw" else "SGD(lr=1e-3, foreach)"
    notes = (
        f"{res['model_class']} built from src/gpuplan/models/data/{cfg.work.model}.json with "
        f"transformers {env.get('transformers')} (attn_implementation=sdpa, use_cache=False, "
        f"dropout as configured), random weights and random token ids; {_precision_text(cfg)}; "
        f"{opt} on {res['params_trainable']} trainable of {res['params_total']} parameters; "
        f"{loss}; model outputs held until after backward; "
        f"activation checkpointing {'on (non-reentrant)' if cfg.checkpointing else 'off'}"
        + (f"; LoRA by {res['lora_impl']}" if res["lora_impl"] else "")
        + f". At rest after step 1 (weights + optimizer state + cuBLAS workspaces): "
        f"{res['allocated_at_rest_after_step1_bytes']} B allocated; allocated before the model "
        f"was built: {res['allocated_before_build_bytes']} B; steps 2-3 took "
        f"{res['steps_2_3_s']:.3f} s. PYTORCH_CUDA_ALLOC_CONF="
        f"{env['env'].get('PYTORCH_CUDA_ALLOC_CONF') or 'unset'}."
    )
    if smoke:
        notes = f"{common.SMOKE_NOTE} {notes}"
    base = {
        "status": "excluded" if smoke else "ok",
        "spec": common.flow_yaml(cfg.spec()),
        "gpu": gpu,
        "count": 1,
        "source": source,
        "notes": notes,
    }
    window = (
        "over training steps 2-3 (peak stats reset after step 1): forward, loss, backward, "
        "optimizer.step, zero_grad(set_to_none=True)"
    )
    prefix = f"{common.slug(gpu)}-memcheck-{stamp}-{cfg.key()}"
    rows = [
        base
        | {
            "id": f"{prefix}-allocated",
            "metric": "allocated",
            "measured": res["peak_allocated_bytes"],
            "unit": "B",
            "what_was_measured": f"torch.cuda.max_memory_allocated() {window}",
        },
        base
        | {
            "id": f"{prefix}-reserved",
            "metric": "reserved",
            "measured": res["peak_reserved_bytes"],
            "unit": "B",
            "what_was_measured": f"torch.cuda.max_memory_reserved() {window}",
        },
    ]
    if res["device_used_mib"] is not None:
        rows.append(
            base
            | {
                "id": f"{prefix}-device-used",
                "metric": "device_used",
                "measured": res["device_used_mib"],
                "unit": "MiB",
                "cuda_context_mib": res["cuda_context_mib"],
                "what_was_measured": (
                    f"{res['device_used_source']} right after step 3, one process on the GPU "
                    "(the caching allocator still holds its peak segments); cuda_context_mib = "
                    "that minus torch.cuda.memory_reserved() at the same moment"
                ),
            }
        )
    return rows


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
        help="folder for memory.csv and memory-check.json",
    )
    ap.add_argument("--quick", action="store_true", help="fewer configurations, half batches")
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny 2-layer models on CPU: tests the script, measures nothing",
    )
    ap.add_argument(
        "--models",
        default=",".join(common.TEXT_MODELS),
        help="comma list of presets (default: %(default)s)",
    )
    ap.add_argument("--no-peft", action="store_true", help="inline LoRA even if peft imports")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=240.0,
        help="skip remaining configurations after this many seconds",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the configurations, write the CSV and JSON, print the summary."""
    args = parse_args(argv)
    started = time.perf_counter()
    torch = common.import_torch(SCRIPT)
    device = common.pick_device(torch, SCRIPT, cpu_smoke=args.cpu_smoke)
    common.import_transformers(SCRIPT)
    gc.freeze()  # imported modules never need collecting: keeps each gc.collect() short
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(common.TEXT_MODELS))
    if unknown:
        common.fail(SCRIPT, f"--models: unknown {unknown}; use {common.TEXT_MODELS}", 2)
    idle = common.smi_query(["memory.used"], None) if device.type == "cuda" else None
    probe = common.MemoryProbe(torch, device)
    torch.zeros(1, device=device)
    env = common.environment(torch, device, script=SCRIPT)
    env["idle_device_used_mib"] = idle["memory.used"] if idle else None
    used0 = probe.device_used_mib()
    env["context_only_mib"] = None if used0 is None else used0 - probe.current()[1] // 2**20
    gpu, _ = common.gpu_label(env)
    source = common.source_text(SCRIPT, gpu, env)
    stamp = common.today().replace("-", "")
    size = "smoke" if args.cpu_smoke else ("quick" if args.quick else "full")
    plan = configs(size, models)
    print(
        f"{SCRIPT}: {len(plan)} configurations on {env['gpu_name']} ({gpu}), torch "
        f"{env['torch']}, driver {env['driver']}",
        flush=True,
    )

    results: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for cfg in plan:
        record: dict[str, Any] = {"key": cfg.key(), "spec": cfg.spec()}
        if time.perf_counter() - started > args.budget_s:
            record["skipped"] = f"time budget of {args.budget_s:.0f} s spent"
            results.append(record)
            continue
        try:
            record |= measure(
                torch, cfg, device, probe, smoke=args.cpu_smoke, use_peft=not args.no_peft
            )
        except Exception as exc:  # noqa: BLE001 - one failed configuration must not stop the run
            record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        probe.release()
        results.append(record)
        if "error" in record:
            print(f"  FAILED {cfg.key()}: {record['error']}", flush=True)
            continue
        rows += rows_for(
            cfg, record, gpu=gpu, source=source, stamp=stamp, smoke=args.cpu_smoke, env=env
        )
        print(
            f"  {cfg.key():<52} alloc {common.fmt_bytes(record['peak_allocated_bytes']):>7} "
            f"GiB  reserved {common.fmt_bytes(record['peak_reserved_bytes']):>7} GiB  "
            f"used {record['device_used_mib']} MiB",
            flush=True,
        )

    squeezed: list[dict[str, Any]] | dict[str, str]
    base = next(
        (
            (cfg, r)
            for cfg, r in zip(plan, results, strict=True)
            if r["key"].startswith(SQUEEZE_KEY_PREFIX) and "peak_allocated_bytes" in r
        ),
        None,
    )
    if device.type != "cuda":
        squeezed = {"skipped": "needs a CUDA device (the caching allocator)"}
    elif base is None:
        squeezed = {"skipped": f"no measured {SQUEEZE_KEY_PREFIX} configuration"}
    elif time.perf_counter() - started > args.budget_s:
        squeezed = {"skipped": f"time budget of {args.budget_s:.0f} s spent"}
    else:
        squeezed = squeeze(torch, base[0], base[1], device, probe, use_peft=not args.no_peft)
        for r in squeezed:
            print(
                f"  squeeze ({r['room_beside_peak']} beside the peak): "
                + (
                    f"ran, {r['num_alloc_retries']} allocation retries, reserve kept "
                    f"{common.fmt_bytes(r['reserve_kept_bytes'])} GiB"
                    if r.get("ran")
                    else r.get("error") or r.get("skipped", "")
                ),
                flush=True,
            )
    wall = time.perf_counter() - started
    n_rows = common.write_csv(args.out / "memory.csv", common.MEMORY_COLUMNS, rows)
    common.write_json(
        args.out / "memory-check.json",
        {
            "environment": env,
            "size": size,
            "wall_s": wall,
            "results": results,
            "allocator_squeeze": squeezed,
        },
    )
    _summary(results, gpu, wall, n_rows, args.out)
    measured = sum(1 for r in results if "peak_allocated_bytes" in r)
    return 0 if measured else common.EXIT_PARTIAL


def _summary(results: list[dict[str, Any]], gpu: str, wall: float, n_rows: int, out: Path) -> None:
    print(f"\nPeak memory of training steps 2-3 on {gpu} (GiB = 2^30 bytes)")
    table = []
    for r in results:
        s = r["spec"]
        status = (
            "ok" if "peak_allocated_bytes" in r else ("skipped" if "skipped" in r else "FAILED")
        )
        used = r.get("device_used_mib")
        table.append(
            [
                s["model"],
                s["method"],
                s["precision"],
                s["optimizer"],
                "on" if s["activation_checkpointing"] == "full" else "off",
                s["micro_batch_size"],
                s["seq_len"],
                common.fmt_bytes(r.get("peak_allocated_bytes")),
                common.fmt_bytes(r.get("peak_reserved_bytes")),
                "-" if used is None else f"{used / 1024:.2f}",
                f"{r['steps_2_3_s']:.2f}" if "steps_2_3_s" in r else "-",
                status,
            ]
        )
    common.print_table(
        [
            "model",
            "method",
            "precision",
            "opt",
            "ckpt",
            "mb",
            "seq",
            "alloc",
            "reserved",
            "smi used",
            "2 steps s",
            "status",
        ],
        table,
    )
    failed = [r for r in results if "error" in r or "skipped" in r]
    for r in failed:
        print(f"  {r['key']}: {r.get('error') or r.get('skipped')}")
    print(
        f"\n{n_rows} rows -> {out / 'memory.csv'}; details -> {out / 'memory-check.json'}; "
        f"{wall:.1f} s in all"
    )


if __name__ == "__main__":
    sys.exit(main())
