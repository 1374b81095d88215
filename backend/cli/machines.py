"""``astraeus agent-token`` and ``astraeus machine-credential``: how machines join a cluster.

astraeus agent-token create          a join token (--expires 24h, --uses 1), shown once
astraeus agent-token list            the cluster's join tokens (legacy machine tokens too)
astraeus agent-token revoke ID       no machine joins with it any more
astraeus machine-credential list     each machine's own credential
astraeus machine-credential revoke   the machine is lost at once; its stream is closed
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from backend.clock import SystemClock
from backend.config import Settings, parse_duration
from backend.machine_identity import service as identity
from backend.machine_identity.rules import DEFAULT_EXPIRY
from backend.models import Cluster
from backend.organizations import service as organizations

T = TypeVar("T")
InTransaction = Callable[[Settings, Callable[[AsyncSession], Awaitable[Any]]], Any]


def duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


async def _cluster(session: AsyncSession, args: argparse.Namespace) -> Cluster:
    org = await organizations.organization_by_name(session, args.organization)
    return await organizations.cluster_by_name(session, org.id, args.cluster)


def create_join_token(
    in_transaction: InTransaction, settings: Settings, args: argparse.Namespace
) -> int:
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


def list_join_tokens(
    in_transaction: InTransaction, settings: Settings, args: argparse.Namespace
) -> int:
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


def revoke_join_token(
    in_transaction: InTransaction, settings: Settings, args: argparse.Namespace
) -> int:
    async def work(session: AsyncSession) -> str:
        token = await identity.revoke_join_token(
            session, SystemClock(), await _cluster(session, args), args.id
        )
        return token.prefix

    print(f"join token {args.id} ({in_transaction(settings, work)}…) revoked")
    return 0


def list_credentials(
    in_transaction: InTransaction, settings: Settings, args: argparse.Namespace
) -> int:
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


def revoke_credential(
    in_transaction: InTransaction, settings: Settings, args: argparse.Namespace
) -> int:
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


def add_commands(sub: Any, in_transaction: InTransaction) -> None:
    """The two command groups, on the ``astraeus`` parser's subcommands."""

    def scoped(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--cluster", default="local", help="the cluster (default: local)")
        parser.add_argument("--organization", default="default")
        return parser

    tokens = sub.add_parser(
        "agent-token", help="join tokens machines exchange for credentials of their own"
    ).add_subparsers(dest="agent_token_command", required=True)
    create = scoped(tokens.add_parser("create", help="print a new join token (shown once)"))
    add_join_token_options(create)
    create.add_argument(
        "--expires", type=duration, help="how long it lets machines join, e.g. 1h or 7d (24h)"
    )
    create.add_argument("--name", default="", help="a label to tell the token apart")
    create.set_defaults(func=partial(create_join_token, in_transaction))
    listed = scoped(tokens.add_parser("list", help="the cluster's join tokens"))
    listed.set_defaults(func=partial(list_join_tokens, in_transaction))
    revoke = scoped(tokens.add_parser("revoke", help="no machine joins with it any more"))
    revoke.add_argument("id", type=int, help="the token's id (agent-token list)")
    revoke.set_defaults(func=partial(revoke_join_token, in_transaction))

    credentials = sub.add_parser(
        "machine-credential", help="machines' own credentials"
    ).add_subparsers(dest="machine_credential_command", required=True)
    shown = scoped(credentials.add_parser("list", help="each machine's credential"))
    shown.set_defaults(func=partial(list_credentials, in_transaction))
    gone = scoped(
        credentials.add_parser(
            "revoke", help="the machine is lost at once, its workers placed elsewhere"
        )
    )
    gone.add_argument("machine", help="the machine's name")
    gone.set_defaults(func=partial(revoke_credential, in_transaction))


def add_join_token_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--uses", type=int, default=1, help="how many machines may join with it (default 1)"
    )
