"""Text a workload controls, made safe for the reader's terminal (issue 37 N7).

A worker's log, and a reason that quotes a machine's or a registry's words, reach astra as the
workload or the engine wrote them: raw, as the API answers them. Written to a terminal as they
are, their control characters are obeyed: an OSC sets the window's title, a CSI clears the
screen or conceals a line, a \\r overwrites what the line said, a bidi override (U+202E) shows
``invoice\\u202efdp.exe`` as ``invoiceexe.pdf``; some terminals do worse (answerbacks, file
writes). astra shows each such character instead: a C0 control or DEL as its Unicode control
picture (ESC as ␛, \\r as ␍), one without a picture (C1, a bidi control) as ``<U+XXXX>``. Tabs
and newlines stay. Colours too (SGR) are shown, not obeyed: SGR 8 conceals, and a colour on
its like hides a line. With --json, the JSON carries the same text, every such character
escaped (``\\u001b``), so it decodes to what the workload wrote."""

from __future__ import annotations

import json
import re
from typing import Any

# C0 but tab and newline, DEL, C1; the bidi controls (Unicode's Bidi_Control: ALM, LRM, RLM,
# the embeddings and overrides, the isolates).
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
CONTROL_PICTURES = 0x2400  # ␀ … ␟ stand for U+0000 … U+001F
DEL_PICTURE = "\u2421"  # ␡


def _marker(found: re.Match[str]) -> str:
    code = ord(found.group())
    if code < 0x20:
        return chr(CONTROL_PICTURES + code)
    if code == 0x7F:
        return DEL_PICTURE
    return f"<U+{code:04X}>"


def shown(text: str) -> str:
    """``text`` with each control character shown, not obeyed (tabs and newlines kept)."""
    return UNSAFE.sub(_marker, text)


def shown_all(found: Any) -> Any:
    """An API's answer with every string in it shown so (names and numbers are unchanged)."""
    if isinstance(found, str):
        return shown(found)
    if isinstance(found, dict):
        return {key: shown_all(value) for key, value in found.items()}
    if isinstance(found, list):
        return [shown_all(value) for value in found]
    return found


def as_json(found: Any, indent: int | None = 2) -> str:
    """JSON of what the API answered, the text raw once decoded: C0 controls are escaped by
    json itself; DEL, C1 and the bidi controls are escaped here (only a
    string can hold them, so the document stays valid)."""
    text = json.dumps(found, indent=indent, ensure_ascii=False)
    return UNSAFE_IN_JSON.sub(lambda c: f"\\u{ord(c.group()):04x}", text)
