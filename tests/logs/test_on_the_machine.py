"""A worker's log lives on its machine (seed L-2, L-3, L-15, L-18, L-19, L-20): the embedded
server and a real agent in this event loop, real workload processes, asked through
`GET /v1/tasks/<worker>/logs` as a user would. The agent here runs processes; what the seed says
of a container holds of the process that stands for it (a Docker engine's own: test_docker.py)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from backend.app import create_app
from backend.config import Settings
from backend.db import Database
from backend.gateway import routing
from backend.logs.service import MAX_BYTES
from backend.models import Machine, Worker
from tests.lifecycle.world import World
from tests.support import WORKLOAD_PYTHON, FakeClock, Tenancy
from tests.support.agents import agent_for, wait_for, worker_state
from tests.support.api import auth
from tests.support.stream import _port

# Waits for a file (named by its first argument) to exist, at most a minute, after printing.
UNTIL_TOLD = """
deadline = time.time() + 60
while time.time() < deadline and not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.05)
"""


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the workload's own user can write and read (its files tell it when to end)."""
    folder = Path(tempfile.mkdtemp(prefix="astraeus-logs-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def embedded(
    settings: Settings, db: Database, clock: FakeClock
) -> AsyncIterator[tuple[routing.LocalRouter, httpx.AsyncClient, str]]:
    """The embedded server, a client of its API, and the address of its agent endpoint."""
    port = _port()
    app = create_app(settings.model_copy(update={"agent_port": port}), clock=clock, database=db)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://astraeus.test") as c:
            yield app.state.agents, c, f"127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def machine(address: str, token: str, data_dir: Path) -> AsyncIterator[None]:
    """The real agent of gpu-07, connected while inside (its only connection: outbound)."""
    running = asyncio.create_task(agent_for(address, token, data_dir).run_forever())
    try:
        yield
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def logs(client: httpx.AsyncClient, tenancy: Tenancy, tail: int | None) -> httpx.Response:
    """`GET /v1/tasks/llama-sft-0/logs`, with ``tail`` or without (its default)."""
    return await client.get(
        "/v1/tasks/llama-sft-0/logs",
        params={} if tail is None else {"tail": tail},
        headers=auth(tenancy.member_token),
    )


async def state_is(db: Database, state: str) -> None:
    async def reached() -> bool:
        return await worker_state(db, "llama-sft-0") == state

    await wait_for(state, reached, seconds=30)


async def run(world: World, router: routing.LocalRouter, program: str, *args: str) -> None:
    """llama-sft-0 running ``program`` with ``args`` on gpu-07, once the machine has joined."""
    await wait_for("the machine", lambda: _joined(router))
    await world.submit(workers=1, gpus=1, command=[WORKLOAD_PYTHON, "-c", program, *args])
    await world.schedule()
    await state_is(world.db, "Running")


async def _joined(router: routing.LocalRouter) -> bool:
    return bool(router.local and router.local.streams.by_machine)


OUT_AND_ERR = (
    "import pathlib, sys, time\n"
    "for i in range(1500):\n"
    "    print(f'out {i}', flush=True)\n"
    "    if i % 100 == 99:\n"
    "        print(f'err {i}', file=sys.stderr, flush=True)\n" + UNTIL_TOLD
)


async def test_a_log_is_its_stdout_and_stderr_kept_on_the_machine_and_asked_of_it(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    machine_token: str,
    settings: Settings,
    tmp_path: Path,
    shared: Path,
) -> None:
    # seed L-2: a worker's log is its stdout and stderr, kept on the machine that runs it.
    # seed L-3: fetched from the machine on request over its own outbound connection, kept
    # nowhere else: with the machine gone, the server has no copy to answer with.
    # seed L-19: once its process is gone, the machine serves its last 1 000 lines (archived).
    world = World(db, clock, tenancy)
    end = shared / "end"
    async with embedded(settings, db, clock) as (router, client, address):
        async with machine(address, machine_token, tmp_path / "agent"):
            await run(world, router, OUT_AND_ERR, str(end))

            async def printed() -> bool:
                answer = await logs(client, tenancy, 3)
                return answer.status_code == 200 and "err 1499" in answer.json()["logs"]

            await wait_for("its lines", printed)
            answer = (await logs(client, tenancy, 3)).json()
            assert answer == {
                "task_name": "llama-sft-0",
                "logs": "out 1498\nout 1499\nerr 1499\n",
            }  # "archived" only when true (seed L-14)
            kept = [
                p
                for p in (tmp_path / "agent").rglob("*")
                if p.is_file() and b"err 1499" in p.read_bytes()
            ]
            assert kept, "the log is on the machine's disk"
            written = []
            for i in range(1500):
                written.append(f"out {i}")
                if i % 100 == 99:
                    written.append(f"err {i}")
            # seed L-13: without `tail`, its last 1 000 lines
            default = (await logs(client, tenancy, None)).json()["logs"]
            assert default.splitlines() == written[-1000:]
            end.touch()
            await state_is(db, "Completed")
            archived = (await logs(client, tenancy, 10_000)).json()
            lines = archived["logs"].splitlines()
            assert archived["archived"] is True and len(lines) == 1000
            assert lines == written[-1000:]
        # seed L-17: its machine is away (does not answer): 400; and nobody else holds its log
        away = await logs(client, tenancy, 3)
    assert away.status_code == 400
    assert away.json()["code"] == "TASK_LOG_UNAVAILABLE"


# 1 100 lines of 1 000 bytes each (1.05 MiB), then waits to be told to end.
WIDE = (
    "import pathlib, sys, time\n"
    "for i in range(1100):\n"
    "    print('x' * 993 + f' {i:05d}', flush=True)\n" + UNTIL_TOLD
)


async def test_a_tail_is_cut_to_its_last_900_kib(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    machine_token: str,
    settings: Settings,
    tmp_path: Path,
    shared: Path,
) -> None:
    # seed L-15: the text is cut to its last 900 KiB: 10 000 lines asked, 1 100 written of
    # 1 000 bytes each; what comes back is the log's last 921 600 bytes, its last line whole
    world = World(db, clock, tenancy)
    end = shared / "end"
    async with (
        embedded(settings, db, clock) as (router, client, address),
        machine(address, machine_token, tmp_path / "agent"),
    ):
        await run(world, router, WIDE, str(end))

        async def printed() -> bool:
            answer = await logs(client, tenancy, 1)
            return answer.status_code == 200 and answer.json()["logs"].endswith(" 01099\n")

        await wait_for("its lines", printed)
        text = (await logs(client, tenancy, 10_000)).json()["logs"]
        end.touch()
        await state_is(db, "Completed")
    assert MAX_BYTES == 900 * 1024
    assert len(text.encode()) == 900 * 1024
    written = "".join("x" * 993 + f" {i:05d}\n" for i in range(1100))
    assert text == written[-900 * 1024 :]


# The first process prints its id and fails; the next, for the same worker, prints its own.
TWICE = (
    "import os, pathlib, sys, time\n"
    "first = pathlib.Path(sys.argv[2])\n"
    "if not first.exists():\n"
    "    first.write_text(str(os.getpid()))\n"
    "    print(f'first attempt, process {os.getpid()}', flush=True)\n"
    "    raise SystemExit(1)\n"
    "print(f'next attempt, process {os.getpid()}', flush=True)\n" + UNTIL_TOLD
)


async def test_a_restart_starts_a_new_process_whose_log_replaces_the_last(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    machine_token: str,
    settings: Settings,
    tmp_path: Path,
    shared: Path,
) -> None:
    # seed L-18, as the process agent does it: a restart starts a new process (not the same
    # one resumed). seed L-20: the new one, for the same worker on the same machine, replaces
    # what is shown; the one before is in the failure snapshot (its last lines).
    world = World(db, clock, tenancy)
    end, first = shared / "end", shared / "first"
    async with (
        embedded(settings, db, clock) as (router, client, address),
        machine(address, machine_token, tmp_path / "agent"),
    ):
        await wait_for("the machine", lambda: _joined(router))
        await world.submit(
            workers=1, gpus=1, command=[WORKLOAD_PYTHON, "-c", TWICE, str(end), str(first)]
        )
        await world.schedule()

        async def failed_once() -> bool:
            async with db.read() as session:
                row = await session.scalar(select(Worker).where(Worker.name == "llama-sft-0"))
            return row is not None and row.last_failure is not None

        await wait_for("the first attempt's failure", failed_once, seconds=30)
        clock.advance(minutes=5)  # past its backoff
        await world.timers()
        await world.schedule()
        await state_is(db, "Running")

        async def second() -> bool:
            answer = await logs(client, tenancy, 100)
            return answer.status_code == 200 and "next attempt" in answer.json()["logs"]

        await wait_for("the next attempt's line", second)
        shown = (await logs(client, tenancy, 100)).json()
        (worker,) = await world.workers("llama-sft")
        end.touch()
        await state_is(db, "Completed")
    before = int(first.read_text())
    assert worker.restarts == 1 and worker.machine_id is not None
    assert worker.last_failure is not None
    assert worker.last_failure["log_tail"] == f"first attempt, process {before}\n"
    [line] = shown["logs"].splitlines()
    found = re.fullmatch(r"next attempt, process (\d+)", line)
    assert found is not None, line
    assert int(found[1]) != before  # a new process
    assert "archived" not in shown
    async with db.read() as session:  # the same machine: the only one
        assert list(await session.scalars(select(Machine.id))) == [worker.machine_id]
