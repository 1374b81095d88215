"""No token reaches uvicorn's logs: a token in a logged path or message is redacted."""

from __future__ import annotations

import logging

import pytest

from backend.access import redaction

TOKEN = "astx_Q2x9-vTq_8hLw0pZrN3mK7yB1cD4eF6gH8iJ0kL2mN4"


@pytest.mark.parametrize(
    ("logged", "kept"),
    [
        (f"/v1/tasks?token={TOKEN}", "/v1/tasks?token=[redacted]"),
        (f"/graphql?a=1&access_token={TOKEN}&b=2", "/graphql?a=1&access_token=[redacted]&b=2"),
        ("/v1/tasks?api_key=hunter2", "/v1/tasks?api_key=[redacted]"),
        (f"/v1/jobs/{TOKEN}", "/v1/jobs/astx_[redacted]"),
        ("/v1/jobs/train?tail=10", "/v1/jobs/train?tail=10"),
    ],
)
def test_tokens_and_credential_parameters_are_redacted(logged: str, kept: str) -> None:
    assert redaction.redact(logged) == kept


def test_uvicorns_access_log_record_is_written_without_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    redaction.install()
    redaction.install()  # once is enough: no second filter
    access = logging.getLogger("uvicorn.access")
    assert sum(isinstance(f, redaction.TokenRedaction) for f in access.filters) == 1
    # The record as uvicorn's own handler gets it: a server started earlier in this process
    # configured uvicorn's loggers not to propagate, so caplog's root handler would see nothing.
    access.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="uvicorn.access"):
            access.info(
                '%s - "%s %s HTTP/%s" %d',
                "127.0.0.1:5000",
                "GET",
                f"/v1/tasks?token={TOKEN}",
                "1.1",
                401,
            )
    finally:
        access.removeHandler(caplog.handler)
    assert caplog.messages[-1:] == [
        '127.0.0.1:5000 - "GET /v1/tasks?token=[redacted] HTTP/1.1" 401'
    ]
