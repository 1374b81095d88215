"""``astraeus cluster`` admin commands for clusters (issue 25): a new cluster, scheduled by
Astraeus or run by Slurm; a Slurm cluster's accounts mapped to workspaces; its import run now,
or read again from a date; and where its import stands."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.cli.transaction import in_transaction, with_database
from backend.clock import SystemClock
from backend.config import Settings, format_duration
from backend.db import Database
from backend.organizations import service as organizations
from backend.slurm import service as slurm


def cmd_cluster_create(settings: Settings, args: argparse.Namespace) -> int:
    clock = SystemClock()

    async def work(session: AsyncSession) -> str:
        org = await organizations.organization_by_name(session, args.organization)
        if not args.slurm:
            found = await organizations.create_cluster(session, clock, org.id, args.name)
            return (
                f"cluster {found.name}: scheduled by Astraeus; machines join it with a join token"
            )
        options = slurm.SlurmSettings(
            conf=args.slurm_conf,
            bin=args.slurm_bin,
            timeout_s=args.timeout,
            state_dir=args.state_dir,
            python=args.node_python,
            operator=args.slurm_operator,
            stall_timeout=format_duration(args.stall_timeout) if args.stall_timeout else None,
        )
        found = await slurm.create_cluster(
            session, clock, org.id, args.name, options, since=args.import_since
        )
        return (
            f"cluster {found.name}: run by Slurm; its jobs are imported every "
            f"{settings.slurm_import_interval.total_seconds():g}s once its accounts are mapped "
            f"(astraeus cluster account {found.name} ACCOUNT --workspace WORKSPACE)"
        )

    print(in_transaction(settings, work))
    return 0


def cmd_cluster_account(settings: Settings, args: argparse.Namespace) -> int:
    clock = SystemClock()

    async def work(session: AsyncSession) -> None:
        org = await organizations.organization_by_name(session, args.organization)
        await slurm.map_account(
            session,
            clock,
            org.id,
            args.cluster,
            args.account,
            None if args.none else args.workspace,
        )

    in_transaction(settings, work)
    if args.none:
        print(f"Slurm account {args.account} on {args.cluster}: not imported any more")
    else:
        print(
            f"Slurm account {args.account} on {args.cluster}: its jobs are imported into "
            f"workspace {args.workspace}"
        )
    return 0


def cmd_cluster_import(settings: Settings, args: argparse.Namespace) -> int:
    clock = SystemClock()

    async def work(db: Database) -> slurm.ImportResult:
        async with db.transaction() as session:
            org = await organizations.organization_by_name(session, args.organization)
            cluster = await slurm.slurm_cluster(session, org.id, args.cluster)
            if args.since is not None:
                await slurm.read_again_from(session, org.id, args.cluster, args.since)
        return await slurm.import_cluster(db, clock, cluster.id)

    result = with_database(settings, work)
    if result.error:
        print(f"cluster {result.cluster}: not imported: {result.error}")
        return 1
    print(
        f"cluster {result.cluster}: {_count(result.jobs, 'job')} of mapped accounts read, "
        f"{_count(result.created, 'new run')}, {result.changed} changed"
    )
    _print_unmapped(result.unmapped)
    _print_quarantined(result.quarantined)
    return 0


def cmd_cluster_status(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> slurm.Status:
        org = await organizations.organization_by_name(session, args.organization)
        return await slurm.status(session, org.id, args.cluster)

    found = in_transaction(settings, work)
    conf = found.settings.conf or "the default slurm.conf"
    print(
        f"cluster {found.cluster}: run by Slurm ({conf}; commands time out after "
        f"{found.settings.timeout_s:g}s)"
    )
    print(f"  imported:  {_time(found.imported_at)}; jobs active since {_time(found.since)}")
    if found.settings.stall_timeout:
        print(
            f"  imported jobs whose output stops for {found.settings.stall_timeout} are counted "
            "stalled"
        )
    if found.error:
        print(f"  last error ({_time(found.error_at)}): {found.error}")
    for account, workspace in found.accounts:
        print(f"  account {account} -> workspace {workspace}")
    if not found.accounts:
        print("  no account is mapped to a workspace: no job is imported")
    _print_unmapped(found.unmapped)
    _print_quarantined(found.quarantined)
    return 0


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _time(moment: datetime | None) -> str:
    return "never" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _print_quarantined(quarantined: dict[str, str]) -> None:
    """What Slurm printed that the last import could not read (each set aside, the rest read)."""
    if quarantined:
        print(f"  not read, set aside: {_count(len(quarantined), 'record')}")
        for what, why in sorted(quarantined.items())[:20]:
            print(f"    {what}: {why}")


def _print_unmapped(unmapped: dict[str, int]) -> None:
    if unmapped:
        listed = ", ".join(
            f"{a} ({n} job{'' if n == 1 else 's'})" for a, n in sorted(unmapped.items())
        )
        print(f"  not imported, their accounts mapped to no workspace: {listed}")
