"""``astraeus agent-token`` and ``astraeus machine-credential``: how machines join a cluster.

astraeus agent-token create          a join token (--expires 24h, --uses 1), shown once
astraeus agent-token list            the cluster's join tokens (legacy machine tokens too)
astraeus agent-token revoke ID       no machine joins with it any more
astraeus machine-credential list     each machine's own credential
astraeus machine-credential revoke   the machine is lost at once; its stream is closed
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.cli.transaction import in_transaction
from backend.clock import SystemClock
from backend.config import Settings
from backend.machine_identity import service as identity
from backend.machine_identity.rules import DEFAULT_EXPIRY
from backend.models import Cluster
from backend.organizations import service as organizations


async def _cluster(session: AsyncSession, args: argparse.Namespace) -> Cluster:
    org = await organizations.organization_by_name(session, args.organization)
    return await organizations.cluster_by_name(session, org.id, args.cluster)


def create_join_token(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> str:
        cluster = await _cluster(session, args)
        issued = await identity.issue_join_token(
            session,
            SystemClock(),
            organization_id=cluster.organization_id,
            cluster_id=cluster.id,
            expires_in=args.expires or DEFAULT_EXPIRY,
            uses=args.uses,
            name=args.name,
        )
        return issued.secret

    print(in_transaction(settings, work))
    return 0


def list_join_tokens(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> list[list[str]]:
        now = datetime.now(UTC)
        return [
            [
                str(t.id),
                t.prefix,
                t.name or "-",
                "legacy machine token" if t.legacy else "join token",
                _join_state(t.revoked_at, t.expires_at, t.uses_left, now),
                "any" if t.uses_left is None else str(t.uses_left),
                _when(t.last_used_at),
            ]
            for t in await identity.list_join_tokens(session, await _cluster(session, args))
        ]

    header = ["ID", "PREFIX", "NAME", "KIND", "STATE", "USES LEFT", "LAST USED"]
    _table(header, in_transaction(settings, work))
    return 0


def revoke_join_token(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> str:
        token = await identity.revoke_join_token(
            session, SystemClock(), await _cluster(session, args), args.id
        )
        return token.prefix

    print(f"join token {args.id} ({in_transaction(settings, work)}…) revoked")
    return 0


def list_credentials(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> list[list[str]]:
        return [
            [
                str(c.id),
                c.machine,
                c.prefix,
                "-" if c.join_token_id is None else str(c.join_token_id),
                "active" if c.revoked_at is None else f"revoked {_when(c.revoked_at)}",
                _when(c.created_at),
                _when(c.last_used_at),
            ]
            for c in await identity.list_credentials(session, await _cluster(session, args))
        ]

    header = ["ID", "MACHINE", "PREFIX", "JOIN TOKEN", "STATE", "CREATED", "LAST USED"]
    _table(header, in_transaction(settings, work))
    return 0


def revoke_credential(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> int:
        revoked, _ = await identity.revoke_credential(
            session, SystemClock(), await _cluster(session, args), args.machine
        )
        return len(revoked)

    in_transaction(settings, work)
    print(f"machine {args.machine}: its credential is revoked; the machine is lost")
    return 0


def _join_state(
    revoked_at: datetime | None, expires_at: datetime | None, uses_left: int | None, now: datetime
) -> str:
    if revoked_at is not None:
        return f"revoked {_when(revoked_at)}"
    if expires_at is not None and expires_at <= now:
        return f"expired {_when(expires_at)}"
    if uses_left is not None and uses_left <= 0:
        return "used up"
    return "active" if expires_at is None else f"expires {_when(expires_at)}"


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.strftime("%Y-%m-%dT%H:%MZ")


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
