"""The actors' bodies. Each opens its own transactions and calls one service per step."""

from __future__ import annotations

import logging
import time

from backend.accounting import counting
from backend.accounting import service as accounting
from backend.alerts import service as alerts
from backend.jobs import runtime
from backend.lifecycle import service as lifecycle
from backend.machines import service as machines
from backend.metrics import service as metrics
from backend.scheduling import service as scheduling
from backend.webhooks import service as webhooks

log = logging.getLogger(__name__)


async def scheduling_pass() -> None:
    """Leases, then timers, then placement: each a transaction of its own, each idempotent."""
    db, clock, settings = runtime.database(), runtime.clock(), runtime.settings()
    async with db.transaction() as session:
        await machines.expire_leases(session, clock, settings.lease_time)
    async with db.transaction() as session:
        await lifecycle.check_timers(session, clock)
    async with db.transaction() as session:
        results = await scheduling.schedule_all(session, clock)
    placed = [name for r in results.values() for name in r.placed]
    if placed:
        log.info("placed %s", ", ".join(placed))


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
    mark, in one transaction with it (backend/accounting/service.py)."""
    db, clock = runtime.database(), runtime.clock()
    async with db.transaction() as session:
        result = await counting.tick(session, clock)
    if result.recounted_from is not None:
        log.info("goodput: counted again from %s (a transition dated back)", result.recounted_from)
    # Then the alerts, on the ledgers just written (their own transaction: a failed
    # evaluation never takes a tick back).
    async with db.transaction() as session:
        evaluated = await alerts.evaluate(session, clock)
    for alert in evaluated.fired:
        log.warning("alert firing: %s", alert.reason)


async def accounting_prune() -> None:
    """Goodput hours and intervals past 400 days deleted (the ledgers' retention)."""
    db, clock = runtime.database(), runtime.clock()
    async with db.transaction() as session:
        hours, intervals = await accounting.prune(session, clock)
    if hours or intervals:
        log.info(
            "goodput: %d ledger hours and %d intervals past 400 days deleted", hours, intervals
        )


async def webhooks_deliver() -> None:
    """New events handed to each webhook's deliveries, then the due deliveries POSTed.

    Handing out is one transaction; each round of sending claims a batch in a short
    transaction, POSTs it with none open, and records the answers in another. Rounds go on
    while full batches are due, for SEND_BUDGET_S at most; what is left waits for the next
    pass (every 10 s)."""
    db, clock = runtime.database(), runtime.clock()
    async with db.transaction() as session:
        await webhooks.hand_out(session, clock)
    started = time.monotonic()
    while time.monotonic() - started < SEND_BUDGET_S:
        async with db.transaction() as session:
            due = await webhooks.claim_due(session, clock)
        if not due:
            return
        sent = await webhooks.send(due)
        async with db.transaction() as session:
            delivered = await webhooks.record(session, clock, sent)
        if delivered < len(sent):
            log.info("webhooks: %d of %d deliveries failed", len(sent) - delivered, len(sent))
        if len(due) < webhooks.SEND_BATCH:
            return


async def webhooks_prune() -> None:
    """Deliveries settled over 30 days ago deleted: the deliveries table stays the size of a
    month of events, not of every event there ever was."""
    db, clock = runtime.database(), runtime.clock()
    async with db.transaction() as session:
        deleted = await webhooks.prune(session, clock)
    if deleted:
        log.info("webhooks: %d deliveries settled over 30 days ago deleted", deleted)


# A round lasts the HTTP timeout (5 s) at most, so a pass ends within about 13 s.
SEND_BUDGET_S = 8.0


BODIES = {
    "scheduling.pass": scheduling_pass,
    "metrics.prune": metrics_prune,
    "accounting.tick": accounting_tick,
    "accounting.prune": accounting_prune,
    "webhooks.deliver": webhooks_deliver,
    "webhooks.prune": webhooks_prune,
}
