"""The address a machine's agent advertises (issue 20): checked at its Hello, kept on the
machine, shown to the organisation's admins, a gang's MASTER_ADDR."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from backend.db import Database
from backend.machines import rules
from backend.machines import service as machines
from tests.lifecycle.world import LEASE
from tests.support import FakeClock, Tenancy, local_cluster


@pytest.mark.parametrize(
    "address", ["10.1.2.3", "127.0.0.1", "fd00::7", "gpu-07", "gpu-07.cluster.example.com"]
)
def test_an_ip_address_or_a_host_name_is_taken(address: str) -> None:
    assert rules.address_problem(address) is None


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        (
            "10.0.0.1 ; rm -rf /",
            "advertise_address must be an IP address or a host name (labels of letters, digits "
            "and '-', at most 63 characters each), got '10.0.0.1 ; rm -rf /'",
        ),
        (
            "gpu-07:29500",
            "advertise_address must be an IP address or a host name (labels of letters, digits "
            "and '-', at most 63 characters each), got 'gpu-07:29500'",
        ),
        (
            "-gpu",
            "advertise_address must be an IP address or a host name (labels of letters, digits "
            "and '-', at most 63 characters each), got '-gpu'",
        ),
        ("a" * 254, "advertise_address must be at most 253 characters (got 254)"),
        ("fe80::1%eth0", "advertise_address must not name a zone (got 'fe80::1%eth0')"),
    ],
)
def test_anything_else_is_refused_naming_the_field(address: str, problem: str) -> None:
    assert rules.address_problem(address) == problem


def test_a_hello_with_a_bad_address_is_refused_and_none_is_no_problem() -> None:
    facts = rules.MachineFacts("gpu-07", "", 8.0, 2**30, (), "0.2.0", 0)
    assert rules.registration_problem(facts) is None  # an agent before addresses
    bad = rules.MachineFacts("gpu-07", "", 8.0, 2**30, (), "0.2.0", 0, "x" * 300)
    assert rules.registration_problem(bad) == (
        "advertise_address must be at most 253 characters (got 300)"
    )


async def register(db: Database, clock: FakeClock, name: str, address: str | None) -> None:
    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        await machines.register(
            session,
            clock,
            cluster_id=cluster.id,
            name=name,
            cpu_cores=8,
            memory_bytes=2**34,
            gpus=[],
            lease=LEASE,
            address=address,
        )


async def graphql(client: httpx.AsyncClient, token: str, query: str) -> dict[str, Any]:
    answer = await client.post(
        "/graphql", json={"query": query}, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def test_the_address_is_kept_and_shown_to_the_organisations_admins_only(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    await register(db, clock, "gpu-07", "10.1.2.3")
    await register(db, clock, "gpu-08", None)
    await register(db, clock, "gpu-07", "10.1.2.4")  # its agent came back on another address
    query = "{ machines { name address } }"
    admin = await graphql(client, tenancy.admin_token, query)
    assert admin["data"]["machines"] == [
        {"name": "gpu-07", "address": "10.1.2.4"},
        {"name": "gpu-08", "address": None},
    ]
    for outsider in (tenancy.member_token, tenancy.other_token, tenancy.foreign_token):
        refused = await graphql(client, outsider, query)
        assert refused["data"] is None
        assert refused["errors"][0]["message"].startswith("Only the organisation's admins")
