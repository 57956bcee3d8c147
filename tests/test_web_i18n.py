"""Both languages have every text; pages pick the language from ?lang, cookie or the browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpuplan.web.i18n import LANGS, Texts, pick

I18N = Path(__file__).resolve().parents[1] / "src" / "gpuplan" / "web" / "i18n"
SRC = I18N.parent


def test_every_language_has_the_same_keys() -> None:
    catalogs = {lang: yaml.safe_load((I18N / f"{lang}.yaml").read_text("utf-8")) for lang in LANGS}
    keys = set(catalogs["en"])
    for lang, data in catalogs.items():
        assert set(data) == keys, f"{lang}: {sorted(set(data) ^ keys)}"
        assert all(isinstance(v, str) and v for v in data.values()), lang
        for key in keys:  # the same placeholders in every language
            assert set(re.findall(r"{(\w+)}", data[key])) == set(
                re.findall(r"{(\w+)}", catalogs["en"][key])
            ), f"{lang}: {key}"


def test_every_key_the_code_uses_exists() -> None:
    en = yaml.safe_load((I18N / "en.yaml").read_text("utf-8"))
    used: set[str] = set()
    for path in SRC.glob("*.py"):
        used |= set(re.findall(r"""\bt\(\s*["']([a-z_]+\.[a-z_.]+)["']""", path.read_text("utf-8")))
    assert used, "no t('...') calls found"
    assert sorted(used - set(en)) == []


def test_chart_texts_are_translated() -> None:
    from gpuplan.report.svg import TEXT

    zh = Texts("zh").svg()
    assert set(TEXT) <= set(zh)
    assert zh["memory.axis"] != TEXT["memory.axis"]
    assert zh["billing.spot"] == "竞价"  # the legend's billing modes


@pytest.mark.parametrize(
    ("query", "cookie", "header", "lang"),
    [
        ("zh", None, None, "zh"),
        (None, None, "zh-CN,zh;q=0.9,en;q=0.8", "zh"),
        (None, None, "en-US,en;q=0.9,zh-CN;q=0.8", "en"),
        (None, None, "fr-FR,zh;q=0.5", "zh"),
        (None, "zh", "en", "zh"),
        ("en", "zh", "zh-CN", "en"),
        (None, None, None, "en"),
        ("xx", None, "garbage;;q=x", "en"),
    ],
)
def test_language_choice(
    query: str | None, cookie: str | None, header: str | None, lang: str
) -> None:
    assert pick(query, cookie, header) == lang


def test_numbers_units_and_money_per_locale() -> None:
    en, zh = Texts("en"), Texts("zh")
    assert en.num(1234567.891, 2) == "1,234,567.89" == zh.num(1234567.891, 2)
    assert en.duration(5400) == "90.0 min" and zh.duration(5400) == "90.0 分钟"
    assert en.duration(86400) == "24.0 h" and zh.duration(86400) == "24.0 小时"
    assert en.money(1234.5, "CNY") == "1,234.50 CNY" and zh.money(1234.5, "CNY") == "1,234.50 元"


def test_pages_in_chinese(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from gpuplan.web.app import create_app

    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    client = TestClient(create_app(tmp_path / "web.db"))
    zh = client.get("/", headers={"accept-language": "zh-CN,zh;q=0.9"})
    assert '<html lang="zh-CN"' in zh.text and "规划训练任务" in zh.text
    assert zh.cookies.get("lang") == "zh"
    for url in ("/?lang=zh", "/fit?lang=zh", "/bill?lang=zh", "/catalog?lang=zh&gpu=H100-SXM"):
        text = client.get(url).text
        raw = re.findall(r">\s*((?:col|form|field|nav|title|opt|h|share|plan)\.[a-z_]+)\s*<", text)
        assert raw == [], f"{url}: untranslated keys {raw}"
