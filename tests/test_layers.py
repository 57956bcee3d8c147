"""No import goes up a layer.

cli/web > report/planner/validation > estimate/cost/trace > models/catalog/monitor/spec > units/errors.
A new top-level package must be given a layer here, so that the rule cannot be skipped by accident.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gpuplan"

LAYERS: dict[str, int] = {
    "errors": 0,
    "units": 0,
    "userfile": 0,
    "schema_base": 0,
    "<root>": 0,
    "models": 1,
    "catalog": 1,
    "monitor": 1,
    "spec": 1,
    "estimate": 2,
    "cost": 2,
    "trace": 2,
    "serve": 1,
    "report": 3,
    "planner": 3,
    "validation": 3,
    "holdout": 3,
    "validation_inference": 3,
    "cli": 4,
    "web": 4,
}


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "gpuplan":
                found.update(f"gpuplan.{alias.name}" for alias in node.names)
            elif node.module.startswith("gpuplan."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gpuplan."))
    return found


def _edges() -> list[tuple[str, str]]:
    edges = []
    for path in sorted(SRC.rglob("*.py")):
        source = _module_name(path)
        edges.extend((source, target) for target in sorted(_imports(path)))
    return edges


def test_every_package_has_a_layer() -> None:
    tops = {_top(_module_name(p)) for p in SRC.rglob("*.py")}
    missing = sorted(tops - LAYERS.keys())
    assert not missing, f"give these packages a layer in tests/test_layers.py: {missing}"


def test_no_import_goes_up_a_layer() -> None:
    upward = [
        f"{source} imports {target}"
        for source, target in _edges()
        if _top(target) != "__version__"
        and LAYERS.get(_top(target), -1) > LAYERS.get(_top(source), 99)
    ]
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)
