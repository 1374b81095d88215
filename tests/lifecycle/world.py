"""A small cluster for scenario tests: machines, runs and agent reports under a fake clock."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import select

from backend.access import service as access
from backend.access.rules import Principal
from backend.db import Database
from backend.lifecycle import service as lifecycle
from backend.machines import service as machines
from backend.machines.service import GpuInfo
from backend.models import AgentCommand, Machine, Run, StateTransition, Worker
from backend.runs import service as runs
from backend.scheduling import service as scheduling
from backend.scheduling.service import PassResult
from tests.support import FakeClock, Tenancy, local_cluster, run_spec

GIB = 2**30
LEASE = timedelta(seconds=60)


@dataclass
class World:
    db: Database
    clock: FakeClock
    tenancy: Tenancy

    async def principal(self, token: str | None = None) -> Principal:
        async with self.db.read() as session:
            return await access.authenticate(session, token or self.tenancy.member_token)

    async def machine(
        self,
        name: str,
        gpus: int = 8,
        cpu: float = 64,
        memory: int = 512 * GIB,
        pool: str | None = None,
    ) -> int:
        async with self.db.transaction() as session:
            cluster = await session.scalar(local_cluster())
            assert cluster is not None
            row = await machines.register(
                session,
                self.clock,
                cluster_id=cluster.id,
                name=name,
                cpu_cores=cpu,
                memory_bytes=memory,
                gpus=[
                    GpuInfo(i, f"GPU-{name}-{i}", "NVIDIA H100 80GB HBM3", 80 * GIB)
                    for i in range(gpus)
                ],
                lease=LEASE,
                pool=pool,
            )
            return row.id

    async def submit(self, token: str | None = None, **spec: Any) -> Run:
        principal = await self.principal(token)
        async with self.db.transaction() as session:
            return await runs.create_run(session, self.clock, principal, run_spec(**spec))

    async def schedule(self) -> PassResult:
        async with self.db.transaction() as session:
            results = await scheduling.schedule_all(session, self.clock)
        merged = PassResult(planned=False)
        for r in results.values():
            merged.placed += r.placed
            merged.preempted += r.preempted
            merged.reasons.update(r.reasons)
            merged.planned |= r.planned
        return merged

    async def report(self, worker: str, kind: str, **fields: Any) -> None:
        async with self.db.transaction() as session:
            row = await session.scalar(select(Worker).where(Worker.name == worker))
            assert row is not None and row.machine_id is not None, f"{worker} is not placed"
            await lifecycle.report(
                session,
                self.clock,
                machine_id=row.machine_id,
                worker_id=row.id,
                kind=kind,
                **fields,
            )

    async def start(self, *workers: str) -> None:
        """Each worker gets ready at the barrier, then runs."""
        for w in workers:
            await self.report(w, "ready")
        for w in workers:
            await self.report(w, "running")

    async def timers(self) -> None:
        async with self.db.transaction() as session:
            await lifecycle.check_timers(session, self.clock)

    async def run(self, name: str) -> Run:
        async with self.db.read() as session:
            row = await session.scalar(select(Run).where(Run.name == name))
            assert row is not None
            return row

    async def workers(self, run: str) -> list[Worker]:
        async with self.db.read() as session:
            rows = await session.scalars(
                select(Worker)
                .join(Run, Run.id == Worker.run_id)
                .where(Run.name == run)
                .order_by(Worker.rank)
            )
            return list(rows)

    async def status(self, run: str) -> tuple[str, str]:
        row = await self.run(run)
        return row.state, row.reason

    async def history(self, run: str) -> list[tuple[Any, str, str]]:
        """The run's own transitions: (time, state, reason), oldest first."""
        async with self.db.read() as session:
            rows = await session.scalars(
                select(StateTransition)
                .join(Run, Run.id == StateTransition.run_id)
                .where(Run.name == run, StateTransition.worker_id.is_(None))
                .order_by(StateTransition.id)
            )
            return [(t.transition_at, t.state, t.reason) for t in rows]

    async def phases(self, worker: str) -> list[tuple[Any, str, str | None, int]]:
        """A worker's transitions: (time, state, phase, held GPUs), oldest first."""
        async with self.db.read() as session:
            rows = await session.scalars(
                select(StateTransition)
                .join(Worker, Worker.id == StateTransition.worker_id)
                .where(Worker.name == worker)
                .order_by(StateTransition.id)
            )
            return [(t.transition_at, t.state, t.phase, t.held_gpus) for t in rows]

    async def commands(self, machine: str) -> list[tuple[str, str]]:
        async with self.db.read() as session:
            rows = await session.execute(
                select(AgentCommand.kind, AgentCommand.worker_name)
                .join(Machine, Machine.id == AgentCommand.machine_id)
                .where(Machine.name == machine)
                .order_by(AgentCommand.id)
            )
            return [(r.kind, r.worker_name) for r in rows]
