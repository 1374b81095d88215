"""GET /v1/tasks?job=, /v1/tasks/<worker> (seed L-22, L-33) and /v1/tasks/<worker>/logs: no
machine to ask, and bad input (seed L-13, L-17)."""

import httpx
import pytest
from sqlalchemy import select

from backend.db import Database
from backend.gateway import service as agents
from backend.lifecycle.sentences import EndCause
from backend.metrics.rules import SampleIn
from backend.models import Worker
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import auth


async def test_a_machine_that_does_not_answer_is_a_400(
    client: httpx.AsyncClient, tenancy: Tenancy, placed: None
) -> None:
    # seed L-17: a machine that does not answer -> 400 TASK_LOG_UNAVAILABLE
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
    # seed L-13: `tail` at most 10 000 (its default, 1 000: tests/logs/test_on_the_machine.py)
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


OOM = "OOMKilled: the container exceeded its memory limit"


async def a_run_with_an_oom(world: World) -> None:
    """llama-sft: two workers on gpu-07 and gpu-08; rank 1 ran out of memory (137)."""
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(gpus=8)
    await world.schedule()
    await world.start("llama-sft-0", "llama-sft-1")
    world.clock.advance(minutes=3)
    await world.report(
        "llama-sft-1",
        "exited",
        exit_code=137,
        cause=EndCause.OOM_KILLED,
        log_tail="[rank1]: step 4410 loss 1.402\n",
    )


async def test_a_runs_tasks_have_the_seeds_fields(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # seed L-33: GET $API/tasks?job=<run> -> status, exit_code, restarts, restart_at,
    # last_failure, placement and metrics
    world = World(db, clock, tenancy)
    await a_run_with_an_oom(world)
    async with db.transaction() as session:
        worker = await session.scalar(select(Worker).where(Worker.name == "llama-sft-0"))
        assert worker is not None and worker.machine_id is not None
        at = int(clock.now().timestamp() * 1000)
        await agents.metrics(
            session,
            worker.machine_id,
            [
                SampleIn(worker.id, "task_cpu_usage_cores", None, at, 3.5),
                SampleIn(worker.id, "task_gpu_utilization_ratio", 0, at - 5000, 0.5),
                SampleIn(worker.id, "task_gpu_utilization_ratio", 0, at, 0.97),
                SampleIn(worker.id, "task_gpu_utilization_ratio", 1, at, 0.95),
            ],
        )
    answer = await client.get(
        "/v1/tasks", params={"job": "llama-sft"}, headers=auth(tenancy.member_token)
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["job"] == "llama-sft"
    first, second = body["tasks"]
    for task in (first, second):
        assert {
            "status",
            "exit_code",
            "restarts",
            "restart_at",
            "last_failure",
            "placement",
            "metrics",
        } <= set(task)
    assert first["name"] == "llama-sft-0" and first["rank"] == 0
    assert first["placement"]["machine"] in ("gpu-07", "gpu-08")
    assert first["placement"]["gpu_ids"] == list(range(8))
    assert first["metrics"] == {
        "task_cpu_usage_cores": 3.5,
        "task_gpu_utilization_ratio": {"0": 0.97, "1": 0.95},  # the newest of each GPU
    }
    assert second["exit_code"] == 137
    assert second["last_failure"]["reason"] == OOM
    assert second["metrics"] == {}  # nothing sampled in the last two minutes
    clock.advance(minutes=3)
    later = await client.get(
        "/v1/tasks", params={"job": "llama-sft"}, headers=auth(tenancy.member_token)
    )
    assert later.json()["tasks"][0]["metrics"] == {}  # older than two minutes: not "now"


async def test_a_workers_last_failure_as_the_seed_reads_it(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # seed L-22: curl "$API/tasks/llama-sft-1" | jq .last_failure
    await a_run_with_an_oom(World(db, clock, tenancy))
    answer = await client.get("/v1/tasks/llama-sft-1", headers=auth(tenancy.member_token))
    assert answer.status_code == 200
    failure = answer.json()["last_failure"]
    assert set(failure) == {"reason", "failed_at", "exit_code", "log_tail"}
    assert failure["reason"] == OOM and failure["exit_code"] == 137
    assert failure["log_tail"].endswith("[rank1]: step 4410 loss 1.402\n")
    assert failure["failed_at"].startswith("2026-10-01T")


async def test_tasks_need_a_job_and_hide_other_workspaces_runs(
    client: httpx.AsyncClient, tenancy: Tenancy, placed: None
) -> None:
    missing = await client.get("/v1/tasks", headers=auth(tenancy.member_token))
    assert missing.status_code == 400
    assert missing.json()["errors"] == [
        {"field": "job", "reason": "is required: the run whose workers to list"}
    ]
    unknown = await client.get(
        "/v1/tasks", params={"job": "nope"}, headers=auth(tenancy.member_token)
    )
    assert unknown.status_code == 404 and unknown.json()["code"] == "JOB_NOT_FOUND"
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        listing = await client.get("/v1/tasks", params={"job": "llama-sft"}, headers=auth(outsider))
        assert listing.status_code == 404 and "llama-sft-0" not in listing.text
        one = await client.get("/v1/tasks/llama-sft-0", headers=auth(outsider))
        assert one.status_code == 404 and one.json()["code"] == "TASK_NOT_FOUND"
    # The same answers at the console's address.
    same = await client.get("/api/v1/tasks/llama-sft-0", headers=auth(tenancy.member_token))
    assert same.status_code == 200 and same.json()["name"] == "llama-sft-0"
