"""Join tokens and machine credentials, on SQLite and PostgreSQL: a join token is exchanged for a
credential bound to one machine's name; a credential registers only its machine; a revoked one
makes the machine lost at once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from backend.db import Database
from backend.errors import InvalidInput, Unauthenticated
from backend.machine_identity import service as identity
from backend.machine_identity.rules import JOIN_ONLY, REVOKED, hash_token
from backend.machines import service as machines
from backend.models import Cluster, JoinToken, Machine, MachineCredential
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support import local_cluster as local_cluster_query

LEASE = timedelta(seconds=60)


async def local_cluster(db: Database) -> Cluster:
    async with db.read() as session:
        cluster = await session.scalar(local_cluster_query())
    assert cluster is not None
    return cluster


async def join_token(db: Database, clock: FakeClock, **options: object) -> str:
    cluster = await local_cluster(db)
    async with db.transaction() as session:
        issued = await identity.issue_join_token(
            session,
            clock,
            organization_id=cluster.organization_id,
            cluster_id=cluster.id,
            **options,  # type: ignore[arg-type]
        )
    return issued.secret


async def join(db: Database, clock: FakeClock, token: str, machine: str) -> str:
    async with db.transaction() as session:
        return (await identity.join(session, clock, token, machine)).secret


async def refused_join(db: Database, clock: FakeClock, token: str, machine: str) -> str:
    with pytest.raises(identity.JoinRefused) as refused:
        await join(db, clock, token, machine)
    return refused.value.message


async def credentials_of(db: Database, machine: str) -> int:
    async with db.read() as session:
        found = await session.scalar(
            select(func.count()).where(MachineCredential.machine == machine)
        )
    return int(found or 0)


async def test_a_join_token_is_exchanged_once_for_a_credential_of_that_machine_alone(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    token = await join_token(db, clock)
    credential = await join(db, clock, token, "gpu-01")
    assert credential.startswith("astm_") and token.startswith("astj_")
    async with db.read() as session:
        principal = await identity.authenticate(session, credential)
        assert principal.machine == "gpu-01" and not principal.legacy
        assert await identity.registration_refusal(session, principal, "gpu-01") is None
        assert await identity.registration_refusal(session, principal, "gpu-02") == (
            "This credential belongs to machine 'gpu-01': it cannot register as 'gpu-02'."
        )
        stored = await session.scalar(select(MachineCredential))
    assert stored is not None and stored.token_hash == hash_token(credential)
    assert credential not in (stored.token_hash, stored.prefix)  # only its digest is kept

    # Used once (its default): no second machine joins with it.
    assert await refused_join(db, clock, token, "evil") == (
        "The join token has been used as many times as it allows: an admin makes another "
        "(astraeus agent-token create)."
    )
    assert await credentials_of(db, "evil") == 0


async def test_a_machine_with_a_credential_cannot_be_joined_again_or_posed_as(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    token = await join_token(db, clock, uses=5)
    credential = await join(db, clock, token, "gpu-01")
    await connect(db, clock, credential)  # its agent connected with it
    assert await refused_join(db, clock, token, "gpu-01") == (
        "Machine 'gpu-01' already has a credential of its own: its agent connects with it. "
        "To join it again, an admin revokes that credential first "
        "(astraeus machine-credential revoke gpu-01)."
    )
    assert await credentials_of(db, "gpu-01") == 1
    async with db.read() as session:
        with pytest.raises(Unauthenticated) as refused:
            await identity.authenticate(session, token)  # a join token does not connect
    assert refused.value.message == JOIN_ONLY


async def connect(db: Database, clock: FakeClock, credential: str) -> None:
    """What a Hello does with the credential: it is used."""
    async with db.transaction() as session:
        await identity.mark_used(session, clock, await identity.authenticate(session, credential))


async def test_a_join_retried_after_its_answer_was_lost_gets_a_new_credential(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """The server completed a Join but its agent gave up waiting (a busy server): the retry
    with the same join token is answered, not refused as already joined, and the token's one
    use is not spent twice. The lost credential is revoked."""
    token = await join_token(db, clock)  # one use
    lost = await join(db, clock, token, "gpu-01")
    clock.advance(seconds=90)
    again = await join(db, clock, token, "gpu-01")
    assert again != lost
    async with db.read() as session:
        assert (await identity.authenticate(session, again)).machine == "gpu-01"
        with pytest.raises(Unauthenticated) as refused:
            await identity.authenticate(session, lost)
        assert refused.value.message == REVOKED
        live = await session.scalars(
            select(MachineCredential).where(MachineCredential.revoked_at.is_(None))
        )
        assert [c.machine for c in live] == ["gpu-01"]
    # Its one use went to gpu-01: no other machine joins with it.
    assert (await refused_join(db, clock, token, "gpu-02")).startswith(
        "The join token has been used as many times as it allows"
    )

    # Once the credential has connected, a Join is no retry: refused.
    await connect(db, clock, again)
    assert (await refused_join(db, clock, token, "gpu-01")).startswith(
        "The join token has been used as many times"
    )
    # Nor after the window, never connected; nor with another join token.
    late = await join_token(db, clock, uses=5)
    await join(db, clock, late, "gpu-02")
    clock.advance(minutes=11)
    assert (await refused_join(db, clock, late, "gpu-02")).startswith(
        "Machine 'gpu-02' already has a credential of its own"
    )
    other = await join_token(db, clock, uses=5)
    await join(db, clock, other, "gpu-03")
    assert (await refused_join(db, clock, late, "gpu-03")).startswith(
        "Machine 'gpu-03' already has a credential of its own"
    )
    # A revoked join token is refused, retry or not.
    async with db.transaction() as session:
        row = await session.scalar(
            select(JoinToken).where(JoinToken.token_hash == hash_token(other))
        )
        assert row is not None
        row.revoked_at = clock.now()
    assert await refused_join(db, clock, other, "gpu-03") == "The join token is unknown or revoked."


async def test_streams_credentials_are_checked_together(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """revoked_among: what still_valid says of each principal, for many in one go."""
    cluster = await local_cluster(db)
    token = await join_token(db, clock, uses=10)
    principals = []
    for i in range(4):
        credential = await join(db, clock, token, f"gpu-{i:02d}")
        async with db.read() as session:
            principals.append(await identity.authenticate(session, credential))
    async with db.read() as session:
        assert await identity.revoked_among(session, principals) == {}
    async with db.transaction() as session:
        await identity.revoke_credential(session, clock, cluster, "gpu-02")
    async with db.read() as session:
        assert await identity.revoked_among(session, principals) == {principals[2]: REVOKED}
        for p in principals:
            assert await identity.still_valid(session, p) == (
                REVOKED if p is principals[2] else None
            )


async def test_an_expired_or_revoked_join_token_and_a_bad_name_are_refused(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    expiring = await join_token(db, clock, expires_in=timedelta(hours=1))
    clock.advance(hours=1)
    assert await refused_join(db, clock, expiring, "gpu-01") == (
        f"The join token expired at {clock.now():%Y-%m-%d %H:%M} UTC: an admin makes another "
        "(astraeus agent-token create)."
    )
    revoked = await join_token(db, clock)
    cluster = await local_cluster(db)
    async with db.transaction() as session:
        row = await session.scalar(
            select(JoinToken).where(JoinToken.token_hash == hash_token(revoked))
        )
        assert row is not None
        await identity.revoke_join_token(session, clock, cluster, row.id)
    assert (
        await refused_join(db, clock, revoked, "gpu-01") == "The join token is unknown or revoked."
    )
    fresh = await join_token(db, clock)
    assert await refused_join(db, clock, fresh, "x" * 300) == (
        "The machine's name is refused: machine must be at most 253 characters (got 300)."
    )
    assert await refused_join(db, clock, fresh, "") == (
        "The machine's name is refused: machine must not be empty."
    )
    assert await credentials_of(db, "gpu-01") == 0


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"expires_in": timedelta(0)}, "expires", "must be a duration between 1s and 365d"),
        (
            {"expires_in": timedelta(days=400)},
            "expires",
            "must be a duration between 1s and 365d",
        ),
        ({"uses": 0}, "uses", "must be between 1 and 10000"),
    ],
)
async def test_a_join_token_without_a_bounded_life_is_refused(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    options: dict[str, object],
    field: str,
    message: str,
) -> None:
    with pytest.raises(InvalidInput) as refused:
        await join_token(db, clock, **options)
    assert [(f.field, f.reason) for f in refused.value.fields] == [(field, message)]
    async with db.read() as session:
        assert await session.scalar(select(func.count()).select_from(JoinToken)) == 0


async def test_a_revoked_credential_makes_its_machine_lost_and_its_workers_placed_again(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    cluster = await local_cluster(db)
    credential = await join(db, clock, await join_token(db, clock), "gpu-01")
    async with db.transaction() as session:
        await machines.register(
            session,
            clock,
            cluster_id=cluster.id,
            name="gpu-01",
            cpu_cores=32,
            memory_bytes=256 * 2**30,
            gpus=[machines.GpuInfo(i, f"SIM-{i}", "Simulated GPU", 80 * 2**30) for i in range(2)],
            lease=LEASE,
        )
    world = World(db, clock, tenancy)
    await world.submit(workers=1, gpus=2)
    await world.schedule()
    assert (await world.workers("llama-sft"))[0].machine_id is not None

    async with db.transaction() as session:
        revoked, fx = await identity.revoke_credential(session, clock, cluster, "gpu-01")
    assert [c.machine for c in revoked] == ["gpu-01"] and fx.freed
    async with db.read() as session:
        machine = await session.scalar(select(Machine).where(Machine.name == "gpu-01"))
        principal_refusal = None
        try:
            await identity.authenticate(session, credential)
        except Unauthenticated as error:
            principal_refusal = error.message
    assert machine is not None
    assert (machine.state, machine.reason) == ("lost", "Machine lost: " + REVOKED)
    assert principal_refusal == REVOKED  # it connects no more, and says why
    (worker,) = await world.workers("llama-sft")
    assert worker.machine_id is None  # waiting to be placed elsewhere, as for a lost lease
    assert (await world.status("llama-sft"))[0] == "Pending"


async def test_a_stream_learns_its_credential_was_revoked(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    cluster = await local_cluster(db)
    credential = await join(db, clock, await join_token(db, clock), "gpu-01")
    async with db.read() as session:
        principal = await identity.authenticate(session, credential)
        assert await identity.still_valid(session, principal) is None
    async with db.transaction() as session:
        await identity.revoke_credential(session, clock, cluster, "gpu-01")
    async with db.read() as session:
        assert await identity.still_valid(session, principal) == REVOKED
    # Revoked, the machine joins again with a new join token.
    again = await join(db, clock, await join_token(db, clock), "gpu-01")
    async with db.read() as session:
        assert (await identity.authenticate(session, again)).machine == "gpu-01"


async def test_up_rotates_its_own_legacy_token_and_a_credential_its_agent_lost(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """`astraeus up` with an agent folder holding no credential: the machine token it made
    before credentials is revoked, a credential `local` had is revoked, and a one-use join
    token for an hour takes their place."""
    cluster = await local_cluster(db)
    legacy = "astx_" + "made-by-up-before-0015" * 2
    async with db.transaction() as session:
        session.add(
            JoinToken(
                token_hash=hash_token(legacy),
                prefix=legacy[:12],
                name="local",
                organization_id=cluster.organization_id,
                cluster_id=cluster.id,
                legacy=True,
                created_at=clock.now(),
            )
        )
    old = await join(db, clock, legacy, "local")  # its agent joined with it, then lost it
    async with db.transaction() as session:
        issued = await identity.rejoin_token(session, clock, cluster, "local", legacy)
    async with db.read() as session:
        for gone in (legacy, old):
            with pytest.raises(Unauthenticated):
                await identity.authenticate(session, gone)
        token = await session.scalar(
            select(JoinToken).where(JoinToken.token_hash == hash_token(issued.secret))
        )
    assert token is not None
    assert (token.uses_left, token.expires_at) == (1, clock.now() + timedelta(hours=1))
    again = await join(db, clock, issued.secret, "local")
    async with db.read() as session:
        assert (await identity.authenticate(session, again)).machine == "local"
