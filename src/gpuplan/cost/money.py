"""Currency conversion with the catalog's dated FX rates.

The catalog stores rates as *units of each currency per 1 USD* (``fx.yaml``),
so converting ``amount`` from ``A`` to ``B`` is ``amount / per_usd[A] * per_usd[B]``.
This module does the same arithmetic as :meth:`gpuplan.catalog.loader.Catalog.convert`
without building a dict per call, and returns the rate it used so that a cost
breakdown can record it with its ``as_of`` date.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from gpuplan.catalog.schema import FxRates
from gpuplan.errors import UnknownNameError


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FxUse:
    """One conversion rate a cost used.

    Attributes:
        from_currency: ISO code of the price.
        to_currency: ISO code of the result.
        rate: units of ``to_currency`` per unit of ``from_currency``.
        as_of: date of the catalog's rates.
        source: where the catalog's rates come from.
    """

    from_currency: str
    to_currency: str
    rate: float
    as_of: dt.date
    source: str

    def describe(self) -> str:
        """One line for a breakdown's assumptions.

        >>> FxUse(from_currency="CNY", to_currency="USD", rate=0.147, as_of=dt.date(2026, 5, 8),
        ...       source="ECB").describe()
        'FX: 1 CNY = 0.147 USD (catalog rate as of 2026-05-08, ECB)'
        """
        return (
            f"FX: 1 {self.from_currency} = {self.rate:.6g} {self.to_currency} "
            f"(catalog rate as of {self.as_of.isoformat()}, {self.source})"
        )


def _per_usd(fx: FxRates, currency: str) -> float:
    if currency == "USD":
        return 1.0
    rate = fx.per_usd.get(currency)
    if rate is None:
        raise UnknownNameError("currency", currency, ["USD", *fx.per_usd], field="currency")
    return rate


def fx_rate(fx: FxRates, from_currency: str, to_currency: str) -> float:
    """Units of ``to_currency`` per unit of ``from_currency``.

    Args:
        fx: the catalog's rates (units per 1 USD).
        from_currency: ISO code converted from.
        to_currency: ISO code converted to.

    Raises:
        UnknownNameError: a currency the catalog has no rate for.

    >>> rates = FxRates(per_usd={"CNY": 7.0, "EUR": 0.5}, source="test", as_of=dt.date(2026, 1, 1))
    >>> fx_rate(rates, "CNY", "USD")
    0.14285714285714285
    >>> fx_rate(rates, "EUR", "CNY")
    14.0
    >>> fx_rate(rates, "USD", "USD")
    1.0
    """
    if from_currency == to_currency:
        return 1.0
    return _per_usd(fx, to_currency) / _per_usd(fx, from_currency)


def fx_use(fx: FxRates, from_currency: str, to_currency: str) -> FxUse | None:
    """The conversion record for a breakdown, or None when no conversion is needed.

    >>> rates = FxRates(per_usd={"CNY": 8.0}, source="test", as_of=dt.date(2026, 1, 1))
    >>> fx_use(rates, "CNY", "USD").rate
    0.125
    >>> fx_use(rates, "USD", "USD") is None
    True
    """
    if from_currency == to_currency:
        return None
    return FxUse(
        from_currency=from_currency,
        to_currency=to_currency,
        rate=fx_rate(fx, from_currency, to_currency),
        as_of=fx.as_of,
        source=" ".join(fx.source.split()),
    )
