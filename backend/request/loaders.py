"""DataLoaders, built per request, so that no relation is ever loaded one row at a time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from strawberry.dataloader import DataLoader

from backend.access.rules import Principal
from backend.accounting import rework, run_goodput
from backend.accounting.rules import Ledger
from backend.clock import Clock
from backend.code import service as code
from backend.db import Database
from backend.errors import AstraeusError
from backend.gateway import service as agents
from backend.models import CodeArchive, Run, StateTransition, WebhookDelivery, Worker
from backend.request.slurm_jobs import SlurmJob, slurm_jobs
from backend.runs import service as runs
from backend.scheduling import service as scheduling
from backend.webhooks import service as webhooks

K = TypeVar("K")
V = TypeVar("V")


def _grouped(
    db: Database,
    fetch: Callable[[AsyncSession, Sequence[int]], Awaitable[Mapping[int, V]]],
    default: Callable[[], V],
) -> DataLoader[int, V]:
    async def load(keys: list[int]) -> list[V]:
        async with db.read() as session:
            found = await fetch(session, keys)
        return [found.get(key, default()) for key in keys]

    return DataLoader(load_fn=load)


@dataclass
class Loaders:
    workers_by_run: DataLoader[int, list[Worker]]
    history_by_run: DataLoader[int, list[StateTransition]]
    history_by_worker: DataLoader[int, list[StateTransition]]
    run: DataLoader[int, Run | None]
    user_name: DataLoader[int, str]
    machine_name: DataLoader[int, str]
    # Where a worker was placed last, also after it ended; None: never placed.
    last_placement: DataLoader[int, agents.LastPlacement | None]
    cluster_name: DataLoader[int, str]
    webhook_deliveries: DataLoader[int, list[tuple[WebhookDelivery, str]]]
    # A run's ledger since it was submitted, by (run id, submitted at).
    run_ledger: DataLoader[tuple[int, datetime], Ledger]
    # A run's ETTR (accounting.rules.ettr), by what it is computed from besides its ledger:
    # (run id, submitted at, ended at, its gang's GPUs).
    run_ettr: DataLoader[tuple[int, datetime, datetime | None, int], float | None]
    # A run's rework since it was submitted, by (run id, submitted at, workspace id).
    run_rework: DataLoader[tuple[int, datetime, int], rework.RunRework]
    # Why a run waits: each machine of its cluster and why it takes a worker or not.
    pending_reasons: DataLoader[int, list[tuple[str, str]]]
    # A run's Slurm job (issue 38); None: its cluster is not Slurm's.
    slurm_job: DataLoader[int, SlurmJob | None]
    # A run's code archive, by its id (runs.code_id); None: no longer stored.
    code_archive: DataLoader[int, CodeArchive | None]

    @classmethod
    def build(cls, db: Database, clock: Clock, principal: Callable[[], Principal]) -> Loaders:
        """The request's loaders; ``principal`` answers who asks (or refuses), for the loads
        that depend on it."""

        async def run_ledgers(keys: list[tuple[int, datetime]]) -> list[Ledger]:
            async with db.read() as session:
                found = await run_goodput.run_ledgers(session, keys, clock.now())
            return [found[run_id] for run_id, _ in keys]

        async def run_ettrs(
            keys: list[tuple[int, datetime, datetime | None, int]],
        ) -> list[float | None]:
            clocks = [run_goodput.RunClock(*k) for k in keys]
            async with db.read() as session:
                found = await run_goodput.run_ettrs(session, clocks, clock.now())
            return [found[k[0]] for k in keys]

        async def run_reworks(keys: list[tuple[int, datetime, int]]) -> list[rework.RunRework]:
            async with db.read() as session:
                found = await rework.run_reworks(session, keys, clock.now())
            return [found[k[0]] for k in keys]

        async def pending_reasons(keys: list[int]) -> list[list[tuple[str, str]] | Exception]:
            found: list[list[tuple[str, str]] | Exception] = []
            async with db.read() as session:
                for run_id in keys:
                    try:  # a run refused is its own field's error, not its neighbours'
                        run = await runs.get_run_by_id(session, principal(), run_id)
                        reasons = await scheduling.pending_reasons(session, clock, principal(), run)
                    except AstraeusError as error:
                        found.append(error)
                    else:
                        found.append(reasons)
            return found

        return cls(
            workers_by_run=_grouped(db, runs.workers_by_run, list),
            history_by_run=_grouped(db, runs.history_by_run, list),
            history_by_worker=_grouped(db, runs.history_by_worker, list),
            run=_grouped(db, runs.runs_by_id, lambda: None),
            user_name=_grouped(db, runs.user_names, str),
            machine_name=_grouped(db, runs.machine_names, str),
            last_placement=_grouped(db, agents.last_placements, lambda: None),
            cluster_name=_grouped(db, runs.cluster_names, str),
            webhook_deliveries=_grouped(db, webhooks.recent_deliveries, list),
            run_ledger=DataLoader(load_fn=run_ledgers),
            run_ettr=DataLoader(load_fn=run_ettrs),
            run_rework=DataLoader(load_fn=run_reworks),
            pending_reasons=DataLoader(load_fn=pending_reasons),
            slurm_job=_grouped(db, slurm_jobs, lambda: None),
            code_archive=_grouped(db, code.archives_by_id, lambda: None),
        )
