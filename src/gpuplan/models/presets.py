"""Shipped model presets and :func:`load_model`, which resolves a job spec's ``model``.

Presets live in ``gpuplan/models/data``: one Hugging Face style ``<id>.json`` per
model (the upstream config, trimmed to the keys that matter) and the index
``presets.yaml`` with each preset's published parameter count and its source.
Nothing is downloaded. Files are parsed once per process (cached).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError

from gpuplan.errors import CatalogError, SpecError, UnknownNameError
from gpuplan.models.config import ModelConfig
from gpuplan.models.hf import from_hf_config

_DATA = "data"
_INDEX = "presets.yaml"


class PresetInfo(BaseModel):
    """One row of ``presets.yaml``: where a preset comes from and its published size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Preset id, as users type it (case-insensitive).")
    file: str = Field(default="", description="Config file in data/; default ``<id>.json``.")
    hf_repo: str | None = Field(
        description="Hugging Face repository of the weights (None when there is none: GPT-3)."
    )
    aliases: tuple[str, ...] = Field(default=(), description="Other names that resolve here.")
    published_params: StrictInt | StrictFloat = Field(
        description=(
            "Published parameter count: an int is an exact count, a float a rounded figure "
            "(e.g. 175.0e9) compared within tolerance_pct."
        )
    )
    tolerance_pct: float = Field(
        default=0.5,
        gt=0,
        description="Allowed |computed - published| / published, in percent, for a rounded figure.",
    )
    params_source: str = Field(description="URL of the published count.")
    as_of: dt.date = Field(description="Date the published count was checked.")
    notes: str = Field(default="", description="What the count includes; caveats.")

    @property
    def config_file(self) -> str:
        """File name of the preset's config in the data folder."""
        return self.file or f"{self.id}.json"

    @property
    def published_exact(self) -> bool:
        """Whether the published figure is an exact count (an int)."""
        return isinstance(self.published_params, int)

    def matches(self, computed: int) -> bool:
        """Whether a computed count agrees with the published one.

        Exact figures must be equal; rounded ones within :attr:`tolerance_pct`.
        """
        if isinstance(self.published_params, int):
            return computed == self.published_params
        error = abs(computed - self.published_params) / self.published_params
        return error * 100 <= self.tolerance_pct


def _read_text(name: str) -> str:
    return resources.files("gpuplan.models").joinpath(_DATA, name).read_text(encoding="utf-8")


@functools.cache
def list_presets() -> tuple[PresetInfo, ...]:
    """All shipped presets, in the order of ``presets.yaml``.

    Raises:
        CatalogError: the shipped index is malformed (a packaging bug).
    """
    try:
        raw = yaml.safe_load(_read_text(_INDEX))
        rows = raw["presets"]
        infos = tuple(PresetInfo.model_validate(row) for row in rows)
    except (yaml.YAMLError, KeyError, TypeError, ValidationError) as exc:
        raise CatalogError(f"models/data/{_INDEX} is malformed: {exc}") from exc
    return infos


@functools.cache
def _names() -> dict[str, PresetInfo]:
    """Lower-cased id, aliases and HF repo of every preset."""
    names: dict[str, PresetInfo] = {}
    for info in list_presets():
        for name in (info.id, *info.aliases, *([info.hf_repo] if info.hf_repo else [])):
            key = name.lower()
            if key in names and names[key] is not info:
                raise CatalogError(f"models/data/{_INDEX}: name {name!r} is used twice")
            names[key] = info
    return names


def find_preset(name: str) -> PresetInfo | None:
    """The preset called ``name`` (id, alias or HF repo; any case), or None."""
    return _names().get(name.strip().lower())


def preset_info(name: str) -> PresetInfo:
    """The preset called ``name``.

    Raises:
        UnknownNameError: no such preset; the message suggests close ids.
    """
    info = find_preset(name)
    if info is None:
        raise UnknownNameError("model preset", name, (p.id for p in list_presets()), field="model")
    return info


@functools.cache
def _load_preset(preset_id: str) -> ModelConfig:
    info = preset_info(preset_id)
    try:
        data = json.loads(_read_text(info.config_file))
    except (OSError, json.JSONDecodeError) as exc:
        raise CatalogError(f"models/data/{info.config_file}: {exc}") from exc
    return from_hf_config(data, id=info.id)


def load_preset(name: str) -> ModelConfig:
    """The architecture of a shipped preset (parsed once, then cached).

    Raises:
        UnknownNameError: no such preset.
    """
    return _load_preset(preset_info(name).id)


@functools.cache
def _load_file(path: Path, mtime_ns: int) -> ModelConfig:
    del mtime_ns  # part of the cache key only: an edited file is read again
    from gpuplan.userfile import read_json

    data: Any = read_json(path, what="model", error=SpecError)
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return from_hf_config(data, id=name)


def load_model(ref: str) -> ModelConfig:
    """Resolve a job spec's ``model``: a preset id or a path to a ``config.json``.

    A preset id, alias or Hugging Face repo name (``meta-llama/Meta-Llama-3-8B``)
    is matched case-insensitively first. Otherwise ``ref`` is read as a file, or
    as a directory holding ``config.json``.

    Args:
        ref: preset name or path.

    Returns:
        The model's architecture.

    Raises:
        UnknownNameError: ``ref`` is neither a preset nor an existing path; the
            message suggests close preset ids.
        SpecError: the file cannot be read, is not JSON, or is not a supported
            config (the message names the key).

    Example:
        >>> load_model("Llama-3-8B").num_kv_heads
        8
    """
    info = find_preset(ref)
    if info is not None:
        return _load_preset(info.id)
    from gpuplan.userfile import path_kind

    try:
        path = Path(ref).expanduser()
    except RuntimeError:  # "~user" with no such user
        path = Path(ref)
    kind = path_kind(path)
    if kind == "dir":
        path = path / "config.json"
        kind = path_kind(path)
    if kind == "file":
        return _load_file(path.resolve(), path.stat().st_mtime_ns)
    if ref.endswith(".json") or ref.startswith((".", "/", "~")):
        raise SpecError(
            f"model: no such file {ref!r}",
            hint="give a preset id from `gpuplan models` or the path of a config.json",
        )
    raise UnknownNameError("model preset", ref, (p.id for p in list_presets()), field="model")
