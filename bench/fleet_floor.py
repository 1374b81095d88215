"""The fleet's bare baseline (issue 40): what the same simulated machines cost a server that
does nothing with their messages but read them and acknowledge them, in the same stack (grpcio's
asyncio server, protobuf, one event loop), with no database, no jobs, no logs.

The bare server answers a Join with a credential, a stream's Hello with a Welcome of protocol 4
and one worker's START (8 GPUs, running for good), that worker's READY with a RELEASE, and every
message with an Ack of its id, as ``serve`` does. The fleet (bench/fleet.py's, unchanged) then
sends what it sends ``serve``: a Report a sample period, a heartbeat after a quiet interval.
``serve``'s CPU per message beside this floor's, measured in the same invocation, says how much
of it is ours and how much the stack's: a target below the floor cannot be met in this stack.

``python -m bench.fleet_floor serve PORT`` runs the bare server (bench/fleet.py starts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc

WORKER_GPUS = 8


class BareAgentService(agent_pb2_grpc.AgentServicer):
    """Reads and acknowledges; one running worker a machine."""

    def __init__(self) -> None:
        self.machines = 0

    async def Join(
        self, request: agent_pb2.JoinRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> agent_pb2.JoinReply:
        return agent_pb2.JoinReply(credential=f"bare-{request.machine}", machine=request.machine)

    async def Connect(
        self,
        request_iterator: AsyncIterator[agent_pb2.AgentMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[agent_pb2.ServerMessage]:
        self.machines += 1
        machine = self.machines
        sent = 0

        def message(**body: Any) -> agent_pb2.ServerMessage:
            nonlocal sent
            sent += 1
            return agent_pb2.ServerMessage(id=sent, **body)

        async for incoming in request_iterator:
            kind = incoming.WhichOneof("body")
            if kind == "hello":
                yield message(welcome=agent_pb2.Welcome(machine_id=machine, protocol=4))
                if not incoming.hello.workers:
                    yield message(command=_command(1, machine, agent_pb2.COMMAND_KIND_START))
                continue
            if kind == "worker_event" and incoming.worker_event.state == (
                agent_pb2.WORKER_STATE_READY
            ):
                yield message(command=_command(2, machine, agent_pb2.COMMAND_KIND_RELEASE))
            yield message(ack=agent_pb2.Ack(up_to=incoming.id))


def _command(command_id: int, worker_id: int, kind: int) -> agent_pb2.Command:
    command = agent_pb2.Command(command_id=command_id, kind=kind, worker_id=worker_id)
    if kind == agent_pb2.COMMAND_KIND_START:
        command.start.CopyFrom(
            agent_pb2.StartWorker(
                worker=f"bare-{worker_id}-0",
                run=f"bare-{worker_id}",
                attempt=1,
                gpu_ids=list(range(WORKER_GPUS)),
                environment={"SIM_SECONDS": "1000000000"},
            )
        )
    return command


async def _serve(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 4 * 2**20)])
    agent_pb2_grpc.add_AgentServicer_to_server(BareAgentService(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


@contextlib.contextmanager
def bare_server(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """The bare server in a process of its own, as ``serve`` is, until the block ends."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.fleet_floor", "serve", str(port)],
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 30
        while process.stdout.readline().strip() != b"serving":
            assert process.poll() is None and time.monotonic() < deadline, "the bare server died"
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    asyncio.run(_serve(int(sys.argv[2])))
