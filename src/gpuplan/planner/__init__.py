"""The planner: every offering x node count x strategy x billing mode, ranked and explained."""

from gpuplan.planner.model import Option, Plan, PlanSettings, Rejection
from gpuplan.planner.search import plan

__all__ = ["Option", "Plan", "PlanSettings", "Rejection", "plan"]
