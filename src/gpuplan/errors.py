"""The one error tree of gpuplan.

Every error a user can cause is a :class:`GpuPlanError`; the CLI prints its
message on one line (with the hint) and exits 2. Anything else is a bug.

::

    GpuPlanError
    ├── CatalogError        a shipped or user catalog file is malformed
    ├── UnknownNameError    an id (GPU, model, provider...) is not known; carries suggestions
    ├── SpecError           a job spec field is missing or has a bad value
    ├── InfeasibleError     nothing satisfies the spec; carries the closest rejections
    ├── MissingInputError   an estimate needs an input the user did not give
    ├── MonitorError        a sampler or the watch agent cannot proceed
    ├── ActionError         a stop/scale action failed
    └── ExportError         (gpuplan.planner.export) an option cannot be exported to a launcher
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class GpuPlanError(Exception):
    """Base class of every user-facing error.

    Args:
        message: what was asked and why it failed, one line.
        hint: how to fix it, ideally a command to try.
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        """Return the message and hint as a single line."""
        text = " ".join(self.message.split())
        if self.hint:
            text += f" (hint: {' '.join(self.hint.split())})"
        return text

    def __str__(self) -> str:
        return self.one_line()


class CatalogError(GpuPlanError):
    """A catalog data file (shipped or user override) is invalid."""


class SpecError(GpuPlanError):
    """A job spec field is missing or has a value that is not allowed."""


class MissingInputError(GpuPlanError):
    """An estimate needs an input that was not given (we never assume silently)."""


class InfeasibleError(GpuPlanError):
    """No option satisfies the request.

    Args:
        message: what was asked and why nothing matched.
        closest: short descriptions of the closest rejected options and why.
        hint: what to relax.
    """

    def __init__(
        self, message: str, *, closest: Iterable[str] = (), hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.closest = tuple(closest)


class MonitorError(GpuPlanError):
    """The watch agent or one of its samplers cannot proceed."""


class ActionError(GpuPlanError):
    """An idle action (stop, terminate, scale-in, webhook) failed."""


MAX_NAME_SHOWN = 80
"""Characters of an unknown name an error repeats (a name can be a whole file's worth)."""


class UnknownNameError(GpuPlanError):
    """A name that is not in a known set, with did-you-mean suggestions.

    Args:
        kind: what kind of name ("GPU id", "model preset", ...).
        name: the name given.
        known: the valid names.
        field: the spec or CLI field that held it, if any.
    """

    def __init__(
        self, kind: str, name: str, known: Iterable[str], *, field: str | None = None
    ) -> None:
        known_list = sorted(set(known), key=str.lower)
        lower = {k.lower(): k for k in known_list}
        long = len(name) > MAX_NAME_SHOWN
        close = (
            [] if long else difflib.get_close_matches(name.lower(), list(lower), n=3, cutoff=0.5)
        )
        suggestions = [lower[c] for c in close]
        where = f"{field}: " if field else ""
        shown_name = (
            f"{name[:MAX_NAME_SHOWN]!r}... ({len(name)} characters)" if long else repr(name)
        )
        message = f"{where}unknown {kind} {shown_name}"
        if suggestions:
            message += f"; did you mean {', '.join(suggestions)}?"
        shown = ", ".join(known_list[:40]) + (" ..." if len(known_list) > 40 else "")
        message += f" Allowed: {shown}"
        super().__init__(message)
        self.kind = kind
        self.name = name
        self.suggestions = tuple(suggestions)
