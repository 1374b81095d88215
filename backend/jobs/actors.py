"""The actors' bodies. Each opens its own transactions and calls one service per step."""

from __future__ import annotations

import asyncio
import logging
import time

from backend.accounting import counting, retention
from backend.alerts import service as alerts
from backend.clock import Clock
from backend.code import service as code
from backend.db import Database
from backend.idle import service as idle
from backend.jobs import runtime
from backend.lifecycle import service as lifecycle
from backend.machines import service as machines
from backend.metrics import service as metrics
from backend.scheduling import service as scheduling
from backend.slurm import service as slurm
from backend.webhooks import service as webhooks
from backend.webhooks.sender import Sender

log = logging.getLogger(__name__)


async def scheduling_pass() -> None:
    """Leases, then timers, then placement: each a transaction of its own, each idempotent.
    (Leases are also checked by an actor of their own, on the clock's queue, so a slow pass
    never delays the check; here they are checked again so a pass places on live machines.)"""
    db, clock = runtime.database(), runtime.clock()
    await machines_check_leases()
    # Each step a unit of work: one that loses a deadlock to an agent's writes is tried again
    # whole (it is idempotent), instead of ending the pass with an unhandled error.
    await db.unit(lambda session: lifecycle.check_timers(session, clock))
    results = await db.unit(lambda session: scheduling.schedule_all(session, clock))
    placed = [name for r in results.values() for name in r.placed]
    if placed:
        log.info("placed %s", ", ".join(placed))


async def slurm_import() -> None:
    """Every Slurm-backed cluster's jobs and nodes read and written as runs and machines
    (nothing to do without one: one query)."""
    db, clock = runtime.database(), runtime.clock()
    for result in await slurm.import_all(db, clock):
        if result.unmapped:
            log.info(
                "slurm: cluster %s: jobs of accounts mapped to no workspace: %s",
                result.cluster,
                ", ".join(f"{a} ({n})" for a, n in sorted(result.unmapped.items())),
            )


async def machines_check_leases() -> None:
    """Machines whose agent went silent past its lease lost, their workers failed."""
    db, clock, settings = runtime.database(), runtime.clock(), runtime.settings()
    await db.unit(lambda session: machines.expire_leases(session, clock, settings.lease_time))


async def metrics_prune() -> None:
    """Samples past the retention summarised to minutes, and both pruned: one transaction,
    cut at a whole minute, so a redelivered message changes nothing more."""
    db, clock, settings = runtime.database(), runtime.clock(), runtime.settings()
    async with db.transaction() as session:
        pruned = await metrics.prune(
            session,
            clock.now(),
            retention=settings.metrics_retention,
            downsampled_retention=settings.metrics_downsampled_retention,
        )
    if pruned.deleted or pruned.minutes_deleted:
        log.info(
            "metrics: %d samples summarised into %d minutes; %d minutes past retention deleted",
            pruned.deleted,
            pruned.summarised,
            pruned.minutes_deleted,
        )


async def accounting_tick() -> None:
    """Count every worker's GPU time up to the last whole minute into the goodput ledgers.

    Retried, late, duplicated or concurrent messages are safe: the tick counts from its own
    mark, in one transaction with it (backend/accounting/counting.py)."""
    db, clock = runtime.database(), runtime.clock()
    result = await db.unit(lambda session: counting.tick(session, clock))
    if result.recounted_from is not None:
        log.info("goodput: counted again from %s (a transition dated back)", result.recounted_from)
    # Then the alerts, on the ledgers just written (their own transaction: a failed
    # evaluation never takes a tick back).
    async with db.transaction() as session:
        evaluated = await alerts.evaluate(session, clock)
    for alert in evaluated.fired:
        log.warning("alert firing: %s", alert.reason)
    # Then the idle policies, on the samples in by now (15 s past the minute): their own
    # transaction too, each run's stop under its gang's lock.
    checked = await db.unit(lambda session: idle.check(session, clock))
    for name in checked.stopped:
        log.info("idle policy: stopped %s", name)


async def accounting_prune() -> None:
    """Goodput hours and intervals past 400 days deleted (the ledgers' retention), and the
    checkpoints reported over 30 days ago (the checkpoint advice's)."""
    db, clock = runtime.database(), runtime.clock()
    async with db.transaction() as session:
        hours, intervals = await retention.prune(session, clock)
        checkpoints = await lifecycle.prune_checkpoints(session, clock)
    if hours or intervals:
        log.info(
            "goodput: %d ledger hours and %d intervals past 400 days deleted", hours, intervals
        )
    if checkpoints:
        log.info("checkpoints: %d reported over 30 days ago deleted", checkpoints)


async def code_prune() -> None:
    """Runs' code archives past their retention (code_retention since their last upload or
    use) deleted, unless a live run ships with them (issue 41)."""
    db, clock = runtime.database(), runtime.clock()
    kept_for = runtime.settings().code_retention
    async with db.transaction() as session:
        deleted = await code.prune(session, clock, kept_for)
    if deleted:
        log.info("code: %d archives past their retention deleted", deleted)


async def webhooks_deliver() -> None:
    """New events handed to each webhook's deliveries, then the due ones sent.

    Handing out and claiming are a short transaction each; the sending goes on in this
    process's event loop after the pass returns (each webhook's deliveries one at a time, in
    order, none past rules.TIMEOUT_S), so a pass takes a worker for SEND_WAIT_S at most however
    long receivers take, and passes every 2 s find new events and free room at once."""
    db, clock = runtime.database(), runtime.clock()
    async with db.transaction() as session:
        await webhooks.hand_out(session, clock)
    room = SENDING_AT_ONCE - sum(_sending.values())
    async with db.transaction() as session:
        due = await webhooks.claim_due(session, clock, room)
    if not due:
        return
    task = asyncio.create_task(_send(due))
    _sending[task] = len(due)
    task.add_done_callback(_sending.pop)
    await asyncio.wait([task], timeout=SEND_WAIT_S)


async def _send(due: list[webhooks.Outgoing]) -> None:
    db, clock, settings = runtime.database(), runtime.clock(), runtime.settings()
    async with webhooks.sending(settings, clock) as sender:
        failed = await asyncio.gather(*(_send_in_order(db, clock, sender, d) for d in due))
    if sum(failed):
        log.info("webhooks: %d deliveries failed", sum(failed))


async def _send_in_order(
    db: Database, clock: Clock, sender: Sender, first: webhooks.Outgoing
) -> int:
    """A webhook's due deliveries, one after the other, for IN_ORDER_S at most (then it is let
    go, and claimed again in its turn). How many attempts failed."""
    started, failed = time.monotonic(), 0
    delivery: webhooks.Outgoing | None = first
    while delivery is not None:
        sent = await sender.send(delivery)
        failed += sent.status is None or not 200 <= sent.status < 300
        go_on = time.monotonic() - started < IN_ORDER_S
        try:
            async with db.transaction() as session:
                delivery = await webhooks.record(session, clock, sent, go_on=go_on)
        except Exception:  # the claim runs out and the delivery is sent again (at least once)
            log.exception("webhooks: could not record an attempt")
            return failed
    return failed


async def webhooks_sent() -> None:
    """Every delivery this process is sending, done (the tests wait so). A worker that stops
    drops what it was sending: the claims run out after rules.CLAIM and it is sent again."""
    while _sending:
        await asyncio.gather(*list(_sending), return_exceptions=True)


async def webhooks_prune() -> None:
    """Deliveries settled over 30 days ago deleted: the deliveries table stays the size of a
    month of events, not of every event there ever was."""
    db, clock = runtime.database(), runtime.clock()
    async with db.transaction() as session:
        deleted = await webhooks.prune(session, clock)
    if deleted:
        log.info("webhooks: %d deliveries settled over 30 days ago deleted", deleted)


# Deliveries one process has in flight at once, all workspaces together (each workspace
# has at most rules.WORKSPACE_IN_FLIGHT of them).
SENDING_AT_ONCE = 64
# How long a pass waits for its deliveries before leaving them to the event loop: quick
# receivers are recorded within the pass, slow ones hold no worker.
SEND_WAIT_S = 1.0
# A webhook's backlog is sent in order by one pass for this long, then it waits its turn.
IN_ORDER_S = 20.0
_sending: dict[asyncio.Task[None], int] = {}  # each pass's sending: how many webhooks


BODIES = {
    "scheduling.pass": scheduling_pass,
    "machines.check_leases": machines_check_leases,
    "metrics.prune": metrics_prune,
    "accounting.tick": accounting_tick,
    "accounting.prune": accounting_prune,
    "code.prune": code_prune,
    "webhooks.deliver": webhooks_deliver,
    "webhooks.prune": webhooks_prune,
    "slurm.import": slurm_import,
}
