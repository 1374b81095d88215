"""GET /v1/tasks/<worker>/logs: no machine to ask, and bad input (seed L-13, L-17)."""

import httpx
import pytest

from backend.db import Database
from tests.lifecycle.world import World
from tests.rest.test_jobs import auth
from tests.support import FakeClock, Tenancy


@pytest.fixture
async def placed(db: Database, clock: FakeClock, tenancy: Tenancy) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=1)
    await world.schedule()


async def test_a_machine_that_does_not_answer_is_a_400(
    client: httpx.AsyncClient, tenancy: Tenancy, placed: None
) -> None:
    answer = await client.get("/v1/tasks/llama-sft-0/logs", headers=auth(tenancy.member_token))
    assert answer.status_code == 400
    assert answer.json()["code"] == "TASK_LOG_UNAVAILABLE"


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        ("0", "must be a whole number from 1"),
        ("ten", "must be a whole number from 1"),
        ("10001", "must be at most 10000"),
    ],
)
async def test_tail_is_from_1_to_10000(
    client: httpx.AsyncClient, tenancy: Tenancy, placed: None, tail: str, reason: str
) -> None:
    answer = await client.get(
        "/v1/tasks/llama-sft-0/logs", params={"tail": tail}, headers=auth(tenancy.member_token)
    )
    assert answer.status_code == 400
    assert answer.json()["errors"] == [{"field": "tail", "reason": reason}]


async def test_another_workspace_gets_404(
    client: httpx.AsyncClient, tenancy: Tenancy, placed: None
) -> None:
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        answer = await client.get("/v1/tasks/llama-sft-0/logs", headers=auth(outsider))
        assert answer.status_code == 404
        assert answer.json()["code"] == "TASK_NOT_FOUND"
