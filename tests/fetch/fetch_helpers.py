"""Checks every fetcher test ends with: the file validates, loads, and a plan uses it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
LORA = REPO / "examples" / "llama3-8b-lora.yaml"


def written(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data


def prices_of(data: dict[str, Any], instance_type: str) -> list[dict[str, Any]]:
    rows = [o for o in data["offerings"] if o["instance_type"] == instance_type]
    assert len(rows) == 1, instance_type
    return list(rows[0]["prices"])


def fetched(prices: list[dict[str, Any]], mode: str, region: str) -> dict[str, Any]:
    hits = [p for p in prices if p["mode"] == mode and region in p.get("regions", [])]
    assert len(hits) == 1, (mode, region, prices)
    return hits[0]


def check_loads_and_plans(
    cli: Any, out: Path, *, provider: str, region: str, instance_type: str, mode: str,
    amount: float, currency: str, spec: Path = LORA,
) -> None:  # fmt: skip
    """`catalog validate FILE` passes; a plan in that region picks the fetched price."""
    result = cli("catalog", "validate", str(out))
    assert result.exit_code == 0, result.stdout
    result = cli(
        "plan", str(spec), "--catalog", str(out), "--json", "--top", "500",
        "--set", f"constraints.providers=[{provider}]",
        "--set", f"constraints.regions=[{region}]",
        "--set", f"constraints.currency={currency}",
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    options = json.loads(result.stdout)["options"]
    mine = [
        o for o in options
        if o["instance_type"] == instance_type and o["billing_mode"] == mode
    ]  # fmt: skip
    assert mine, [(o["instance_type"], o["billing_mode"]) for o in options]
    opt = mine[0]
    assert opt["region"] == region
    assert opt["price"]["amount"] == amount
    assert opt["price"]["currency"] == currency
    assert opt["price_source"].startswith(f"api:{provider}:")
