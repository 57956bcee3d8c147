"""Command, pre-stop hook and webhook actions (webhook against a loopback server)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from watch_helpers import Recorder, free_port

from gpuplan.errors import MonitorError
from gpuplan.monitor.actions import (
    ActionContext,
    ActionPlan,
    CommandAction,
    PreStopHook,
    WebhookAction,
)

CTX = ActionContext(
    reason="idle 600s of 600s window; stop due", decision={"t": 600.0, "state": "idle"}
)


def test_command_is_dry_run_unless_execute(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    action = CommandAction([sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"])
    dry = action.run(CTX, execute=False)
    assert dry.ok and not dry.executed and "would run" in dry.detail
    assert not marker.exists()
    done = action.run(CTX, execute=True)
    assert done.ok and done.executed and marker.exists()


def test_command_is_never_run_through_a_shell(tmp_path: Path) -> None:
    marker = tmp_path / "injected"
    argv = [sys.executable, "-c", "import sys; print(sys.argv[1:])", f"; touch {marker}", "$(id)"]
    result = CommandAction(argv).run(CTX, execute=True)
    assert result.ok and not marker.exists()
    assert "$(id)" in result.detail  # the argument arrived verbatim


def test_command_failure_and_timeout() -> None:
    fail = CommandAction([sys.executable, "-c", "import sys; sys.exit(3)"]).run(CTX, execute=True)
    assert not fail.ok and "exit 3" in fail.detail
    started = time.monotonic()
    slow = CommandAction([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.3)
    result = slow.run(CTX, execute=True)
    assert not result.ok and "timed out" in result.detail
    assert time.monotonic() - started < 5
    with pytest.raises(MonitorError, match="--command: an empty command"):
        CommandAction([])


def test_pre_stop_hook_is_bounded_and_the_stop_proceeds(tmp_path: Path) -> None:
    order = tmp_path / "order"
    hook = PreStopHook([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.3)
    main = CommandAction([sys.executable, "-c", f"open({str(order)!r}, 'a').write('stop')"])
    results = ActionPlan(pre_stop=hook, main=main).run(CTX, execute=True)
    assert [r.action for r in results] == ["pre-stop", "command"]
    assert not results[0].ok and "timed out" in results[0].detail
    assert results[1].ok and order.read_text() == "stop"


def test_fleet_target_is_substituted() -> None:
    action = CommandAction(["drain", "--node", "{instance}"])
    ctx = ActionContext(reason="r", target="i-0abc")
    assert action.run(ctx, execute=False).detail == "dry run: would run drain --node i-0abc"


def test_webhook_posts_the_decision(webhook_server: tuple[str, Recorder]) -> None:
    url, rec = webhook_server
    hook = WebhookAction(url)
    assert not hook.run(CTX, execute=False).executed and rec.requests == []
    result = hook.run(CTX, execute=True)
    assert result.ok and "HTTP 204" in result.detail
    body = rec.requests[0]["body"]
    assert body["event"] == "gpuplan.watch.idle-stop"
    assert body["reason"] == CTX.reason and body["decision"]["t"] == 600.0


def test_webhook_failures_are_results_not_crashes() -> None:
    result = WebhookAction(f"http://127.0.0.1:{free_port()}/hook", timeout_s=1).run(
        CTX, execute=True
    )
    assert not result.ok and result.executed
    with pytest.raises(MonitorError, match="--webhook"):
        WebhookAction("file:///etc/passwd")


def test_plan_description() -> None:
    assert ActionPlan().describe() == "log only"
    plan = ActionPlan(pre_stop=PreStopHook(["true"]), main=CommandAction(["true"]))
    assert plan.describe() == "pre-stop -> command"
