"""plan --html: one self-contained, escaped, deterministic HTML page with inline SVG charts."""

from __future__ import annotations

import dataclasses
import html
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.planner import Plan, PlanSettings, plan
from gpuplan.report import render_html
from gpuplan.report.html import reason_class
from gpuplan.spec import JobSpec, load_spec

EX = Path(__file__).resolve().parents[1] / "examples"
VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}


class _Collector(HTMLParser):
    """Records every tag and attribute and checks that elements nest properly."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(doc: str) -> _Collector:
    p = _Collector()
    p.feed(doc)
    p.close()
    return p


@pytest.fixture(scope="module")
def spec() -> JobSpec:
    return load_spec(EX / "llama3-8b-lora.yaml")


@pytest.fixture(scope="module")
def lora_plan(spec: JobSpec) -> Plan:
    return plan(spec, load_catalog(use_user=False), PlanSettings(top=15))


@pytest.fixture(scope="module")
def doc(lora_plan: Plan, spec: JobSpec) -> str:
    return render_html(lora_plan, spec)


def test_parses_and_nests(doc: str) -> None:
    p = _parse(doc)
    assert doc.startswith("<!DOCTYPE html>")
    assert p.errors == []
    assert p.stack == []
    for tag in ("html", "head", "body", "title", "style", "table", "svg"):
        assert tag in p.tags


def test_charts_are_inline_svg(doc: str, lora_plan: Plan) -> None:
    p = _parse(doc)
    assert p.tags.count("svg") == 2  # cost/time scatter and memory bars
    assert "polyline" in p.tags  # the Pareto front as a connected line
    points = next(v for t, k, v in p.attrs if t == "polyline" and k == "points")
    assert len(points.split()) == len(lora_plan.pareto)
    text = " ".join(p.text)
    assert "Total cost (USD, log scale)" in text
    assert "Memory per GPU (GiB)" in text
    assert any(
        t == "line" and k == "class" and v == "limit" for t, k, v in p.attrs
    )  # the 24 h deadline
    # one capacity tick per memory row, each with a tooltip
    assert sum(1 for t in p.text if t.startswith("capacity ")) == min(len(lora_plan.options), 10)


def test_no_external_resources(doc: str) -> None:
    p = _parse(doc)
    assert "script" not in p.tags
    assert "link" not in p.tags
    assert "img" not in p.tags
    assert "iframe" not in p.tags
    for tag, key, value in p.attrs:
        if key in ("src", "href", "xlink:href", "action", "data"):
            raise AssertionError(f"<{tag} {key}={value!r}> loads or links a resource")
        assert not re.match(r"\s*(https?:)?//", value), (tag, key, value)
    style = "".join(re.findall(r"<style>(.*?)</style>", doc, re.S))
    assert "@import" not in style
    assert "url(" not in style


def test_contains_every_top_option(doc: str, lora_plan: Plan) -> None:
    for o in lora_plan.options:
        assert html.escape(o.instance_type) in doc
        assert html.escape(o.configuration.strategy.label()) in doc
    assert html.escape(lora_plan.options[0].why) in doc


def test_summary_and_provenance(doc: str, lora_plan: Plan) -> None:
    text = " ".join(_parse(doc).text)
    assert "llama-3-8b" in text
    assert "lora (rank 16)" in text
    assert f"gpuplan {lora_plan.provenance['gpuplan_version']}" in text
    for as_of in lora_plan.provenance["price_as_of"]:
        assert as_of in text
    for f in lora_plan.provenance["catalog_files"]:
        assert f in text
    for a in lora_plan.assumptions:
        assert a in text
    assert "Efficiency basis" in text


def test_rejections_summarised_by_class(doc: str, lora_plan: Plan) -> None:
    text = " ".join(_parse(doc).text)
    assert f"Rejected options ({len(lora_plan.rejected):,})" in text
    assert "misses the deadline" in text
    assert "Closest rejected options" in text


def test_deterministic_bytes(lora_plan: Plan, spec: JobSpec, doc: str) -> None:
    assert render_html(lora_plan, spec).encode() == doc.encode()
    again = plan(spec, load_catalog(use_user=False), PlanSettings(top=15))
    assert render_html(again, spec).encode() == doc.encode()


def test_size_is_small(doc: str) -> None:
    assert len(doc.encode()) < 300_000


def test_text_is_escaped(lora_plan: Plan, spec: JobSpec) -> None:
    evil = "<script>alert('x')</script> & \"q\""
    first = dataclasses.replace(lora_plan.options[0], why=evil, warnings=(evil,))
    bad = dataclasses.replace(
        lora_plan, options=(first, *lora_plan.options[1:]), assumptions=(evil,), warnings=(evil,)
    )
    doc = render_html(bad, spec, title=evil)
    assert "<script" not in doc
    assert html.escape(evil) in doc
    assert _parse(doc).errors == []


def test_renders_without_options(lora_plan: Plan, spec: JobSpec) -> None:
    empty = dataclasses.replace(lora_plan, options=(), pareto=(), rejected=())
    doc = render_html(empty, spec)
    p = _parse(doc)
    assert p.errors == []
    assert "No option was ranked." in doc


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("misses the deadline: 53.8 h > 24.0 h", "misses the deadline"),
        ("over budget: 12.00 > 10.00 USD", "over budget"),
        ("llama-3-8b does not fit on 1 x L4 with any strategy tried", "does not fit in GPU memory"),
        ("no price in the catalog", "no price (in the allowed billing modes)"),
        ("provider aws not in constraints.providers", "provider not allowed"),
        ("precision: bf16-mixed needs bf16", "precision not supported by the GPU"),
        ("weird: thing", "weird"),
    ],
)
def test_reason_class(reason: str, expected: str) -> None:
    assert reason_class(reason) == expected


def test_budget_line_and_currency(spec: JobSpec) -> None:
    cny = load_spec(
        EX / "llama3-8b-lora.yaml",
        ["constraints.currency=CNY", "constraints.budget=100", "constraints.deadline=null"],
    )
    p = plan(cny, load_catalog(use_user=False), PlanSettings(objective="time", top=8))
    doc = render_html(p, cny)
    parsed = _parse(doc)
    text = " ".join(parsed.text)
    assert parsed.errors == []
    assert "Total cost (CNY, log scale)" in text
    assert "budget 100.00 CNY" in text  # the budget line's tooltip
    assert "Best by time:" in text
    assert all(o.cost_total <= 100 for o in p.options)
