"""States, categories and failure kinds are GraphQL enums (issue 22) whose values are spelled as
the strings the API answered before (``Running``, ``productive``, ``out_of_memory``): the
console and the seeds' outputs read the same text. Each is the domain's enum, member for member."""

from __future__ import annotations

from enum import StrEnum

import httpx
import pytest

from backend.accounting.rules import Category
from backend.db import Database
from backend.lifecycle.sentences import EndCause
from backend.lifecycle.states import RunState, WorkerState
from backend.resolvers.root import sdl
from backend.runs.failures import FailureKind
from backend.schema.enums import (
    CategoryValue,
    FailureKindValue,
    LifeStateValue,
    RunStateValue,
    WorkerStateValue,
)
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import graphql


@pytest.mark.parametrize(
    ("graphql_enum", "domain"),
    [
        (RunStateValue, [s.value for s in RunState]),
        (WorkerStateValue, [s.value for s in WorkerState]),
        (LifeStateValue, [*dict.fromkeys([*(s.value for s in WorkerState), *RunState])]),
        (CategoryValue, [c.value for c in Category]),
        (FailureKindValue, [k.value for k in FailureKind]),
    ],
)
def test_each_graphql_enum_is_its_domain_enum_spelled_as_its_values(
    graphql_enum: type[StrEnum], domain: list[str]
) -> None:
    assert [m.name for m in graphql_enum] == [m.value for m in graphql_enum]
    assert sorted(m.value for m in graphql_enum) == sorted(domain)


def test_the_schema_types_states_categories_and_kinds_as_enums() -> None:
    text = sdl()
    for field in (
        "state: RunState!",
        "state: WorkerState!",
        "state: LifeState!",
        "category: GoodputCategory!",
        "kind: FailureKind!",
    ):
        assert field in text


QUERY = """query($name: String!) { run(name: $name) { state history { state }
  workers { state advice { kind } } taskCounts { state count } } }"""


async def test_the_wire_values_are_the_strings_answered_before(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=1)
    await world.schedule()
    await world.start("llama-sft-0")
    await world.report("llama-sft-0", "exited", exit_code=137, cause=EndCause.OOM_KILLED)
    answer = await graphql(client, tenancy.member_token, QUERY, name="llama-sft")
    run = answer["data"]["run"]
    assert run["state"] == "Pending"  # restarting after its failure
    assert [h["state"] for h in run["history"]][:3] == ["Pending", "Starting", "Running"]
    assert run["workers"] == [{"state": "Pending", "advice": {"kind": "out_of_memory"}}]
    assert {"state": "Pending", "count": 1} in run["taskCounts"]
