"""Machines' health over a period (issue 23: lemon machines): the machines of an organisation
ranked by the GPU time lost on them, with their workers' failures by kind, their GPU faults,
how that compares with their pool, and what to do about it.

How the ranking is computed (also in the README):
- **lost** is the GPU time held on the machine in the categories a machine's troubles cost:
  failure (gangs torn down after a failure), restart and stalled, from the machine ledger, every
  workspace's;
- **failures** are the attempts that failed or stalled on it: a worker's own end (an exit, an
  OOM kill, a signal, a GPU fault, its lease expiring), never a rank that died of a lost peer
  (its log says so: the rank that crashed is the one counted) nor a stop;
- **GPU faults** are what its agent reported: XIDs, uncorrectable ECC errors, row remapping;
- the machines come most lost first, then most failures, then most faults, then by name;
- **vs pool** is its failures over the median of its pool's other machines (the machines in no
  pool of a cluster are compared with one another; a machine alone has nothing to compare with);
- the **action**: drain a machine whose GPU is unhealthy now or faulted in the period, or whose
  failures are at least 3 and 3 times its pool's median (or its pool's other machines had
  none); watch one with a failure or lost time; none otherwise.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.accounting import machine_losses
from backend.accounting.rules import HOUR, Category, Period
from backend.errors import Forbidden
from backend.lifecycle.sentences import EndCause
from backend.machines import repository
from backend.organizations import service as organizations
from backend.runs import failures as failure_rules

# Drain at this many failures and this many times its pool's median.
DRAIN_FAILURES = 3
DRAIN_TIMES_POOL = 3.0
WEEK = timedelta(days=7)

# A failure's kind: the server's own findings by their cause, a worker's end by its advice.
_SERVER_KINDS = {
    EndCause.MACHINE_LOST: "machine_lost",
    EndCause.LOST: "machine_lost",
    EndCause.LOST_BY_AGENT: "machine_lost",
    EndCause.GPU_FAULT: "gpu_fault",
    EndCause.STALLED: "stalled",
}


def failure_kind(cause: str, exit_code: int | None) -> str:
    """machine_lost, gpu_fault, stalled, or the failure's advice kind (program, out_of_memory,
    signal, command_not_found, image_pull, other)."""
    if cause in _SERVER_KINDS:
        return _SERVER_KINDS[EndCause(cause)]
    return failure_rules.classify(cause, exit_code).kind.value


@dataclass(frozen=True)
class MachineHealth:
    name: str
    cluster: str
    pool: str | None
    lost_gpu_seconds: dict[Category, float]
    failures: dict[str, int]
    gpu_faults: dict[str, int]
    last_fault: str | None
    unhealthy_gpus: int
    # The median of its pool's other machines' failures; None: it is alone in its pool.
    pool_median_failures: float | None
    action: str

    @property
    def lost(self) -> float:
        return sum(self.lost_gpu_seconds.values())

    @property
    def failure_count(self) -> int:
        return sum(self.failures.values())

    @property
    def fault_count(self) -> int:
        return sum(self.gpu_faults.values())

    @property
    def vs_pool(self) -> float | None:
        """Its failures over its pool's median; None when that is 0, or it is alone."""
        median = self.pool_median_failures
        return self.failure_count / median if median else None


def _when(period: Period) -> str:
    """The default period (the last 7 days, to whole hours) is this week."""
    return "this week" if WEEK <= period.end - period.start <= WEEK + HOUR else "in the period"


def action(
    failures: int,
    median: float | None,
    faults: int,
    last_fault: str | None,
    unhealthy: int,
    lost: float,
    period: Period,
) -> str:
    """What to do about a machine, in one sentence (drain, watch, none)."""
    when = _when(period)
    if unhealthy:
        gpus = "a GPU" if unhealthy == 1 else f"{unhealthy} GPUs"
        return f"drain: {gpus} unhealthy now" + (f" ({last_fault})" if last_fault else "")
    if faults:
        counted = "1 GPU fault" if faults == 1 else f"{faults} GPU faults"
        return f"drain: {counted} {when}" + (f" ({last_fault})" if last_fault else "")
    if failures >= DRAIN_FAILURES and median == 0:
        return f"drain: {failures} failures {when}, none on the rest of its pool"
    if median and failures >= DRAIN_FAILURES and failures >= DRAIN_TIMES_POOL * median:
        return f"drain: {failures / median:.0f}× its pool's failures {when}"
    if failures or lost > 0:
        told = "1 failure" if failures == 1 else f"{failures} failures"
        return f"watch: {told}, {lost / 3600:.1f} GPU-hours lost {when}"
    return "none"


async def machine_health(
    session: AsyncSession, principal: Principal, period: Period, cluster: str | None = None
) -> list[MachineHealth]:
    """The organisation's machines (or one cluster's), worst first, for its admins: another
    workspace's failures on a machine are theirs to know, not a member's."""
    if not principal.is_org_admin:
        raise Forbidden(
            "Only the organisation's admins see its machines' health: it counts every "
            "workspace's failures."
        )
    clusters = await organizations.clusters(session, principal.organization_id)
    if cluster is not None:
        clusters = [
            await organizations.cluster_by_name(session, principal.organization_id, cluster)
        ]
    rows = await repository.machines_in_clusters(session, [c.id for c in clusters])
    ids = [m.id for m, *_ in rows]
    losses = await machine_losses.machine_losses(session, ids, period)
    failures: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for machine_id, cause, exit_code, n in await repository.failure_counts(
        session, ids, period.start, period.end
    ):
        failures[machine_id][failure_kind(cause, exit_code)] += n
    faults: dict[int, dict[str, int]] = defaultdict(dict)
    newest: dict[int, tuple[int, str]] = {}
    for machine_id, kind, n, last_id, reason in await repository.gpu_fault_counts(
        session, ids, period.start, period.end
    ):
        faults[machine_id][kind] = n
        if machine_id not in newest or last_id > newest[machine_id][0]:
            newest[machine_id] = (last_id, reason)
    last_fault = {machine_id: reason for machine_id, (_, reason) in newest.items()}
    pools: dict[tuple[str, str | None], list[int]] = defaultdict(list)
    for m, cluster_name, pool, *_ in rows:
        pools[(cluster_name, pool)].append(m.id)
    out = []
    for m, cluster_name, pool, _, unhealthy in rows:
        count = sum(failures[m.id].values())
        others = [sum(failures[o].values()) for o in pools[(cluster_name, pool)] if o != m.id]
        median = float(statistics.median(others)) if others else None
        lost = losses.get(m.id, {})
        fault_count = sum(faults[m.id].values())
        out.append(
            MachineHealth(
                name=m.name,
                cluster=cluster_name,
                pool=pool,
                lost_gpu_seconds=lost,
                failures=dict(failures[m.id]),
                gpu_faults=faults[m.id],
                last_fault=last_fault.get(m.id),
                unhealthy_gpus=unhealthy,
                pool_median_failures=median,
                action=action(
                    count,
                    median,
                    fault_count,
                    last_fault.get(m.id),
                    unhealthy,
                    sum(lost.values()),
                    period,
                ),
            )
        )
    out.sort(key=lambda h: (-h.lost, -h.failure_count, -h.fault_count, h.cluster, h.name))
    return out
