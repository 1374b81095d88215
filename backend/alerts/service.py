"""Alerts' entry point: evaluated after each goodput tick; firing and resolved are events.

Each cluster is looked at as of now: the goodput of its workspaces and pools over the last
complete hour against the day before (the seed's goodput_drop), and its counts of workers
stalled and runs with a straggler (per workspace) and of unhealthy GPUs (the cluster's). An
alert is one row from firing to resolved; a new one and a resolved one each make an event
(``alert.firing``, ``alert.resolved``) in the workspace it concerns, or the organisation's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.accounting import cluster_ledgers
from backend.accounting import rules as accounting_rules
from backend.accounting.rules import HOUR
from backend.alerts import repository, rules
from backend.alerts.rules import DEFAULTS, Finding
from backend.clock import Clock
from backend.errors import FieldError, Forbidden, InvalidInput
from backend.lifecycle.progress import STRAGGLER_AFTER
from backend.models import Alert, AlertThreshold, Cluster, Event
from backend.organizations import service as organizations


@dataclass(frozen=True)
class Evaluated:
    fired: list[Alert]
    resolved: list[Alert]


async def evaluate(session: AsyncSession, clock: Clock) -> Evaluated:
    """Fire what should fire and resolve what should not, on every cluster."""
    now = clock.now()
    fired: list[Alert] = []
    resolved: list[Alert] = []
    for cluster in await repository.clusters(session):
        thresholds = DEFAULTS | await repository.thresholds(session, cluster.id)
        findings = {f.key: f for f in await _findings(session, cluster, thresholds, now)}
        current = {(a.metric, a.subject): a for a in await repository.firing(session, [cluster.id])}
        for key, finding in findings.items():
            if key not in current:
                alert = Alert(
                    cluster_id=cluster.id,
                    workspace_id=finding.workspace_id,
                    metric=finding.metric,
                    subject=finding.subject,
                    value=finding.value,
                    threshold=finding.threshold,
                    reason=finding.reason,
                    fired_at=now,
                )
                session.add(alert)
                fired.append(alert)
                _event(session, cluster, alert, "alert.firing", finding.reason, now)
            else:
                current[key].value = finding.value
        for key, alert in current.items():
            if key not in findings:
                alert.resolved_at = now
                resolved.append(alert)
                _event(session, cluster, alert, "alert.resolved", f"Resolved: {alert.reason}", now)
    await session.flush()
    return Evaluated(fired, resolved)


async def _findings(
    session: AsyncSession, cluster: Cluster, thresholds: dict[str, float], now: datetime
) -> list[Finding]:
    names = await repository.workspaces(session, cluster.organization_id)
    found: list[Finding] = []
    hour_end = accounting_rules.hour_floor(now)
    hour_start = hour_end - HOUR
    label = hour_start.strftime("%H:%M UTC")
    for scope in ("workspace", "pool"):
        hour = await cluster_ledgers.cluster_ledgers(
            session, scope, cluster.id, hour_start, hour_end
        )
        day = await cluster_ledgers.cluster_ledgers(
            session, scope, cluster.id, hour_start - 24 * HOUR, hour_start
        )
        scope_names = await cluster_ledgers.scope_names(session, scope, list(hour))
        for scope_id, ledger in hour.items():
            subject = f"{scope}:{scope_names.get(scope_id, scope_id)}"
            workspace_id = scope_id if scope == "workspace" else None
            before = day.get(scope_id)
            if before is not None:
                finding = rules.goodput_drop(
                    subject, workspace_id, ledger, before, thresholds, label
                )
                if finding is not None:
                    found.append(finding)
    stalled = await repository.stalled_by_workspace(session, cluster.id)
    slow = await repository.straggling_by_workspace(session, cluster.id, now - STRAGGLER_AFTER)
    for workspace_id, name in names.items():
        for metric, counts in (("workers_stalled", stalled), ("runs_with_straggler", slow)):
            finding = rules.count_alert(
                metric,
                f"workspace:{name}",
                workspace_id,
                counts.get(workspace_id, 0),
                thresholds[metric],
            )
            if finding is not None:
                found.append(finding)
    faults = rules.count_alert(
        "gpu_faults",
        f"cluster:{cluster.name}",
        None,
        await repository.unhealthy_gpus(session, cluster.id),
        thresholds["gpu_faults"],
    )
    if faults is not None:
        found.append(faults)
    if cluster.slurm is not None:
        read_at = await repository.slurm_read_at(session, cluster.id)
        lag = None
        if read_at is not None:
            lag = rules.import_lag(cluster.name, read_at, now, thresholds["slurm_import_lag"])
        if lag is not None:
            found.append(lag)
    return found


def _event(
    session: AsyncSession, cluster: Cluster, alert: Alert, kind: str, reason: str, at: datetime
) -> None:
    session.add(
        Event(
            organization_id=cluster.organization_id,
            workspace_id=alert.workspace_id,
            kind=kind,
            state=None,
            reason=reason,
            data={"metric": alert.metric, "subject": alert.subject, "cluster": cluster.name},
            created_at=at,
        )
    )


async def firing_for(session: AsyncSession, principal: Principal) -> list[Alert]:
    """Alerts firing that the caller may see: a workspace's own; all the organisation's for
    its admins."""
    clusters = [
        c.id
        for c in await repository.clusters(session)
        if c.organization_id == principal.organization_id
    ]
    alerts = await repository.firing(session, clusters)
    if principal.is_org_admin:
        return alerts
    return [a for a in alerts if a.workspace_id == principal.workspace_id]


async def set_threshold(
    session: AsyncSession,
    clock: Clock,
    principal: Principal,
    cluster: str,
    name: str,
    value: float,
) -> AlertThreshold:
    """A cluster's operators (its organisation's admins) change one threshold."""
    found = await organizations.cluster_by_name(session, principal.organization_id, cluster)
    if not principal.can_see_organization(found.organization_id):
        raise Forbidden("Setting a cluster's alert threshold needs an organisation admin.")
    problem = rules.check_threshold(name, value)
    if problem is not None:
        raise InvalidInput(
            "INVALID_THRESHOLD", [FieldError("name" if "one of" in problem else "value", problem)]
        )
    row = await repository.threshold(session, found.id, name)
    if row is None:
        row = AlertThreshold(cluster_id=found.id, name=name, value=value, updated_at=clock.now())
        session.add(row)
    row.value, row.updated_at = value, clock.now()
    await session.flush()
    return row


@dataclass(frozen=True)
class ThresholdSetting:
    """One of a cluster's alert thresholds as it applies now: set by its operators (when), or
    the default (updated_at None)."""

    name: str
    value: float
    default: float
    updated_at: datetime | None


async def thresholds_of(
    session: AsyncSession, principal: Principal, cluster: str
) -> list[ThresholdSetting]:
    """Every alert threshold of a cluster, as its operators (organisation admins) read them
    back (issue 21)."""
    if not principal.is_org_admin:
        raise Forbidden("Only the organisation's admins read a cluster's alert thresholds.")
    found = await organizations.cluster_by_name(session, principal.organization_id, cluster)
    rows = {name: await repository.threshold(session, found.id, name) for name in DEFAULTS}
    return [
        ThresholdSetting(
            name=name,
            value=DEFAULTS[name] if row is None else row.value,
            default=DEFAULTS[name],
            updated_at=None if row is None else row.updated_at,
        )
        for name, row in rows.items()
    ]


async def firing_counts(session: AsyncSession, principal: Principal) -> dict[str, int] | None:
    """Alerts firing by metric, for ``astraeus_threshold_alerts_firing`` — a cluster's
    operators only (None for anyone else)."""
    if not principal.is_org_admin:
        return None
    counts = dict.fromkeys(rules.METRICS, 0)
    for alert in await firing_for(session, principal):
        counts[alert.metric] = counts.get(alert.metric, 0) + 1
    return counts
