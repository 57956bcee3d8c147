"""The one reader for every file a user hands to gpuplan.

Job specs, catalog overrides, usage files, watch configs, validation tables,
replay traces and Hugging Face ``config.json`` files all come through here, so
each bad file gets the same one-line :class:`~gpuplan.errors.GpuPlanError`
instead of a traceback or a hang: a missing file, a directory, an unreadable
file, more than :data:`MAX_BYTES`, bytes that are not UTF-8 (with the byte
offset), an empty file, YAML or JSON nested deeper than :data:`MAX_DEPTH`,
YAML aliases (``*name``: an alias bomb expands a few hundred bytes into
gigabytes), duplicate or non-string mapping keys (YAML 1.1 reads ``on:`` as the
boolean key ``True``) and a top level of the wrong kind.

Every function takes ``what``, the name the user knows the file by
(``spec``, ``--catalog``, ``--table`` ...), and ``error``, the
:class:`~gpuplan.errors.GpuPlanError` subclass to raise, so each caller keeps
its own error class. Only :mod:`gpuplan.errors` is imported.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from gpuplan.errors import GpuPlanError

#: Largest user file read, in bytes (checked before reading).
MAX_BYTES = 10 * 2**20
#: Deepest nesting of mappings and sequences accepted in YAML and JSON.
MAX_DEPTH = 100

ErrorType = type[GpuPlanError]


def _fail(error: ErrorType, what: str, path: Path | None, problem: str) -> GpuPlanError:
    return error(f"{what}: {path}: {problem}" if path is not None else f"{what}: {problem}")


def path_kind(path: Path) -> str | None:
    """``"file"``, ``"dir"`` or None (missing, or a name the system cannot look up: too long,
    a NUL byte, a denied directory), never raising: for a user's string that may be a model
    preset id or a path (``Path.is_file`` raises on a name longer than the system allows)."""
    try:
        if path.is_dir():
            return "dir"
        if path.is_file():
            return "file"
    except (OSError, ValueError):
        return None
    return None


def read_bytes(path: Path, *, what: str, error: ErrorType = GpuPlanError) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_BYTES`; never empty.

    Raises:
        GpuPlanError: (of class ``error``) missing, a directory, not a regular
            file, unreadable, too large or empty.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise _fail(error, what, path, "cannot read: no such file") from None
    except OSError as exc:
        raise _fail(error, what, path, f"cannot read: {exc.strerror or exc}") from None
    if path.is_dir():
        raise _fail(error, what, path, "is a directory, expected a file")
    if not path.is_file():
        raise _fail(error, what, path, "is not a regular file")
    if st.st_size > MAX_BYTES:
        raise _fail(
            error,
            what,
            path,
            f"{st.st_size:,} bytes is over the {MAX_BYTES // 2**20} MiB limit for input files",
        )
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise _fail(error, what, path, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise _fail(error, what, path, f"over the {MAX_BYTES // 2**20} MiB limit for input files")
    if not data.strip():
        raise _fail(error, what, path, "is empty")
    return data


def read_text(path: Path, *, what: str, error: ErrorType = GpuPlanError) -> str:
    """The UTF-8 text of a user file (a leading BOM is dropped); see :func:`read_bytes`."""
    data = read_bytes(path, what=what, error=error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise _fail(
            error,
            what,
            path,
            f"not UTF-8 text: byte 0x{bad} at offset {exc.start} (save the file as UTF-8)",
        ) from None
    if "\x00" in text:
        raise _fail(error, what, path, f"not a text file: NUL byte at offset {text.index(chr(0))}")
    return text.removeprefix("\ufeff")


def _yaml_module() -> Any:
    import yaml

    return yaml


def _check_yaml_events(text: str, *, what: str, path: Path | None, error: ErrorType) -> None:
    """Reject aliases, deep nesting and duplicate scalar keys before anything is built.

    libyaml's event parser keeps its own stack, so a file nested 100,000 deep is
    walked here without recursion and refused before the (recursive) composer sees it.
    """
    yaml = _yaml_module()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    # Each open collection: [is_mapping, expecting_key, seen scalar keys].
    stack: list[tuple[bool, list[bool], set[str]]] = []

    def line_of(event: Any) -> str:
        mark = getattr(event, "start_mark", None)
        return f"line {mark.line + 1}: " if mark is not None else ""

    def key_position(event: Any) -> bool:
        """Whether ``event`` is a mapping key (and advance the key/value toggle)."""
        if not stack or not stack[-1][0]:
            return False
        toggle = stack[-1][1]
        is_key = toggle[0]
        toggle[0] = not is_key
        return is_key

    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            raise _fail(
                error,
                what,
                path,
                f"{line_of(event)}YAML aliases (*{event.anchor}) are not allowed in input files; "
                "write the value out",
            )
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if key_position(event):
                raise _fail(error, what, path, f"{line_of(event)}a mapping key must be a string")
            stack.append((isinstance(event, yaml.MappingStartEvent), [True], set()))
            if len(stack) > MAX_DEPTH:
                raise _fail(
                    error,
                    what,
                    path,
                    f"{line_of(event)}nested more than {MAX_DEPTH} levels deep",
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            stack.pop()
        elif isinstance(event, yaml.ScalarEvent) and key_position(event):
            seen = stack[-1][2]
            if event.value in seen:
                raise _fail(
                    error,
                    what,
                    path,
                    f"{line_of(event)}duplicate key {event.value!r} (each key may appear once)",
                )
            seen.add(event.value)


def _check_keys(
    node: Any, *, what: str, path: Path | None, error: ErrorType, where: str = ""
) -> None:
    """Every mapping key is a string (``on:``/``yes:``/``1:`` are not silently other types)."""
    todo: list[tuple[Any, str]] = [(node, where)]
    while todo:
        item, at = todo.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if not isinstance(key, str):
                    shown = f"{at}: " if at else ""
                    raise _fail(
                        error,
                        what,
                        path,
                        f"{shown}key {key!r} is a {type(key).__name__}, not a string "
                        "(quote it, e.g. 'on':)",
                    )
                todo.append((value, f"{at}.{key}" if at else key))
        elif isinstance(item, list):
            todo.extend((v, f"{at}[{i}]") for i, v in enumerate(item))


def parse_yaml(text: str, *, what: str, path: Path | None, error: ErrorType = GpuPlanError) -> Any:
    """Parse user YAML text safely (see the module docs for what is refused)."""
    yaml = _yaml_module()
    try:
        _check_yaml_events(text, what=what, path=path, error=error)
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _fail(error, what, path, f"{where}malformed YAML: {problem}") from None
    except RecursionError:
        raise _fail(error, what, path, f"nested more than {MAX_DEPTH} levels deep") from None
    _check_keys(data, what=what, path=path, error=error)
    return data


def read_yaml(
    path: Path, *, what: str, error: ErrorType = GpuPlanError, mapping: bool = True
) -> Any:
    """Read a user YAML (or JSON) file; with ``mapping`` the top level must be a mapping."""
    data = parse_yaml(read_text(path, what=what, error=error), what=what, path=path, error=error)
    if mapping and not isinstance(data, dict):
        raise _fail(
            error,
            what,
            path,
            f"expected a mapping of key: value at the top level, got {_kind(data)}",
        )
    return data


def _kind(data: Any) -> str:
    if data is None:
        return "nothing"
    if isinstance(data, list):
        return "a list"
    if isinstance(data, dict):
        return "a mapping"
    return f"the {type(data).__name__} {data!r}"[:80]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} (each key may appear once)")
        out[key] = value
    return out


def _bad_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, *, what: str, path: Path | None, error: ErrorType = GpuPlanError) -> Any:
    """Parse user JSON: no duplicate keys, no NaN/Infinity, at most :data:`MAX_DEPTH` deep."""
    depth = 0
    deepest = 0
    in_string = False
    escaped = False
    for ch in text:  # json.loads recurses: refuse deep nesting before it does
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                raise _fail(error, what, path, f"nested more than {MAX_DEPTH} levels deep")
        elif ch in "]}":
            depth -= 1
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_bad_constant)
    except json.JSONDecodeError as exc:
        raise _fail(
            error,
            what,
            path,
            f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
        ) from None
    except (ValueError, RecursionError) as exc:
        raise _fail(error, what, path, f"not valid JSON: {exc}") from None


def read_json(
    path: Path, *, what: str, error: ErrorType = GpuPlanError, mapping: bool = True
) -> Any:
    """Read a user JSON file; with ``mapping`` the top level must be an object."""
    data = parse_json(read_text(path, what=what, error=error), what=what, path=path, error=error)
    if mapping and not isinstance(data, dict):
        raise _fail(
            error, what, path, f"expected a JSON object at the top level, got {_kind(data)}"
        )
    return data


def parse_csv(
    text: str, *, what: str, path: Path, error: ErrorType = GpuPlanError
) -> tuple[list[str], list[dict[str, str]]]:
    """(header, rows) of CSV text; every row has every header column (missing cells are '')."""
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        lines = [row for row in reader if row and any(cell.strip() for cell in row)]
    except csv.Error as exc:
        raise _fail(error, what, path, f"malformed CSV: {exc}") from None
    if not lines:
        raise _fail(error, what, path, "is empty")
    header = [h.strip() for h in lines[0]]
    if len(set(header)) != len(header) or any(not h for h in header):
        raise _fail(
            error, what, path, f"header: column names must be unique and non-empty, got {header}"
        )
    rows: list[dict[str, str]] = []
    for n, cells in enumerate(lines[1:], start=2):
        if len(cells) > len(header):
            raise _fail(
                error,
                what,
                path,
                f"row {n}: {len(cells)} cells but the header has {len(header)} columns",
            )
        rows.append({h: (cells[i] if i < len(cells) else "") for i, h in enumerate(header)})
    return header, rows


def read_csv(
    path: Path, *, what: str, error: ErrorType = GpuPlanError
) -> tuple[list[str], list[dict[str, str]]]:
    """Read a user CSV file; see :func:`parse_csv`."""
    return parse_csv(read_text(path, what=what, error=error), what=what, path=path, error=error)
