"""A placed gang for the metrics tests: llama-sft's two workers of 4 GPUs, one on each of
gpu-07 and gpu-08, and team-b's sweep-7 on gpu-09."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from backend.db import Database
from backend.metrics import service as metrics
from backend.metrics.service import SampleIn
from backend.models import Worker
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy

# 2026-10-01T00:00:00Z: the samples of these tests start here.
T0 = int(datetime(2026, 10, 1, tzinfo=UTC).timestamp() * 1000)
SECOND = 1000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
NO_WORKER = 10**12  # an id no worker has


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(frozen=True)
class Placed:
    gpu07: int
    gpu08: int
    gpu09: int


@pytest.fixture
async def placed(db: Database, clock: FakeClock, tenancy: Tenancy) -> Placed:
    world = World(db, clock, tenancy)
    gpu07 = await world.machine("gpu-07", gpus=4)
    gpu08 = await world.machine("gpu-08", gpus=4)
    gpu09 = await world.machine("gpu-09", gpus=4)
    await world.submit(workers=2, gpus=4)
    await world.schedule()
    await world.submit(tenancy.other_token, name="sweep-7", workers=1, gpus=4)
    await world.schedule()
    machines = {w.name: w.machine_id for w in await world.workers("llama-sft")}
    assert machines == {"llama-sft-0": gpu07, "llama-sft-1": gpu08}
    assert [w.machine_id for w in await world.workers("sweep-7")] == [gpu09]
    return Placed(gpu07, gpu08, gpu09)


async def ingest(db: Database, machine_id: int, samples: Sequence[SampleIn]) -> int:
    """Ingest samples written with workers' names for readability: each name becomes the
    worker's id (what an agent sends), a name of no worker an id of none."""
    async with db.transaction() as session:
        ids = {name: id_ for name, id_ in await session.execute(select(Worker.name, Worker.id))}
        by_id = [
            replace(s, worker_id=ids.get(s.worker_id, NO_WORKER))
            if isinstance(s.worker_id, str)
            else s
            for s in samples
        ]
        return await metrics.ingest(session, machine_id, by_id)


def series(
    worker: str,
    metric: str,
    values: Sequence[float],
    *,
    gpu: int | None = None,
    start: int = T0,
    every: int = 10 * SECOND,
) -> list[SampleIn]:
    """One series sampled every ``every`` ms from ``start``."""
    return [SampleIn(worker, metric, gpu, start + i * every, v) for i, v in enumerate(values)]
