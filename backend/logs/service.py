"""The logs domain's entry point: a worker's log tail, asked of the machine that keeps it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.errors import AstraeusError, FieldError, InvalidInput, NotFound
from backend.lifecycle import service as lifecycle
from backend.logs import repository
from backend.organizations import service as organizations
from backend.parsing import BIGGEST_ID, whole_number
from backend.runs import service as runs

DEFAULT_TAIL = 1000
MAX_TAIL = 10_000
MAX_BYTES = 900 * 1024
ANSWER_WITHIN_SECONDS = 5.0


@dataclass(frozen=True)
class WorkerRef:
    """A worker as its machine knows it (the server's id: names repeat across workspaces) and
    as people do (its name, for sentences)."""

    id: int
    name: str


@dataclass(frozen=True)
class LogText:
    worker: str
    text: str
    archived: bool


class LogSource(Protocol):
    """Whoever can ask a machine for a log: the log router (backend/gateway/routing.py), which
    takes the request to the API replica holding the machine's stream, this one or another.
    It answers None when no machine answers in time, and raises LogUnavailable when Redis,
    which carries requests between replicas, cannot be reached."""

    async def tail(
        self, machine_id: int, worker: WorkerRef, lines: int, max_bytes: int, wait_s: float
    ) -> LogText | None: ...

    def follow(
        self, machine_id: int, worker: WorkerRef, tail_lines: int = 0
    ) -> AsyncGenerator[Chunk, None]: ...


class Chunk(Protocol):
    """Lines of a followed log: ``missed`` lines were dropped before them; ``ended`` is last."""

    @property
    def text(self) -> str: ...
    @property
    def archived(self) -> bool: ...
    @property
    def missed(self) -> int: ...
    @property
    def ended(self) -> bool: ...


def parse_tail(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_TAIL
    if whole_number(raw, 1, BIGGEST_ID) is None:
        raise InvalidInput(
            "INVALID_PARAMETER", [FieldError("tail", "must be a whole number from 1")]
        )
    tail = whole_number(raw, 1, MAX_TAIL)
    if tail is None:
        raise InvalidInput("INVALID_PARAMETER", [FieldError("tail", f"must be at most {MAX_TAIL}")])
    return tail


class NotPlaced(AstraeusError):
    def __init__(self, worker: str) -> None:
        super().__init__(
            code="TASK_NOT_PLACED",
            message=f"Worker {worker} has not been placed on a machine yet: it has no log.",
            status=409,
        )


class LogUnavailable(AstraeusError):
    def __init__(self, worker: str, why: str) -> None:
        super().__init__(
            code="TASK_LOG_UNAVAILABLE",
            message=f"The log of {worker} could not be fetched: {why}",
            status=400,
        )


async def locate(
    session: AsyncSession, principal: Principal, name: str, *, workspace: str | None = None
) -> tuple[WorkerRef, int]:
    """The worker (a run's name means its first worker; a failed run's, the one that failed it:
    runs.worker_shown) and the machine that keeps its log."""
    ws = await organizations.workspace_for(session, principal, workspace)
    worker = await repository.worker_in_workspace(session, ws.id, name)
    if worker is None:
        worker = await runs.worker_shown(session, ws.id, name)
    if worker is None:
        raise NotFound(
            "TASK_NOT_FOUND", f"No worker or run named '{name}' in workspace '{ws.name}'."
        )
    machine_id = worker.machine_id or await lifecycle.last_machine(session, worker.id)
    if machine_id is None:
        raise NotPlaced(worker.name)
    return WorkerRef(worker.id, worker.name), machine_id


async def fetch(
    source: LogSource | None, machine_id: int, worker: WorkerRef, lines: int
) -> LogText:
    """Ask the machine; no database is needed (or held) while it answers."""
    if source is None:
        raise LogUnavailable(worker.name, "this server takes no agent connections.")
    text = await source.tail(machine_id, worker, lines, MAX_BYTES, ANSWER_WITHIN_SECONDS)
    if text is None:
        raise LogUnavailable(worker.name, "its machine did not answer.")
    return text


FOLLOW_TAIL_MAX = 10_000


def parse_follow_tail(lines: int) -> int:
    """A follow begins with the worker's last ``lines`` lines: 0 to 10 000."""
    if not 0 <= lines <= FOLLOW_TAIL_MAX:
        raise InvalidInput(
            "INVALID_PARAMETER",
            [FieldError("tail", f"must be a whole number from 0 to {FOLLOW_TAIL_MAX}")],
        )
    return lines


# A follow's reader is told when this server is behind on its work by this much or more (its
# event loop's lag): the lines it gets are that late, through no fault of the machine's. While
# no line comes, it is told again every NOTICE_EVERY_S (issue 19: at 300 machines lines
# arrived 41 s late and nobody was told).
SLOWED_AFTER_S = 1.0
NOTICE_EVERY_S = 5.0


class LoopLag:
    """How far behind this process's event loop is: a timer asked every PERIOD_S seconds, the
    time it fired late by. Measured only while someone follows a log."""

    PERIOD_S = 0.25

    def __init__(self) -> None:
        self.behind = 0.0
        self.watchers = 0
        self.task: asyncio.Task[None] | None = None

    async def _measure(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(self.PERIOD_S)
            self.behind = max(0.0, loop.time() - asked - self.PERIOD_S)

    @contextlib.contextmanager
    def watching(self) -> Iterator[LoopLag]:
        if self.task is None or self.task.done():
            self.behind = 0.0
            self.task = asyncio.get_running_loop().create_task(self._measure())
        self.watchers += 1
        try:
            yield self
        finally:
            self.watchers -= 1
            if self.watchers == 0 and self.task is not None:
                self.task.cancel()
                self.task = None

    def slowed(self) -> float:
        """Seconds behind, when it is at least SLOWED_AFTER_S; else 0."""
        return round(self.behind, 1) if self.behind >= SLOWED_AFTER_S else 0.0


LAG = LoopLag()


@dataclass(frozen=True)
class Followed:
    """A followed log's lines (``text``), ``missed`` lines dropped before them because the
    reader or this server fell behind, and ``behind``: seconds this server was behind on its
    work as it handed them on (0 when it keeps up). A chunk with no text and ``behind`` is a
    notice alone: the server is slowed, its lines will come late."""

    text: str
    archived: bool
    missed: int
    ended: bool
    behind: float = 0.0


async def follow(
    source: LogSource | None, machine_id: int, worker: WorkerRef, tail: int
) -> AsyncIterator[Followed]:
    """The worker's new lines as its machine writes them, until the worker ends (the last
    chunk says ``ended``). A machine that is not connected, or that goes before the worker
    ends, is a TASK_LOG_UNAVAILABLE error: the follower knows it saw no end. A server behind
    on its work says so (``behind``), with its lines and, while none come, alone."""
    if source is None:
        raise LogUnavailable(worker.name, "no machine is connected to this server")
    ended = False
    async with contextlib.aclosing(source.follow(machine_id, worker, tail)) as chunks:
        with LAG.watching() as lag:
            coming: asyncio.Future[Chunk] | None = None
            try:
                while True:
                    if coming is None:
                        coming = asyncio.ensure_future(anext(chunks))
                    done, _ = await asyncio.wait({coming}, timeout=NOTICE_EVERY_S)
                    if not done:
                        if lag.slowed():
                            yield Followed("", False, 0, False, lag.slowed())
                        continue
                    try:
                        chunk = coming.result()
                    except StopAsyncIteration:
                        break
                    finally:
                        coming = None
                    ended = chunk.ended
                    yield Followed(
                        chunk.text, chunk.archived, chunk.missed, chunk.ended, lag.slowed()
                    )
            finally:
                if coming is not None and not coming.done():
                    coming.cancel()
                    with contextlib.suppress(BaseException):
                        await coming
    if not ended:
        raise LogUnavailable(worker.name, "its machine is not connected")
