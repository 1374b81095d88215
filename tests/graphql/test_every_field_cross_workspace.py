"""Every GraphQL root field tried with the token of another workspace of the organisation and
of another organisation, aimed at workspace 'default': nothing of it comes back, and nothing
of it changes (issue 6). A root field added without a case here fails the first test."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import select

from backend.db import Database
from backend.models import Run, Secret, SlurmRun, Webhook
from backend.resolvers.root import schema
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.accounting import sample, tick
from tests.support.api import graphql

# Each root field, as another workspace would aim it at 'default's run, machine, secret and
# webhook.
QUERIES = {
    "viewer": "{ viewer { workspace } }",
    # issue 38: with its Slurm job, as private as the run
    "run": '{ run(name: "llama-sft", workspace: "default") { name spec '
    "slurm { jobId account partition qos priority cancelledBy } } }",
    "runs": '{ runs(all: true, workspace: "default") { name slurm { jobId account } } }',
    "gpus": '{ gpus(workspace: "default") { heldBy line } }',
    "events": '{ events(workspace: "default") { events { run reason } } }',
    "metricRange": '{ metricRange(metric: "task_gpu_utilization_ratio", '
    'match: ["task:llama-sft-0"], workspace: "default") { series { labels } } }',
    "machines": "{ machines { name } }",
    "pools": "{ pools { name machines } }",
    "attention": '{ attention(workspace: "default") { run worker } }',
    "alertsFiring": "{ alertsFiring { subject reason } }",
    "secrets": '{ secrets(workspace: "default") { name } }',
    "checkpointAdvice": '{ checkpointAdvice(run: "llama-sft", workspace: "default") { sentence } }',
    "idleReport": '{ idleReport(workspace: "default") { runsStopped actions { run } } }',
    "goodput": '{ goodput(by: RUN, workspace: "default") { rows { name } } }',
    "goodputWeekly": '{ goodputWeekly(workspace: "default") { report { rows { name } } } }',
    "goodputIntervals": '{ goodputIntervals(by: RUN, name: "llama-sft", workspace: "default") '
    "{ worker } }",
    "goodputSeries": '{ goodputSeries(by: RUN, name: "llama-sft", workspace: "default") '
    "{ points { ledger { allocatedGpuHours } } } }",
    "goodputCost": '{ goodputCost(by: RUN, workspace: "default") { rows { name held } } }',
    "machineHealth": "{ machineHealth { machines { machine failureCount action } } }",
    "webhooks": '{ webhooks(workspace: "default") { url } }',
    "joinTokens": '{ joinTokens(cluster: "local") { prefix } }',
    "machineCredentials": '{ machineCredentials(cluster: "local") { machine } }',
    "tokens": "{ tokens { user workspace prefix } }",
    "quota": '{ quota(cluster: "local", workspace: "default") { workspace gpus } }',
    "quotas": '{ quotas(cluster: "local") { workspace gpus } }',
    "thresholds": '{ thresholds(cluster: "local") { name value } }',
}
MUTATIONS = {
    "createRun": 'mutation { createRun(spec: {name: "mine", command: ["true"]}, '
    'workspace: "default") { run { name } errors { code } } }',
    "stopRun": 'mutation { stopRun(name: "llama-sft") { run { name } errors { code } } }',
    "deleteRun": 'mutation { deleteRun(name: "llama-sft", workspace: "default") '
    "{ run { name } errors { code } } }",
    "runAgain": 'mutation { runAgain(name: "llama-sft", newName: "copy") '
    "{ run { spec } errors { code } } }",
    "drainMachine": 'mutation { drainMachine(cluster: "local", machine: "gpu-07") '
    "{ machine { name } errors { code } } }",
    "setThreshold": 'mutation { setThreshold(cluster: "local", name: "gpu_faults", value: 9) '
    "{ threshold { name } errors { code } } }",
    "setPriorityCeiling": 'mutation { setPriorityCeiling(workspace: "default", ceiling: 100) '
    "{ workspace { name } errors { code } } }",
    "setQuota": 'mutation { setQuota(workspace: "default", cluster: "local", gpus: 0) '
    "{ quota { gpus } errors { code } } }",
    "setPoolPrice": 'mutation { setPoolPrice(cluster: "local", pool: "h100", '
    "pricePerGpuHour: 99) { price { pool } errors { code } } }",
    "setPoolIdlePolicy": 'mutation { setPoolIdlePolicy(cluster: "local", pool: "h100", '
    'idle: {for: "1m"}) { pool { pool } errors { code } } }',
    "setPreemptionPolicy": 'mutation { setPreemptionPolicy(cluster: "local", '
    "preemptOverQuota: true) { policy { cluster } errors { code } } }",
    "setSecret": 'mutation { setSecret(name: "hf-token", value: "stolen", workspace: "default") '
    "{ secret { name } errors { code } } }",
    "deleteSecret": 'mutation { deleteSecret(name: "hf-token", workspace: "default") '
    "{ secret { name } errors { code } } }",
    "createWebhook": 'mutation { createWebhook(url: "https://evil.example/hook", '
    'workspace: "default") { webhook { url } errors { code } } }',
    "deleteWebhook": 'mutation { deleteWebhook(id: "WEBHOOK") '
    "{ webhook { url } errors { code } } }",
    "createJoinToken": 'mutation { createJoinToken(cluster: "local") { secret errors { code } } }',
    "revokeJoinToken": 'mutation { revokeJoinToken(cluster: "local", id: 1) '
    "{ joinToken { prefix } errors { code } } }",
    "revokeMachineCredential": 'mutation { revokeMachineCredential(cluster: "local", '
    'machine: "gpu-07") { credentials { machine } errors { code } } }',
    # token 1: default's admin's, made first
    "revokeToken": 'mutation { revokeToken(token: "1") { token { user } errors { code } } }',
}
SECRETS = ("llama-sft", "gpu-07", "hf-token", "s3cr3t", "team.example", "nlp-private")


def test_every_root_field_has_a_case() -> None:
    assert set(QUERIES) == _names(schema.query)
    assert set(MUTATIONS) == _names(schema.mutation)


def _names(root: Any) -> set[str]:
    convert = schema.config.name_converter.get_graphql_name
    return {convert(f) for f in root.__strawberry_definition__.fields}


@pytest.fixture
async def default_workspace(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> str:
    """Alice's workspace: a running run with samples and ledgers and a Slurm job's row (issue
    38), a secret, a webhook."""
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=2)
    await world.schedule()
    await world.start("llama-sft-0")
    clock.advance(minutes=2)
    await sample(world, {0: 0.9})
    await tick(world)
    async with db.transaction() as session:
        run_id = await session.scalar(select(Run.id).where(Run.name == "llama-sft"))
        assert run_id is not None
        job = {"job_id": "4242", "account": "nlp-private", "partition": "gpu", "priority": 9}
        session.add(SlurmRun(run_id=run_id, submitted=False, cancelled_by="root", **job))
    own = {"Authorization": f"Bearer {tenancy.member_token}"}
    for query in (
        'mutation { setSecret(name: "hf-token", value: "s3cr3t") { errors { code } } }',
        'mutation { createWebhook(url: "https://team.example/hook") { errors { code } } }',
    ):
        answer = (await client.post("/graphql", json={"query": query}, headers=own)).json()
        assert "errors" not in answer, answer
    seen = await graphql(client, tenancy.member_token, QUERIES["run"])
    assert seen["data"]["run"]["slurm"]["account"] == "nlp-private"  # what the others must not see
    async with db.read() as session:
        webhook = await session.scalar(select(Webhook.id))
    return str(webhook)


async def snapshot(db: Database) -> Any:
    async with db.read() as session:
        runs = [(r.name, r.state, r.reason) for r in await session.scalars(select(Run))]
        secrets = [(s.name, s.value) for s in await session.scalars(select(Secret))]
        hooks = [w.url for w in await session.scalars(select(Webhook))]
    return runs, secrets, hooks


@pytest.mark.parametrize("who", ["other_token", "foreign_token"])
async def test_another_workspace_reads_and_changes_nothing(
    client: httpx.AsyncClient,
    db: Database,
    tenancy: Tenancy,
    default_workspace: str,
    who: str,
) -> None:
    token = getattr(tenancy, who)
    for name, query in QUERIES.items():
        answer = await graphql(client, token, query)
        assert not any(s in str(answer.get("data")) for s in SECRETS), (name, answer)
    before = await snapshot(db)
    for name, query in MUTATIONS.items():
        answer = await graphql(client, token, query.replace("WEBHOOK", default_workspace))
        text = str(answer)
        assert "s3cr3t" not in text and "team.example" not in text, (name, answer)
    # Carol's organisation has a workspace 'default' too: what she asked was done there, if
    # anywhere. Alice's run, secret and webhook are as they were.
    after = await snapshot(db)
    assert [r for r in after[0] if r[0] == "llama-sft"] == [
        r for r in before[0] if r[0] == "llama-sft"
    ]
    assert ("hf-token", "s3cr3t") in after[1]
    assert "https://team.example/hook" in after[2]
    # Nothing was made in 'default' by the outsider: no run 'mine' or 'copy' in it.
    async with db.read() as session:
        alice_ws = await session.scalar(select(Run.workspace_id).where(Run.name == "llama-sft"))
        made = await session.scalars(
            select(Run.name).where(Run.workspace_id == alice_ws, Run.name.in_(["mine", "copy"]))
        )
        assert list(made) == []
        stolen = await session.scalars(select(Secret).where(Secret.value == "stolen"))
        assert all(s.workspace_id != alice_ws for s in stolen)
