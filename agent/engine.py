"""The Docker Engine API over its unix socket (``/var/run/docker.sock``), with httpx and no Docker
SDK: one client per event loop, in the API version both sides speak (agent/engine_answers.py),
and its errors in the engine's words."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Collection
from typing import Any

import httpx

from agent.engine_answers import (
    LABEL_WORKER,
    SOCKET,
    EngineError,
    PullProgress,
    api_version,
    image_reference,
    orphans,
    worker_filters,
)

log = logging.getLogger("astraeus.agent")


def said(error: Exception) -> str:
    """What went wrong, in the engine's words, or how the engine could not be reached."""
    if isinstance(error, EngineError):
        return error.message
    return f"cannot reach the Docker engine: {error or type(error).__name__}"


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message") or response.text).strip()
    except ValueError:
        return response.text.strip() or response.reason_phrase


LONG = httpx.Timeout(30.0, read=None)  # waits, follows and pulls last as long as they last


class Engine:
    """The Docker Engine API over its unix socket, one client per event loop."""

    def __init__(self, socket: str = SOCKET) -> None:
        self.socket = socket
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._prefix: str | None = None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            transport = httpx.AsyncHTTPTransport(uds=self.socket)
            self._client = httpx.AsyncClient(
                transport=transport, base_url="http://docker", timeout=30.0
            )
            self._loop, self._prefix = loop, None
        return self._client

    async def _base(self) -> str:
        client = self._http()
        if self._prefix is None:
            answer = (await client.get("/version")).json()
            version = api_version(str(answer["ApiVersion"]), answer.get("MinAPIVersion"))
            self._prefix = f"/v{version}"
        return self._prefix

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        limit: httpx.Timeout | float = 30.0,
    ) -> Any:
        """One request; its JSON answer (None when empty); an EngineError for an error."""
        url = await self._base() + path
        response = await self._http().request(method, url, params=params, json=body, timeout=limit)
        if response.status_code >= 400:
            raise EngineError(response.status_code, _message(response))
        return response.json() if response.content else None

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, path: str, params: dict[str, Any]
    ) -> AsyncIterator[httpx.Response]:
        url = await self._base() + path
        async with self._http().stream(method, url, params=params, timeout=LONG) as response:
            if response.status_code >= 400:
                await response.aread()
                raise EngineError(response.status_code, _message(response))
            yield response

    async def image(self, image: str) -> dict[str, Any] | None:
        """The image's inspection, or None when this machine does not have it."""
        try:
            answer: dict[str, Any] = await self.call("GET", f"/images/{image}/json")
            return answer
        except EngineError as error:
            if error.status == 404:
                return None
            raise

    async def pull(self, image: str, progress: PullProgress) -> None:
        """Pull, feeding each progress line to ``progress``; an error ends up in it."""
        from_image, tag = image_reference(image)
        params = {"fromImage": from_image, "tag": tag}
        try:
            async with self.stream("POST", "/images/create", params) as response:
                async for line in response.aiter_lines():
                    if line.strip():
                        with contextlib.suppress(ValueError):
                            progress.feed(json.loads(line))
        except EngineError as error:
            progress.error = error.message

    async def containers(self, filters: str) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = await self.call(
            "GET", "/containers/json", params={"all": "1", "filters": filters}
        )
        return answer

    async def remove(self, container: str) -> None:
        """Remove it, running or not, if the engine can; it may be gone already."""
        with contextlib.suppress(EngineError, httpx.TransportError):
            await self.call(
                "DELETE", f"/containers/{container}", params={"force": "1"}, limit=120.0
            )


_engines: dict[str, Engine] = {}


def engine_at(socket: str = SOCKET) -> Engine:
    """The agent's one Engine for a socket, shared by its workers."""
    return _engines.setdefault(socket, Engine(socket))


async def remove_orphans(engine: Engine, kept: Collection[str], install: str) -> list[str]:
    """Remove this install's containers whose workers this agent no longer keeps (after adopt);
    another agent's on the same engine are not its to remove."""
    ours = [
        c
        for c in await engine.containers(worker_filters())
        if str((c.get("Labels") or {}).get(LABEL_WORKER, "")).startswith(f"{install}-")
    ]
    gone = orphans(ours, kept)
    for container in gone:
        await engine.remove(container)
    return gone
