"""Where the API is and how to call it: settings from the environment or a config file."""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from backend.cli.astra.terminal import shown, shown_all

# Exit codes scripts can rely on.
EXIT_OK = 0
EXIT_FAILED = 1  # the thing asked about failed (a run, a followed worker)
EXIT_USAGE = 2  # bad arguments or no token
EXIT_UNREACHABLE = 3  # the server did not answer
EXIT_NOT_FOUND = 4
EXIT_REFUSED = 5  # the server refused the request (validation, permission)

CONFIG_PATH = Path.home() / ".config" / "astraeus" / "cli.json"
# The embedded server's data directory (backend/config.py's default, ASTRAEUS_DATA_DIR), where it
# keeps its admin token. Written here too: the CLI imports nothing of the server, which it only
# speaks HTTP to (the import contract in pyproject.toml; tests/test_config.py checks both agree).
EMBEDDED_DATA_DIR = Path.home() / ".local" / "share" / "astraeus"
EMBEDDED_API = "http://127.0.0.1:8080/v1"


class CliError(Exception):
    """What astra says on stderr, and its exit code. The message often quotes the server (a
    reason, a name): its control characters are shown, not obeyed (issue 37 N7)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(shown(message))
        self.exit_code = exit_code


# Errors that say something could not be reached (the database, a machine), not that the
# request was refused: the exit code of an unreachable server, worth trying again.
# CONFLICT_RETRY: the server tried the work several times and it kept losing to other
# requests changing the same things; nothing was changed (issue 19).
UNREACHABLE_CODES = frozenset({"DATABASE_UNAVAILABLE", "TASK_LOG_UNAVAILABLE", "CONFLICT_RETRY"})

# A request answered CONFLICT_RETRY is sent again, up to this many times in all, waiting a
# random time up to the first wait, doubled at each try; then astra says so.
CONFLICT_TRIES = 4
CONFLICT_FIRST_WAIT_S = 0.25
# An upload (a run's code, up to the server's limit) may take this long on a slow link.
UPLOAD_S = 600.0


def _conflict(body: dict[str, Any]) -> str | None:
    """The message of a CONFLICT_RETRY in a GraphQL answer: a request's error, or one in a
    mutation's payload (``errors`` beside what it changed). None if there is none."""
    for error in body.get("errors") or []:
        if (error.get("extensions") or {}).get("code") == "CONFLICT_RETRY":
            return str(error.get("message") or "")
    for payload in (body.get("data") or {}).values():
        if isinstance(payload, dict):
            for error in payload.get("errors") or []:
                if isinstance(error, dict) and error.get("code") == "CONFLICT_RETRY":
                    return str(error.get("message") or "")
    return None


def gave_up(message: str, tries: int) -> CliError:
    return CliError(
        f"astra: {message} (sent {tries} times, each time other requests were changing the "
        "same things: try again in a moment)",
        EXIT_UNREACHABLE,
    )


def exit_for(code: str) -> int:
    """The exit code for an API error's code."""
    if code == "UNAUTHENTICATED":
        return EXIT_USAGE
    if code.endswith("_NOT_FOUND"):
        return EXIT_NOT_FOUND
    return EXIT_UNREACHABLE if code in UNREACHABLE_CODES else EXIT_REFUSED


@dataclass(frozen=True)
class Target:
    api: str  # the REST base, ending in /v1, as the seeds' $API
    token: str

    @property
    def graphql_url(self) -> str:
        return self.api.rstrip("/").removesuffix("/v1") + "/graphql"


def cli_config() -> dict[str, Any]:
    """The config file's settings; none without one."""
    if CONFIG_PATH.is_file():
        return dict(json.loads(CONFIG_PATH.read_text()))
    return {}


def resolve_target(env: dict[str, str] | None = None) -> Target:
    """The API and token: $ASTRALYX_API/$API and $ASTRALYX_TOKEN/$ASTRA_TOKEN, then the config
    file, then the embedded server's own admin token on this machine."""
    env = dict(os.environ if env is None else env)
    config = cli_config()
    api = env.get("ASTRALYX_API") or env.get("API") or config.get("api") or EMBEDDED_API
    token = env.get("ASTRALYX_TOKEN") or env.get("ASTRA_TOKEN") or config.get("token")
    if not token:
        data_dir = Path(env.get("ASTRAEUS_DATA_DIR") or EMBEDDED_DATA_DIR)
        local = data_dir / "admin-token"
        if local.is_file():
            token = local.read_text().strip()
    if not token:
        raise CliError(
            "astra: no API token: set ASTRA_TOKEN (or ASTRALYX_TOKEN), or write "
            f'{{"api": …, "token": …}} to {CONFIG_PATH}',
            EXIT_USAGE,
        )
    return Target(api=api.rstrip("/"), token=token)


class Api:
    """Calls of the API. ``for_terminal``: every string of its answers is shown as a terminal
    may safely print it (terminal.shown: a workload's log, a reason quoting an engine); else
    the answers are as the API gives them (for --json)."""

    def __init__(self, target: Target, timeout: float = 30.0, for_terminal: bool = False) -> None:
        self.target = target
        self.for_terminal = for_terminal
        self.http = httpx.Client(
            headers={"Authorization": f"Bearer {target.token}"}, timeout=timeout
        )

    def wait_before(self, attempt: int) -> None:
        """Before sending again a request answered CONFLICT_RETRY ``attempt`` times."""
        time.sleep(random.uniform(0, CONFLICT_FIRST_WAIT_S * 2 ** (attempt - 1)))

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        """The answer's data. Answered CONFLICT_RETRY (nothing was changed), it is sent again,
        up to CONFLICT_TRIES times, then a CliError says so."""
        for attempt in range(1, CONFLICT_TRIES + 1):
            answer = self._post(query, variables)
            conflict = _conflict(answer.json()) if answer.status_code == 200 else None
            if conflict is None:
                break
            if attempt == CONFLICT_TRIES:
                raise gave_up(conflict, attempt)
            self.wait_before(attempt)
        return self._data(answer)

    def _post(self, query: str, variables: dict[str, Any]) -> httpx.Response:
        try:
            return self.http.post(
                self.target.graphql_url, json={"query": query, "variables": variables}
            )
        except httpx.TransportError as exc:
            raise CliError(
                f"astra: cannot reach Astraeus at {self.target.graphql_url}: {exc}",
                EXIT_UNREACHABLE,
            ) from None

    def _data(self, answer: httpx.Response) -> dict[str, Any]:
        if answer.status_code != 200:
            raise CliError(
                f"astra: the server answered {answer.status_code}: {answer.text[:200]}",
                EXIT_UNREACHABLE if answer.status_code >= 500 else EXIT_REFUSED,
            )
        body = answer.json()
        if body.get("errors"):
            error = body["errors"][0]
            code = str((error.get("extensions") or {}).get("code") or "")
            raise CliError(f"astra: {error['message']}", exit_for(code))
        return self.answer(dict(body["data"]))

    def answer(self, found: dict[str, Any]) -> dict[str, Any]:
        """An answer as the caller prints it (see the class)."""
        return dict(shown_all(found)) if self.for_terminal else found

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        """A REST call of the shim: its JSON, or a CliError with an exit code by its status."""
        url = f"{self.target.api}{path}"
        for attempt in range(1, CONFLICT_TRIES + 1):
            try:
                answer = self.http.get(url, params=params)
            except httpx.TransportError as exc:
                raise CliError(
                    f"astra: cannot reach Astraeus at {url}: {exc}", EXIT_UNREACHABLE
                ) from None
            if answer.status_code != 409 or _rest_code(answer) != "CONFLICT_RETRY":
                break
            if attempt == CONFLICT_TRIES:
                raise gave_up(str(answer.json().get("message") or ""), attempt)
            self.wait_before(attempt)
        if answer.status_code == 200:
            return self.answer(dict(answer.json()))
        raise _refusal(answer)

    def put(self, path: str, content: bytes, content_type: str) -> dict[str, Any]:
        """A REST upload (a run's code): its JSON answer, or a CliError as ``get``'s."""
        url = f"{self.target.api}{path}"
        try:
            answer = self.http.put(
                url, content=content, headers={"Content-Type": content_type}, timeout=UPLOAD_S
            )
        except httpx.TransportError as exc:
            raise CliError(
                f"astra: cannot reach Astraeus at {url}: {exc}", EXIT_UNREACHABLE
            ) from None
        if answer.status_code in (200, 201):
            return self.answer(dict(answer.json()))
        raise _refusal(answer)

    @property
    def websocket_url(self) -> str:
        return self.target.graphql_url.replace("http", "ws", 1)


def _refusal(answer: httpx.Response) -> CliError:
    """A REST answer other than success, as astra says it, with the exit code of its status."""
    try:
        body = answer.json()
        message, code = body.get("message") or answer.text, str(body.get("code") or "")
    except ValueError:
        message, code = answer.text[:200], ""
    exit_code = {401: EXIT_USAGE, 404: EXIT_NOT_FOUND}.get(answer.status_code, exit_for(code))
    if answer.status_code >= 500:
        exit_code = EXIT_UNREACHABLE
    return CliError(f"astra: {message}", exit_code)


def _rest_code(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("code") or "")
    except ValueError:
        return ""
