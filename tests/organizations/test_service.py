"""First-run set-up, workspaces, and where a run is placed."""

import pytest

from backend.access import service as access
from backend.db import Database
from backend.errors import Conflict, InvalidInput
from backend.models import Cluster, Pool
from backend.organizations import service as organizations
from tests.support import FakeClock, row_counts


async def test_bootstrap_creates_the_first_organisation_once(
    db: Database, clock: FakeClock
) -> None:
    async with db.transaction() as session:
        first = await organizations.bootstrap(session, clock)
    assert first is not None
    assert (first.organization, first.cluster, first.workspace, first.user) == (
        "default",
        "local",
        "default",
        "admin",
    )
    async with db.read() as session:
        principal = await access.authenticate(session, first.token)
    assert principal.is_org_admin and principal.workspace_name == "default"
    before = await row_counts(db)
    async with db.transaction() as session:
        assert await organizations.bootstrap(session, clock) is None
    assert await row_counts(db) == before


async def test_a_workspace_name_is_taken_once_per_organisation(
    db: Database, clock: FakeClock
) -> None:
    async with db.transaction() as session:
        await organizations.bootstrap(session, clock)
    before = await row_counts(db)
    with pytest.raises(Conflict) as caught:
        async with db.transaction() as session:
            org = await organizations.organization_by_name(session, "default")
            await organizations.create_workspace(
                session, clock, organization_id=org.id, name="default"
            )
    assert caught.value.code == "WORKSPACE_EXISTS"
    assert caught.value.fields[0].field == "name"
    assert await row_counts(db) == before


async def test_a_run_goes_to_the_only_cluster_or_the_one_it_names(
    db: Database, clock: FakeClock
) -> None:
    async with db.transaction() as session:
        await organizations.bootstrap(session, clock)
        org = await organizations.organization_by_name(session, "default")
        cluster, pool = await organizations.placement_target(session, org.id, None, None)
        assert (cluster.name, pool) == ("local", None)
        # a Slurm-backed cluster is never where an unnamed run goes, even with every Slurm
        # setting at its default (stored as {}, not SQL's NULL)
        session.add(Cluster(organization_id=org.id, name="hpc", slurm={}, created_at=clock.now()))
        await session.flush()
        cluster, _ = await organizations.placement_target(session, org.id, None, None)
        assert cluster.name == "local"
        session.add(Cluster(organization_id=org.id, name="west", created_at=clock.now()))
        await session.flush()
        with pytest.raises(InvalidInput) as caught:
            await organizations.placement_target(session, org.id, None, None)
        assert str(caught.value.fields[0]) == (
            "cluster: is required: the organisation has 2 clusters (local, west)"
        )
        with pytest.raises(InvalidInput) as caught:
            await organizations.placement_target(session, org.id, "east", None)
        assert str(caught.value.fields[0]) == "cluster: no cluster named 'east'"
        west, _ = await organizations.placement_target(session, org.id, "west", None)
        session.add(Pool(cluster_id=west.id, name="h100", created_at=clock.now()))
        await session.flush()
        _, pool = await organizations.placement_target(session, org.id, "west", "h100")
        assert pool is not None and pool.name == "h100"
        with pytest.raises(InvalidInput) as caught:
            await organizations.placement_target(session, org.id, "local", "h100")
        assert str(caught.value.fields[0]) == "pool: no pool named 'h100' in cluster 'local'"
