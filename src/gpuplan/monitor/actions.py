"""Idle actions: run a command, POST a webhook, run a pre-stop hook.

Every action is a dry run unless ``execute=True``: the dry run returns what it
*would* do and touches nothing. Commands are argv lists, never a shell.
AWS actions live in :mod:`gpuplan.monitor.aws`.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuplan.errors import MonitorError
from gpuplan.monitor.proc import run_bounded


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionContext:
    """What an action is acting on and why.

    Attributes:
        reason: the decision's reason line.
        decision: the decision record (JSON-ready), sent to webhooks.
        target: the instance to act on (fleet mode); ``None`` = this machine.
    """

    reason: str
    decision: Mapping[str, Any] = field(default_factory=dict)
    target: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionResult:
    """Outcome of one action.

    Attributes:
        action: the action's name.
        executed: whether it really ran (``False`` in a dry run).
        ok: whether it succeeded (a dry run is ok unless it could not be planned).
        detail: what was (or would have been) done, or why it failed.
    """

    action: str
    executed: bool
    ok: bool
    detail: str


class Action(Protocol):
    """A stop/scale/notify step. ``run`` never raises for an expected failure."""

    name: str

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        """Do it (``execute``) or describe it (dry run)."""
        ...


def expand_argv(argv: Sequence[str], target: str | None) -> list[str]:
    """Replace ``{instance}`` in each argument with the target (fleet mode).

    >>> expand_argv(["drain", "{instance}"], "i-0abc")
    ['drain', 'i-0abc']
    """
    if target is None:
        return list(argv)
    return [arg.replace("{instance}", target) for arg in argv]


class CommandAction:
    """Run a command (e.g. ``sudo shutdown -h now``) as an argv list, never a shell.

    Args:
        argv: program and arguments; ``{instance}`` is replaced by the fleet target.
        timeout_s: the command's time bound, in seconds.
        name: the name used in logs.
    """

    def __init__(
        self, argv: Sequence[str], *, timeout_s: float = 120.0, name: str = "command"
    ) -> None:
        if not argv or not argv[0]:
            raise MonitorError(f"--{name}: an empty command")
        if timeout_s <= 0:
            raise MonitorError(f"--{name}-timeout: must be > 0, got {timeout_s:g}")
        self.argv = tuple(argv)
        self.timeout_s = timeout_s
        self.name = name

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        """Run the command within ``timeout_s`` (or describe it)."""
        argv = expand_argv(self.argv, ctx.target)
        shown = " ".join(argv)
        if not execute:
            return ActionResult(
                action=self.name, executed=False, ok=True, detail=f"dry run: would run {shown}"
            )
        result, abandoned = run_bounded(argv, self.timeout_s)
        if result.error is not None:
            return ActionResult(
                action=self.name, executed=True, ok=False, detail=f"{shown}: {result.error}"
            )
        tail = (result.stderr or result.stdout or "").strip().splitlines()[-1:] or [""]
        ok = result.exit_code == 0
        detail = f"{shown}: exit {result.exit_code}" + (f" ({tail[0][:200]})" if tail[0] else "")
        return ActionResult(action=self.name, executed=True, ok=ok, detail=detail)


class PreStopHook(CommandAction):
    """A bounded command run before the stop (checkpoint, notify, drain).

    The stop proceeds when the hook fails or times out (as SkyPilot's hooks do);
    the result is logged with the decision.
    """

    def __init__(
        self, argv: Sequence[str], *, timeout_s: float = 300.0, name: str = "pre-stop"
    ) -> None:
        super().__init__(argv, timeout_s=timeout_s, name=name)


class WebhookAction:
    """POST the decision as JSON to a URL.

    The body is ``{"event": "gpuplan.watch.<action>", "target": ..., "reason": ...,
    "decision": {...}, "host": "<hostname>"}``.

    Args:
        url: an ``http://`` or ``https://`` URL.
        timeout_s: HTTP timeout in seconds.
        event: the event name (``idle-stop`` or ``scale-in``).
    """

    name = "webhook"

    def __init__(self, url: str, *, timeout_s: float = 10.0, event: str = "idle-stop") -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise MonitorError(f"--webhook: expected an http(s) URL, got {url!r}")
        self.url = url
        self.timeout_s = timeout_s
        self.event = event

    def body(self, ctx: ActionContext) -> dict[str, Any]:
        """The JSON body that is (or would be) posted."""
        return {
            "event": f"gpuplan.watch.{self.event}",
            "target": ctx.target,
            "reason": ctx.reason,
            "decision": dict(ctx.decision),
            "host": socket.gethostname(),
        }

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        """POST the body (or describe it)."""
        if not execute:
            return ActionResult(
                action=self.name,
                executed=False,
                ok=True,
                detail=f"dry run: would POST to {self.url}",
            )
        data = json.dumps(self.body(ctx)).encode("utf-8")
        request = urllib.request.Request(  # noqa: S310 - scheme checked in __init__
            self.url, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:  # noqa: S310
                status = int(resp.status)
        except urllib.error.HTTPError as exc:
            return ActionResult(
                action=self.name,
                executed=True,
                ok=False,
                detail=f"POST {self.url}: HTTP {exc.code}",
            )
        except (urllib.error.URLError, OSError) as exc:
            return ActionResult(
                action=self.name, executed=True, ok=False, detail=f"POST {self.url}: {exc}"
            )
        return ActionResult(
            action=self.name,
            executed=True,
            ok=200 <= status < 300,
            detail=f"POST {self.url}: HTTP {status}",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionPlan:
    """The ordered steps run when an action is due: pre-stop hook, webhook, main.

    Attributes:
        pre_stop: bounded hook run first; its failure does not stop the plan.
        notify: webhook posted before the main action.
        main: the stop/scale action; ``None`` = observe and log only.
    """

    pre_stop: Action | None = None
    notify: Action | None = None
    main: Action | None = None

    def describe(self) -> str:
        """A short description for logs and status."""
        steps = [a.name for a in (self.pre_stop, self.notify, self.main) if a is not None]
        return " -> ".join(steps) if steps else "log only"

    @property
    def has_hooks(self) -> bool:
        """Whether anything runs before the main action (pre-stop hook or webhook)."""
        return self.pre_stop is not None or self.notify is not None

    def run(self, ctx: ActionContext, *, execute: bool) -> tuple[ActionResult, ...]:
        """Run every step in order; never raises for an expected failure."""
        return self.run_hooks(ctx, execute=execute) + self.run_main(ctx, execute=execute)

    def run_hooks(self, ctx: ActionContext, *, execute: bool) -> tuple[ActionResult, ...]:
        """Run the pre-stop hook and the webhook (the agent re-checks after them)."""
        steps = (self.pre_stop, self.notify)
        return tuple(step.run(ctx, execute=execute) for step in steps if step is not None)

    def run_main(self, ctx: ActionContext, *, execute: bool) -> tuple[ActionResult, ...]:
        """Run the main action alone (empty when there is none)."""
        return () if self.main is None else (self.main.run(ctx, execute=execute),)
