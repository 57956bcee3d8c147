"""The base of every pydantic model that validates user data: frozen, closed, no booleans for numbers.

Pydantic's lax mode reads ``seq_len: true`` as 1 and ``alpha: false`` as 0.0, a
silent wrong answer. :class:`UserModel` refuses a boolean wherever a field
(or an element of a tuple, list or dict field) is an int or a float, naming the
field. Everything else about lax parsing (``2.0e9`` for an int, a list for a
tuple) is kept.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def _bool_for_number(annotation: Any, value: Any) -> bool:
    """Whether ``value`` puts a boolean where ``annotation`` wants a number."""
    if annotation in (int, float):
        return isinstance(value, bool)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _bool_for_number(args[0], value)
    if origin in (typing.Union, types.UnionType):
        if bool in args or not isinstance(value, bool):
            return any(
                _bool_for_number(a, value)
                for a in args
                if typing.get_origin(a) in (tuple, list, dict)
            )
        return any(_bool_for_number(a, value) for a in args)
    if origin in (tuple, list) and isinstance(value, (list, tuple)) and args:
        return any(_bool_for_number(args[0], v) for v in value)
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return any(_bool_for_number(args[1], v) for v in value.values())
    return False


class UserModel(BaseModel):
    """Frozen, unknown fields refused, and numbers are never booleans."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, field in cls.model_fields.items():
            key = field.alias or name
            if key in data and _bool_for_number(field.annotation, data[key]):
                raise ValueError(
                    f"{key}: expected a number, got {str(data[key]).lower()} "
                    "(true/false are not numbers)"
                )
        return data
