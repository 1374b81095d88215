"""``GET /v1/jobs/<run>`` (seed L-32, L-45)."""

import httpx

from backend.db import Database
from tests.support import FakeClock, Tenancy, run_spec
from tests.support.api import auth

CREATE = """mutation($spec: JSON!) {
  createRun(spec: $spec) { run { name } errors { field message } }
}"""


async def submit(client: httpx.AsyncClient, token: str, **spec: object) -> None:
    answer = await client.post(
        "/graphql",
        json={"query": CREATE, "variables": {"spec": run_spec(**spec)}},
        headers=auth(token),
    )
    assert answer.json()["data"]["createRun"]["errors"] == []


async def test_a_job_reads_as_the_seed_shows_it(
    client: httpx.AsyncClient, tenancy: Tenancy, clock: FakeClock
) -> None:
    # seed L-32: the run with status, history, task_counts and task_names
    await submit(client, tenancy.member_token)
    answer = await client.get("/v1/jobs/llama-sft", headers=auth(tenancy.member_token))
    assert answer.status_code == 200
    job = answer.json()
    assert job["name"] == "llama-sft"
    assert job["status"] == "Pending"
    assert job["reason"] == "Run created"
    assert job["created_by"] == "alice"
    assert job["created_at"] == "2026-10-01T01:02:11.402117Z"
    assert job["task_names"] == ["llama-sft-0", "llama-sft-1"]
    assert job["task_counts"] == {
        "Pending": 2,
        "Preparing": 0,
        "Pulling": 0,
        "Starting": 0,
        "Running": 0,
        "Stopping": 0,
        "Completed": 0,
        "Failed": 0,
        "Stopped": 0,
    }
    # seed L-45: jq -c '.history[] | [.transition_at, .state, .reason]'
    rows = [[h["transition_at"], h["state"], h["reason"]] for h in job["history"]]
    assert rows == [["2026-10-01T01:02:11.402117Z", "Pending", "Run created"]]
    assert job["spec"]["command"] == ["python", "train.py"]


async def test_another_workspace_gets_404_and_nothing_of_the_run(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    await submit(client, tenancy.member_token, name="secret-run", environment={"KEY": "s3cr3t"})
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        answer = await client.get("/v1/jobs/secret-run", headers=auth(outsider))
        assert answer.status_code == 404
        assert answer.json()["code"] == "JOB_NOT_FOUND"
        assert "s3cr3t" not in answer.text and "alice" not in answer.text
        named = await client.get(
            "/v1/jobs/secret-run", params={"workspace": "default"}, headers=auth(outsider)
        )
        assert named.status_code == 404
        assert "s3cr3t" not in named.text
    # Bob is refused the other workspace of his organisation; Carol's own 'default' has no such run.
    bob = await client.get(
        "/v1/jobs/secret-run", params={"workspace": "default"}, headers=auth(tenancy.other_token)
    )
    assert bob.json() == {"code": "WORKSPACE_NOT_FOUND", "message": "No workspace named 'default'."}
    carol = await client.get(
        "/v1/jobs/secret-run", params={"workspace": "default"}, headers=auth(tenancy.foreign_token)
    )
    assert carol.json()["code"] == "JOB_NOT_FOUND"


async def test_an_org_admin_names_the_workspace(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    await submit(client, tenancy.other_token, name="sweep-7", workers=1)
    answer = await client.get(
        "/v1/jobs/sweep-7", params={"workspace": "team-b"}, headers=auth(tenancy.admin_token)
    )
    assert answer.status_code == 200 and answer.json()["created_by"] == "bob"


async def test_an_unknown_job_and_a_missing_token(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    missing = await client.get("/v1/jobs/nope", headers=auth(tenancy.member_token))
    assert missing.status_code == 404
    assert missing.json() == {
        "code": "JOB_NOT_FOUND",
        "message": "No run named 'nope' in workspace 'default'.",
    }
    anonymous = await client.get("/v1/jobs/nope")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Bearer"
    assert anonymous.json()["code"] == "UNAUTHENTICATED"
    wrong = await client.get("/v1/jobs/nope", headers={"Authorization": "Bearer astx_" + "0" * 40})
    assert wrong.status_code == 401
    assert wrong.json()["message"] == "The API token is unknown or revoked."


async def test_health_needs_no_token(client: httpx.AsyncClient, db: Database) -> None:
    answer = await client.get("/healthz")
    assert answer.status_code == 200 and answer.json() == {"status": "ok"}
