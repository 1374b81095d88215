"""``astraeus`` admin commands, each one service call in one transaction: first-run set-up
(``bootstrap``, ``db upgrade``), workspaces, a cluster's preemption policy, and the keys of the
secrets at rest. Tokens: backend/cli/tokens.py; machines: backend/cli/machines.py."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession

from backend import crypto, migrations
from backend.cli.transaction import in_transaction
from backend.clock import SystemClock
from backend.config import Settings
from backend.organizations import service as organizations
from backend.secrets import service as secrets_service
from backend.words import counted


def token_file(settings: Settings) -> Path:
    return settings.data_dir / "admin-token"


def cmd_bootstrap(settings: Settings, args: argparse.Namespace) -> int:
    result = in_transaction(
        settings,
        lambda s: organizations.bootstrap(
            s,
            SystemClock(),
            organization=args.organization,
            cluster=args.cluster,
            workspace=args.workspace,
            admin=args.admin,
        ),
    )
    if result is None:
        print("Astraeus is already set up; `astraeus token create` makes more tokens.")
        return 0
    path = token_file(settings) if settings.is_embedded else None
    if path is not None:
        _write_private(path, result.token + "\n")
    print(f"organization: {result.organization}")
    print(f"cluster:      {result.cluster}")
    print(f"workspace:    {result.workspace}")
    print(f"admin user:   {result.user} (organisation admin)")
    if path is not None and getattr(args, "token_to_terminal_only", False) and not _terminal():
        # `astraeus up`'s output is the server's log when it is not a terminal: the token
        # stays in its file
        print(f"token:        in {path} (shown only on a terminal)")
    else:
        print(f"token:        {result.token}")
    return 0


def _terminal() -> bool:
    return sys.stdout.isatty()


def _write_private(path: Path, text: str) -> None:
    """A file only this user may read (0600 from its creation), in a folder of its own."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)  # made before with another mode


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    migrations.upgrade(settings.resolved_database_url, args.revision)
    print(f"database at revision {migrations.current(settings.resolved_database_url)}")
    return 0


def cmd_workspace_create(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> str:
        org = await organizations.organization_by_name(session, args.organization)
        ws = await organizations.create_workspace(
            session,
            SystemClock(),
            organization_id=org.id,
            name=args.name,
        )
        return ws.name

    print(f"workspace {in_transaction(settings, work)} created")
    return 0


def cmd_workspace_ceiling(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> int:
        org = await organizations.organization_by_name(session, args.organization)
        ws = await organizations.set_priority_ceiling(session, org.id, args.name, args.ceiling)
        return ws.priority_ceiling

    print(
        f"workspace {args.name}: runs may ask for priority up to {in_transaction(settings, work)}"
    )
    return 0


def cmd_workspace_quota(settings: Settings, args: argparse.Namespace) -> int:
    gpus = None if args.gpus == "none" else int(args.gpus)

    async def work(session: AsyncSession) -> int | None:
        org = await organizations.organization_by_name(session, args.organization)
        return await organizations.set_quota(session, org.id, args.name, args.cluster, gpus)

    limit = in_transaction(settings, work)
    held = "no quota" if limit is None else f"at most {counted(limit, 'GPU')} at once"
    print(f"workspace {args.name} on {args.cluster}: {held}")
    return 0


def cmd_cluster_preemption(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> bool:
        org = await organizations.organization_by_name(session, args.organization)
        allowed = args.over_quota == "allow"
        found = await organizations.set_preemption_policy(session, org.id, args.name, allowed)
        return found.preempt_over_quota

    if in_transaction(settings, work):
        print(f"cluster {args.name}: runs may preempt other workspaces' runs over their quota")
    else:
        print(f"cluster {args.name}: runs preempt only their own workspace's runs")
    return 0


def cmd_secrets_reencrypt(settings: Settings, args: argparse.Namespace) -> int:
    """After a new key was put first in ASTRAEUS_SECRET_KEY or the key file: every stored
    secret encrypted with it, so that the old key can be dropped."""
    crypto.configure(crypto.load_keyring(settings))
    count = in_transaction(settings, secrets_service.reencrypt)
    print(f"{count} stored secrets encrypted with the first key; the others may now be dropped")
    return 0


def cmd_secrets_new_key(settings: Settings, args: argparse.Namespace) -> int:
    """A new key, to put first in ASTRAEUS_SECRET_KEY or the key file when rotating."""
    print(crypto.Keyring.new_key())
    return 0
