"""The machines' commands delivered on their streams: one loop for all of a replica's
streams finds their new commands (the outbox the lifecycle writes) and checks that their
credentials still hold, a query or two per poll however many streams there are."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from astraeus.agent.v1 import agent_pb2

from backend.clock import Clock
from backend.db import Database
from backend.db.commit_signals import on_rows_committed
from backend.db.notices import Notices
from backend.db.retries import database_away
from backend.gateway import service
from backend.gateway.streams import MESSAGE_LIMIT, MachineStream, Streams, too_large
from backend.machine_identity import service as identity
from backend.machine_identity.rules import MachinePrincipal
from backend.models import AgentCommand
from backend.spec import DEFAULT_CPU

log = logging.getLogger(__name__)

_COMMANDS = {
    "start": agent_pb2.COMMAND_KIND_START,
    "release": agent_pb2.COMMAND_KIND_RELEASE,
    "stop": agent_pb2.COMMAND_KIND_STOP,
    "delete": agent_pb2.COMMAND_KIND_DELETE,
    "watch": agent_pb2.COMMAND_KIND_WATCH,
}
# How often the streams' credentials are checked (all of a replica's in one query): a revoked
# one's stream ends within this and a poll interval.
REVOCATION_CHECK_S = 2.0
# How often the delivery looks for new commands. A commit in this process that adds commands
# wakes it at once (backend/db/commit_signals.py); the poll finds those other processes wrote:
# the scheduler's and workers' in production (every POLL_S), only an admin command's (`astraeus
# cluster import`) where every job runs in the server's process (POLL_EMBEDDED_S: an idle
# `astraeus up` made 120 of its ~220 transactions a minute polling every 0.5 s).
POLL_S = 0.5
POLL_EMBEDDED_S = 2.0
# On PostgreSQL, while the replica hears other processes' commits (backend/db/notices.py): a
# commit anywhere that adds commands, or revokes a machine's credential or join token, wakes
# the loop, and the polls are a net only (issue 40: two queries a second per replica in
# production, whatever the load; the fleet's serve, polling every 2 s, showed no difference).
POLL_NOTIFIED_S = 10.0
REVOCATION_NOTIFIED_S = 30.0
_CREDENTIALS = ("machine_credentials", "join_tokens")


class CommandDelivery:
    """The delivery loop of one replica's ``streams``; ``on_freed`` hears of GPUs freed by a
    command that could not be delivered (its worker fails)."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        streams: Streams,
        *,
        poll_interval: float,
        on_freed: Callable[[], None],
        notices: Notices | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.streams = streams
        self.poll_interval = poll_interval
        self.on_freed = on_freed
        self.notices = notices
        self._delivery: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._revoked = False  # a credential was revoked somewhere: check at once

    def _intervals(self) -> tuple[float, float]:
        """(poll, credential check) intervals: long while other processes' commits are heard."""
        if self.notices is not None and self.notices.connected:
            return max(self.poll_interval, POLL_NOTIFIED_S), REVOCATION_NOTIFIED_S
        return self.poll_interval, REVOCATION_CHECK_S

    def soon(self) -> None:
        """Look for commands now (a stream opened): the delivery loop runs while this
        replica holds streams."""
        self._wake.set()
        if self._delivery is None or self._delivery.done():
            self._delivery = asyncio.create_task(self._delivering())

    def stop(self) -> None:
        """The last stream ended: the loop stops."""
        delivery, self._delivery = self._delivery, None
        if delivery is not None:
            delivery.cancel()

    async def _delivering(self) -> None:
        """While this replica holds streams: every poll interval, one query for all of their
        machines' new unacknowledged commands (sent in order on each machine's stream; none
        while the database is away), and every REVOCATION_CHECK_S one for whether their
        credentials still hold (a stream whose credential was revoked ends, saying why). A
        stream opening, or a commit in this process that adds commands, wakes it at once."""
        loop = asyncio.get_running_loop()
        checked = -REVOCATION_NOTIFIED_S

        def committed() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake.set)

        def revoked() -> None:
            self._revoked = True
            committed()

        forgets = [
            on_rows_committed(AgentCommand.__tablename__, committed),
            *(on_rows_committed(table, revoked) for table in _CREDENTIALS),
        ]
        try:
            while self.streams.by_machine:
                self._wake.clear()
                poll, revocation = self._intervals()
                check = self._revoked or loop.time() - checked >= revocation
                self._revoked = False
                try:
                    await self._deliver_once(check)
                    if check:
                        checked = loop.time()
                except Exception as error:
                    self._revoked |= check
                    if not database_away(error):
                        log.exception("commands could not be delivered; they are tried again")
                # not wait_for: see _wait in backend/gateway/redis_router.py
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll):
                        await self._wake.wait()
        finally:
            for forget in forgets:
                forget()

    async def _deliver_once(self, check_credentials: bool) -> None:
        streams = [s for s in self.streams.by_machine.values() if not s.closed.is_set()]
        if not streams:
            return
        refused: dict[MachinePrincipal, str] = {}
        async with self.db.read() as session:
            if check_credentials:
                refused = await identity.revoked_among(
                    session, {s.agent for s in streams if s.agent is not None}
                )
            commands = await service.new_commands(
                session, {s.machine_id: s.last_command_sent for s in streams}
            )
        for stream in streams:
            if stream.agent is not None and stream.agent in refused:
                stream.refusal = refused[stream.agent]
                stream.closed.set()
                continue
            try:
                await self._send_commands(stream, commands.get(stream.machine_id, []))
            except Exception as error:
                if database_away(error):
                    raise
                log.exception("commands of machine %s could not be sent", stream.machine_id)
                stream.closed.set()  # it registers again, and its commands are sent again

    async def _send_commands(self, stream: MachineStream, commands: list[AgentCommand]) -> None:
        """The machine's new commands on its stream, in order. A command too large for the
        stream is never sent: its worker fails with a reason instead, and the stream carries
        the next one."""
        for c in commands:
            if stream.closed.is_set() or c.id <= stream.last_command_sent:
                return
            message = command_message(c)
            size = message.ByteSize()
            if size > MESSAGE_LIMIT:
                await self._undeliverable(stream.machine_id, c, size)
            else:
                stream.send(command=message)
            stream.last_command_sent = c.id

    async def _undeliverable(self, machine_id: int, command: AgentCommand, size: int) -> None:
        """A command the stream cannot carry: set aside, and its worker fails saying why."""
        reason = too_large(f"Its {command.kind} command is", size)
        async with self.db.transaction() as session:
            fx = await service.undeliverable(session, self.clock, machine_id, command.id, reason)
        if fx.freed:
            self.on_freed()


def command_message(command: AgentCommand) -> agent_pb2.Command:
    """A stored command as the protocol's message."""
    return agent_pb2.Command(
        command_id=command.id,
        kind=_COMMANDS[command.kind],
        worker_id=command.target_worker_id or 0,
        start=start_message(command) if command.kind == "start" else None,
        watch=watch_message(command) if command.kind == "watch" else None,
    )


def watch_message(command: AgentCommand) -> agent_pb2.WatchWorker:
    """A watch command's stored payload (backend/slurm/jobs.py) as the typed message."""
    p = command.payload
    watch = agent_pb2.WatchWorker(
        worker=command.worker_name,
        attempt=int(p.get("attempt") or 0),
        slurm_job_id=str(p.get("job_id") or ""),
        gpu_ids=[int(i) for i in p.get("gpu_ids") or []],
        state_dir=str(p.get("state_dir") or ""),
        run_folder=str(p.get("run_folder") or ""),
        log=str(p.get("log") or ""),
        progress=str(p.get("progress") or ""),
        batch_output=bool(p.get("batch_output")),
    )
    if p.get("task") is not None:
        watch.task = int(p["task"])
    return watch


def start_message(command: AgentCommand) -> agent_pb2.StartWorker:
    """A start command's stored payload as the protocol's typed message."""
    p = command.payload
    start = agent_pb2.StartWorker(
        worker=command.worker_name,
        run=str(p.get("run") or ""),
        rank=int(p.get("rank") or 0),
        attempt=int(p.get("attempt") or 0),
        workspace_id=int(p.get("workspace_id") or 0),
        image=str(p.get("image") or ""),
        command=[str(a) for a in p.get("command") or []],
        user=str(p.get("user") or ""),
        working_dir=str(p.get("working_dir") or ""),
        environment={str(k): str(v) for k, v in (p.get("environment") or {}).items()},
        astraeus_environment={
            str(k): str(v) for k, v in (p.get("astraeus_environment") or {}).items()
        },
        mounts=[
            agent_pb2.Mount(
                drive=m["drive"],
                path=m["path"],
                fill_from=m.get("fill_from") or "",
                read_only=bool(m.get("read_only")),
            )
            for m in p.get("mounts") or []
        ],
        credentials=[
            agent_pb2.Credential(
                secret=c["secret"], env=c.get("env") or "", file=c.get("file") or ""
            )
            for c in p.get("credentials") or []
        ],
        gpu_ids=[int(i) for i in p.get("gpu_ids") or []],
        gang_addresses=[str(a) for a in p.get("gang_addresses") or []],
        worker_key=str(p.get("worker_key") or ""),
        code=str(p.get("code") or ""),
    )
    if p.get("cpu") is not None:
        start.cpu = float(p["cpu"])
    start.cpu_request = float(p["cpu"]) if p.get("cpu") is not None else DEFAULT_CPU
    if p.get("memory_limit_bytes") is not None:
        start.memory_limit_bytes = int(p["memory_limit_bytes"])
    return start
