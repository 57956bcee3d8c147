"""What every live price fetcher shares: the request, the quotes, retries, HTTP, errors.

A fetcher asks one provider's own price API (with the user's own credentials,
from that SDK's standard chain) for the prices of instance types the catalog
already describes, and returns :class:`Quote` rows; :mod:`.writer` turns them
into an overrides file. Nothing here prints: progress goes to a callback the
CLI may draw as a bar.

Retries: a throttled call (the provider's "too many requests" answer) is
retried up to ``max_retries`` times with exponential backoff
(``backoff_s * 2**attempt``, capped at 30 s); after that, or on any other
failure, a one-line :class:`FetchError`. Credentials are never logged or
written: errors name the missing credential, never its value.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from gpuplan.errors import CatalogError

T = TypeVar("T")
Unit = Literal["per_hour", "per_month", "per_year"]
Progress = Callable[[int, int, str], None]
"""``progress(done, total, what)``: called after each request group."""

MAX_BACKOFF_S = 30.0


class FetchError(CatalogError):
    """A live price fetch failed: credentials, throttling, a region that sells nothing."""


class Throttled(Exception):  # noqa: N818 - internal signal, never reaches the user
    """Raised by a fetcher's call when the provider answered "too many requests"."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FetchRequest:
    """What to fetch and how.

    Attributes:
        regions: provider region ids; empty = every real region the catalog lists for
            the provider's offerings.
        gpus: GPU ids (canonical); empty = every GPU the provider's offerings carry.
        endpoint: base URL (or host) replacing the provider's public endpoint (tests,
            proxies, sovereign clouds).
        timeout_s: per-request timeout, seconds.
        max_retries: retries of a throttled request before giving up.
        backoff_s: first backoff, seconds (doubled after each throttled try).
        currency: currency of the account's prices where the API does not say (Tencent).
        api_key: an API key (GCP); None = the SDK's standard credential chain.
        now: the fetch time (UTC); it becomes every price's ``as_of``.
    """

    regions: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    endpoint: str | None = None
    timeout_s: float = 20.0
    max_retries: int = 4
    backoff_s: float = 1.0
    currency: str | None = None
    api_key: str | None = None
    now: dt.datetime = dataclasses.field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Quote:
    """One price read from a provider's API: an instance type, a region, a billing mode."""

    instance_type: str
    region: str
    mode: str
    amount: float
    unit: Unit
    currency: str
    action: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FetchOutcome:
    """A fetcher's answer: the quotes, the regions it asked, and what it could not price."""

    quotes: tuple[Quote, ...]
    regions_asked: tuple[str, ...]
    modes: tuple[str, ...]
    """Billing modes the fetcher asks for: its quotes replace these modes in the regions asked."""
    skipped: tuple[str, ...] = ()


def with_retries(
    call: Callable[[], T],
    *,
    what: str,
    req: FetchRequest,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``call``; on :class:`Throttled`, back off and retry (bounded), then fail in one line."""
    for attempt in range(req.max_retries + 1):
        try:
            return call()
        except Throttled:
            if attempt == req.max_retries:
                break
            sleep(min(req.backoff_s * 2**attempt, MAX_BACKOFF_S))
    raise FetchError(
        f"{what}: throttled by the provider after {req.max_retries + 1} tries",
        hint="wait a minute and run again, or fetch fewer regions/GPUs (--region, --gpu)",
    )


def http_get_json(url: str, *, headers: dict[str, str] | None = None, timeout_s: float) -> Any:
    """GET ``url`` and parse JSON; HTTP 429 (and 503) raise :class:`Throttled`."""
    request = urllib.request.Request(url, headers={"Accept": "application/json", **(headers or {})})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310
            return json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        if exc.code in (429, 503):
            raise Throttled() from exc
        body = exc.read().decode("utf-8", "replace")[:200]
        raise FetchError(
            f"GET {_strip_query(url)}: HTTP {exc.code}: {' '.join(body.split())}"
        ) from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FetchError(
            f"GET {_strip_query(url)}: cannot reach the price API: {reason}",
            hint="check the network or --endpoint; --timeout raises the per-request limit",
        ) from exc
    except ValueError as exc:
        raise FetchError(f"GET {_strip_query(url)}: the answer is not JSON") from exc


def _strip_query(url: str) -> str:
    """The URL without its query (which may carry an API key): never logged."""
    return url.split("?", 1)[0]


def tick(progress: Progress | None, done: int, total: int, what: str) -> None:
    """Report progress when a callback is given."""
    if progress is not None:
        progress(done, total, what)


def choose_regions(
    req: FetchRequest, catalog_regions: Sequence[str], known: Sequence[str], *, kind: str
) -> tuple[str, ...]:
    """The regions to ask: ``--region`` values (checked, did-you-mean) or the catalog's real ones.

    Args:
        req: the request.
        catalog_regions: regions the catalog lists for the offerings asked.
        known: every region id of the provider this fetcher knows.
        kind: e.g. "alibaba region" for the error message.
    """
    from gpuplan.errors import UnknownNameError

    if req.regions:
        lower = {k.lower(): k for k in known}
        out = []
        for region in req.regions:
            if region.lower() not in lower:
                raise UnknownNameError(kind, region, known, field="--region")
            out.append(lower[region.lower()])
        return tuple(dict.fromkeys(out))
    real = [r for r in dict.fromkeys(catalog_regions) if r in set(known)]
    if not real:
        raise FetchError(
            f"{kind}: the catalog lists no known region for these offerings",
            hint="name regions with --region",
        )
    return tuple(sorted(real))


def missing_credentials(provider: str, how: str) -> FetchError:
    """The one-line error for credentials the SDK's chain did not find."""
    return FetchError(f"{provider}: no credentials found", hint=how)
