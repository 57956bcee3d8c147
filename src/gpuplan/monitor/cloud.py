"""Build the Alibaba Cloud / Tencent Cloud action the CLI asked for.

:func:`build_cloud_action` is the one constructor (single machine and fleet);
:func:`cloud_action_from_raw` reads the agent's raw option values (flags or a
``--config`` file) and rejects options that would be silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplan.errors import ActionError, MonitorError
from gpuplan.monitor.actions import Action
from gpuplan.monitor.cloud_meta import (
    ALIBABA,
    TENCENT,
    check_group_id,
    check_region,
    parse_endpoint,
)

PROVIDERS = ("alibaba", "tencent")
CLOUD_MODES = ("stop", "scale-in")
# Agent option keys (flag names without --) that only the cloud actions read.
CLOUD_KEYS = (
    "alibaba",
    "tencent",
    "keep-charging",
    "scaling-group",
    "alibaba-endpoint",
    "tencent-endpoint",
    "metadata-url",
)


def build_cloud_action(  # noqa: PLR0913 - one keyword per option
    provider: str,
    mode: str,
    *,
    keep_charging: bool = False,
    min_size: int = 1,
    group: str | None = None,
    instance_id: str | None = None,
    region: str | None = None,
    endpoint: str | None = None,
    metadata_url: str | None = None,
) -> Action:
    """The action for ``--alibaba MODE`` / ``--tencent MODE`` (fleet: ``mode="scale-in"``).

    Args:
        provider: ``alibaba`` or ``tencent``.
        mode: ``stop`` or ``scale-in``.
        keep_charging: stop without the no-charge stopped mode (stop only).
        min_size: scale-in floor (the group's own minimum is a floor too).
        group: scaling group id (``asg-...``); required for Alibaba and in fleet mode.
        instance_id: the instance, or ``None`` for instance metadata.
        region: the region, or ``None`` for instance metadata.
        endpoint: API endpoint override (``http://127.0.0.1:PORT`` in tests).
        metadata_url: instance-metadata base URL override.

    Raises:
        MonitorError: an unknown provider or mode, options that do not apply,
            or a missing SDK (with the install hint).
        ActionError: a malformed instance id or region.
    """
    if provider not in PROVIDERS:
        raise MonitorError(f"unknown cloud {provider!r}: expected one of {', '.join(PROVIDERS)}")
    spec = ALIBABA if provider == "alibaba" else TENCENT
    if mode not in CLOUD_MODES:
        raise MonitorError(f"{spec.flag}: expected stop or scale-in, got {mode!r}")
    if instance_id is not None:
        try:
            spec.check_instance_id(instance_id)
        except ActionError as exc:
            raise MonitorError(f"--instance-id: {exc.message}") from exc
    if region is not None:
        check_region(region, spec)
    if metadata_url is not None:
        parse_endpoint(metadata_url, "--metadata-url")
    where: dict[str, Any] = {
        "instance_id": instance_id,
        "region": region,
        "endpoint": endpoint,
        "metadata_url": metadata_url,
    }
    if mode == "stop":
        if group is not None:
            raise MonitorError(f"--scaling-group: only used with {spec.flag} scale-in")
        if provider == "alibaba":
            from gpuplan.monitor.alibaba import AlibabaStopAction

            return AlibabaStopAction(keep_charging=keep_charging, **where)
        from gpuplan.monitor.tencent import TencentStopAction

        return TencentStopAction(keep_charging=keep_charging, **where)
    if keep_charging:
        raise MonitorError(f"--keep-charging: only used with {spec.flag} stop")
    if group is not None:
        check_group_id(group, "--scaling-group")
    if provider == "alibaba":
        from gpuplan.monitor.alibaba import EssScaleInAction

        if group is None:
            raise MonitorError(
                "--scaling-group: required with --alibaba scale-in (ESS looks instances up by "
                "group)",
                hint="pass the ESS scaling group id, e.g. --scaling-group asg-bp1abcd2efgh3ijk",
            )
        return EssScaleInAction(min_size=min_size, group=group, **where)
    from gpuplan.monitor.tencent import TencentScaleInAction

    return TencentScaleInAction(min_size=min_size, group=group, **where)


def cloud_action_from_raw(raw: Mapping[str, Any]) -> Action | None:
    """The cloud action from the agent's raw options, or ``None`` when none is asked for.

    Options that belong to a cloud action but would be ignored (an endpoint for
    the other cloud, ``--keep-charging`` without a stop) are errors.
    """
    from gpuplan.monitor.config import boolean, choice, integer

    asked = [p for p in PROVIDERS if raw.get(p)]
    if len(asked) > 1:
        raise MonitorError("--alibaba and --tencent both given: choose one stop action")
    provider = asked[0] if asked else None
    for other in PROVIDERS:
        if raw.get(f"{other}-endpoint") and provider != other:
            raise MonitorError(f"--{other}-endpoint: only used with --{other}")
    keep = boolean(raw.get("keep-charging", False), "--keep-charging")
    if provider is None:
        for key in ("metadata-url", "scaling-group"):
            if raw.get(key):
                raise MonitorError(f"--{key}: only used with --alibaba or --tencent")
        if keep:
            raise MonitorError("--keep-charging: only used with --alibaba stop or --tencent stop")
        return None
    mode = choice(raw[provider], f"--{provider}", CLOUD_MODES)
    return build_cloud_action(
        provider,
        mode,
        keep_charging=keep,
        min_size=integer(raw.get("min-size", 1), "--min-size", low=0),
        group=_opt_str(raw.get("scaling-group")),
        instance_id=_opt_str(raw.get("instance-id")),
        region=_opt_str(raw.get("region")),
        endpoint=_opt_str(raw.get(f"{provider}-endpoint")),
        metadata_url=_opt_str(raw.get("metadata-url")),
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def fleet_cloud_action(
    *,
    alibaba_ess: str | None,
    tencent_asg: str | None,
    min_size: int,
    region: str | None,
    alibaba_endpoint: str | None,
    tencent_endpoint: str | None,
    other: str | None = None,
) -> Action | None:
    """The fleet removal action for ``--alibaba-ess GROUP_ID`` / ``--tencent-asg GROUP_ID``.

    The target instance comes from each decision (its ``--instance-label``
    value, which must be an instance id of that cloud). ``other`` names another
    removal option given on the command line (``--aws-asg``, ``--command``).
    """
    given = [f for f, v in (("--alibaba-ess", alibaba_ess), ("--tencent-asg", tencent_asg)) if v]
    if other is not None:
        given.append(other)
    if len(given) > 1:
        raise MonitorError(f"{given[0]} and {given[1]} both given: choose one removal action")
    if alibaba_endpoint and not alibaba_ess:
        raise MonitorError("--alibaba-endpoint: only used with --alibaba-ess")
    if tencent_endpoint and not tencent_asg:
        raise MonitorError("--tencent-endpoint: only used with --tencent-asg")
    if alibaba_ess:
        group = check_group_id(alibaba_ess, "--alibaba-ess")
        provider, endpoint = "alibaba", alibaba_endpoint
    elif tencent_asg:
        group = check_group_id(tencent_asg, "--tencent-asg")
        provider, endpoint = "tencent", tencent_endpoint
    else:
        return None
    return build_cloud_action(
        provider, "scale-in", min_size=min_size, group=group, region=region, endpoint=endpoint
    )
