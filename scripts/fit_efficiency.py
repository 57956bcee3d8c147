"""Fit the speed model's efficiency parameters to validation/training.csv.

Parameters: one per (architecture, compute class), ``gemm`` for 16-bit/tf32 tensor
cores, ``gemm_fp8`` for fp8, ``gemm_fp32`` for plain fp32; per architecture ``attention``
and ``attention_cudnn``, the fused-attention efficiencies (FlashAttention-2 class and
cuDNN/FlashAttention-3 class), on its rows at sequence length >= 8192 (on Hopper,
``attention_cudnn`` is the measured cuDNN/FA2 ratio times ``attention``); and one global
tensor-parallel overlap fraction, on the rows with tp > 1. Each is chosen on a grid to
minimise the median |log(predicted / measured)| over its rows, never per row; groups with
fewer than 2 rows keep their prior. GEMM, attention and overlap interact, so they are
fitted in turns from fixed starting values for at most 4 rounds: a re-run on the same
table writes the same values. The parameters trade off against each other along flat
valleys (the median moves little), so read single values with that in mind. Also reports
a 2-fold cross-validated median error (fit on even rows, test on odd, and back), so the
in-sample numbers are not the only ones quoted.

Usage: python scripts/fit_efficiency.py [--write]   (--write updates efficiency.yaml)
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from gpuplan.catalog.loader import load_catalog
from gpuplan.errors import GpuPlanError
from gpuplan.estimate import calibration
from gpuplan.validation import UNIT_SCALE, predict_training, read_table

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "validation" / "training.csv"
YAML = REPO / "src" / "gpuplan" / "estimate" / "efficiency.yaml"
GRID = [round(0.15 + 0.01 * i, 2) for i in range(76)]  # 0.15 .. 0.90 (no GEMM sustains more)
MIN_ROWS = 2
LONG_SEQ = 8192


def _class(row: dict[str, str]) -> str:
    spec = row["spec"]
    if "fp8-mixed" in spec:
        return "gemm_fp8"
    if "precision: fp32" in spec:
        return "gemm_fp32"
    return "gemm"


def _with(
    base: calibration.Efficiencies, arch: str, key: str, value: float
) -> calibration.Efficiencies:
    archs = dict(base.archs)
    archs[arch] = dataclasses.replace(archs[arch], **{key: value})
    return dataclasses.replace(base, archs=archs)


def _error(rows: list[dict[str, str]]) -> list[float]:
    out = []
    for row in rows:
        measured = float(row["measured"]) * UNIT_SCALE.get(row["unit"], 1)
        try:
            predicted, _ = predict_training(row, REPO)
        except GpuPlanError:
            continue
        if predicted > 0 and measured > 0:
            out.append(abs(math.log(predicted / measured)))
    return out


def _fit_tp_overlap(
    rows: list[dict[str, str]], base: calibration.Efficiencies
) -> calibration.Efficiencies:
    """Fit the fraction of tensor-parallel traffic hidden behind compute on rows with tp > 1."""
    members = [r for r in rows if re.search(r"\btp: ([2-9]|\d\d)", r["spec"])]
    if len(members) < MIN_ROWS:
        return base
    best = (math.inf, base.overlap["tensor_parallel"])
    for value in [round(0.05 * i, 2) for i in range(20)]:
        trial = dataclasses.replace(base, overlap={**base.overlap, "tensor_parallel": value})
        calibration.use_efficiencies(trial)
        errs = _error(members)
        if errs and statistics.median(errs) < best[0]:
            best = (statistics.median(errs), value)
    calibration.use_efficiencies(None)
    print(
        f"  overlap tensor_parallel = {best[1]:.2f} on {len(members)} rows (median |log err| {best[0]:.3f})"
    )
    return dataclasses.replace(base, overlap={**base.overlap, "tensor_parallel": best[1]})


def _fit_key(
    effs: calibration.Efficiencies, arch: str, key: str, members: list[dict[str, str]]
) -> calibration.Efficiencies:
    """Grid-search one parameter of one architecture on its member rows."""
    if len(members) < MIN_ROWS:
        print(f"  {arch:13s} {key:9s}   kept prior: only {len(members)} row(s)")
        return effs
    best = (math.inf, getattr(effs.archs[arch], key))
    for value in GRID:
        calibration.use_efficiencies(_with(effs, arch, key, value))
        errs = _error(members)
        if errs:
            score = statistics.median(errs)
            if score < best[0]:
                best = (score, value)
    calibration.use_efficiencies(None)
    print(
        f"  {arch:13s} {key:9s} = {best[1]:.2f} on {len(members)} rows (median |log err| {best[0]:.3f})"
    )
    return _with(effs, arch, key, best[1])


START = {
    "gemm": 0.5,
    "gemm_fp8": 0.5,
    "gemm_fp32": 0.5,
    "attention": 0.375,
    "attention_cudnn": 0.375,
}
"""Where every fitted parameter starts, whatever efficiency.yaml holds, so a re-run of this
script on the same table writes the same values."""
START_TP_OVERLAP = 0.85
MAX_ROUNDS = 4
CUDNN_OVER_FLASH2 = {"Hopper": 2.0}
"""cuDNN-class over FlashAttention-2-class attention throughput, measured: on H100 631 vs 329
TFLOP/s (pytorch/pytorch#141133) and 75% vs 35% of peak (FlashAttention-3 paper,
arXiv:2407.08608). Where an architecture has a ratio here, ``attention_cudnn`` follows its
fitted ``attention`` instead of being fitted on the few cuDNN rows, which cannot separate it
from the GEMM efficiencies."""


def _fitted(effs: calibration.Efficiencies) -> tuple[float, ...]:
    return (
        *(getattr(a, k) for a in effs.archs.values() for k in START),
        effs.overlap["tensor_parallel"],
    )


def fit(rows: list[dict[str, str]], base: calibration.Efficiencies) -> calibration.Efficiencies:
    """Fitted parameters for the given rows.

    GEMM efficiencies per (architecture, class); each architecture's fused attention
    efficiencies on its rows at sequence length >= 8192 (where attention is a large share of
    the step, so the rows carry information about it); the tensor-parallel overlap. GEMM and
    attention interact, so the three are repeated (coordinate descent) until nothing moves,
    from fixed starting values.
    """
    cat = load_catalog(use_user=False)
    groups: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        arch = cat.gpu(row["gpu"]).architecture
        if arch in base.archs:
            groups[(arch, _class(row))].append(row)
            if _long_fused(row):
                key = "attention_cudnn" if "attention: cudnn" in row["spec"] else "attention"
                groups[(arch, key)].append(row)
    effs = dataclasses.replace(base, overlap={**base.overlap, "tensor_parallel": START_TP_OVERLAP})
    for arch in CUDNN_OVER_FLASH2:
        groups.pop((arch, "attention_cudnn"), None)
    for (arch, key), members in groups.items():
        if len(members) >= MIN_ROWS:
            effs = _with(effs, arch, key, START[key])
    order = sorted(groups.items(), key=lambda kv: (kv[0][1].startswith("attention"), kv[0]))
    for n in range(1, MAX_ROUNDS + 1):
        before = _fitted(effs)
        print(f" round {n}")
        for (arch, key), members in order:
            effs = _fit_key(effs, arch, key, members)
            if key == "attention" and arch in CUDNN_OVER_FLASH2:
                cudnn = round(CUDNN_OVER_FLASH2[arch] * effs.archs[arch].attention, 2)
                effs = _with(effs, arch, "attention_cudnn", cudnn)
        effs = _fit_tp_overlap(rows, effs)
        if _fitted(effs) == before:
            break
    return effs


def _long_fused(row: dict[str, str]) -> bool:
    m = re.search(r"seq_len: (\d+)", row["spec"])
    return bool(m) and int(m.group(1)) >= LONG_SEQ and "attention: eager" not in row["spec"]


def _median_pct(rows: list[dict[str, str]], effs: calibration.Efficiencies) -> float:
    calibration.use_efficiencies(effs)
    errs = [math.exp(e) - 1 for e in _error(rows)]
    calibration.use_efficiencies(None)
    return statistics.median(errs)


def main() -> int:
    rows = [r for r in read_table(TABLE) if r.get("status") == "ok"]
    base = calibration.efficiencies()
    print("fold A (even rows) -> test on odd rows")
    fa = fit(rows[0::2], base)
    print("fold B (odd rows) -> test on even rows")
    fb = fit(rows[1::2], base)
    cv = statistics.median([_median_pct(rows[1::2], fa), _median_pct(rows[0::2], fb)])
    print("all rows")
    fitted = fit(rows, base)
    in_sample = _median_pct(rows, fitted)
    print(f"2-fold cross-validated median |error| ~{cv:.1%}; in-sample {in_sample:.1%}")
    if "--write" in sys.argv:
        text = YAML.read_text()
        for arch, eff in fitted.archs.items():
            block = re.search(rf"(\n  {re.escape(arch)}:\n(?:    .*\n|      .*\n)+)", text)
            if not block:
                continue
            old = block.group(1)
            new = old
            for key in ("gemm", "gemm_fp8", "gemm_fp32", "attention", "attention_cudnn"):
                value = getattr(eff, key)
                if re.search(rf"\n    {key}: ", new):
                    new = re.sub(rf"(\n    {key}: )[0-9.]+", rf"\g<1>{value:.2f}", new)
                elif value != getattr(base.archs[arch], key):
                    new = new.replace("\n    hbm:", f"\n    {key}: {value:.2f}\n    hbm:")
            text = text.replace(old, new)
        text = re.sub(
            r"(\n  tensor_parallel: )[0-9.]+",
            rf"\g<1>{fitted.overlap['tensor_parallel']:.2f}",
            text,
        )
        YAML.write_text(text)
        print(f"wrote {YAML}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
