"""Screenshot the plan page for the README (docs/web-plan.png), with Debian's Chromium.

Starts the app on 127.0.0.1 and a free port, plans examples/llama3-8b-lora.yaml from the
form, opens the share link and captures the ranked table and the cost/time chart.
Run: ``python scripts/web_screenshot.py [--lang en|zh] [--out docs/web-plan.png]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from playwright.sync_api import sync_playwright

from gpuplan.web.app import create_app

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lang", default="en", choices=("en", "zh"))
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "web-plan.png")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GPUPLAN_HOME"] = tmp
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(Path(tmp) / "web.db"), host="127.0.0.1", port=0, log_level="warning"
            )
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{base}/?lang={args.lang}")
                page.click("#run")
                page.wait_for_selector("#ranked tbody tr", timeout=120_000)
                href = page.get_attribute("#share-link", "href")
                page.goto(f"{base}{href}?lang={args.lang}")
                bottom = page.locator("#chart").bounding_box()
                height = int(bottom["y"] + bottom["height"] + 16) if bottom else 1500
                page.set_viewport_size({"width": 1280, "height": height})
                page.screenshot(
                    path=str(args.out), clip={"x": 0, "y": 0, "width": 1280, "height": height}
                )
                browser.close()
        finally:
            server.should_exit = True
            thread.join(10)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
