"""The pages in a real browser: Debian's Chromium driven by Playwright (nothing downloaded).

Skipped, with the reason shown, only where /usr/bin/chromium (or $GPUPLAN_CHROMIUM) is absent;
CI installs it (see .ci/run).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("playwright")

import uvicorn  # noqa: E402
from playwright.sync_api import Browser, Page, expect  # noqa: E402

from gpuplan.spec import parse_spec  # noqa: E402
from gpuplan.web.app import create_app  # noqa: E402

EX = Path(__file__).resolve().parents[1] / "examples"
LORA = (EX / "llama3-8b-lora.yaml").read_text(encoding="utf-8")
RUN_TIMEOUT_MS = 60_000


def _chromium() -> str | None:
    path = os.environ.get("GPUPLAN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    return path if Path(path).is_file() else None


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """pytest-playwright's launch arguments, pointed at the system Chromium."""
    path = _chromium()
    if path is None:
        pytest.skip("Chromium not installed (apt-get install chromium): browser tests skipped")
    return {**browser_type_launch_args, "executable_path": path, "args": ["--no-sandbox"]}


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """uvicorn on 127.0.0.1 and a free port, in a thread, stopped after the module."""
    home = tmp_path_factory.mktemp("web")
    old = os.environ.get("GPUPLAN_HOME")
    os.environ["GPUPLAN_HOME"] = str(home / "home")
    config = uvicorn.Config(
        create_app(home / "web.db"), host="127.0.0.1", port=0, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("uvicorn did not start within 30 s")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        if old is None:
            os.environ.pop("GPUPLAN_HOME", None)
        else:
            os.environ["GPUPLAN_HOME"] = old


def _fill_lora_example(page: Page) -> None:
    """Fill the form field by field with examples/llama3-8b-lora.yaml."""
    page.fill('[data-spec="model"]', "llama-3")
    page.fill('[data-spec="model"]', "llama-3-8b")
    page.select_option('[data-spec="method"]', "lora")
    page.fill('[data-spec="lora.rank"]', "16")
    page.fill('[data-spec="lora.alpha"]', "32")
    page.fill('[data-spec="lora.targets"]', "q_proj, k_proj, v_proj, o_proj")
    page.select_option('[data-spec="precision"]', "bf16-mixed")
    page.select_option('[data-spec="optimizer"]', "adamw")
    page.fill('[data-spec="micro_batch_size"]', "4")
    page.fill('[data-spec="global_batch_size"]', "64")
    page.fill('[data-spec="seq_len"]', "2048")
    page.select_option('[data-spec="activation_checkpointing"]', "full")
    page.fill('[data-spec="work.tokens"]', "200000000")
    page.fill('[data-spec="constraints.deadline"]', "24h")
    page.select_option('[data-spec="constraints.currency"]', "USD")


def test_plan_form_result_share_link_and_chinese(
    page: Page, browser: Browser, live_server: str
) -> None:
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(live_server) else outside.append(r.url))
    page.goto(f"{live_server}/?lang=en")
    assert page.locator("#presets option").count() > 10  # the type-ahead over the presets
    _fill_lora_example(page)
    shown = parse_spec(yaml.safe_load(page.input_value("#spec-yaml")))
    assert shown == parse_spec(yaml.safe_load(LORA))  # the YAML it would run is the example
    page.click("#run")
    assert page.locator('[data-spec="seq_len"]').is_enabled()  # the form stays usable
    rows = page.locator("#ranked tbody tr")
    expect(rows.first).to_be_visible(timeout=RUN_TIMEOUT_MS)
    api = page.request.post(
        f"{live_server}/api/plan", data=LORA, headers={"content-type": "application/yaml"}
    ).json()
    assert rows.count() == len(api["options"])
    for i, option in enumerate(api["options"][:3]):
        assert option["instance_type"] in rows.nth(i).inner_text()
    expect(page.locator("#chart svg circle").first).to_be_attached()
    expect(page.locator("#memory svg rect").first).to_be_attached()
    href = page.get_attribute("#share-link", "href")
    assert href and href.startswith("/plans/")
    assert outside == []  # every asset came from the app

    fresh = browser.new_context()
    try:
        other = fresh.new_page()
        other.goto(live_server + href)
        expect(other.locator("#ranked tbody tr").first).to_be_visible()
        assert (
            api["options"][0]["instance_type"]
            in other.locator("#ranked tbody tr").first.inner_text()
        )
        expect(other.locator("#rerun")).to_be_visible()
        other.click('a[data-lang="zh"]')
        expect(other.locator("h1")).to_have_text("共享的规划")
        expect(other.locator("#ranked th").nth(1)).to_have_text("GPU")
        assert "单卡显存（GiB）" in other.locator("#memory svg").inner_html()
        assert "方案排名" in other.content()
    finally:
        fresh.close()


def test_invalid_spec_shows_the_error_next_to_its_field(page: Page, live_server: str) -> None:
    page.goto(f"{live_server}/?lang=en")
    page.fill('[data-spec="seq_len"]', "0")
    page.click("#run")
    err = page.locator('[data-field="seq_len"] .err')
    expect(err).to_contain_text("seq_len: Input should be greater than or equal to 1")
    expect(page.locator('[data-spec="seq_len"]')).to_have_attribute("aria-invalid", "true")
    assert page.locator("#ranked").count() == 0


def test_fit_page_with_a_pasted_spec(page: Page, live_server: str) -> None:
    page.goto(f"{live_server}/fit?lang=zh")
    page.fill("#spec-yaml", LORA)
    page.click("#fit-form button[type=submit]")
    expect(page.locator("#fit tbody tr").first).to_be_visible(timeout=RUN_TIMEOUT_MS)
    assert "H100-SXM" in page.locator("#fit").inner_text()
    assert "放得下" in page.locator("#fit").inner_text()


def test_bill_page_with_an_uploaded_utilization_csv(page: Page, live_server: str) -> None:
    page.goto(f"{live_server}/bill?lang=en")
    page.set_input_files("#spec-file", str(EX / "usage-trace.csv"))
    expect(page.locator("#spec-yaml")).to_have_value(
        (EX / "usage-trace.csv").read_text(encoding="utf-8")
    )
    page.click("#bill-form button[type=submit]")
    err = page.locator('[data-field="gpu"] .err')
    expect(err).to_contain_text("--gpu: required with a CSV trace")  # next to the GPU field
    page.fill('[data-opt="gpu"]', "H100-SXM")
    page.click("#bill-form button[type=submit]")
    expect(page.locator("#bill tbody tr").first).to_be_visible(timeout=RUN_TIMEOUT_MS)
    assert "H100-SXM" in page.locator("#result").inner_text()


def test_serve_page_with_the_seed_services(page: Page, live_server: str) -> None:
    page.goto(f"{live_server}/serve?lang=en")
    page.fill("#spec-yaml", (EX / "serve-seed.yaml").read_text(encoding="utf-8"))
    page.select_option('[data-opt="objective"]', "cost")
    page.click("#serve-form button[type=submit]")
    expect(page.locator("#serve-services tbody tr").first).to_be_visible(timeout=RUN_TIMEOUT_MS)
    assert "sd-webui" in page.locator("#serve-services").inner_text()
    expect(page.locator("#serve-shared tbody tr").first).to_be_visible()


def test_api_docs_render_from_local_files(page: Page, live_server: str) -> None:
    outside: list[str] = []
    page.on(
        "request",
        lambda req: outside.append(req.url) if not req.url.startswith(live_server) else None,
    )
    page.goto(f"{live_server}/docs")
    expect(page.get_by_text("/api/plan", exact=True)).to_be_visible()
    expect(page.get_by_text("/api/catalog/offerings", exact=True)).to_be_visible()
    assert outside == []
