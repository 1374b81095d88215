"""The machines' messages written to the database: each stream's in the order they came,
acknowledged once written, and many machines' in one transaction by a few writers for the
whole replica, so a stream's messages wait for a writer rather than each for a connection of
the pool (whose wait times out)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from astraeus.agent.v1 import agent_pb2
from sqlalchemy.exc import TimeoutError as PoolTimeout

from agent.backoff import Backoff
from backend.clock import Clock
from backend.db import Database
from backend.db.retries import database_away
from backend.gateway import service
from backend.gateway.handlers import Handler, MessageHandlers, samples
from backend.gateway.streams import MachineStream
from backend.lifecycle.views import Effects
from backend.models import Machine

log = logging.getLogger(__name__)

# A machine's messages written, at most, before one Ack says so (when more of them wait).
ACK_EVERY = 50

# Messages of many machines written in one transaction, at most; and how many such
# transactions at once (the rest of the pool is the requests'). A stream's messages wait
# for a writer rather than each for a connection of the pool (whose wait times out).
WRITE_BATCH = 50
WRITERS = 2
# How long a writer waits, once a message came, for others to write with it (unless a whole
# batch waits already): a transaction's cost (a connection, its ping, BEGIN, COMMIT) is paid
# for a few machines' messages instead of for each, for a few hundredths of a second later.
WRITE_LINGER_S = 0.02
# What is written with other machines' messages: samples, progress and acknowledgements,
# most of what machines send. Each takes its rows' locks (a run's, its workers', commands') in
# the order of its worker's id, and a batch is written in that order, so two batches, or a
# batch and a scheduling pass (runs in id order), take them in one order. The rest is
# written alone: a worker's state changes and GPU faults take wider locks (a gang's, a
# machine's), and a secret request answers on the stream, which a batch tried again would
# do twice. (Batching worker events too deadlocked with scheduling passes at 1 000 machines.)
_BATCHED = frozenset({"metrics", "progress", "command_ack"})


# A machine's messages written together, at most: the next ones waiting, while they are
# batched ones (and at most one sample batch, whose GPU utilisation folds into the worker's
# once a batch).
GROUP_MAX = 50


def _group(
    first: agent_pb2.AgentMessage,
    waiting: asyncio.Queue[agent_pb2.AgentMessage],
    handlers: MessageHandlers,
) -> tuple[list[agent_pb2.AgentMessage], agent_pb2.AgentMessage | None]:
    """The machine's messages to write together, starting with ``first``: the next ones
    already waiting, while each is batched (samples, progress, acknowledgements) or writes
    nothing (heartbeats, replies). Issue 19: a stream wrote one message per batch, so a
    machine sending more than its writer's round trips allowed (a busy server) fell minutes
    behind, its workers' ends queued behind its progress. Batched messages are each written
    as many times as asked (written again they change nothing), so a group is tried again
    whole. A Report counts as its parts (``parts``), all in one group: it is acknowledged
    once all are written. Returns the group, and the message taken that ends it (written
    next), if any."""
    group = parts(first)
    if not all(_groups(m, handlers) for m in group):
        return group, None
    samples = any(m.WhichOneof("body") == "metrics" for m in group)
    while len(group) < GROUP_MAX and not waiting.empty():
        message = waiting.get_nowait()
        more = parts(message)
        more_samples = any(m.WhichOneof("body") == "metrics" for m in more)
        if (
            not all(_groups(m, handlers) for m in more)
            or (samples and more_samples)
            or len(group) + len(more) > GROUP_MAX
        ):
            return group, message
        samples |= more_samples
        group.extend(more)
    return group, None


# A Report's progress entries, at most: one a worker, and an agent with more workers sends
# its period's progress in several reports (agent/state.py REPORT_PROGRESS, equal). Each entry
# locks and moves its worker's row in the group's transaction: a forged agent's 4 MiB of them
# (about 200 000) would hold one transaction, and the writers, for as long.
MAX_REPORT_PROGRESS = 1024


def report_refusal(message: agent_pb2.AgentMessage) -> str | None:
    """Why a message is refused before it is queued to be written, if it is: a Report of more
    progress entries than a report holds. A refusal is cheap: the message is taken as a sign
    of life, acknowledged, and nothing of it written."""
    if message.WhichOneof("body") != "report":
        return None
    count = len(message.report.progress)
    if count <= MAX_REPORT_PROGRESS:
        return None
    return (
        f"a Report of {count} progress entries refused (at most {MAX_REPORT_PROGRESS} a "
        "report, one a worker): nothing of it written"
    )


def parts(message: agent_pb2.AgentMessage) -> list[agent_pb2.AgentMessage]:
    """A Report as the messages an agent of protocol 3 sends for it, each with the report's
    id: each worker's Progress, then the MetricBatch (issue 40: one message a period for a
    machine, written as before). An empty one is a heartbeat. Any other message is itself."""
    if message.WhichOneof("body") != "report":
        return [message]
    report = message.report
    out = [agent_pb2.AgentMessage(id=message.id, progress=p) for p in report.progress]
    if report.metrics.samples:
        out.append(agent_pb2.AgentMessage(id=message.id, metrics=report.metrics))
    return out or [agent_pb2.AgentMessage(id=message.id, heartbeat=agent_pb2.Heartbeat())]


def _groups(message: agent_pb2.AgentMessage, handlers: MessageHandlers) -> bool:
    kind = message.WhichOneof("body")
    return kind in _BATCHED or handlers.get(kind or "") is None


def _lock_order(message: agent_pb2.AgentMessage) -> int:
    """Where a batched message goes in its batch: by the worker whose rows it locks."""
    kind = message.WhichOneof("body")
    if kind == "progress":
        return message.progress.worker_id
    if kind == "metrics":
        return min((s.worker_id for s in message.metrics.samples), default=0)
    return 0  # acknowledgements lock only their own commands, in id order


@dataclass
class _Write:
    machine: Machine
    message: agent_pb2.AgentMessage
    handler: Handler
    batched: bool
    done: asyncio.Future[Effects | None]


OUTAGE_RETRY_START = 0.5  # seconds before a message the database could not take is retried
OUTAGE_RETRY_CAP = 5.0


class MessageWriter:
    """The replica's writers of its machines' messages; ``on_freed`` hears of GPUs a
    message freed (a scheduling pass may place a waiting run on them)."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        handlers: MessageHandlers,
        on_freed: Callable[[], None],
    ) -> None:
        self.db = db
        self.clock = clock
        self.handlers = handlers
        self.on_freed = on_freed
        # The machines' messages waiting to be written, and the writers that write them.
        # Each entry one stream's group of messages (_group), written in one batch.
        self._writes: asyncio.Queue[list[_Write]] = asyncio.Queue()
        self._writers: list[asyncio.Task[None]] = []
        # The batches being written: each finishes its transaction even when its writer is
        # cancelled (the last stream ended), so none is cut off holding a connection.
        self._batches: set[asyncio.Task[None]] = set()

    @property
    def writing(self) -> bool:
        """A batch is being written."""
        return bool(self._batches)

    def stop(self) -> None:
        """The last stream ended: the writers stop, unless messages are left to write."""
        if self._writes.empty():  # nothing left to write: the writers stop
            for writer in self._writers:
                writer.cancel()
            self._writers = []

    async def write(self, stream: MachineStream, machine: Machine) -> None:
        """Apply the machine's messages in order, acknowledging them once written: an Ack
        says "all up to this one", so one is sent when no other message of the machine waits
        (or after ACK_EVERY of them), not one per message (issue 19: at a thousand machines
        the acknowledgements were half of what the server sent)."""
        unacknowledged = 0
        carried: agent_pb2.AgentMessage | None = None
        while True:
            first = carried if carried is not None else await stream.received.get()
            group, carried = _group(first, stream.received, self.handlers)
            await self._apply_when_possible(machine, group)
            unacknowledged += len(group)
            if (carried is None and stream.received.empty()) or unacknowledged >= ACK_EVERY:
                stream.send(ack=agent_pb2.Ack(up_to=group[-1].id))
                unacknowledged = 0

    async def _apply_when_possible(
        self, machine: Machine, group: list[agent_pb2.AgentMessage]
    ) -> None:
        """Apply the messages; while the database is away they wait and are tried again (the
        stream, and the log follows and tails that ride on it, go on); a group of several is
        of messages written again unchanged (_group). A heartbeat writes nothing: that it was
        read renewed the lease already."""
        retry = Backoff(OUTAGE_RETRY_START, OUTAGE_RETRY_CAP)
        while True:
            try:
                await self._apply(machine, group)
                return
            except Exception as error:
                # a pool with no connection free in time is the database too busy: waited out
                if not database_away(error) and not isinstance(error, PoolTimeout):
                    raise
                wait = retry.wait()
                log.warning(
                    "machine %s: the database is away; its message %d waits %.1fs",
                    machine.name,
                    group[0].id,
                    wait,
                )
                await asyncio.sleep(wait)

    async def _apply(self, machine: Machine, group: list[agent_pb2.AgentMessage]) -> None:
        """Written with other machines' messages (``_writing``), the group's together;
        raises what writing one of them alone raised."""
        loop = asyncio.get_running_loop()
        writes: list[_Write] = []
        for message in group:
            kind = message.WhichOneof("body") or ""
            handler = self.handlers.get(kind)
            if handler is not None:
                writes.append(
                    _Write(machine, message, handler, kind in _BATCHED, loop.create_future())
                )
        if not writes:
            return
        self._writes.put_nowait(writes)
        self._start_writers()
        await asyncio.wait([w.done for w in writes])
        for w in writes:
            fx = w.done.result()  # raises what writing it raised
            if fx is not None and fx.freed:
                self.on_freed()

    def _start_writers(self) -> None:
        self._writers = [w for w in self._writers if not w.done()]
        while len(self._writers) < WRITERS:
            self._writers.append(asyncio.create_task(self._writing()))

    async def _writing(self) -> None:
        """One of the replica's writers: the machines' messages waiting to be written, up to
        WRITE_BATCH of them (each stream has at most one waiting, so a stream's messages keep
        their order), in one transaction: a transaction's own cost (a connection, BEGIN,
        COMMIT, the session) paid once for many machines, not for each message. If one of
        them fails, each is written alone, so its failure is its own."""
        while True:
            batch = list(await self._writes.get())
            if len(batch) + self._writes.qsize() < WRITE_BATCH:
                await asyncio.sleep(WRITE_LINGER_S)  # let other machines' messages join it
            while len(batch) < WRITE_BATCH and not self._writes.empty():
                batch.extend(self._writes.get_nowait())
            writing = asyncio.create_task(self._write_batch(batch))
            self._batches.add(writing)
            writing.add_done_callback(self._batches.discard)
            try:
                await asyncio.shield(writing)
            except Exception as error:  # never expected: each was settled with its own
                for w in batch:
                    if not w.done.done():
                        w.done.set_exception(error)

    async def _write_batch(self, batch: list[_Write]) -> None:
        """The batch's progress reports and samples in a few statements for them all
        (service.reports), its acknowledgements beside them, in one transaction; then what
        that left (reports whose rows another transaction held, or that change a worker's
        state) and the rest of the batch, each alone."""
        together = sorted((w for w in batch if w.batched), key=lambda w: _lock_order(w.message))
        alone = [w for w in batch if not w.batched]
        utilization: dict[tuple[int, int], float] = {}
        if together:
            progress = [w for w in together if w.message.WhichOneof("body") == "progress"]
            metrics = [w for w in together if w.message.WhichOneof("body") == "metrics"]
            others = [w for w in together if w not in progress and w not in metrics]
            try:
                results: list[Effects | None] = []
                async with self.db.transaction() as session:
                    left = await service.reports(
                        session,
                        self.clock,
                        [self.handlers.progress_info(w.machine, w.message) for w in progress],
                        [(w.machine.id, samples(w.message)) for w in metrics],
                    )
                    for w in others:
                        results.append(await w.handler(session, w.machine, w.message))
            except Exception:
                alone = batch  # which one failed is found by writing each alone
            else:
                again = {id(progress[i]) for i in left.progress}
                alone += [w for w in progress if id(w) in again]
                utilization = left.utilization
                written = [w for w in progress + metrics if id(w) not in again]
                for w, fx in [*zip(others, results, strict=True), *((w, None) for w in written)]:
                    if not w.done.done():
                        w.done.set_result(fx)
        else:
            alone = batch
        if utilization:
            try:
                async with self.db.transaction() as session:
                    await service.record_gpu_utilizations(session, utilization)
            except Exception:  # a pace is an estimate: this one's loss is logged, not fatal
                log.exception(
                    "GPU utilisation of %d workers could not be written", len(utilization)
                )
        for w in alone:
            try:
                async with self.db.transaction() as session:
                    fx = await w.handler(session, w.machine, w.message)
            except Exception as error:
                if not w.done.done():
                    w.done.set_exception(error)
            else:
                if not w.done.done():
                    w.done.set_result(fx)
