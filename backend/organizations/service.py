"""The organisations domain's entry point: first-run set-up, workspaces, where a run goes."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access import service as access
from backend.access.rules import Principal
from backend.clock import Clock
from backend.db.commit_jobs import after_commit
from backend.errors import Conflict, FieldError, Forbidden, InvalidInput, NotFound
from backend.job_names import PASS_JOB
from backend.models import Cluster, Organization, Pool, Workspace, WorkspaceQuota
from backend.organizations import repository
from backend.spec import parse_idle_policy

# A run's priority is 0 to 100 (backend/spec.py); so is a ceiling on it.
MIN_PRIORITY, MAX_PRIORITY = 0, 100


@dataclass(frozen=True)
class Bootstrap:
    organization: str
    cluster: str
    workspace: str
    user: str
    token: str


async def bootstrap(
    session: AsyncSession,
    clock: Clock,
    *,
    organization: str = "default",
    cluster: str = "local",
    workspace: str = "default",
    admin: str = "admin",
) -> Bootstrap | None:
    """On a database with no organisation yet, create the first one with an admin token.

    Returns None when the database was already set up, so a restart never makes a second admin.
    """
    if await repository.count_organizations(session) > 0:
        return None
    now = clock.now()
    org = Organization(name=organization, created_at=now)
    repository.add(session, org)
    await session.flush()
    repository.add(session, Cluster(organization_id=org.id, name=cluster, created_at=now))
    ws = await create_workspace(session, clock, organization_id=org.id, name=workspace)
    user = await access.ensure_user(
        session, clock, name=admin, organization_id=org.id, workspace_id=ws.id, org_admin=True
    )
    issued = await access.issue_user_token(
        session, clock, user=user, organization_id=org.id, workspace_id=ws.id, name="bootstrap"
    )
    return Bootstrap(organization, cluster, workspace, admin, issued.secret)


async def create_workspace(
    session: AsyncSession, clock: Clock, *, organization_id: int, name: str
) -> Workspace:
    if await repository.get_workspace_by_name(session, organization_id, name) is not None:
        raise Conflict(
            "WORKSPACE_EXISTS",
            f"A workspace named '{name}' already exists.",
            [FieldError("name", "is taken by another workspace of the organisation")],
        )
    ws = Workspace(organization_id=organization_id, name=name, created_at=clock.now())
    repository.add(session, ws)
    await session.flush()
    return ws


async def organization_by_name(session: AsyncSession, name: str) -> Organization:
    org = await repository.get_organization_by_name(session, name)
    if org is None:
        raise NotFound("ORGANIZATION_NOT_FOUND", f"No organisation named '{name}'.")
    return org


async def workspace_by_name(session: AsyncSession, organization_id: int, name: str) -> Workspace:
    ws = await repository.get_workspace_by_name(session, organization_id, name)
    if ws is None:
        raise NotFound("WORKSPACE_NOT_FOUND", f"No workspace named '{name}'.")
    return ws


async def workspace(session: AsyncSession, workspace_id: int) -> Workspace | None:
    return await repository.get_workspace(session, workspace_id)


async def find_workspace(
    session: AsyncSession, organization_id: int, name: str
) -> Workspace | None:
    return await repository.get_workspace_by_name(session, organization_id, name)


async def workspace_for(
    session: AsyncSession, principal: Principal, name: str | None = None
) -> Workspace:
    """The workspace a request acts in: the token's own, or (for an org admin) one it names.

    A workspace the principal may not see is reported as absent, never as forbidden.
    """
    wanted = workspace_wanted(principal, name)
    if isinstance(wanted, int):
        found = await workspace(session, wanted)
    else:
        found = await find_workspace(session, principal.organization_id, wanted)
    check_visible(principal, name, None if found is None else (found.id, found.organization_id))
    assert found is not None
    return found


def workspace_wanted(principal: Principal, name: str | None) -> int | str:
    """Which workspace a request names: the token's own (its id), or another by name. For a
    caller that finds it in its own statement (``workspace_for``'s rules, then
    ``check_visible``)."""
    if name is None or name == principal.workspace_name:
        if principal.workspace_id is None:
            raise NotFound("WORKSPACE_NOT_FOUND", "This token acts in no workspace.")
        return principal.workspace_id
    return name


def check_visible(principal: Principal, name: str | None, found: tuple[int, int] | None) -> None:
    """The workspace found, (id, organisation), is one the principal may act in: else it is
    absent (404), the same answer whether it exists elsewhere or nowhere."""
    if found is None or not principal.can_see_workspace(*found):
        raise NotFound("WORKSPACE_NOT_FOUND", f"No workspace named '{name}'.")


async def clusters(session: AsyncSession, organization_id: int) -> list[Cluster]:
    """The organisation's clusters, by name."""
    return await repository.list_clusters(session, organization_id)


CLUSTER_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


async def create_cluster(
    session: AsyncSession,
    clock: Clock,
    organization_id: int,
    name: str,
    *,
    slurm: dict[str, Any] | None = None,
) -> Cluster:
    """A new cluster of the organisation: scheduled by Astraeus, or run by Slurm (``slurm``:
    how its commands reach it, backend/slurm/commands.py's SlurmSettings)."""
    if not CLUSTER_NAME.match(name):
        raise InvalidInput(
            "INVALID_CLUSTER",
            [FieldError("name", "must be 1 to 63 lowercase letters, digits and '-'")],
        )
    if any(c.name == name for c in await repository.list_clusters(session, organization_id)):
        raise Conflict(
            "CLUSTER_EXISTS",
            f"A cluster named '{name}' already exists.",
            [FieldError("name", "is taken by a cluster of this organisation")],
        )
    cluster = Cluster(organization_id=organization_id, name=name, created_at=clock.now())
    if slurm is not None:  # never JSON's null: "not Slurm" is SQL's NULL, as in every query
        cluster.slurm = slurm
    repository.add(session, cluster)
    await session.flush()
    return cluster


async def cluster_by_name(session: AsyncSession, organization_id: int, name: str) -> Cluster:
    found = [c for c in await repository.list_clusters(session, organization_id) if c.name == name]
    if not found:
        raise NotFound("CLUSTER_NOT_FOUND", f"No cluster named '{name}'.")
    return found[0]


async def placement_target(
    session: AsyncSession, organization_id: int, cluster: str | None, pool: str | None
) -> tuple[Cluster, Pool | None]:
    """The cluster (and pool) a run specification names, or the organisation's only cluster."""
    # A Slurm-backed cluster takes the runs that name it (backend/slurm/ submits them); it is
    # never the cluster a run goes to unnamed.
    every = await repository.list_clusters(session, organization_id)
    clusters = [c for c in every if c.slurm is None]
    if cluster is None:
        if len(clusters) != 1:
            names = ", ".join(c.name for c in clusters) or "none"
            raise InvalidInput(
                "INVALID_SPEC",
                [
                    FieldError(
                        "cluster",
                        f"is required: the organisation has {len(clusters)} clusters ({names})",
                    )
                ],
            )
        chosen = clusters[0]
    else:
        found = [c for c in every if c.name == cluster]
        if not found:
            raise InvalidInput(
                "INVALID_SPEC", [FieldError("cluster", f"no cluster named '{cluster}'")]
            )
        chosen = found[0]
    if pool is None:
        return chosen, None
    found_pool = await repository.get_pool_by_name(session, chosen.id, pool)
    if found_pool is None:
        raise InvalidInput(
            "INVALID_SPEC",
            [FieldError("pool", f"no pool named '{pool}' in cluster '{chosen.name}'")],
        )
    return chosen, found_pool


async def set_priority_ceiling(
    session: AsyncSession, organization_id: int, workspace: str, ceiling: int
) -> Workspace:
    """The highest priority a workspace's runs may ask for; runs already submitted keep theirs."""
    if not MIN_PRIORITY <= ceiling <= MAX_PRIORITY:
        raise InvalidInput(
            "INVALID_CEILING",
            [FieldError("ceiling", f"must be from {MIN_PRIORITY} to {MAX_PRIORITY}")],
        )
    ws = await workspace_by_name(session, organization_id, workspace)
    ws.priority_ceiling = ceiling
    await session.flush()
    return ws


async def set_preemption_policy(
    session: AsyncSession, organization_id: int, cluster: str, preempt_over_quota: bool
) -> Cluster:
    """Whether a cluster's higher-priority runs may preempt runs of other workspaces holding
    more than their quota there; without it, runs preempt only their own workspace's."""
    found = await cluster_by_name(session, organization_id, cluster)
    found.preempt_over_quota = preempt_over_quota
    await session.flush()
    after_commit(session, PASS_JOB)  # runs may now make room by preempting over-quota ones
    return found


async def set_quota(
    session: AsyncSession, organization_id: int, workspace: str, cluster: str, gpus: int | None
) -> int | None:
    """The most GPUs a workspace's runs may hold at once on a cluster; None: no quota. Runs
    already placed keep their GPUs: a workspace above a lowered quota is over it until they end
    (or, where the cluster's policy allows, until other workspaces' runs preempt them)."""
    if gpus is not None and gpus < 0:
        raise InvalidInput("INVALID_QUOTA", [FieldError("gpus", "must be 0 or more")])
    ws = await workspace_by_name(session, organization_id, workspace)
    found = await cluster_by_name(session, organization_id, cluster)
    quota = await repository.get_quota(session, ws.id, found.id)
    if gpus is None:
        if quota is not None:
            await repository.delete(session, quota)
    elif quota is None:
        repository.add(session, WorkspaceQuota(workspace_id=ws.id, cluster_id=found.id, gpus=gpus))
    else:
        quota.gpus = gpus
    await session.flush()
    after_commit(session, PASS_JOB)  # runs waiting for the quota may fit now
    return gpus


async def read_quota(
    session: AsyncSession, principal: Principal, cluster: str, workspace: str | None
) -> tuple[str, int | None]:
    """A workspace's GPU quota on a cluster (None: no quota), as (workspace, gpus): members read
    their own workspace's; the organisation's admins any of its workspaces' (issue 21)."""
    name = workspace if workspace is not None else principal.workspace_name
    if name is None:
        raise InvalidInput(
            "INVALID_WORKSPACE", [FieldError("workspace", "is needed: this token has none")]
        )
    if name != principal.workspace_name and not principal.is_org_admin:
        raise Forbidden(
            "Members read their own workspace's quota; only the organisation's admins read "
            "another workspace's."
        )
    ws = await workspace_by_name(session, principal.organization_id, name)
    found = await cluster_by_name(session, principal.organization_id, cluster)
    quota = await repository.get_quota(session, ws.id, found.id)
    return ws.name, None if quota is None else quota.gpus


async def quotas_of(
    session: AsyncSession, principal: Principal, cluster: str
) -> list[tuple[str, int]]:
    """Every workspace's GPU quota on a cluster, as (workspace, gpus): the organisation's admins
    only (issue 21: the console's Machines page)."""
    if not principal.is_org_admin:
        raise Forbidden("Only the organisation's admins read every workspace's quota.")
    found = await cluster_by_name(session, principal.organization_id, cluster)
    return await repository.list_quotas(session, found.id)


def require_admin(principal: Principal, what: str) -> None:
    if not principal.is_org_admin:
        raise Forbidden(f"Only the organisation's admins set {what}.")


# The most a GPU-hour may be priced at: a typo (a price per GPU-year) is refused.
MAX_GPU_HOUR_PRICE = 1_000_000.0
CURRENCY = re.compile(r"[A-Z]{3}")


@dataclass(frozen=True)
class PoolPrice:
    cluster: str
    pool: str
    gpu_hour_price: float | None
    currency: str | None


async def set_pool_price(
    session: AsyncSession,
    organization_id: int,
    cluster: str,
    pool: str,
    price: float | None,
    currency: str,
) -> PoolPrice:
    """What a GPU-hour of a pool's machines costs (issue 23); None: no price. One currency for
    the organisation: every figure with a price adds up across pools."""
    problems = []
    if price is not None and not (math.isfinite(price) and 0 <= price <= MAX_GPU_HOUR_PRICE):
        problems.append(
            FieldError("pricePerGpuHour", f"must be from 0 to {MAX_GPU_HOUR_PRICE:,.0f}")
        )
    if not CURRENCY.fullmatch(currency):
        problems.append(FieldError("currency", "must be an ISO 4217 code of 3 capital letters"))
    if problems:
        raise InvalidInput("INVALID_PRICE", problems)
    found = await cluster_by_name(session, organization_id, cluster)
    row = await repository.get_pool_by_name(session, found.id, pool)
    if row is None:
        raise NotFound("POOL_NOT_FOUND", f"No pool named '{pool}' in the cluster '{cluster}'.")
    if price is not None:
        others = {
            p.currency
            for p, _ in await repository.priced_pools(session, organization_id)
            if p.id != row.id
        }
        if others and others != {currency}:
            (theirs,) = others
            raise InvalidInput(
                "INVALID_PRICE",
                [
                    FieldError(
                        "currency",
                        f"must be {theirs}, the currency of the organisation's other priced "
                        "pools: every cost adds up in one",
                    )
                ],
            )
    row.gpu_hour_price = price
    row.currency = currency if price is not None else None
    await session.flush()
    return PoolPrice(found.name, row.name, row.gpu_hour_price, row.currency)


async def pool_prices(session: AsyncSession, organization_id: int) -> dict[int, tuple[float, str]]:
    """The price per GPU-hour and currency of each of the organisation's priced pools, by id."""
    return {
        p.id: (float(p.gpu_hour_price), str(p.currency))
        for p, _ in await repository.priced_pools(session, organization_id)
        if p.gpu_hour_price is not None and p.currency is not None
    }


@dataclass(frozen=True)
class PoolIdlePolicy:
    cluster: str
    pool: str
    idle_policy: dict[str, Any] | None


async def set_pool_idle_policy(
    session: AsyncSession,
    organization_id: int,
    cluster: str,
    pool: str,
    policy: Any,
) -> PoolIdlePolicy:
    """The idle policy a run submitted to the pool without its own takes (issue 41), checked as
    a run's is; None: none. Runs submitted before keep what they were given (a default applies
    at submission, as a Kubernetes LimitRange's)."""
    stored = None if policy is None else parse_idle_policy(policy).model_dump(mode="json")
    found = await cluster_by_name(session, organization_id, cluster)
    row = await repository.get_pool_by_name(session, found.id, pool)
    if row is None:
        raise NotFound("POOL_NOT_FOUND", f"No pool named '{pool}' in the cluster '{cluster}'.")
    if stored is not None and found.slurm is not None:
        raise InvalidInput(
            "INVALID_IDLE_POLICY",
            [FieldError("idle", f"is not supported on cluster '{cluster}', which Slurm runs")],
        )
    row.idle_policy = stored
    await session.flush()
    return PoolIdlePolicy(found.name, row.name, stored)
