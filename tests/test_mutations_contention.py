"""Every mutation is a unit of work (issue 19): one that loses to another transaction (a
deadlock, a serialisation failure) is tried again whole, and one that keeps losing is answered
CONFLICT_RETRY, "send it again", never DATABASE_UNAVAILABLE (the database is not away).
createRun, runAgain, stopRun and deleteRun: tests/test_database_contention.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import gql

RETRY = (
    "Other requests changed the same things at once and this one gave way; nothing was "
    "changed: send it again."
)


@dataclass(frozen=True)
class Mutation:
    name: str
    table: str  # the table it writes: writing it deadlocks while the test says so
    query: str  # @N: 1 the first time, 2 the second (a write that changes something)
    admin: bool = True
    before: Callable[[httpx.AsyncClient, Database, FakeClock, Tenancy], Awaitable[None]] | None = (
        None
    )


async def a_machine(client: httpx.AsyncClient, db: Database, clock: FakeClock, t: Tenancy) -> None:
    world = World(db, clock, t)
    await world.machine("gpu-01", gpus=8)
    await world.machine("gpu-02", gpus=8)


async def a_secret(client: httpx.AsyncClient, db: Database, clock: FakeClock, t: Tenancy) -> None:
    made = await gql(
        client, t.admin_token, 'mutation { setSecret(name: "k", value: "v") { errors { code } } }'
    )
    assert made["data"]["setSecret"]["errors"] == []


MUTATIONS = [
    Mutation(
        "setSecret",
        "secrets",
        'mutation { setSecret(name: "k", value: "v@N") '
        "{ secret { name } errors { code message } } }",
    ),
    Mutation(
        "deleteSecret",
        "secrets",
        'mutation { deleteSecret(name: "k") { secret { name } errors { code message } } }',
        before=a_secret,
    ),
    Mutation(
        "createWebhook",
        "webhooks",
        'mutation { createWebhook(url: "https://team.example/hook@N") '
        "{ webhook { url } errors { code message } } }",
    ),
    Mutation(
        "setQuota",
        "workspace_quotas",
        'mutation { setQuota(workspace: "default", cluster: "local", gpus: @N) '
        "{ quota { gpus } errors { code message } } }",
    ),
    Mutation(
        "setPriorityCeiling",
        "workspaces",
        'mutation { setPriorityCeiling(workspace: "default", ceiling: 6@N) '
        "{ workspace { name } errors { code message } } }",
    ),
    Mutation(
        "setPreemptionPolicy",
        "clusters",
        'mutation { setPreemptionPolicy(cluster: "local", preemptOverQuota: @FLAG) '
        "{ policy { cluster } errors { code message } } }",
    ),
    Mutation(
        "drainMachine",
        "machines",
        'mutation { drainMachine(cluster: "local", machine: "gpu-0@N") '
        "{ machine { name } errors { code message } } }",
        before=a_machine,
    ),
    Mutation(
        "createJoinToken",
        "join_tokens",
        "mutation { createJoinToken { joinToken { id } errors { code message } } }",
    ),
]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
async def test_a_mutation_that_loses_is_tried_again_then_a_conflict_to_retry(
    client: httpx.AsyncClient,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    losing: Callable[[str, int], Awaitable[None]],
    mutation: Mutation,
) -> None:
    if mutation.before is not None:
        await mutation.before(client, db, clock, tenancy)
    token = tenancy.admin_token if mutation.admin else tenancy.member_token
    await losing(mutation.table, 2)  # two tries lose, the third wins
    once = await gql(client, token, mutation.query.replace("@N", "1").replace("@FLAG", "true"))
    assert "errors" not in once, once
    payload: dict[str, Any] = once["data"][mutation.name]
    assert payload["errors"] == [], payload
    if mutation.name == "deleteSecret":
        await a_secret(client, db, clock, tenancy)  # there again, to delete again
    await losing(mutation.table, 1000)  # every try loses
    always = await gql(client, token, mutation.query.replace("@N", "2").replace("@FLAG", "false"))
    assert "errors" not in always, always
    assert always["data"][mutation.name]["errors"] == [{"code": "CONFLICT_RETRY", "message": RETRY}]
