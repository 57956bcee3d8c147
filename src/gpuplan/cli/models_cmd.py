"""``gpuplan models``: the shipped model presets with computed and published parameter counts."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpuplan.cli.common import JsonOpt, WideOpt, console, print_json, print_table


def register(app: typer.Typer) -> None:
    """Attach ``models`` to the top-level app."""
    app.command("models")(models)


def _row(preset_id: str) -> dict[str, Any]:
    from gpuplan.models import count_parameters, load_preset, preset_info

    info = preset_info(preset_id)
    cfg = load_preset(preset_id)
    counts = count_parameters(cfg)
    return {
        "id": info.id,
        "family": cfg.family,
        "model_type": cfg.model_type,
        "hf_repo": info.hf_repo,
        "num_layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "num_experts": cfg.num_experts,
        "params": counts.total,
        "active_params_per_token": counts.active_per_token,
        "published_params": info.published_params,
        "published_exact": info.published_exact,
        "params_match_published": info.matches(counts.total),
        "params_source": info.params_source,
        "as_of": info.as_of.isoformat(),
    }


def _detail(ref: str) -> dict[str, Any]:
    from gpuplan.models import count_parameters, find_preset, load_model

    cfg = load_model(ref)
    out: dict[str, Any] = {
        "config": cfg.model_dump(mode="json", exclude={"cnn_layers"}),
        "params": count_parameters(cfg).as_dict(),
    }
    if cfg.cnn_layers:
        out["config"]["num_cnn_layers"] = len(cfg.cnn_layers)
    info = find_preset(ref)
    if info is not None:
        out["preset"] = info.model_dump(mode="json")
    return out


def _published(value: int | float) -> str:
    from gpuplan.units import format_count

    return f"{value:,}" if isinstance(value, int) else f"~{format_count(value)}"


def models(
    model: Annotated[
        str | None,
        typer.Argument(
            help="Show one model in full: a preset id or the path of a Hugging Face config.json.",
            show_default=False,
        ),
    ] = None,
    family: Annotated[
        str | None,
        typer.Option("--family", help="List only this family: decoder, encoder, cnn or vit."),
    ] = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """List the model presets: shape, computed parameter count and the published figure."""
    if model is not None:
        detail = _detail(model)
        if json_out:
            print_json(detail)
        else:
            console().print_json(data=detail)
        return
    from gpuplan.models import list_presets

    rows = [_row(p.id) for p in list_presets()]
    if family is not None:
        allowed = ("decoder", "encoder", "cnn", "vit")
        if family not in allowed:
            from gpuplan.errors import UnknownNameError

            raise UnknownNameError("model family", family, allowed, field="--family")
        rows = [r for r in rows if r["family"] == family]
    if json_out:
        print_json(rows)
        return
    _table(rows, wide)


def _table(rows: list[dict[str, Any]], wide: bool = False) -> None:
    from gpuplan.report.table import Column
    from gpuplan.units import format_count

    columns = (
        Column(header="id", shrink=True, min_width=14),
        Column(header="family", priority=3),
        Column(header="layers", justify="right", priority=4),
        Column(header="hidden", justify="right", priority=5),
        Column(header="heads/kv", justify="right", priority=6),
        Column(header="vocab", justify="right", priority=7),
        Column(header="params", justify="right"),
        Column(header="published", justify="right", priority=1),
        Column(header="match", priority=2),
    )
    cells = []
    for r in rows:
        heads = "-"
        if r["num_attention_heads"]:
            heads = f"{r['num_attention_heads']}/{r['num_kv_heads']}"
        params = f"{r['params']:,}"
        if r["num_experts"] > 1:
            params += f" ({format_count(r['active_params_per_token'])} active)"
        cells.append(
            (
                r["id"],
                r["family"],
                str(r["num_layers"]),
                str(r["hidden_size"]),
                heads,
                str(r["vocab_size"] or "-"),
                params,
                _published(r["published_params"]),
                "yes" if r["params_match_published"] else "NO",
            )
        )
    print_table(
        columns,
        cells,
        title=f"{len(rows)} model presets (params computed from the architecture)",
        wide=wide,
    )
