"""astra's exit codes for the API's error codes (README: 2 usage or no token, 3 server
unreachable, 4 not found, 5 refused)."""

import pytest

from backend.cli.astra.client import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    exit_for,
)


@pytest.mark.parametrize(
    ("code", "exit_code"),
    [
        ("UNAUTHENTICATED", EXIT_USAGE),
        ("RUN_NOT_FOUND", EXIT_NOT_FOUND),
        ("TASK_NOT_FOUND", EXIT_NOT_FOUND),
        ("DATABASE_UNAVAILABLE", EXIT_UNREACHABLE),  # try again in a moment
        ("TASK_LOG_UNAVAILABLE", EXIT_UNREACHABLE),  # its machine (or Redis) did not answer
        ("RUN_ENDED", EXIT_REFUSED),
        ("INVALID_PARAMETER", EXIT_REFUSED),
        ("", EXIT_REFUSED),
    ],
)
def test_each_error_code_has_its_exit_code(code: str, exit_code: int) -> None:
    assert exit_for(code) == exit_code
