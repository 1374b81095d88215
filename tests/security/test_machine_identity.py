"""Issue 18's machine-identity attacks, played live: `astraeus up` with its real local agent
(machine `local`, joined with the one-use join token `up` made), a second workspace, and a
forged agent speaking the protocol by hand.

Before issue 18 the cluster's machine token was any machine: with it a client registered as
`local` and received another workspace's secret values, and registered a fake machine `evil`
advertising 64 cores and 1 TiB; NaN cores answered the agent with the SQL error's text; a
100 000-character name, an empty name and 3 000 GPUs were registered. (A start command over
the stream's limit is played with the real agent in tests/gateway/test_agent_in_process.py: the
request body's bound now refuses a 5 MiB spec before it is a run.)
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc

from backend.machine_identity.rules import hash_token
from tests.e2e.live import Api, Server, serving
from tests.support import WORKLOAD_PYTHON
from tests.support.waiting import wait_for

FAKE_CORES, FAKE_MEMORY = 64.0, 2**40  # what the fake machine `evil` advertises


class Forged:
    """A client speaking the agent protocol by hand with whatever token it holds."""

    def __init__(self, server: Server, token: str) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.agent_port}")
        self.bearer = (("authorization", f"Bearer {token}"),)
        self.outgoing: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()
        self.ids = iter(range(1, 1_000_000))
        self.call: Any = None

    async def join(self, machine: str) -> str:
        stub = agent_pb2_grpc.AgentStub(self.channel)
        reply = await stub.Join(agent_pb2.JoinRequest(machine=machine), metadata=self.bearer)
        return str(reply.credential)

    def connect(self, hello: agent_pb2.Hello) -> None:
        async def messages() -> AsyncIterator[agent_pb2.AgentMessage]:
            while (message := await self.outgoing.get()) is not None:
                yield message

        stub = agent_pb2_grpc.AgentStub(self.channel)
        self.call = stub.Connect(messages(), metadata=self.bearer)
        self.send(hello=hello)

    def send(self, **body: Any) -> int:
        message_id = next(self.ids)
        self.outgoing.put_nowait(agent_pb2.AgentMessage(id=message_id, **body))
        return message_id

    async def receive(self, kind: str, seconds: float = 10) -> agent_pb2.ServerMessage:
        while True:
            message = await asyncio.wait_for(self.call.read(), seconds)
            assert message is not grpc.aio.EOF, "the server closed the stream"
            if message.WhichOneof("body") == kind:
                return message

    async def receive_any(self, seconds: float) -> agent_pb2.ServerMessage:
        message = await asyncio.wait_for(self.call.read(), seconds)
        assert message is not grpc.aio.EOF, "the server closed the stream"
        return message

    async def close(self) -> None:
        self.outgoing.put_nowait(None)
        await self.channel.close()


def hello(machine: str, cores: float = 4, memory: int = 8 * 2**30, gpus: int = 0) -> Any:
    return agent_pb2.Hello(
        machine=machine,
        cpu_cores=cores,
        memory_bytes=memory,
        gpus=[
            agent_pb2.Gpu(index=i, uuid=f"SIM-{machine}-{i}", model="Simulated GPU", healthy=True)
            for i in range(gpus)
        ],
        agent_version="forged",
        protocol=3,
    )


async def refused(forged: Forged, message: Any) -> tuple[grpc.StatusCode, str]:
    """Connect with this Hello; the stream's refusal (code, details)."""
    forged.connect(message)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await forged.receive("welcome")
        return caught.value.code(), str(caught.value.details())
    finally:
        await forged.close()


async def join_refused(forged: Forged, machine: str) -> tuple[grpc.StatusCode, str]:
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await forged.join(machine)
        return caught.value.code(), str(caught.value.details())
    finally:
        await forged.close()


class Admin(Api):
    def machines(self) -> dict[str, dict[str, Any]]:
        found = self.graphql("{ machines { name state reason cpuCores memoryBytes } }")
        return {m["name"]: m for m in found["machines"]}

    def submit(self, **spec: Any) -> list[dict[str, Any]]:
        created = self.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { field message } } }", s=spec
        )
        return list(created["createRun"]["errors"])

    def status(self, run: str) -> str:
        return str(self.get(f"/jobs/{run}")["status"])

    def log(self, worker: str) -> list[str]:
        return str(self.get(f"/tasks/{worker}/logs?tail=1000").get("logs", "")).splitlines()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Admin]]:
    root = tmp_path_factory.mktemp("identity")
    with serving(root / "data", lease_time="60s") as (server, _):
        admin = Admin(server, server.admin_token)
        wait_for("machine local", lambda: admin.machines().get("local", {}).get("state") == "ready")
        yield server, admin


def join_token(server: Server, uses: int = 1) -> str:
    return server.cli("agent-token", "create", "--uses", str(uses), "--expires", "1h").strip()


def test_the_cluster_join_token_neither_poses_as_local_nor_registers_a_fake_machine(
    live: tuple[Server, Admin],
) -> None:
    server, admin = live
    used = (server.data_dir / "agent-token").read_text().strip()  # `up`'s, used by `local`
    fresh = join_token(server, uses=5)

    async def attacks() -> list[tuple[grpc.StatusCode, str]]:
        return [
            await refused(Forged(server, used), hello("local", 64, 2**40, 8)),
            await refused(Forged(server, fresh), hello("evil", FAKE_CORES, FAKE_MEMORY, 8)),
            await join_refused(Forged(server, used), "evil"),
            await join_refused(Forged(server, fresh), "local"),
            await refused(Forged(server, admin.token), hello("evil", FAKE_CORES, FAKE_MEMORY)),
        ]

    join_only = (
        "This is a join token: `astraeus agent` exchanges it for the machine's own credential; "
        "it does not connect as a machine."
    )
    assert asyncio.run(attacks()) == [
        (grpc.StatusCode.UNAUTHENTICATED, join_only),
        (grpc.StatusCode.UNAUTHENTICATED, join_only),
        (
            grpc.StatusCode.UNAUTHENTICATED,
            "The join token has been used as many times as it allows: an admin makes another "
            "(astraeus agent-token create).",
        ),
        (
            grpc.StatusCode.PERMISSION_DENIED,
            "Machine 'local' already has a credential of its own: its agent connects with it. "
            "To join it again, an admin revokes that credential first "
            "(astraeus machine-credential revoke local).",
        ),
        # A user token is no machine's: it gets no stream, so no command and no secret value.
        (grpc.StatusCode.UNAUTHENTICATED, "The machine token is unknown or revoked."),
    ]
    machines = admin.machines()
    assert set(machines) == {"local"}  # no `evil`
    assert machines["local"]["cpuCores"] != FAKE_CORES and machines["local"]["state"] == "ready"
    listed = server.cli("machine-credential", "list")
    assert [line.split()[1] for line in listed.splitlines()[1:]] == ["local"]


def test_a_legacy_machine_token_works_until_rotated_and_never_as_a_machine_with_a_credential(
    live: tuple[Server, Admin],
) -> None:
    """The upgrade: a cluster machine token made before credentials is kept (migration 0015)
    and still connects an old agent as a machine without a credential, until an admin revokes
    it; it never registers as a machine that holds its own credential."""
    server, admin = live
    legacy = "astx_" + "upgraded-install-token" * 2
    with contextlib.closing(sqlite3.connect(server.data_dir / "astraeus.db")) as db, db:
        db.execute(
            "INSERT INTO join_tokens (token_hash, prefix, name, organization_id, cluster_id, "
            "legacy, created_at) SELECT ?, ?, 'old', organization_id, id, 1, ? FROM clusters "
            "WHERE name = 'local'",
            (hash_token(legacy), legacy[:12], datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")),
        )
    listed = server.cli("agent-token", "list").splitlines()
    (row,) = [line for line in listed if "legacy machine token" in line]
    token_id = row.split()[0]

    async def before_rotation() -> tuple[tuple[grpc.StatusCode, str], Forged]:
        posing = await refused(Forged(server, legacy), hello("local", 64, 2**40, 8))
        old_agent = Forged(server, legacy)
        old_agent.connect(hello("old-machine"))
        await old_agent.receive("welcome")
        return posing, old_agent

    async def rotate(old_agent: Forged) -> tuple[grpc.StatusCode, str]:
        server.cli("agent-token", "revoke", token_id)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as closed:
                await old_agent.receive("never", seconds=15)
            return closed.value.code(), str(closed.value.details())
        finally:
            await old_agent.close()

    async def play() -> list[tuple[grpc.StatusCode, str]]:
        posing, old_agent = await before_rotation()
        assert admin.machines()["old-machine"]["state"] == "ready"  # documented: until rotated
        closed = await rotate(old_agent)
        after = await refused(Forged(server, legacy), hello("old-machine"))
        return [posing, closed, after]

    assert asyncio.run(play()) == [
        (
            grpc.StatusCode.PERMISSION_DENIED,
            "Machine 'local' has a credential of its own: a cluster machine token cannot "
            "register as it.",
        ),
        (grpc.StatusCode.UNAUTHENTICATED, "The machine token is unknown or revoked."),
        (grpc.StatusCode.UNAUTHENTICATED, "The machine token is unknown or revoked."),
    ]
    assert admin.machines()["local"]["state"] == "ready"


SECRET_PROBE = (
    "import os, time\n"
    "print('token set' if os.environ.get('HF') == 'hunter2-of-default' else 'token missing',"
    " flush=True)\n"
    "time.sleep(600)\n"
)


def test_another_machines_credential_gets_neither_its_commands_nor_its_secret_values(
    live: tuple[Server, Admin],
) -> None:
    server, admin = live
    admin.graphql(
        'mutation { setSecret(name: "hf", value: "hunter2-of-default") { errors { message } } }'
    )
    errors = admin.submit(
        name="victim",
        gpus=1,
        restart_policy="never",
        credentials=[{"secret": "hf", "env": "HF"}],
        command=[WORKLOAD_PYTHON, "-c", SECRET_PROBE],
    )
    assert errors == []
    wait_for("the victim running", lambda: admin.status("victim") == "Running", 90)
    wait_for("its secret", lambda: admin.log("victim-0") == ["token set"], 30)

    async def spy() -> tuple[tuple[grpc.StatusCode, str], list[str]]:
        credential = await Forged(server, join_token(server)).join("spy")
        posing = await refused(Forged(server, credential), hello("local", 64, 2**40, 8))
        forged = Forged(server, credential)
        forged.connect(hello("spy"))  # no GPUs: nothing is placed on it
        await forged.receive("welcome")
        for worker_id in range(1, 200):  # every worker id there may be, each attempt
            for attempt in (1, 2):
                forged.send(
                    secret_request=agent_pb2.SecretRequest(worker_id=worker_id, attempt=attempt)
                )
        got: list[str] = []
        with contextlib.suppress(TimeoutError):
            while True:
                message = await forged.receive_any(5)
                if message.WhichOneof("body") in ("secret_values", "command"):
                    got.append(str(message))
        await forged.close()
        return posing, got

    posing, got = asyncio.run(spy())
    assert posing == (
        grpc.StatusCode.PERMISSION_DENIED,
        "This credential belongs to machine 'spy': it cannot register as 'local'.",
    )
    assert got == []  # no value, no command of `local`'s workers reached `spy`
    assert admin.status("victim") == "Running"


def test_a_revoked_credential_closes_its_stream_and_the_machine_is_lost(
    live: tuple[Server, Admin],
) -> None:
    server, admin = live

    async def play() -> tuple[grpc.StatusCode, str]:
        credential = await Forged(server, join_token(server)).join("doomed")
        forged = Forged(server, credential)
        forged.connect(hello("doomed"))
        await forged.receive("welcome")
        assert admin.machines()["doomed"]["state"] == "ready"
        printed = server.cli("machine-credential", "revoke", "doomed")
        assert printed == "machine doomed: its credential is revoked; the machine is lost\n"
        try:
            with pytest.raises(grpc.aio.AioRpcError) as closed:
                await forged.receive("never", seconds=15)
            return closed.value.code(), str(closed.value.details())
        finally:
            await forged.close()

    assert asyncio.run(play()) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "This machine's credential was revoked by an organisation admin.",
    )
    doomed = admin.machines()["doomed"]
    assert (doomed["state"], doomed["reason"]) == (
        "lost",
        "Machine lost: This machine's credential was revoked by an organisation admin.",
    )
    listed = server.cli("machine-credential", "list").splitlines()
    assert any(line.split()[1] == "doomed" and " revoked " in line for line in listed)


@pytest.mark.parametrize(
    ("machine", "cores", "memory", "gpus", "sentence"),
    [
        (
            "nan-cores",
            float("nan"),
            2**30,
            0,
            "Hello refused: cpu_cores must be a number above 0 and at most 4096 (got nan).",
        ),
        ("", 4, 2**30, 0, "Hello refused: machine must not be empty."),
        (
            "n" * 100_000,
            4,
            2**30,
            0,
            "Hello refused: machine must be at most 253 characters (got 100000).",
        ),
        (
            "many-gpus",
            4,
            2**30,
            3000,
            "Hello refused: gpus must list at most 64 GPUs (got 3000).",
        ),
    ],
)
def test_malformed_registration_fields_are_refused_with_a_sentence(
    live: tuple[Server, Admin], machine: str, cores: float, memory: int, gpus: int, sentence: str
) -> None:
    server, admin = live
    token = join_token(server)

    async def play() -> tuple[grpc.StatusCode, str]:
        credential = await Forged(server, token).join("malformed")
        return await refused(Forged(server, credential), hello(machine, cores, memory, gpus))

    code, details = asyncio.run(play())
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, sentence)
    assert "SQL" not in details and "INSERT" not in details
    assert set(admin.machines()) <= {"local", "old-machine", "spy", "doomed"}
    server.cli("machine-credential", "revoke", "malformed")  # the next case joins it again
