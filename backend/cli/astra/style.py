"""Colour for a person at a terminal, never for a pipe or a file (nor with NO_COLOR set)."""

from __future__ import annotations

import os
from typing import TextIO

RESET = "\033[0m"
# A state's colour: green when it is going or went well, yellow while it waits, red when it
# failed, dim when it is over without failing.
STATE_COLOURS = {
    "Running": "\033[32m",
    "Completed": "\033[32m",
    "Pending": "\033[33m",
    "Preparing": "\033[33m",
    "Starting": "\033[33m",
    "Restarting": "\033[33m",
    "Stopping": "\033[33m",
    "Failed": "\033[31m",
    "Stopped": "\033[2m",
    "Deleted": "\033[2m",
}
ERROR = "\033[31m"


def wanted(stream: TextIO, env: dict[str, str] | None = None) -> bool:
    """Colour on a terminal only: not when piped or redirected, not with NO_COLOR
    (no-color.org) or TERM=dumb."""
    env = dict(os.environ if env is None else env)
    if "NO_COLOR" in env or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Paint:
    """Colours a cell after it was padded, so columns stay where the plain table has them."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def state(self, cell: str, state: str | None = None) -> str:
        colour = STATE_COLOURS.get((state or cell).strip())
        return f"{colour}{cell}{RESET}" if self.on and colour else cell

    def error(self, text: str) -> str:
        return f"{ERROR}{text}{RESET}" if self.on else text


PLAIN = Paint(False)
