"""The table-layout helper: columns chosen by width, one line per row, --wide keeps all."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from gpuplan.report.table import Column, fit_columns, render_table, table_width

COLUMNS = (
    Column(header="#", justify="right"),
    Column(header="GPU"),
    Column(header="offering", shrink=True, min_width=12),
    Column(header="region", priority=3, shrink=True, min_width=8),
    Column(header="strategy", priority=4, shrink=True, min_width=10),
    Column(header="time", justify="right"),
    Column(header="cost USD", justify="right"),
    Column(header="per 1M tok", priority=6, justify="right"),
    Column(header="headroom", priority=5, justify="right"),
)
ROWS = [
    (
        str(i),
        "A100-40GB",
        f"verda {i}A100.40S.176V.with-a-very-long-name x1",
        "europe-west4-a +3",
        "zero1 dp8 mb4 ga2 ckpt=full",
        "105.1m",
        f"{1234.5 * i:,.2f}",
        "0.015",
        "3 GiB",
    )
    for i in range(1, 11)
]


def render(width: int, *, wide: bool = False) -> list[str]:
    buf = io.StringIO()
    out = Console(file=buf, width=width, color_system=None, force_terminal=False)
    out.print(render_table(COLUMNS, ROWS, width=None if wide else width, wide=wide, title="t"))
    return buf.getvalue().splitlines()


def body_lines(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.startswith("│")]


@pytest.mark.parametrize("width", [80, 100, 160])
def test_no_cell_wraps(width: int) -> None:
    lines = render(width)
    assert all(len(ln) <= width for ln in lines), max(len(ln) for ln in lines)
    assert len(body_lines(lines)) == len(ROWS)  # each row on one line
    # numbers are never cut: every cost appears whole
    text = "\n".join(lines)
    for row in ROWS:
        assert row[6] in text


def test_least_important_columns_go_first() -> None:
    narrow = fit_columns(COLUMNS, ROWS, 80)
    assert "per 1M tok" in narrow.dropped
    assert "headroom" in narrow.dropped
    assert {"#", "GPU", "offering", "time", "cost USD"} <= {COLUMNS[i].header for i in narrow.shown}
    mid = fit_columns(COLUMNS, ROWS, 100)
    assert len(mid.shown) >= len(narrow.shown)
    full = fit_columns(COLUMNS, ROWS, 160)
    assert len(full.shown) >= len(mid.shown)


def test_wide_keeps_every_column() -> None:
    layout = fit_columns(COLUMNS, ROWS, 80, wide=True)
    assert layout.dropped == ()
    assert len(layout.shown) == len(COLUMNS)
    lines = render(400, wide=True)
    assert "per 1M tok" in "\n".join(lines)
    assert "verda 3A100.40S.176V.with-a-very-long-name x1" in "\n".join(lines)


def test_caption_names_hidden_columns() -> None:
    text = "\n".join(render(80))
    assert "--wide" in text
    assert "per 1M tok" in text  # named in the caption, not shown as a column


@given(
    width=st.integers(min_value=60, max_value=240),
    cells=st.lists(
        st.tuples(st.text("abcdefghij .-", min_size=1, max_size=40), st.integers(0, 10**9)),
        min_size=1,
        max_size=6,
    ),
)
def test_layout_never_exceeds_width_when_it_can_fit(width: int, cells: list) -> None:  # type: ignore[type-arg]
    cols = (
        Column(header="n", justify="right"),
        Column(header="name", shrink=True, min_width=6),
        Column(header="note", priority=2, shrink=True, min_width=6),
        Column(header="value", justify="right", priority=1),
    )
    rows = [(str(i), name, name[::-1], f"{v:,}") for i, (name, v) in enumerate(cells)]
    layout = fit_columns(cols, rows, width)
    assert layout.total <= width
    assert table_width(layout.widths) == layout.total
