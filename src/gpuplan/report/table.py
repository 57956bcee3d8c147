"""Terminal tables that fit the screen: one place for every command's column choice.

A command describes its table as :class:`Column` s (each with a priority) and
rows of strings; :func:`fit_columns` decides, for a terminal width, which
columns to show and how wide the abbreviated ones may be, and
:func:`render_table` builds the Rich table. Rules:

* every cell stays on one line (``no_wrap``); a number is never cut;
* below the width the table needs, the columns with the highest ``priority``
  number (least important) are dropped first, then long text cells of
  ``shrink`` columns (offering names, strategies) are abbreviated with an
  ellipsis down to ``min_width``;
* ``wide=True`` (``--wide``, or output that is not a terminal) keeps every
  column at full width.

Nothing here prints: the CLI owns the console.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from rich.table import Table
from rich.text import Text

Justify = Literal["left", "right", "center"]

ESSENTIAL = 0
"""Priority of columns that are never dropped."""

_BORDER = 1
"""Rich's default box: one character of border on the left of every column, one at the end."""
_PADDING = 2
"""Rich's default padding: one space each side of a cell."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Column:
    """One table column and how it behaves on a narrow terminal."""

    header: str
    priority: int = ESSENTIAL
    """0 = always shown; larger numbers are dropped first when the terminal is narrow."""
    justify: Justify = "left"
    shrink: bool = False
    """Long text that may be abbreviated with an ellipsis (never numbers)."""
    min_width: int = 8
    """Narrowest an abbreviated (``shrink``) column gets."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Which columns a table shows at a width, and their widths."""

    shown: tuple[int, ...]
    """Indexes of the shown columns, in table order."""
    widths: tuple[int, ...]
    """Content width of each shown column."""
    dropped: tuple[str, ...]
    """Headers of the dropped columns."""

    @property
    def total(self) -> int:
        """Characters the rendered table needs."""
        return table_width(self.widths)


def cell_width(text: str) -> int:
    """Printed width of a cell (Rich markup removed)."""
    return Text.from_markup(text).cell_len


def table_width(widths: Sequence[int]) -> int:
    """Characters a bordered, padded table with these content widths needs."""
    return sum(w + _PADDING + _BORDER for w in widths) + _BORDER


def fit_columns(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    width: int | None,
    *,
    wide: bool = False,
) -> Layout:
    """Choose the columns and widths for a table ``width`` characters wide.

    Args:
        columns: the table's columns, in display order.
        rows: cell texts (Rich markup allowed), one per column.
        width: the terminal's width; None = unlimited.
        wide: keep every column at its full width whatever the width.
    """
    natural = [
        max([cell_width(c.header), *(cell_width(r[i]) for r in rows)])
        for i, c in enumerate(columns)
    ]
    shown = list(range(len(columns)))
    if wide or width is None or table_width(natural) <= width:
        return Layout(shown=tuple(shown), widths=tuple(natural), dropped=())

    def narrowest(i: int) -> int:
        c = columns[i]
        if not c.shrink:
            return natural[i]
        return min(natural[i], max(c.min_width, cell_width(c.header)))

    droppable = sorted(
        (i for i, c in enumerate(columns) if c.priority != ESSENTIAL),
        key=lambda i: (-columns[i].priority, -i),
    )
    dropped: list[int] = []
    while table_width([narrowest(i) for i in shown]) > width and droppable:
        i = droppable.pop(0)
        shown.remove(i)
        dropped.append(i)
    # columns dropped too eagerly come back if they fit at full width, most important first
    for i in sorted(dropped, key=lambda i: columns[i].priority):
        trial = sorted([*shown, i])
        if table_width([narrowest(j) for j in trial]) <= width:
            shown = trial
            dropped.remove(i)
    widths = {i: narrowest(i) for i in shown}
    spare = width - table_width(list(widths.values()))
    for i in shown:  # give the room left to the abbreviated columns, left to right
        grow = min(max(spare, 0), natural[i] - widths[i])
        widths[i] += grow
        spare -= grow
    return Layout(
        shown=tuple(shown),
        widths=tuple(widths[i] for i in shown),
        dropped=tuple(columns[i].header for i in sorted(dropped)),
    )


def render_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    width: int | None,
    wide: bool = False,
    title: str | None = None,
) -> Table:
    """A Rich table of ``rows`` that fits ``width`` (see :func:`fit_columns`).

    The caption names the dropped columns and how to see them.
    """
    layout = fit_columns(columns, rows, width, wide=wide)
    caption = None
    if layout.dropped:
        caption = f"hidden to fit: {', '.join(layout.dropped)} (--wide shows all)"
    table = Table(title=title, caption=caption)
    for i, w in zip(layout.shown, layout.widths, strict=True):
        c = columns[i]
        table.add_column(
            c.header,
            justify=c.justify,
            no_wrap=True,
            overflow="ellipsis",
            min_width=w,
            max_width=w,
        )
    for row in rows:
        table.add_row(*(row[i] for i in layout.shown))
    return table
