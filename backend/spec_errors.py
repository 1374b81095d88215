"""A run specification's refusals as the API reports them: pydantic's errors turned into
fields named by their path (``mounts[0].path``) and reasons in our words, every one at once."""

from __future__ import annotations

import re

from pydantic_core import ErrorDetails

from backend.errors import FieldError

# Control characters, escaped wherever a refused key is shown
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_SHOWN_KEY = 64  # characters of a refused key shown in a field's path


class Refusals(ValueError):
    """Several fields refused together by a check across fields, each with its own path."""

    def __init__(self, fields: list[FieldError]) -> None:
        super().__init__("; ".join(str(f) for f in fields))
        self.fields = fields


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match[0]):04x}"


def _path(loc: tuple[int | str, ...]) -> str:
    """``mounts[0].path``; a key of the input is shown with its control characters escaped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in {"[key]"}:
            continue
        else:
            if len(part) > MAX_SHOWN_KEY:  # a refused key may be huge: show its start
                part = f"{part[:MAX_SHOWN_KEY]}…"
            part = CONTROL.sub(_escaped, part)
            out += f".{part}" if out else part
    return out or "spec"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


_MESSAGES = {
    "missing": lambda ctx: "is required",
    "extra_forbidden": lambda ctx: "is not a field of a run specification",
    "greater_than_equal": lambda ctx: f"must be at least {_number(ctx['ge'])}",
    "greater_than": lambda ctx: f"must be more than {_number(ctx['gt'])}",
    "less_than_equal": lambda ctx: f"must be at most {_number(ctx['le'])}",
    "int_type": lambda ctx: "must be a whole number",
    "int_parsing": lambda ctx: "must be a whole number",
    "int_from_float": lambda ctx: "must be a whole number",
    "float_type": lambda ctx: "must be a number",
    "float_parsing": lambda ctx: "must be a number",
    "string_type": lambda ctx: "must be a string",
    "bool_type": lambda ctx: "must be true or false",
    "bool_parsing": lambda ctx: "must be true or false",
    "list_type": lambda ctx: "must be a list",
    "dict_type": lambda ctx: "must be an object",
    "model_type": lambda ctx: "must be an object",
    "literal_error": lambda ctx: f"must be one of {ctx['expected']}",
    "string_pattern_mismatch": lambda ctx: (
        "must be lowercase letters, digits and '-', starting and ending with a letter or "
        "digit, at most 63 characters"
    ),
    "string_too_short": lambda ctx: "must not be empty",
    "string_too_long": lambda ctx: f"must be at most {ctx['max_length']} characters",
    "too_long": lambda ctx: (
        f"must have at most {ctx['max_length']} items"
        + (f" (this one has {ctx['actual_length']})" if ctx.get("actual_length") else "")
    ),
}


def field_errors(error: ErrorDetails) -> list[FieldError]:
    path = _path(tuple(error["loc"]))
    kind = error["type"]
    ctx = error.get("ctx", {})
    if kind == "value_error":
        cause = ctx.get("error")
        if isinstance(cause, Refusals):
            return list(cause.fields)
        return [FieldError(path, str(cause if cause is not None else error["msg"]))]
    describe = _MESSAGES.get(kind)
    return [FieldError(path, describe(ctx) if describe else error["msg"])]
