"""Billing model: what a job, or a month of recurring use, costs, and why.

Pure functions, no I/O. The planner calls :func:`job_cost` for every option;
``gpuplan bill`` calls :func:`bill` with a usage profile parsed by
:mod:`gpuplan.cost.usage`.

Modules: ``billing`` (billed duration, terms, blocks, spot overhead), ``money``
(FX with dated catalog rates), ``transfer`` (egress and storage), ``breakdown``
(:class:`CostBreakdown`), ``job`` (:func:`job_cost`), ``usage`` (the usage file
and trace CSV), ``runs`` (instance runs over a demand timeline), ``mix``
(commitment vs on-demand mixes and auto-stop savings, :func:`gpuplan.cost.mix.bill`).
"""

from __future__ import annotations

from gpuplan.cost.billing import (
    CAPACITY_BLOCK_INCREMENT_S,
    COMMITMENT_MODES,
    HOURLY_MODES,
    TERM_HOURS,
    CommitmentPolicy,
    billed_seconds,
    break_even_utilization,
    capacity_block_seconds,
    commitment_terms,
    expected_loss_per_interruption_s,
    spot_overhead_s,
    term_price,
)
from gpuplan.cost.breakdown import CostBreakdown
from gpuplan.cost.job import CostOptions, SpotRisk, Startup, job_cost
from gpuplan.cost.money import FxUse, fx_rate, fx_use
from gpuplan.cost.transfer import DataPlan, Location, StorageRate, TransferCost, transfer_cost

__all__ = [
    "CAPACITY_BLOCK_INCREMENT_S",
    "COMMITMENT_MODES",
    "HOURLY_MODES",
    "TERM_HOURS",
    "CommitmentPolicy",
    "CostBreakdown",
    "CostOptions",
    "DataPlan",
    "FxUse",
    "Location",
    "SpotRisk",
    "Startup",
    "StorageRate",
    "TransferCost",
    "billed_seconds",
    "break_even_utilization",
    "capacity_block_seconds",
    "commitment_terms",
    "expected_loss_per_interruption_s",
    "fx_rate",
    "fx_use",
    "job_cost",
    "spot_overhead_s",
    "term_price",
    "transfer_cost",
]
