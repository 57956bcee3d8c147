"""English and Simplified Chinese texts of the web pages, from ``i18n/<lang>.yaml``.

The language comes from ``?lang=``, then the ``lang`` cookie, then the browser's
``Accept-Language``; English otherwise. Numbers use the locale's grouping
(``1,234.5`` in both en-US and zh-CN) and units come from the catalog files.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from gpuplan.report.svg import TEXT as SVG_TEXT

LANGS = ("en", "zh")
DEFAULT = "en"


@functools.cache
def messages(lang: str) -> dict[str, str]:
    """The flat message catalog of one language."""
    text = resources.files("gpuplan.web").joinpath(f"i18n/{lang}.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    return {str(k): str(v) for k, v in data.items()}


def pick(query: str | None, cookie: str | None, accept_language: str | None) -> str:
    """The page language from the query, the cookie, then ``Accept-Language`` (by q)."""
    for choice in (query, cookie):
        if choice and choice.lower()[:2] in LANGS:
            return choice.lower()[:2]
    ranked: list[tuple[float, int, str]] = []
    for i, part in enumerate((accept_language or "").split(",")):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0
        ranked.append((-q, i, tag.strip().lower()[:2]))
    return next((lang for _, _, lang in sorted(ranked) if lang in LANGS), DEFAULT)


class Texts:
    """Messages, numbers, durations and money in one language."""

    def __init__(self, lang: str) -> None:
        self.lang = lang if lang in LANGS else DEFAULT
        self._m = messages(self.lang)

    def __call__(self, key: str, **kw: Any) -> str:
        """The message ``key`` with ``{placeholders}`` filled (the key itself if missing)."""
        text = self._m.get(key, messages(DEFAULT).get(key, key))
        return text.format(**kw) if kw else text

    def get(self, key: str, default: str) -> str:
        """The message ``key``, or ``default`` where neither catalog has it."""
        return self._m.get(key, default)

    def num(self, value: float | None, digits: int = 0) -> str:
        """A number with the locale's digit grouping; ``-`` for None."""
        if value is None:
            return "-"
        return f"{value:,.{digits}f}"

    def money(self, value: float | None, currency: str) -> str:
        """An amount with its currency, e.g. ``1,234.50 USD`` / ``1,234.50 美元``."""
        if value is None:
            return "-"
        return f"{value:,.2f} {self.get(f'currency.{currency}', currency)}"

    def duration(self, seconds: float | None) -> str:
        """A duration in the largest sensible unit: ``45 s``, ``12.5 min``, ``3.2 h``, ``4.1 d``."""
        if seconds is None:
            return "-"
        for limit, per, unit in ((120, 1.0, "s"), (7200, 60.0, "min"), (3 * 86400, 3600.0, "h")):
            if seconds < limit:
                return f"{seconds / per:,.1f} {self(f'unit.{unit}')}"
        return f"{seconds / 86400:,.1f} {self('unit.d')}"

    def gib(self, n_bytes: float | None) -> str:
        """Bytes as GiB with one decimal."""
        return "-" if n_bytes is None else f"{n_bytes / 2**30:,.1f} GiB"

    def svg(self) -> dict[str, str]:
        """The chart texts (:data:`gpuplan.report.svg.TEXT`) in this language."""
        out = {k: self.get(f"svg.{k}", v) for k, v in SVG_TEXT.items()}
        out.update({k: v for k, v in self._m.items() if k.startswith("billing.")})
        return out
