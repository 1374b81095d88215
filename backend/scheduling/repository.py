"""All SQL of the scheduling domain: what one pass reads about a cluster."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import BigInteger, Result, Row, RowMapping, Table, select, text, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.ext.asyncio import AsyncSession

from backend.db.bulk import update_many
from backend.lifecycle.states import ENDED_RUN_STATES
from backend.models import Cluster, Gpu, Machine, Pool, Run, Worker, Workspace, WorkspaceQuota
from backend.spec import Footprint, stored_footprint

SCHEDULING_LOCK = 0x5CED  # the advisory lock namespace of scheduling passes


async def lock_cluster(session: AsyncSession, cluster_id: int) -> None:
    """One pass at a time per cluster, across every process: two passes deciding at once could
    give the same GPUs twice. Both locks last to the end of the transaction."""
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(
            text("SELECT pg_advisory_xact_lock(:space, :key)"),
            {"space": SCHEDULING_LOCK, "key": cluster_id},
        )
    else:
        # SQLite has one writer at a time: writing first makes the pass that writer before it
        # reads anything, so a second pass waits (busy_timeout) until this one commits.
        await session.execute(
            update(Cluster).where(Cluster.id == cluster_id).values(name=Cluster.name)
        )


async def cluster_ids(session: AsyncSession) -> list[int]:
    """The clusters Astraeus places runs on: a Slurm-backed one's jobs are placed by Slurm."""
    return list(
        await session.scalars(
            select(Cluster.id).where(Cluster.slurm.is_(None)).order_by(Cluster.id)
        )
    )


async def cluster_policy(session: AsyncSession, cluster_id: int) -> tuple[str, bool]:
    """The cluster's name, and whether its admins let runs preempt over-quota workspaces."""
    row = (
        await session.execute(
            select(Cluster.name, Cluster.preempt_over_quota).where(Cluster.id == cluster_id)
        )
    ).one()
    return str(row.name), bool(row.preempt_over_quota)


# The tables a pass reads, read as tables: plain rows, without the ORM's work per row (issue 24:
# a first pass reads 10 000 pending runs).
RUNS = cast(Table, Run.__table__)
WORKERS = cast(Table, Worker.__table__)
MACHINES = cast(Table, Machine.__table__)
GPUS = cast(Table, Gpu.__table__)
POOLS = cast(Table, Pool.__table__)


def _footprint() -> list[Any]:
    """The columns of a run's stored specification that placement reads (backend.spec
    stored_footprint makes its Footprint of them): read in SQL, so a pass neither sends nor
    decodes every specification whole."""
    spec = RUNS.c.spec
    return [
        spec["cpu"].as_float().label("cpu"),
        # Bytes exceed a 32-bit INTEGER (as_integer()'s cast): read as text, cast to BIGINT.
        sql_cast(spec["memory_bytes"].as_string(), BigInteger).label("memory_bytes"),
        sql_cast(spec[("per_gpu", "memory_bytes")].as_string(), BigInteger).label("per_gpu_bytes"),
        spec["pool"].as_string().label("pool"),
        spec["image"].as_string().label("image"),
    ]


def footprint(row: Row[Any] | RowMapping) -> Footprint:
    m = row if isinstance(row, RowMapping) else row._mapping
    return _footprint_of(
        m["cpu"], m["memory_bytes"], m["per_gpu_bytes"], m["gpus_per_worker"], m["pool"], m["image"]
    )


# Runs come in few shapes: a pass makes each shape's footprint once (frozen, so shared).
_footprint_of = functools.lru_cache(maxsize=4096)(stored_footprint)


async def machines(session: AsyncSession, cluster_id: int) -> list[Row[Any]]:
    """The cluster's machines (not removed), by name, with their pool's name (``pool``)."""
    m = MACHINES.c
    rows: Result[Any] = await session.execute(
        select(
            m.id,
            m.name,
            m.state,
            m.cpu_cores,
            m.memory_bytes,
            m.executor,
            POOLS.c.name.label("pool"),
        )
        .select_from(MACHINES.outerjoin(POOLS, POOLS.c.id == m.pool_id))
        .where(m.cluster_id == cluster_id, m.state != "removed")
        .order_by(m.name)
    )
    return list(rows.all())


async def gpus(session: AsyncSession, cluster_id: int) -> dict[int, list[tuple[int, str]]]:
    """(index, health) of every GPU of the cluster, by machine."""
    g = GPUS.c
    rows = await session.execute(
        select(g.machine_id, g.index, g.health)
        .select_from(GPUS.join(MACHINES, MACHINES.c.id == g.machine_id))
        .where(MACHINES.c.cluster_id == cluster_id)
    )
    grouped: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for machine_id, index, health in rows.all():
        grouped[machine_id].append((index, health))
    return grouped


async def placed_workers(session: AsyncSession, cluster_id: int) -> list[Row[Any]]:
    """Every worker that holds room on a machine of the cluster (``machine_id``, ``gpu_ids``),
    with what placement needs of its run, as plain rows, by run and rank (and, for a gang
    winding down to restart, its place in the queue and its size)."""
    r, w = RUNS.c, WORKERS.c
    rows: Result[Any] = await session.execute(
        select(
            w.machine_id,
            w.gpu_ids,
            r.id,
            r.name,
            r.priority,
            r.workspace_id,
            r.placed_at,
            r.stop_cause,
            r.gpus_per_worker,
            r.worker_count,
            r.created_at,
            RUNS.c.spec["restart_policy"].as_string().label("restart_policy"),
            *_footprint(),
        )
        .select_from(WORKERS.join(RUNS, r.id == w.run_id))
        .where(r.cluster_id == cluster_id, w.machine_id.is_not(None))
        .order_by(r.id, w.rank)
    )
    return list(rows.all())


async def pending_runs(session: AsyncSession, cluster_id: int) -> list[Row[Any]]:
    """What placement needs of each pending run, as plain rows (thousands of them per pass)."""
    r = RUNS.c
    rows: Result[Any] = await session.execute(
        select(
            r.id,
            r.name,
            r.workspace_id,
            r.priority,
            r.created_at,
            r.worker_count,
            r.gpus_per_worker,
            r.restart_at,
            r.reason,
            r.waits_for,
            r.cause,
            *_footprint(),
        ).where(r.cluster_id == cluster_id, r.state == "Pending", r.deleted_at.is_(None))
    )
    return list(rows.all())


# Everything a pass decides from, in one value: the cluster's policy, its pending runs (with
# whether each may be placed now: a restart's backoff ends with time), the workers placed on it
# and their runs, its machines and their GPUs, the quotas and the names reasons show. Each part
# in its key's order; md5 over the text, so equal inputs give the same value on any replica.
_FINGERPRINT = text(
    """
SELECT md5(concat_ws(E'\\n',
  (SELECT concat_ws(',', c.name, c.preempt_over_quota) FROM clusters c WHERE c.id = :cluster),
  (SELECT string_agg(concat_ws(',', r.id, r.workspace_id, ws.name, r.priority, r.created_at,
          r.worker_count, r.gpus_per_worker, r.restart_at, r.restart_at > :now, r.reason,
          r.waits_for, r.cause), ';' ORDER BY r.id)
     FROM runs r JOIN workspaces ws ON ws.id = r.workspace_id
    WHERE r.cluster_id = :cluster AND r.state = 'Pending' AND r.deleted_at IS NULL),
  (SELECT string_agg(concat_ws(',', w.id, w.run_id, w.machine_id, w.gpu_ids::text, r.priority,
          r.workspace_id, r.placed_at, r.stop_cause, r.state), ';' ORDER BY w.id)
     FROM workers w JOIN runs r ON r.id = w.run_id
    WHERE r.cluster_id = :cluster AND w.machine_id IS NOT NULL),
  (SELECT string_agg(concat_ws(',', m.id, m.name, m.state, m.cpu_cores, m.memory_bytes,
          m.executor, m.pool_id, p.name), ';' ORDER BY m.id)
     FROM machines m LEFT JOIN pools p ON p.id = m.pool_id
    WHERE m.cluster_id = :cluster AND m.state <> 'removed'),
  (SELECT string_agg(concat_ws(',', g.machine_id, g.index, g.health), ';'
          ORDER BY g.machine_id, g.index)
     FROM gpus g JOIN machines m ON m.id = g.machine_id WHERE m.cluster_id = :cluster),
  (SELECT string_agg(concat_ws(',', q.workspace_id, ws.name, q.gpus), ';'
          ORDER BY q.workspace_id)
     FROM workspace_quotas q JOIN workspaces ws ON ws.id = q.workspace_id
    WHERE q.cluster_id = :cluster)
))
"""
)


async def inputs_fingerprint(session: AsyncSession, cluster_id: int, now: datetime) -> str | None:
    """A digest of every input of a pass over the cluster at ``now`` (see _FINGERPRINT):
    equal digests, equal decisions. Computed in the database, so a pass with nothing new reads
    one value instead of every row. PostgreSQL only (None on SQLite: every pass plans)."""
    if session.get_bind().dialect.name != "postgresql":
        return None
    digest = await session.scalar(_FINGERPRINT, {"cluster": cluster_id, "now": now})
    return str(digest)


async def quotas(session: AsyncSession, cluster_id: int) -> list[tuple[int, str, int]]:
    rows = await session.execute(
        select(WorkspaceQuota.workspace_id, Workspace.name, WorkspaceQuota.gpus)
        .join(Workspace, Workspace.id == WorkspaceQuota.workspace_id)
        .where(WorkspaceQuota.cluster_id == cluster_id)
    )
    return [(r[0], r[1], r[2]) for r in rows]


async def workspace_names(session: AsyncSession, ids: Sequence[int]) -> dict[int, str]:
    rows = await session.execute(select(Workspace.id, Workspace.name).where(Workspace.id.in_(ids)))
    return {r.id: r.name for r in rows}


async def master_ports_in_use(session: AsyncSession) -> dict[int, set[int]]:
    """The MASTER_PORT of every live run, by the machine its rank 0 is on."""
    rows = await session.execute(
        select(Worker.machine_id, Run.master_port)
        .join(Worker, Worker.run_id == Run.id)
        .where(
            Worker.rank == 0,
            Worker.machine_id.is_not(None),
            Run.master_port.is_not(None),
            Run.state.not_in([s.value for s in ENDED_RUN_STATES]),
        )
    )
    used: dict[int, set[int]] = defaultdict(set)
    for machine_id, port in rows:
        if machine_id is not None and port is not None:
            used[machine_id].add(port)
    return used


async def machine_addresses(session: AsyncSession, ids: Sequence[int]) -> dict[int, str]:
    """The address each machine's agent advertised (those that did)."""
    rows = await session.execute(
        select(Machine.id, Machine.address).where(Machine.id.in_(ids), Machine.address.is_not(None))
    )
    return {r.id: r.address for r in rows if r.address}


async def set_reasons(session: AsyncSession, reasons: list[dict[str, Any]]) -> None:
    """Change pending runs' sentences and what each says they wait for (no history: the state is
    unchanged); a sentence of the scheduler's has no cause (a restart's is replaced with it).
    All at once (a first pass over a queue of 10 000 writes as many): db.update_many."""
    await update_many(
        session,
        Run,
        {
            r["id"]: {"reason": r["reason"], "waits_for": r["waits_for"], "cause": None}
            for r in reasons
        },
    )
