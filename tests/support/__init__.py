"""Test helpers: a fake clock and plain factory functions with keyword defaults."""

from __future__ import annotations

import os
import random
import socket
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.access import service as access
from backend.config import Settings
from backend.db import Database
from backend.models import Base, Cluster, Organization
from backend.organizations import service as organizations
from tests.support.sandboxed import TEMP_ROOT

SEED_TIME = datetime(2026, 10, 1, 1, 2, 11, 402117, tzinfo=UTC)


TOPS = (Path("/tmp"), TEMP_ROOT, Path("/"))  # where searchable() stops


def local_cluster() -> Select[tuple[Cluster]]:
    """The query of the default organisation's cluster "local". Every organisation has one of
    that name: by name alone, which of them comes first is the table's order on disk (after
    rows were deleted, the other organisation's, and a test's machines joined a cluster its
    runs are not in)."""
    return (
        select(Cluster)
        .join(Organization, Organization.id == Cluster.organization_id)
        .where(Cluster.name == "local", Organization.name == "default")
    )


def searchable(folder: Path) -> Path:
    """The folder and those above it, up to the tests' temporary root, made searchable by other
    users (0711, no listing): an agent running as root keeps its workloads' own folders in its
    data folder, and they run as users of their own, who must be able to reach them (issue
    17). pytest makes its temporary folders 0700."""
    for each in [folder, *folder.parents]:
        if each in TOPS or each.stat().st_uid != os.geteuid():
            break
        each.chmod(each.stat().st_mode | 0o111)
    return folder


# Ports for the tests' servers: below the ephemeral range (32768-60999 here), where a port a
# killed server leaves is never handed to some lane's outgoing connection before the server
# comes back on it, and a thousand of their own to each parallel lane (pytest-xdist's gwN),
# so two lanes never draw the same one. (20000-28999 are the servers' MASTER_PORTS.)
_LANE = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 10
_GIVEN: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 no server of this lane has been given and nothing listens on."""
    first = 10000 + 1000 * _LANE
    for port in random.sample(range(first, first + 1000), 1000):
        if port in _GIVEN:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port left in {first}-{first + 999}")


# The Python a workload's command runs. An agent running as root starts workloads as users of
# their own, who cannot read /root (where this interpreter may live): they get Debian's.
WORKLOAD_PYTHON = (
    "/usr/bin/python3"
    if os.geteuid() == 0 and os.path.exists("/usr/bin/python3")
    else sys.executable
)


class FakeClock:
    """A clock that moves only when a test moves it."""

    def __init__(self, start: datetime = SEED_TIME) -> None:
        self.moment = start

    def now(self) -> datetime:
        return self.moment

    def advance(self, **delta: float) -> datetime:
        self.moment += timedelta(**delta)
        return self.moment


@dataclass(frozen=True)
class Tenancy:
    """Two workspaces of one organisation, and a third organisation, each with a token."""

    admin_token: str  # org admin of 'default', acting in workspace 'default'
    member_token: str  # a member of workspace 'default'
    other_token: str  # a member of workspace 'team-b' of the same organisation
    foreign_token: str  # a member of workspace 'default' of organisation 'other-org'


async def make_tenancy(db: Database, clock: FakeClock) -> Tenancy:
    async with db.transaction() as session:
        boot = await organizations.bootstrap(session, clock)
        assert boot is not None
        org = await organizations.organization_by_name(session, "default")
        ws_a = await organizations.workspace_by_name(session, org.id, "default")
        # The seed's scenarios give runs priorities up to 90: default's admin allows them.
        # team-b keeps the default ceiling (50).
        await organizations.set_priority_ceiling(session, org.id, "default", 100)
        ws_b = await organizations.create_workspace(
            session, clock, organization_id=org.id, name="team-b"
        )
        member = await _token(session, clock, "alice", org.id, ws_a.id)
        other = await _token(session, clock, "bob", org.id, ws_b.id)
    async with db.transaction() as session:
        foreign_org = await _organization(session, clock, "other-org")
        foreign = await _token(session, clock, "carol", foreign_org[0], foreign_org[1])
    return Tenancy(boot.token, member, other, foreign)


async def _token(
    session: AsyncSession, clock: FakeClock, user: str, org_id: int, ws_id: int
) -> str:
    row = await access.ensure_user(
        session, clock, name=user, organization_id=org_id, workspace_id=ws_id, org_admin=False
    )
    issued = await access.issue_user_token(
        session, clock, user=row, organization_id=org_id, workspace_id=ws_id
    )
    return issued.secret


async def _organization(session: AsyncSession, clock: FakeClock, name: str) -> tuple[int, int]:
    from backend.models import Cluster, Organization

    org = Organization(name=name, created_at=clock.now())
    session.add(org)
    await session.flush()
    session.add(Cluster(organization_id=org.id, name="local", created_at=clock.now()))
    ws = await organizations.create_workspace(
        session, clock, organization_id=org.id, name="default"
    )
    return org.id, ws.id


def run_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "llama-sft",
        "workers": 2,
        "gpus": 1,
        "cpu": 4,
        "memory_bytes": 16 * 2**30,
        "command": ["python", "train.py"],
    }
    spec.update(overrides)
    return spec


async def row_counts(db: Database) -> dict[str, int]:
    """How many rows each table holds: to assert that a refused request changed nothing."""
    counts = {}
    async with db.read() as session:
        for table in Base.metadata.sorted_tables:
            counts[table.name] = int(
                await session.scalar(select(func.count()).select_from(table)) or 0
            )
    return counts


def server_settings(database_url: str, folder: Path) -> Settings:
    """A server's settings for a test: its database, folders of its own, no migrations on
    start, no in-process jobs, no agent endpoint."""
    return Settings(
        database_url=database_url,
        data_dir=folder / "data",
        console_dir=folder / "no-console",
        migrate_on_start=False,
        run_jobs=False,
        agent_port=0,
    )
