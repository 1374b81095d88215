"""``astraeus token``: users' API tokens made, listed (a table) and revoked; ``token create
--agent`` makes a machine's join token (backend/cli/machines.py)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access import service as access
from backend.access.service import TokenRow
from backend.cli import machines as machine_cli
from backend.cli.transaction import in_transaction
from backend.clock import SystemClock
from backend.config import Settings
from backend.organizations import service as organizations


def cmd_token_create(settings: Settings, args: argparse.Namespace) -> int:
    if args.agent:
        return cmd_agent_token_create(settings, args)
    if not args.workspace or not args.user:
        print("astraeus: a user token needs --workspace and --user", file=sys.stderr)
        return 2

    async def work(session: AsyncSession) -> str:
        clock = SystemClock()
        org = await organizations.organization_by_name(session, args.organization)
        ws = await organizations.workspace_by_name(session, org.id, args.workspace)
        user = await access.ensure_user(
            session,
            clock,
            name=args.user,
            organization_id=org.id,
            workspace_id=ws.id,
            org_admin=args.admin,
        )
        issued = await access.issue_user_token(
            session,
            clock,
            user=user,
            organization_id=org.id,
            workspace_id=ws.id,
            name=args.name,
            expires_in=args.expires,
        )
        return issued.secret

    print(in_transaction(settings, work))
    return 0


def cmd_token_list(settings: Settings, args: argparse.Namespace) -> int:
    """Every user token of the organisation: id, prefix, user, workspace, state, when it was
    created and last used (written at most a minute late)."""

    async def work(session: AsyncSession) -> list[TokenRow]:
        org = await organizations.organization_by_name(session, args.organization)
        return await access.organization_tokens(session, org.id)

    now = datetime.now(UTC)
    rows = [
        [
            str(t.id),
            t.prefix,
            t.user_name,
            t.workspace_name or "-",
            t.name or "-",
            _token_state(t, now),
            _when(t.created_at),
            _when(t.last_used_at),
        ]
        for t in in_transaction(settings, work)
    ]
    header = ["ID", "PREFIX", "USER", "WORKSPACE", "NAME", "STATE", "CREATED", "LAST USED"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _token_state(token: TokenRow, now: datetime) -> str:
    if token.revoked_at is not None:
        return f"revoked {_when(token.revoked_at)}"
    if token.expires_at is None:
        return "active"
    return f"{'expired' if token.expires_at <= now else 'expires'} {_when(token.expires_at)}"


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.strftime("%Y-%m-%dT%H:%MZ")


def cmd_token_revoke(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> TokenRow:
        org = await organizations.organization_by_name(session, args.organization)
        return await access.revoke_organization_token(session, SystemClock(), org.id, args.token)

    found = in_transaction(settings, work)
    print(f"token {found.id} ({found.prefix}…, {found.user_name}) revoked")
    return 0


def cmd_agent_token_create(settings: Settings, args: argparse.Namespace) -> int:
    """`token create --agent`: a join token, as `astraeus agent-token create` makes."""
    return machine_cli.create_join_token(settings, args)
