"""Planner settings from the ``plan`` command's flags, validated once for the CLI and the web."""

from __future__ import annotations

from typing import Literal

from gpuplan.errors import SpecError
from gpuplan.planner.model import PlanSettings
from gpuplan.planner.search import RISKS
from gpuplan.units import parse_duration_s

OBJECTIVES = ("cost", "time", "pareto")
SERVE_OBJECTIVES = ("cost", "latency")


def plan_settings(
    *,
    objective: str,
    top: int,
    max_gpus: int | None,
    spot_rate: float,
    checkpoint_interval: str,
    risk: str = "medium",
) -> PlanSettings:
    """``PlanSettings`` from the flag values; a bad value is a ``SpecError`` naming the flag."""
    if objective not in OBJECTIVES:
        raise SpecError(f"--objective: unknown {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if risk not in RISKS:
        raise SpecError(f"--risk: unknown {risk!r}; allowed: {', '.join(RISKS)}")
    try:
        interval = parse_duration_s(checkpoint_interval, field="--checkpoint-interval")
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if interval <= 0:
        raise SpecError(
            f"--checkpoint-interval: must be longer than 0, got {checkpoint_interval!r}",
            hint="--checkpoint-interval 30m",
        )
    return PlanSettings(
        objective=objective,
        top=top,
        max_gpus=max_gpus,
        spot_interruptions_per_hour=spot_rate,
        checkpoint_interval_s=interval,
        risk=risk,
    )


def spec_overrides(overrides: list[str] | None, currency: str | None) -> list[str]:
    """The ``--set`` overrides, plus ``--currency`` as ``constraints.currency``."""
    extra = list(overrides or [])
    if currency is not None:
        extra.append(f"constraints.currency={currency}")
    return extra


def serve_objective(objective: str) -> Literal["cost", "latency"]:
    """``serve plan --objective``, checked once for the CLI and the web."""
    if objective == "cost":
        return "cost"
    if objective == "latency":
        return "latency"
    raise SpecError(f"--objective: expected cost or latency, got {objective!r}")
