"""What each kind of message a machine sends writes: its worker events, progress reports,
GPU faults, command acknowledgements, secret requests and metric samples, each in the
transaction the writer (backend/gateway/writer.py) gives it. Heartbeats and replies write
nothing: they have no handler."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from astraeus.agent.v1 import agent_pb2
from sqlalchemy.ext.asyncio import AsyncSession

from backend.clock import Clock
from backend.errors import NotFound
from backend.gateway import service
from backend.gateway.service import ProgressInfo, WorkerEventInfo, agent_time
from backend.gateway.streams import MESSAGE_LIMIT, Streams, too_large
from backend.lifecycle.sentences import EndCause
from backend.lifecycle.states import Wait
from backend.lifecycle.views import Effects
from backend.machines import rules as machine_rules
from backend.machines.rules import FaultKind
from backend.metrics.rules import SampleIn
from backend.models import Machine
from backend.parsing import BIGGEST_ID
from backend.secrets import service as secrets

log = logging.getLogger(__name__)

_STATES = {
    agent_pb2.WORKER_STATE_PREPARING: "preparing",
    agent_pb2.WORKER_STATE_PULLING: "pulling",
    agent_pb2.WORKER_STATE_READY: "ready",
    agent_pb2.WORKER_STATE_RUNNING: "running",
    agent_pb2.WORKER_STATE_EXITED: "exited",
}
# How a worker ended, as the agent says (an end it does not name is an exit).
_CAUSES = {
    agent_pb2.END_CAUSE_UNSPECIFIED: EndCause.EXITED,
    agent_pb2.END_CAUSE_EXITED: EndCause.EXITED,
    agent_pb2.END_CAUSE_OOM_KILLED: EndCause.OOM_KILLED,
    agent_pb2.END_CAUSE_SIGNALLED: EndCause.SIGNALLED,
    agent_pb2.END_CAUSE_NOT_FOUND: EndCause.NOT_FOUND,
    agent_pb2.END_CAUSE_LOST: EndCause.LOST,
    agent_pb2.END_CAUSE_LOST_BEFORE_START: EndCause.LOST_BEFORE_START,
    agent_pb2.END_CAUSE_IMAGE_PULL: EndCause.IMAGE_PULL,
    agent_pb2.END_CAUSE_NOT_STARTED: EndCause.NOT_STARTED,
    agent_pb2.END_CAUSE_STOPPED_BEFORE_START: EndCause.STOPPED_BEFORE_START,
    agent_pb2.END_CAUSE_UNREADABLE: EndCause.UNREADABLE,
    agent_pb2.END_CAUSE_PORT_TAKEN: EndCause.PORT_TAKEN,
}
# A GPU fault's kind, as the agent says: what NVML reported (a kind this server does not know,
# or none, from an agent before kinds were sent, is another fault; its sentence is never read).
_FAULT_KINDS = {
    agent_pb2.GPU_FAULT_KIND_XID: FaultKind.XID,
    agent_pb2.GPU_FAULT_KIND_ECC: FaultKind.ECC,
    agent_pb2.GPU_FAULT_KIND_ROW_REMAP_PENDING: FaultKind.REMAP,
    agent_pb2.GPU_FAULT_KIND_ROW_REMAP_FAILED: FaultKind.REMAP,
}
# What a preparing or pulling worker waits for, as the agent says (unspecified: nothing said).
_WAITS = {
    agent_pb2.WAIT_SECRET: Wait.SECRET,
    agent_pb2.WAIT_DRIVE: Wait.DRIVE,
    agent_pb2.WAIT_IMAGE: Wait.IMAGE,
    agent_pb2.WAIT_CODE: Wait.CODE,
}

# A message's handler: (session, machine, message), what it did to the lifecycle.
Handler = Callable[[AsyncSession, Machine, agent_pb2.AgentMessage], Awaitable[Effects | None]]


class MessageHandlers:
    """The replica's handlers of its machines' messages, by kind. A secret request is
    answered on the machine's stream (``streams``)."""

    def __init__(self, clock: Clock, streams: Streams) -> None:
        self.clock = clock
        self.streams = streams
        self._by_kind: dict[str, Handler] = {
            "metrics": self._metrics,
            "secret_request": self._secret_request,
            "worker_event": self._worker_event,
            "progress": self._progress,
            "gpu_health": self._gpu_health,
            "command_ack": self._command_ack,
        }

    def get(self, kind: str) -> Handler | None:
        """What writes a message of this kind; None: it writes nothing."""
        return self._by_kind.get(kind)

    async def _worker_event(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> Effects:
        e = message.worker_event
        event = WorkerEventInfo(
            worker_id=e.worker_id,
            attempt=e.attempt or None,
            kind=_STATES[e.state],
            at=agent_time(e.at_ms, self.clock.now()),
            reason=e.reason[: machine_rules.MAX_WORKER_REASON],
            waits=(
                (_WAITS[e.waits_for], e.waits_on[: machine_rules.MAX_WAITS_ON])
                if e.waits_for in _WAITS
                else None
            ),
            exit_code=e.exit_code if e.HasField("exit_code") else None,
            log_tail=e.log_tail,  # cut once, where the snapshot is made (lifecycle)
            cause=_CAUSES.get(e.cause, EndCause.EXITED),
            signal=e.signal if e.HasField("signal") else None,
            detail=e.detail[: machine_rules.MAX_DETAIL],
            uid=e.uid if e.HasField("uid") else None,
            blocked_at=e.blocked_at[: machine_rules.MAX_DETAIL],
            pids_limit=e.pids_limit if e.HasField("pids_limit") else None,
            offered_port=e.offered_port if e.HasField("offered_port") else None,
        )
        return await service.worker_event(session, self.clock, machine.id, event)

    def progress_info(self, machine: Machine, message: agent_pb2.AgentMessage) -> ProgressInfo:
        p = message.progress
        # uint64 on the wire: past what a step column keeps, a (forged) agent's is no step
        step = p.step if p.HasField("step") and p.step <= BIGGEST_ID else None
        checkpoint = (
            p.checkpoint_step
            if p.HasField("checkpoint_step") and p.checkpoint_step <= BIGGEST_ID
            else None
        )
        at = agent_time(p.at_ms, self.clock.now())
        return ProgressInfo(machine.id, p.worker_id, p.attempt or None, step, at, checkpoint)

    async def _progress(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> Effects:
        p = self.progress_info(machine, message)
        return await service.progress(
            session,
            self.clock,
            p.machine_id,
            p.worker_id,
            p.attempt,
            p.step,
            p.at,
            checkpoint_step=p.checkpoint_step,
        )

    async def _gpu_health(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> Effects:
        h = message.gpu_health
        row = await session.get(Machine, machine.id)
        assert row is not None
        reason = h.reason[: machine_rules.MAX_HEALTH_REASON]
        kind = _FAULT_KINDS.get(h.kind, FaultKind.OTHER)
        try:
            return await service.gpu_health(
                session, self.clock, row, h.index, h.healthy, reason, kind
            )
        except NotFound as refused:  # a GPU it never registered: refused, the stream goes on
            log.warning("machine %s: GpuHealth refused: %s", machine.name, refused.message)
            return Effects()

    async def _command_ack(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> None:
        await service.acknowledge(
            session, self.clock, machine.id, list(message.command_ack.command_ids)
        )

    async def _secret_request(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> Effects | None:
        asked = message.secret_request
        found = await secrets.values_for_worker(session, machine.id, asked.worker_id, asked.attempt)
        stream = self.streams.get(machine.id)
        if found is None or stream is None:
            return None  # not this machine's worker (or not this attempt): it gets nothing
        answer = agent_pb2.SecretValues(
            worker_id=asked.worker_id, values=found.values, missing=found.missing
        )
        size = answer.ByteSize()
        if size > MESSAGE_LIMIT:
            reason = too_large(
                "The values of its secrets are", size, "give the run fewer or smaller secrets"
            )
            return await service.fail_worker(
                session, self.clock, machine.id, asked.worker_id, asked.attempt, reason
            )
        stream.send(secret_values=answer)
        return None

    async def _metrics(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> None:
        await service.metrics(session, machine.id, samples(message), self.clock)


def samples(message: agent_pb2.AgentMessage) -> list[SampleIn]:
    """A metric batch's samples, as the metrics domain takes them."""
    return [
        SampleIn(
            s.worker_id,
            s.metric,
            s.gpu if s.HasField("gpu") else None,
            s.at_ms,
            s.value,
            s.attempt or None,
        )
        for s in message.metrics.samples
    ]
