"""An import that stops reading (issue 38 F3), against a real one-node Slurm
(tests/support/slurm.py): while a cluster's import is behind, its jobs are counted no further
than the import's last read (the horizon), no stall is found past it, the lag gauge and the
slurm_import_lag alert show it; when it reads again, every job equals sacct to the second."""

from __future__ import annotations

from datetime import timedelta

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from backend.accounting import counting
from backend.alerts import service as alerts
from backend.db import Database
from backend.gateway import service as agents
from backend.lifecycle import service as lifecycle
from backend.models import Alert, GoodputHorizon
from backend.slurm import service as importer
from tests.support import FakeClock, Tenancy
from tests.support.api import get
from tests.support.slurm import (
    SlurmCluster,
    assert_equals_sacct,
    hpc,
    import_until,
    ledger,
    run_of,
    utc,
    wait_for,
    workers_of,
)
from tests.support.slurm import marks as slurm_marks

pytestmark = slurm_marks()


async def test_an_import_frozen_for_five_minutes_counts_nothing_past_its_last_read(  # F3
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"}, stall_timeout="1m")
    job = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "frozen", "--wrap", "sleep 8")
    await import_until(db, clock, cluster_id, job, "Running")
    read_at = clock.moment  # the import's last read: it reads as of its clock
    run = await run_of(db, job)
    (worker,) = await workers_of(db, run)
    assert worker.machine_id is not None
    async with db.transaction() as session:  # its output, as the node's agent reports it
        await agents.progress(
            session, clock, worker.machine_id, worker.id, worker.attempt, None, read_at
        )
    done = await wait_for(slurm, job, "COMPLETED")  # ended in Slurm, unread: the import froze
    submit, start = utc(done["submit"]), utc(done["start"])

    # Five minutes without an import: the tick and the timers go on.
    for minute in range(1, 6):
        clock.moment = read_at + timedelta(minutes=minute)
        async with db.transaction() as session:
            await counting.tick(session, clock)
        async with db.transaction() as session:
            await lifecycle.check_timers(session, clock)
    run = await run_of(db, job)
    (worker,) = await workers_of(db, run)
    assert (run.state, worker.state, worker.stalled_since) == ("Running", "Running", None)
    # (to the horizon: Slurm dates to the second, and may date the start after the read that
    # saw the job running)
    waited = round((min(start, read_at) - submit).total_seconds(), 3)
    held = round(max(0.0, (read_at - start).total_seconds()), 3)
    assert await ledger(db, "run", run.id) == {
        k: v for k, v in {("waiting", False): waited, ("idle", True): held}.items() if v
    }
    async with db.read() as session:
        hold = await session.get(GoodputHorizon, cluster_id)
    assert hold is not None and hold.counted_to == read_at

    # The gauge and the alert say how far behind it is.
    text = (await get(client, tenancy.admin_token, "/goodput/metrics")).text
    lag = {
        s.labels["cluster"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "astraeus_slurm_import_lag_seconds"
    }
    assert lag == {"hpc": 300.0}
    async with db.transaction() as session:
        fired = (await alerts.evaluate(session, clock)).fired
    assert [(a.metric, a.subject, a.value) for a in fired] == [
        ("slurm_import_lag", "cluster:hpc", 300.0)
    ]
    assert fired[0].reason == (
        f"The Slurm import of cluster hpc is 5m behind: it last read Slurm at "
        f"{read_at:%Y-%m-%d %H:%M:%S} UTC, and its jobs are not counted past that (threshold 5m)"
    )

    # It reads again: the job's end, and its minutes since the horizon, as Slurm has them.
    clock.moment = read_at + timedelta(minutes=5, seconds=10)
    assert (await importer.import_cluster(db, clock, cluster_id)).error is None
    assert (await run_of(db, job)).state == "Completed"
    clock.moment = read_at + timedelta(minutes=6)
    async with db.transaction() as session:
        await counting.tick(session, clock)
    await assert_equals_sacct(db, slurm, job, 1)
    async with db.read() as session:
        assert await session.get(GoodputHorizon, cluster_id) is None
    async with db.transaction() as session:
        resolved = (await alerts.evaluate(session, clock)).resolved
        assert [a.metric for a in resolved] == ["slurm_import_lag"]
        assert not list(await session.scalars(select(Alert).where(Alert.resolved_at.is_(None))))
