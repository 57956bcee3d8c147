"""The page shell: head, navigation, language switch; every asset from ``/static``."""

from __future__ import annotations

from gpuplan.report.svg import esc
from gpuplan.web.i18n import LANGS, Texts

NAV = (
    ("/", "nav.plan"),
    ("/fit", "nav.fit"),
    ("/serve", "nav.serve"),
    ("/bill", "nav.bill"),
    ("/catalog", "nav.catalog"),
)


def page(t: Texts, title: str, body: str, *, path: str, query: str = "") -> str:
    """A whole HTML document in ``t``'s language around ``body``."""
    nav = "".join(
        f'<a href="{href}?lang={t.lang}"{" class=on" if href == path else ""}>{esc(t(key))}</a>'
        for href, key in NAV
    )
    sep = "&" if query else ""
    switch = " | ".join(
        f'<a hreflang="{lang}" data-lang="{lang}" href="{esc(path)}?{esc(query)}{sep}lang={lang}"'
        f"{' class=on' if lang == t.lang else ''}>{esc(t(f'lang.{lang}'))}</a>"
        for lang in LANGS
    )
    html_lang = "zh-CN" if t.lang == "zh" else "en"
    return f"""<!DOCTYPE html>
<html lang="{html_lang}" data-lang="{t.lang}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} - gpuplan</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/app.css">
<script src="/static/app.js" defer></script>
</head>
<body>
<header><strong>gpuplan</strong><nav>{nav}<a href="/docs">API</a></nav>
<span class="langs">{switch}</span></header>
<main>
<h1>{esc(title)}</h1>
{body}
</main>
<footer>{esc(t("footer"))}</footer>
</body>
</html>
"""
