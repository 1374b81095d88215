"""Whose share of the ledgers a caller reads, and over what: the viewer (some workspaces, maybe
on one cluster), the period and the scope a request names. Every read model of the ledgers
(reports, series, costs, rework, explain) is asked with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.accounting.rules import SCOPES, Period, parse_period
from backend.errors import FieldError, Forbidden, InvalidInput, NotFound
from backend.organizations import service as organizations


@dataclass(frozen=True)
class Viewer:
    """Whose share of the ledgers a caller reads: some workspaces, maybe on one cluster."""

    workspace_ids: list[int] | None  # None: every workspace (of the cluster)
    cluster_id: int | None = None


def scope_of(by: str | None) -> str:
    """What a request's ``by`` names: a workspace by default, else a run, machine or pool."""
    scope = by or "workspace"
    if scope not in SCOPES:
        raise InvalidInput(
            "INVALID_PARAMETER", [FieldError("by", "must be one of workspace, run, machine, pool")]
        )
    return scope


def period_of(start: str | None, end: str | None, now: datetime) -> Period:
    period, problems = parse_period(start, end, now)
    if period is None:
        raise InvalidInput("INVALID_PARAMETER", [FieldError(f, r) for f, r in problems])
    return period


async def viewer_for(
    session: AsyncSession, principal: Principal, workspace: str | None = None
) -> Viewer:
    """A workspace's token reads its workspace's share (its runs' time on the machines they
    used); an organisation admin names any workspace of the organisation."""
    ws = await organizations.workspace_for(session, principal, workspace)
    return Viewer([ws.id])


async def cluster_viewer(
    session: AsyncSession, principal: Principal, organization: str, cluster: str
) -> Viewer:
    """Every workspace's time on one cluster of the organisation: its admins only."""
    org = await organizations.organization_by_name(session, organization)
    if org.id != principal.organization_id:  # another organisation's clusters are not named
        raise NotFound("CLUSTER_NOT_FOUND", f"No cluster named '{cluster}'.")
    found = await organizations.cluster_by_name(session, org.id, cluster)
    if not principal.can_see_organization(org.id):
        raise Forbidden(
            f"A cluster's goodput needs an organisation admin of '{org.name}'; "
            "a member reads their workspace's at /v1/goodput."
        )
    return Viewer(None, found.id)
