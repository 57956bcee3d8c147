"""The web API answers what the CLI's --json prints; errors are one line naming the field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from gpuplan.web.app import create_app  # noqa: E402

EX = Path(__file__).resolve().parents[1] / "examples"
LORA = (EX / "llama3-8b-lora.yaml").read_text(encoding="utf-8")
YAML = {"content-type": "application/yaml"}


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> TestClient:
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    return TestClient(create_app(tmp_path / "web.db"))


def _keys(options: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (o["provider"], o["instance_type"], o["region"], o["billing_mode"], o["nodes"])
        for o in options
    ]


def test_plan_answers_exactly_the_cli_json(client: TestClient, cli) -> None:  # type: ignore[no-untyped-def]
    expected = cli("plan", str(EX / "llama3-8b-lora.yaml"), "--json")
    assert expected.exit_code == 0, expected.output
    r = client.post("/api/plan", content=LORA, headers=YAML)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert _keys(r.json()["options"]) == _keys(json.loads(expected.stdout)["options"])
    assert r.text == expected.stdout


def test_plan_json_body_and_options_envelope(client: TestClient, cli) -> None:  # type: ignore[no-untyped-def]
    spec = yaml.safe_load(LORA)
    expected = cli(
        "plan", str(EX / "llama3-8b-lora.yaml"), "--json", "--objective", "time", "--top", "3"
    )
    as_json = client.post(
        "/api/plan?objective=time&top=3",
        content=json.dumps(spec),
        headers={"content-type": "application/json"},
    )
    envelope = client.post("/api/plan", json={"spec": spec, "objective": "time", "top": 3})
    assert as_json.status_code == envelope.status_code == 200, envelope.text
    assert as_json.text == envelope.text == expected.stdout


@pytest.mark.parametrize(
    ("url", "body", "field", "message"),
    [
        (
            "/api/plan",
            "model: llama-3-8b\nseq_len: 0\n",
            "seq_len",
            "spec: seq_len: Input should be greater than or equal to 1",
        ),
        (
            "/api/plan",
            LORA.replace("deadline: 24h", "deadline: soon"),
            "constraints.deadline",
            "constraints.deadline",
        ),
        ("/api/plan?top=0", LORA, "top", "--top: Input should be greater than or equal to 1"),
        ("/api/plan?objective=cheap", LORA, "objective", "--objective: unknown 'cheap'"),
        ("/api/plan?bogus=1", LORA, "bogus", "--bogus: unknown option"),
        ("/api/plan", "model: [unclosed\n", None, "malformed YAML"),
        ("/api/fit?gpu=H999", LORA, "gpu", "unknown GPU"),
        ("/api/estimate?gpu=H100-SXM&fabric=carrier-pigeon", LORA, "fabric", "--fabric: unknown"),
        ("/api/bill", "gpu: H100-SXM\ngpus: -1\n", "gpus", "gpus"),
    ],
)
def test_bad_input_is_422_with_one_line_naming_the_field(
    client: TestClient, url: str, body: str, field: str | None, message: str
) -> None:
    r = client.post(url, content=body, headers=YAML)
    assert r.status_code == 422, r.text
    data = r.json()
    assert message in data["detail"]
    assert "\n" not in data["detail"]
    if field is not None:
        assert data["field"] == field


def test_fit_estimate_bill_offerings_match_the_cli(client: TestClient, cli) -> None:  # type: ignore[no-untyped-def]
    spec = str(EX / "llama3-8b-lora.yaml")
    cases = [
        (cli("fit", spec, "--json"), client.post("/api/fit", content=LORA, headers=YAML)),
        (
            cli("fit", spec, "--gpu", "H100-SXM", "--gpus", "2", "--json"),
            client.post("/api/fit?gpu=H100-SXM&gpus=2", content=LORA, headers=YAML),
        ),
        (
            cli("estimate", spec, "--gpu", "A100-80GB", "--count", "8", "--json"),
            client.post("/api/estimate?gpu=A100-80GB&count=8", content=LORA, headers=YAML),
        ),
        (
            cli("bill", str(EX / "usage-team-8xh100.yaml"), "--json"),
            client.post(
                "/api/bill", content=(EX / "usage-team-8xh100.yaml").read_bytes(), headers=YAML
            ),
        ),
        (
            cli("bill", str(EX / "usage-trace.csv"), "--gpu", "H100-SXM", "--json"),
            client.post(
                "/api/bill?gpu=H100-SXM",
                content=(EX / "usage-trace.csv").read_bytes(),
                headers={"content-type": "text/csv"},
            ),
        ),
        (
            cli(
                "catalog",
                "offerings",
                "--gpu",
                "H100-SXM",
                "--provider",
                "aws",
                "--provider",
                "gcp",
                "--json",
            ),
            client.get("/api/catalog/offerings?gpu=H100-SXM&provider=aws&provider=gcp"),
        ),
        (
            cli("catalog", "offerings", "--max-price", "3", "--currency", "CNY", "--json"),
            client.get("/api/catalog/offerings?max_price=3&currency=CNY"),
        ),
    ]
    for expected, got in cases:
        assert expected.exit_code == 0, expected.output
        assert got.status_code == 200, got.text
        want, have = json.loads(expected.stdout), got.json()
        if isinstance(want, dict) and "origin" in want:  # bill names its input: a file vs "usage"
            origin = want.pop("origin")
            for name in ("usage-team-8xh100.yaml", "usage-trace.csv"):
                origin = origin.replace(
                    str(EX / name), "usage.csv" if name.endswith("csv") else "usage"
                )
            assert have.pop("origin") == origin
            assert have == want
        else:
            assert got.text == expected.stdout


def test_share_link_round_trip_and_rerun(client: TestClient) -> None:
    r = client.post("/api/plan?top=5", content=LORA, headers=YAML)
    plan_id = r.headers["x-plan-id"]
    assert r.headers["x-plan-url"] == f"/plans/{plan_id}"
    assert len(plan_id) >= 20 and re.fullmatch(r"[A-Za-z0-9_-]+", plan_id)
    best = r.json()["options"][0]
    page = client.get(f"/plans/{plan_id}")
    assert page.status_code == 200
    assert 'id="ranked"' in page.text and "<svg" in page.text
    assert best["instance_type"] in page.text
    assert "llama-3-8b" in page.text  # the YAML it ran
    rerun = client.post(f"/plans/{plan_id}/rerun", follow_redirects=False)
    assert rerun.status_code == 303
    new_id = rerun.headers["location"].split("/plans/")[1].split("?")[0]
    assert new_id != plan_id
    again = client.get(f"/plans/{new_id}")
    assert again.status_code == 200 and best["instance_type"] in again.text
    stored = client.app.state.store.get(new_id)  # type: ignore[attr-defined]
    assert stored.options == {"top": 5} and stored.result["options"][0] == best
    assert client.get("/plans/not-a-real-id").status_code == 404


_EXTERNAL = re.compile(
    r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?(?:https?:)?//|@import""",
    re.I,
)


def test_no_page_references_an_external_url(client: TestClient) -> None:
    plan_id = client.post("/api/plan?top=3", content=LORA, headers=YAML).headers["x-plan-id"]
    urls = [
        "/",
        "/fit",
        "/bill",
        "/catalog",
        "/docs",
        f"/plans/{plan_id}",
        f"/plans/{plan_id}/fragment",
    ]
    urls += [u + ("&" if "?" in u else "?") + "lang=zh" for u in urls]
    urls += ["/static/app.css", "/static/app.js", "/static/swagger/swagger-ui.css"]
    for url in urls:
        r = client.get(url)
        assert r.status_code == 200, url
        assert not _EXTERNAL.search(r.text), f"{url}: {_EXTERNAL.search(r.text)}"
        for ref in re.findall(r"""(?:src|href)="([^"]+)\"""", r.text):
            if ref.startswith("/"):
                assert client.get(ref).status_code == 200, f"{url} references missing {ref}"


def test_openapi_lists_every_route(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for route in ("/api/plan", "/api/fit", "/api/estimate", "/api/bill", "/api/catalog/offerings"):
        assert route in paths
    assert "/static/swagger/swagger-ui-bundle.js" in client.get("/docs").text


def test_web_command_help_and_missing_extra(cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import sys

    result = cli("web", "--help")
    assert result.exit_code == 0
    for flag in ("--host", "--port", "--db"):
        assert flag in result.output
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the extra were not installed
    result = cli("web")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: web: needs the web extra (uvicorn is not installed) (hint: pip install 'gpuplan[web]')"
    ]


def test_pages_show_bad_input_as_an_error_page(client: TestClient) -> None:
    r = client.get("/catalog?currency=XYZ")
    assert r.status_code == 422
    assert 'id="error"' in r.text and "XYZ" in r.text
    r = client.get("/catalog?gpu=H100-SXM&provider=aws&lang=zh")
    assert r.status_code == 200 and 'id="offerings"' in r.text and "来源" in r.text


def test_openapi_documents_the_one_line_error(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    answer = doc["paths"]["/api/plan"]["post"]["responses"]["422"]
    assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/ApiError")
    swagger = client.get("/openapi-3.0.json").json()
    assert swagger["openapi"] == "3.0.3" and "anyOf" not in json.dumps(swagger["components"])


SEED = EX / "serve-seed.yaml"


def test_serve_plan_answers_exactly_the_cli_json(client: TestClient, cli) -> None:  # type: ignore[no-untyped-def]
    expected = cli("serve", "plan", str(SEED), "--json")
    assert expected.exit_code == 0, expected.output
    r = client.post("/api/serve/plan", content=SEED.read_bytes(), headers=YAML)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.text == expected.stdout


def test_serve_plan_options_follow_the_cli(client: TestClient, cli) -> None:  # type: ignore[no-untyped-def]
    expected = cli("serve", "plan", str(SEED), "--json", "--objective", "latency")
    assert expected.exit_code == 0, expected.output
    body = {"spec": yaml.safe_load(SEED.read_text(encoding="utf-8")), "objective": "latency"}
    r = client.post("/api/serve/plan", json=body)
    assert r.status_code == 200, r.text
    assert r.text == expected.stdout


@pytest.mark.parametrize(
    ("url", "body", "field", "message"),
    [
        ("/api/serve/plan?objective=cheap", None, "objective", "--objective: expected cost or"),
        ("/api/serve/plan", "a: &x [1]\nb: *x\n", None, "YAML aliases"),
        ("/api/serve/plan", "services: 3\n", "services", "services"),
    ],
)
def test_serve_plan_bad_input_is_422(
    client: TestClient, url: str, body: str | None, field: str | None, message: str
) -> None:
    content = SEED.read_text(encoding="utf-8") if body is None else body
    r = client.post(url, content=content, headers=YAML)
    assert r.status_code == 422, r.text
    assert message in r.json()["detail"]
    assert "\n" not in r.json()["detail"]
    if field is not None:
        assert r.json()["field"] == field


def test_plan_risk_follows_the_cli(client: TestClient, cli) -> None:  # type: ignore[no-untyped-def]
    expected = cli("plan", str(EX / "llama3-8b-lora.yaml"), "--json", "--risk", "low")
    assert expected.exit_code == 0, expected.output
    r = client.post("/api/plan?risk=low", content=LORA, headers=YAML)
    assert r.status_code == 200, r.text
    assert r.text == expected.stdout
    bad = client.post("/api/plan?risk=reckless", content=LORA, headers=YAML)
    assert bad.status_code == 422
    assert bad.json()["detail"].startswith("--risk: unknown 'reckless'")
    assert bad.json()["field"] == "risk"


def test_serve_page_and_fragment(client: TestClient) -> None:
    page = client.get("/serve?lang=en")
    assert page.status_code == 200
    assert 'id="serve-form"' in page.text
    assert 'data-fragment="/fragments/serve"' in page.text
    frag = client.post("/fragments/serve?lang=zh", content=SEED.read_bytes(), headers=YAML)
    assert frag.status_code == 200, frag.text
    assert 'id="serve-services"' in frag.text
    assert 'id="serve-shared"' in frag.text
    assert "sd-webui" in frag.text


def test_plan_form_has_the_risk_select(client: TestClient) -> None:
    page = client.get("/?lang=en")
    assert '<select name="risk" data-opt="risk">' in page.text
    for risk in ("low", "medium", "high"):
        assert f'<option value="{risk}"' in page.text


def test_plan_result_shows_the_verdict_and_keeps_the_risk(client: TestClient) -> None:
    r = client.post("/api/plan?risk=high", content=LORA, headers=YAML)
    assert r.status_code == 200, r.text
    verdicts = {o["verdict"] for o in r.json()["options"]}
    assert verdicts <= {"fits", "tight", "no"}
    shared = client.get(f"{r.headers['X-Plan-Url']}?lang=en")
    assert shared.status_code == 200
    assert "<th>Fits?</th>" in shared.text
    assert any(f'class="verdict {v}"' in shared.text for v in verdicts)
