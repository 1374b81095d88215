"""What astra prints of text a workload controls (issue 37 N7): its control characters shown,
not obeyed; --json's text as the API answered it, every such character escaped. The live test
is tests/e2e/test_astra_cli_ux.py's test_a_workloads_escape_sequences_reach_no_terminal."""

from __future__ import annotations

import json

from backend.cli.astra.client import Api, CliError, Target
from backend.cli.astra.main import format_status
from backend.cli.astra.terminal import as_json, shown

# Every character astra must not pass to a terminal: C0 but tab and newline, DEL, C1, bidi.
UNSAFE = [
    *(chr(c) for c in range(0x20) if chr(c) not in "\t\n"),
    *(chr(c) for c in range(0x7F, 0xA0)),
    "\u061c",
    "\u200e",
    "\u200f",
    *(chr(c) for c in range(0x202A, 0x202F)),
    *(chr(c) for c in range(0x2066, 0x206A)),
]


def test_each_control_character_is_shown_by_a_marker() -> None:
    assert shown("\x1b]0;pwned\x07") == "␛]0;pwned␇"  # OSC: the window's title
    assert shown("\x1b[2J\r\x08\x00\x7f") == "␛[2J␍␈␀␡"
    assert shown("\x9b2J invoice\u202efdp.exe") == "<U+009B>2J invoice<U+202E>fdp.exe"
    assert shown("step 1\tloss 0.5\n") == "step 1\tloss 0.5\n"  # tabs and newlines stay
    assert shown("λ 数据 ✓ █▉") == "λ 数据 ✓ █▉"  # printable text of any script stays
    for character in UNSAFE:
        marked = shown(f"a{character}b")
        assert character not in marked and marked.startswith("a") and marked.endswith("b")


def test_a_tables_strings_are_shown_so_its_numbers_and_names_kept() -> None:
    api = Api(Target(api="http://127.0.0.1:1/v1", token="t"), for_terminal=True)
    answer = {
        "run": {
            "name": "pull",
            "state": "Failed",
            "reason": "ErrImagePull: \x1b]8;;http://evil\x07registry says hi",
            "workers": [
                {
                    "name": "pull-0",
                    "state": "Failed",
                    "machine": None,
                    "lastPlacement": {"machine": "gpu-07"},
                    "reason": "ErrImagePull: \x1b[2Jgone",
                    "restarts": 3,
                }
            ],
        }
    }
    run = api.answer(answer)["run"]
    assert format_status(run).splitlines() == [
        "pull: Failed — ErrImagePull: ␛]8;;http://evil␇registry says hi",
        "  pull-0  Failed  gpu-07  ErrImagePull: ␛[2Jgone",
    ]
    assert run["workers"][0]["restarts"] == 3 and run["workers"][0]["machine"] is None
    raw = Api(Target(api="http://127.0.0.1:1/v1", token="t"))
    assert raw.answer(answer) == answer  # --json: as the API answered


def test_json_decodes_to_the_raw_text_and_holds_none_of_it() -> None:
    text = "".join(UNSAFE) + "λ\t\n"
    printed = as_json({"logs": text})
    assert json.loads(printed) == {"logs": text}
    assert not any(character in printed for character in UNSAFE)
    assert "λ" in as_json({"logs": "λ"})  # the rest stays as it is, not \u-escaped
    assert as_json({"a": 1}, indent=None) == '{"a": 1}'


def test_an_error_quoting_the_server_is_shown_so() -> None:
    assert str(CliError("astra: \x1b[8mhidden\u202e", 1)) == "astra: ␛[8mhidden<U+202E>"
