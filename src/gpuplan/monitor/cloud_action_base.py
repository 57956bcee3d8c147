"""The run logic the Alibaba Cloud and Tencent Cloud actions share.

Each provider module keeps only its API calls and parameters; this module
resolves the target, answers a dry run, bounds every SDK call in time and maps
its errors to an :class:`ActionResult` (an action reports, never raises).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuplan.errors import ActionError, MonitorError
from gpuplan.monitor.actions import ActionContext, ActionResult
from gpuplan.monitor.cloud_meta import CloudTarget, bounded, sdk_error

# ``(group, detail, remove_policy)`` when allowed, ``(None, why-not, "")`` otherwise.
ScaleInPlan = tuple[str | None, str, str]


class CloudActionBase:
    """Target resolution and result building for one cloud action."""

    name: str
    where: CloudTarget
    call_timeout_s: float

    def resolve(self) -> tuple[str, str]:
        """Instance id and region (given, else from metadata); the daemon calls it at start."""
        return self.where.resolve()

    def _result(self, *, executed: bool, ok: bool, detail: str) -> ActionResult:
        return ActionResult(action=self.name, executed=executed, ok=ok, detail=detail)

    def _target(self, ctx: ActionContext) -> tuple[str, str] | ActionResult:
        """``(instance id, region)``, or the failed result when they cannot be had."""
        try:
            return self.where.target(ctx.target)
        except ActionError as exc:
            return self._result(executed=False, ok=False, detail=exc.message)


class CloudStopBase(CloudActionBase):
    """Stop one instance: a subclass names the call, makes it and reads its answer."""

    def _describe_stop(self, iid: str, region: str) -> str:
        raise NotImplementedError

    def _stop_call(self, iid: str, region: str) -> Callable[[], Any]:
        """Build the request (may raise) and return the SDK call to bound."""
        raise NotImplementedError

    def _stop_outcome(self, answer: Any, iid: str, call: str) -> tuple[bool, str]:
        """``(ok, detail)`` read from the SDK's answer."""
        raise NotImplementedError

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        """Stop the instance (or describe the call in a dry run)."""
        target = self._target(ctx)
        if isinstance(target, ActionResult):
            return target
        iid, region = target
        call = self._describe_stop(iid, region)
        if not execute:
            return self._result(executed=False, ok=True, detail=f"dry run: would call {call}")
        try:
            work = self._stop_call(iid, region)
            answer = bounded(work, self.call_timeout_s, "StopInstances")
        except MonitorError as exc:
            return self._result(executed=False, ok=False, detail=exc.one_line())
        except Exception as exc:  # noqa: BLE001 - SDK errors vary; report, never raise
            return self._result(executed=True, ok=False, detail=f"{call}: {sdk_error(exc)}")
        ok, detail = self._stop_outcome(answer, iid, call)
        return self._result(executed=True, ok=ok, detail=detail)


class CloudScaleInBase(CloudActionBase):
    """Check the scaling group, then remove one instance from it."""

    min_size: int
    # How the group is named in "cannot check the ... group".
    group_noun: str

    def _describe_scale_in(self, iid: str, region: str) -> str:
        raise NotImplementedError

    def _plan(self, iid: str, region: str) -> ScaleInPlan:
        raise NotImplementedError

    def _remove_call(self, iid: str, region: str, group: str, policy: str) -> Callable[[], Any]:
        """Build the removal request (may raise) and return the SDK call to bound."""
        raise NotImplementedError

    def _activity(self, answer: Any) -> object:
        """The scaling activity id in the removal's answer."""
        raise NotImplementedError

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        """Check the group, then remove the instance (a dry run calls nothing)."""
        target = self._target(ctx)
        if isinstance(target, ActionResult):
            return target
        iid, region = target
        if not execute:
            return self._result(
                executed=False, ok=True, detail=self._describe_scale_in(iid, region)
            )
        try:
            group, detail, policy = bounded(
                lambda: self._plan(iid, region), self.call_timeout_s, "the group check"
            )
        except MonitorError as exc:
            return self._result(executed=False, ok=False, detail=exc.one_line())
        except Exception as exc:  # noqa: BLE001 - SDK errors vary
            return self._result(
                executed=False,
                ok=False,
                detail=f"cannot check the {self.group_noun}: {sdk_error(exc)}",
            )
        if group is None:
            return self._result(executed=False, ok=False, detail=detail)
        try:
            work = self._remove_call(iid, region, group, policy)
            answer = bounded(work, self.call_timeout_s, "RemoveInstances")
        except Exception as exc:  # noqa: BLE001
            return self._result(executed=True, ok=False, detail=f"{detail}: {sdk_error(exc)}")
        return self._result(
            executed=True, ok=True, detail=f"{detail}; activity {self._activity(answer)}"
        )
