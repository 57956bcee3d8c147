"""The forms of the plan, fit and bill pages (server-rendered; ``app.js`` submits them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

from gpuplan.catalog.schema import BILLING_MODES
from gpuplan.planner.search import RISKS
from gpuplan.report.svg import esc
from gpuplan.spec import Checkpointing, Method, Optimizer, Precision
from gpuplan.web.i18n import Texts
from gpuplan.web.service import PlanOptions

_METHODS: tuple[str, ...] = get_args(Method)
_PRECISIONS: tuple[str, ...] = get_args(Precision)
_OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
_CHECKPOINTING: tuple[str, ...] = get_args(Checkpointing)
CURRENCIES = ("USD", "CNY")


def _field(t: Texts, path: str, control: str, *, hint: str = "") -> str:
    """A labelled control with its error slot; ``path`` is the spec field it sets."""
    key = "field." + path.replace(".", "_")
    note = f'<small class="muted">{esc(hint)}</small>' if hint else ""
    return (
        f'<label class="field" data-field="{esc(path)}"><span>{esc(t(key))}</span>{control}{note}'
        f'<span class="err" role="alert"></span></label>'
    )


def _input(path: str, value: str = "", *, kind: str = "text", extra: str = "") -> str:
    return (
        f'<input type="{kind}" name="{esc(path)}" data-spec="{esc(path)}" value="{esc(value)}"'
        f"{extra}>"
    )


def select(path: str, values: Sequence[str], chosen: str, *, spec: bool = True) -> str:
    opts = "".join(
        f'<option value="{esc(v)}"{" selected" if v == chosen else ""}>{esc(v)}</option>'
        for v in values
    )
    attr = f'data-spec="{esc(path)}"' if spec else f'data-opt="{esc(path)}"'
    return f'<select name="{esc(path)}" {attr}>{opts}</select>'


def _checks(path: str, values: Sequence[str], labels: Sequence[str]) -> str:
    return (
        '<span class="checks">'
        + "".join(
            f'<label><input type="checkbox" data-spec-list="{esc(path)}" value="{esc(v)}"> '
            f"{esc(label)}</label>"
            for v, label in zip(values, labels, strict=True)
        )
        + "</span>"
    )


def spec_editor(t: Texts) -> str:
    """The YAML the page runs: filled from the form, or pasted or uploaded."""
    return (
        f'<fieldset class="yaml"><legend>{esc(t("form.yaml"))}</legend>'
        f'<p class="muted">{esc(t("form.yaml_note"))}</p>'
        f'<label class="field" data-field="spec"><span>{esc(t("form.upload"))}</span>'
        '<input type="file" id="spec-file" accept=".yaml,.yml,.json,text/yaml">'
        '<span class="err" role="alert"></span></label>'
        '<textarea id="spec-yaml" name="spec" rows="16" spellcheck="false"></textarea>'
        "</fieldset>"
    )


def plan_form(t: Texts, presets: Sequence[str], providers: Sequence[str]) -> str:
    """The job form of the plan page."""
    datalist = "".join(f'<option value="{esc(p)}">' for p in presets)
    job = [
        _field(
            t,
            "model",
            _input("model", "llama-3-8b", extra=' list="presets" autocomplete="off"')
            + f'<datalist id="presets">{datalist}</datalist>',
        ),
        _field(t, "method", select("method", _METHODS, "lora")),
        _field(t, "lora.rank", _input("lora.rank", "16", kind="number")),
        _field(t, "lora.alpha", _input("lora.alpha", "32", kind="number")),
        _field(
            t,
            "lora.targets",
            _input("lora.targets", "q_proj, k_proj, v_proj, o_proj"),
            hint=t("hint.list"),
        ),
        _field(t, "precision", select("precision", _PRECISIONS, "bf16-mixed")),
        _field(t, "optimizer", select("optimizer", _OPTIMIZERS, "adamw")),
        _field(t, "micro_batch_size", _input("micro_batch_size", "4", kind="number")),
        _field(t, "global_batch_size", _input("global_batch_size", "64", kind="number")),
        _field(t, "seq_len", _input("seq_len", "2048", kind="number")),
        _field(
            t,
            "activation_checkpointing",
            select("activation_checkpointing", _CHECKPOINTING, "full"),
        ),
        _field(t, "work.tokens", _input("work.tokens", "200000000", kind="number")),
    ]
    limits = [
        _field(
            t,
            "constraints.deadline",
            _input("constraints.deadline", "24h"),
            hint=t("hint.duration"),
        ),
        _field(t, "constraints.budget", _input("constraints.budget", "", kind="number")),
        _field(t, "constraints.currency", select("constraints.currency", CURRENCIES, "USD")),
        _field(t, "constraints.regions", _input("constraints.regions", ""), hint=t("hint.list")),
        _field(t, "constraints.providers", _checks("constraints.providers", providers, providers)),
        _field(
            t,
            "constraints.billing",
            _checks(
                "constraints.billing",
                BILLING_MODES,
                [t.get(f"billing.{m}", m) for m in BILLING_MODES],
            ),
        ),
    ]
    default = PlanOptions()
    run = [
        _field(
            t,
            "objective",
            select("objective", ("cost", "time", "pareto"), default.objective, spec=False),
        ),
        _field(
            t,
            "risk",
            select("risk", RISKS, default.risk, spec=False),
            hint=t("hint.risk"),
        ),
    ]
    return (
        '<form id="plan-form" class="job" data-api="/api/plan" novalidate>'
        f"<fieldset><legend>{esc(t('form.job'))}</legend>{''.join(job)}</fieldset>"
        f"<fieldset><legend>{esc(t('form.limits'))}</legend>{''.join(limits)}</fieldset>"
        f"<fieldset><legend>{esc(t('form.run'))}</legend>{''.join(run)}</fieldset>"
        + spec_editor(t)
        + f'<p><button type="submit" id="run">{esc(t("form.submit"))}</button> '
        f'<span class="spinner" hidden aria-live="polite">{esc(t("form.running"))}</span></p>'
        "</form>"
    )


def simple_form(t: Texts, form_id: str, fragment: str, controls: str, *, upload: str) -> str:
    """A document editor plus option controls, submitted to an HTML fragment route."""
    return (
        f'<form id="{form_id}" class="doc" data-fragment="{fragment}" novalidate>'
        f"<fieldset><legend>{esc(t('form.options'))}</legend>{controls}</fieldset>"
        f'<fieldset class="yaml"><legend>{esc(upload)}</legend>'
        f'<label class="field" data-field="spec"><span>{esc(t("form.upload"))}</span>'
        '<input type="file" id="spec-file">'
        '<span class="err" role="alert"></span></label>'
        '<textarea id="spec-yaml" name="spec" rows="14" spellcheck="false"></textarea></fieldset>'
        f'<p><button type="submit">{esc(t("form.submit"))}</button> '
        f'<span class="spinner" hidden aria-live="polite">{esc(t("form.running"))}</span></p>'
        "</form>"
    )


def option_field(t: Texts, name: str, control: str) -> str:
    """A labelled query option (``data-opt``) with its error slot."""
    return (
        f'<label class="field" data-field="{esc(name)}"><span>{esc(t("opt." + name))}</span>'
        f'{control}<span class="err" role="alert"></span></label>'
    )


def opt_input(name: str, value: str = "", kind: str = "text") -> str:
    """An option input sent as a query parameter."""
    return f'<input type="{kind}" name="{esc(name)}" data-opt="{esc(name)}" value="{esc(value)}">'
