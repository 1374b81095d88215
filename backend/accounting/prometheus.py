"""What ``GET /goodput/metrics`` shows: the ledgers the caller may see (clusters, workspaces,
machines, pools, runs still going), stalled workers, stragglers, unhealthy GPUs and firing
alerts, read from the ledgers at each scrape; exposition.py writes them as Prometheus text.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.accounting import ledger_queries, prometheus_queries, rules
from backend.accounting.exposition import Exposition
from backend.accounting.rules import Period, ledgers_by_id
from backend.lifecycle.progress import STRAGGLER_AFTER


async def exposition(
    session: AsyncSession,
    principal: Principal,
    now: datetime,
    alerts_firing: dict[str, int] | None = None,
) -> str:
    """``GET /goodput/metrics``: what the caller may see, as Prometheus text.

    A workspace's token: its workspace, its share of the machines, pools and clusters it
    used, its runs still going. An organisation admin's: every workspace of the organisation."""
    names = await prometheus_queries.workspaces(
        session,
        principal.organization_id,
        None if principal.is_org_admin else [principal.workspace_id or 0],
    )
    ids = list(names)
    out = Exposition()
    hour = rules.hour_floor(now)
    windows = {
        "hour": Period(hour, hour + rules.HOUR),
        "day": Period(hour - 23 * rules.HOUR, hour + rules.HOUR),
    }
    for window, period in windows.items():
        clusters = ledgers_by_id(
            await prometheus_queries.cluster_sums(session, period.start, period.end, ids)
        )
        cluster_names = await prometheus_queries.cluster_names(session, list(clusters))
        for cluster_id, ledger in sorted(clusters.items()):
            out.ledger("cluster", cluster_names.get(cluster_id, str(cluster_id)), window, ledger)
        for scope in ("workspace", "machine", "pool"):
            ledgers = ledgers_by_id(
                await ledger_queries.hour_sums(
                    session, scope, period.start, period.end, workspace_ids=ids
                )
            )
            scope_names = await ledger_queries.scope_names(session, scope, list(ledgers))
            for scope_id, ledger in sorted(ledgers.items()):
                out.ledger(scope, scope_names.get(scope_id, str(scope_id)), window, ledger)
    live = await prometheus_queries.live_runs(session, ids)
    if live:
        since = min(rules.hour_floor(r.created_at) for r in live)
        runs_ = ledgers_by_id(
            await ledger_queries.hour_sums(
                session, "run", since, hour + rules.HOUR, scope_ids=[r.id for r in live]
            )
        )
        for run in sorted(live, key=lambda r: (names.get(r.workspace_id, ""), r.name)):
            if run.id in runs_:
                out.run(names.get(run.workspace_id, ""), run.name, runs_[run.id])
    stalled = await prometheus_queries.stalled_workers(session, ids)
    slow = await prometheus_queries.runs_with_straggler(session, ids, now - STRAGGLER_AFTER)
    for workspace_id, workspace in sorted(names.items(), key=lambda kv: kv[1]):
        out.add("astraeus_workers_stalled", {"namespace": workspace}, stalled.get(workspace_id, 0))
        out.add("astraeus_runs_with_straggler", {"namespace": workspace}, slow.get(workspace_id, 0))
    for cluster, unhealthy in await prometheus_queries.unhealthy_gpus(
        session, principal.organization_id
    ):
        out.add("astraeus_gpus_unhealthy", {"cluster": cluster}, unhealthy)
    for state in await prometheus_queries.slurm_imports(session, principal.organization_id):
        of = {"cluster": state.cluster}
        lag = max(0.0, (now - state.last_read).total_seconds())
        out.add("astraeus_slurm_import_lag_seconds", of, lag)
        out.add("astraeus_slurm_import_failing", of, 1 if state.failing else 0)
        out.add("astraeus_slurm_records_quarantined", of, state.quarantined)
    for metric, firing in (alerts_firing or {}).items():  # a cluster's operators only
        out.add("astraeus_threshold_alerts_firing", {"metric": metric}, firing)
    return out.text()
