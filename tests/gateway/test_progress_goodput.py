"""Progress appended or overwritten gives the same goodput (issue 20: two identical six-minute
runs got 0.157 and 0.996). The real agent (agent/connection.py) runs two real workloads, one
appending its step to $ASTRAEUS_PROGRESS_FILE a line at a time, one overwriting it; the agent's
looks and the server share a fake clock, six minutes of looks every 5 s; the samples go over
the real stream to the real server side, and the goodput tick counts them (seed G-3, G-5, G-14).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from agent.config import AgentConfig
from agent.connection import Agent
from agent.executor import end_left_workers
from agent.gpus import simulated
from agent.identity import WorkloadUsers
from backend.accounting import counting, run_goodput
from backend.db import Database
from backend.gateway.servicer import AgentService
from backend.models import MetricSample, Run, Worker
from tests.lifecycle.world import World
from tests.support import WORKLOAD_PYTHON, FakeClock, Tenancy
from tests.support.agents import agent_endpoint, wait_for
from tests.support.sandboxed import process_uids

STEPS = (
    "import os, time\n"
    "path = os.environ['ASTRAEUS_PROGRESS_FILE']\n"
    "for step in range(1_000_000):\n"
    "    with open(path, {mode!r}) as f:\n"
    "        f.write(f'{{step}}\\n')\n"
    "    time.sleep(0.02)\n"
)
LOOKS = 72  # six minutes, a look every 5 s


@pytest.fixture
async def service(db: Database, clock: FakeClock) -> AsyncIterator[tuple[AgentService, str]]:
    async with agent_endpoint(db, clock, lease=timedelta(hours=1)) as endpoint:
        yield endpoint


def file_state(path: Path) -> tuple[int, int] | None:
    with contextlib.suppress(OSError):
        status = path.stat()
        return status.st_mtime_ns, status.st_size
    return None


async def test_appended_and_overwritten_progress_give_the_same_goodput(
    service: tuple[AgentService, str],
    machine_token: str,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    tmp_path: Path,
) -> None:
    svc, address = service
    # Within the hour before the agent's real clock: what it keeps to send (agent/outbox.py).
    # On a minute: the runs start there, so their first minute holds twelve looks. From the
    # middle of one, its part before the next minute could hold two, the first taken at the
    # start (no step yet), and the second, if it fell between an overwriting workload's
    # truncate and its write (an empty file), no step either: that part idle (CI: 7.3 s, 0.976).
    clock.moment = datetime.now(UTC).replace(second=0, microsecond=0)
    agent = Agent(
        AgentConfig(
            server=address,
            token=machine_token,
            machine="gpu-07",
            data_dir=tmp_path,
            gpus=simulated(2, "gpu-07"),
            cpu_cores=8,
            memory_bytes=64 * 2**30,
            heartbeat_seconds=1,
            sample_seconds=3600,  # the test looks, on the fake clock
            users=WorkloadUsers(uids=process_uids()),
        )
    )
    # The agent's looks on the server's clock: its events (real time, later) are clamped to it.
    agent.sampling.sampler.clock = lambda: clock.now().timestamp()
    running = asyncio.create_task(agent.run_forever())
    try:

        async def joined() -> bool:
            return bool(svc.streams.by_machine)

        await wait_for("the machine", joined, seconds=60)
        world = World(db, clock, tenancy)
        for name, mode in (("appends", "a"), ("overwrites", "w")):
            command = [WORKLOAD_PYTHON, "-c", STEPS.format(mode=mode)]
            await world.submit(name=name, workers=1, gpus=1, command=command)
        await world.schedule()

        async def both_running() -> bool:
            async with db.read() as session:
                states = list(await session.scalars(select(Worker.state)))
            return states == ["Running", "Running"]

        await wait_for("both running", both_running, seconds=60)
        async with db.read() as session:
            ids = dict((await session.execute(select(Worker.name, Worker.id))).all())
        files = [agent.workers.by_id[i].progress_file for i in ids.values()]
        for _ in range(LOOKS):
            before = [file_state(f) for f in files]

            async def both_stepped(before: list[tuple[int, int] | None] = before) -> bool:
                now = [file_state(f) for f in files]
                return all(n not in (None, b) for n, b in zip(now, before, strict=True))

            try:
                await wait_for("a step of each", both_stepped, seconds=60)
            except AssertionError:
                async with db.read() as session:
                    rows = (await session.execute(select(Worker.state, Worker.reason))).all()
                raise AssertionError(f"{before} {[file_state(f) for f in files]} {rows}") from None
            clock.advance(seconds=5)
            await agent.sampling.once()
        last_ms = int(clock.now().timestamp() * 1000)

        async def all_samples_in() -> bool:
            async with db.read() as session:
                newest = await session.execute(
                    select(MetricSample.worker_id, func.max(MetricSample.ts)).group_by(
                        MetricSample.worker_id
                    )
                )
            return sorted(ts for _, ts in newest.all()) == [last_ms, last_ms]

        await wait_for("the samples on the server", all_samples_in, seconds=60)
        async with db.transaction() as session:
            await counting.tick(session, clock)
            runs = list(await session.scalars(select(Run).order_by(Run.name)))
            ledgers = await run_goodput.run_ledgers(
                session, [(r.id, r.created_at) for r in runs], clock.now()
            )
        appends, overwrites = (ledgers[r.id] for r in runs)
        assert [r.name for r in runs] == ["appends", "overwrites"]
        assert appends.allocated == overwrites.allocated >= 5 * 60  # GPU-seconds counted
        assert appends.goodput is not None and overwrites.goodput is not None
        assert overwrites.goodput >= 0.98
        assert abs(appends.goodput - overwrites.goodput) <= 0.02, (appends, overwrites)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        end_left_workers(tmp_path)
