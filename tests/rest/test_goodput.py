"""The goodput endpoints of the seed, their ledgers and who sees what (seed G-27 … G-34)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from datetime import timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from backend.accounting import counting
from backend.db import Database
from backend.models import Cluster, Organization, SlurmImport
from tests.lifecycle.world import World
from tests.support import SEED_TIME, FakeClock, Tenancy
from tests.support.accounting import tick
from tests.support.api import get

CATEGORIES = [
    "productive",
    "idle",
    "stalled",
    "starting",
    "restart",
    "failure",
    "preemption",
    "waiting",
]


def gpu_hours(ledger: dict[str, Any]) -> dict[str, float]:
    return {c: round(v, 4) for c, v in ledger["gpu_hours"].items() if v}


async def test_a_ledger_per_run_and_their_total(
    client: httpx.AsyncClient, week: World, tenancy: Tenancy
) -> None:
    # seed G-27, G-30, G-31: every field of the ledger object, by run
    answer = await get(client, tenancy.member_token, "/goodput", by="run")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["by"] == "run"
    rows = {r["name"]: r for r in body["ledgers"]}
    assert list(rows) == ["llm", "sweep-7"]
    llm = rows["llm"]
    assert set(llm) == {
        "name",
        "gpu_hours",
        "held_gpu_hours",
        "allocated_gpu_hours",
        "productive_gpu_hours",
        "lost_gpu_hours",
        "waiting_gpu_hours",
        "goodput",
        "rework_gpu_hours",
        "rework_unknown_runs",
    }
    assert list(llm["gpu_hours"]) == CATEGORIES
    total = body["total"]
    for field in ("allocated_gpu_hours", "productive_gpu_hours", "waiting_gpu_hours"):
        assert total[field] == pytest.approx(sum(r[field] for r in rows.values()))
    assert total["goodput"] == pytest.approx(
        total["productive_gpu_hours"] / total["allocated_gpu_hours"]
    )
    sweep = rows["sweep-7"]
    assert sweep["waiting_gpu_hours"] == pytest.approx(4 * 10 / 60)  # ten minutes of 4 GPUs
    assert sweep["lost_gpu_hours"] == pytest.approx(
        sweep["allocated_gpu_hours"] + sweep["waiting_gpu_hours"] - sweep["productive_gpu_hours"]
    )


async def test_a_runs_own_ledger_and_the_weeks(
    client: httpx.AsyncClient, week: World, tenancy: Tenancy
) -> None:
    # seed G-28, G-29
    run = (await get(client, tenancy.member_token, "/runs/llm/goodput")).json()
    by_run = (await get(client, tenancy.member_token, "/goodput", by="run")).json()
    llm = next(r for r in by_run["ledgers"] if r["name"] == "llm")
    assert run["run"] == "llm"
    assert run["allocated_gpu_hours"] == pytest.approx(llm["allocated_gpu_hours"])
    weekly = (await get(client, tenancy.member_token, "/goodput/weekly", weeks=8, by="run")).json()
    assert [w["week"] for w in weekly["weeks"]][-1] == "2026-W40"  # 2026-10-01 is a Thursday
    assert len(weekly["weeks"]) == 8
    assert all(w["ledgers"] == [] for w in weekly["weeks"][:-1])
    assert weekly["weeks"][-1]["total"]["allocated_gpu_hours"] == pytest.approx(
        by_run["total"]["allocated_gpu_hours"]
    )


async def test_nothing_held_has_no_goodput(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy, clock: FakeClock
) -> None:
    # seed G-30: goodput absent when nothing was held
    await world.submit(name="waits", workers=1, gpus=8)  # no machine at all
    clock.advance(minutes=5)
    await tick(world)
    body = (await get(client, tenancy.member_token, "/goodput", by="run")).json()
    [waits] = body["ledgers"]
    counted = (counting.minute_floor(clock.now()) - SEED_TIME).total_seconds()  # whole minutes
    assert "goodput" not in waits and waits["waiting_gpu_hours"] == pytest.approx(
        8 * counted / 3600
    )


async def test_another_workspace_sees_none_of_it(
    client: httpx.AsyncClient, week: World, tenancy: Tenancy
) -> None:
    # seed G-33; every endpoint tried with a token of another workspace
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        for by in ("run", "machine", "pool", "workspace"):
            body = (await get(client, outsider, "/goodput", by=by)).json()
            assert body["ledgers"] == [] and "goodput" not in body["total"]
        assert (await get(client, outsider, "/runs/llm/goodput")).status_code == 404
        weekly = (await get(client, outsider, "/goodput/weekly")).json()
        assert all(w["ledgers"] == [] for w in weekly["weeks"])
        cluster = await get(client, outsider, "/organizations/default/clusters/local/goodput")
        # team-b's member is of the organisation: told it needs an admin (issue 21)
        assert cluster.status_code == (403 if outsider == tenancy.other_token else 404)


async def test_an_organisation_admin_sees_the_clusters_ledgers(
    client: httpx.AsyncClient, week: World, tenancy: Tenancy
) -> None:
    # seed G-34
    path = "/organizations/default/clusters/local/goodput"
    admin = (await get(client, tenancy.admin_token, path, by="machine")).json()
    assert sorted(r["name"] for r in admin["ledgers"]) == ["gpu-07", "gpu-08"]
    member = await get(client, tenancy.member_token, path)
    assert member.status_code == 403 and member.json()["code"] == "FORBIDDEN"  # issue 21
    unknown = await get(client, tenancy.admin_token, "/organizations/default/clusters/nope/goodput")
    assert unknown.status_code == 404


@pytest.mark.parametrize(
    ("params", "field", "reason"),
    [
        ({"by": "team"}, "by", "must be one of workspace, run, machine, pool"),
        ({"start": "2025-01-01T00:00:00Z"}, "start", "a period is at most 400 days"),
        ({"start": "yesterday"}, "start", None),
        ({"start": "2026-10-01T05:00:00Z", "end": "2026-10-01T01:00:00Z"}, "end", None),
    ],
)
async def test_bad_parameters_are_named_with_the_reason(
    client: httpx.AsyncClient,
    tenancy: Tenancy,
    params: dict[str, str],
    field: str,
    reason: str | None,
) -> None:
    # seed G-32: a period is at most 400 days
    answer = await get(client, tenancy.member_token, "/goodput", **params)
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "INVALID_PARAMETER"
    assert [e["field"] for e in body["errors"]] == [field]
    if reason is not None:
        assert body["errors"][0]["reason"] == reason
    weeks = await get(client, tenancy.member_token, "/goodput/weekly", weeks=0)
    assert weeks.status_code == 400 and weeks.json()["errors"][0]["field"] == "weeks"


# -- /goodput/metrics ----------------------------------------------------------------------------


def key(metric: str, **labels: str) -> str:
    """A sample's name and labels, the labels in name order (their order means nothing)."""
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def samples(text: str) -> dict[str, float]:
    """Each sample of the text, read by prometheus_client's parser."""
    return {
        key(s.name, **s.labels): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_the_prometheus_exposition_has_the_seeds_names_and_labels(
    client: httpx.AsyncClient, week: World, tenancy: Tenancy
) -> None:
    # seed G-35 … G-41, G-43: gauges with HELP and TYPE, the seed's metric and label names
    answer = await get(client, tenancy.member_token, "/goodput/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = answer.text
    for metric in (
        "astraeus_goodput_ratio",
        "astraeus_goodput_gpu_hours",
        "astraeus_run_goodput_gpu_hours",
        "astraeus_run_goodput_ratio",
        "astraeus_workers_stalled",
        "astraeus_runs_with_straggler",
    ):
        assert f"# TYPE {metric} gauge\n" in text
        assert f"# HELP {metric} " in text
    got = samples(text)
    by_run = (await get(client, tenancy.member_token, "/goodput", by="run")).json()
    llm = next(r for r in by_run["ledgers"] if r["name"] == "llm")
    assert got[key("astraeus_run_goodput_ratio", namespace="default", run="llm")] == pytest.approx(
        llm["goodput"]
    )
    waiting = key(
        "astraeus_run_goodput_gpu_hours", namespace="default", run="sweep-7", category="waiting"
    )
    assert got[waiting] == pytest.approx(4 * 10 / 60)
    for scope, name in (("workspace", "default"), ("machine", "gpu-07"), ("cluster", "local")):
        for window in ("hour", "day"):
            assert key("astraeus_goodput_ratio", scope=scope, name=name, window=window) in got
    assert got[key("astraeus_workers_stalled", namespace="default")] == 0
    assert got[key("astraeus_runs_with_straggler", namespace="default")] == 0


async def test_the_exposition_shows_another_workspace_nothing_of_ours(
    client: httpx.AsyncClient, week: World, tenancy: Tenancy
) -> None:
    text = (await get(client, tenancy.other_token, "/goodput/metrics")).text
    assert "llm" not in text and "gpu-07" not in text and 'namespace="default"' not in text
    assert samples(text) == {
        'astraeus_workers_stalled{namespace="team-b"}': 0.0,
        'astraeus_runs_with_straggler{namespace="team-b"}': 0.0,
        # the cluster both workspaces' runs use: its GPUs' health, as `gpus` shows it to them
        'astraeus_gpus_unhealthy{cluster="local"}': 0.0,
    }
    assert (await client.get("/v1/goodput/metrics")).status_code == 401


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed here")
async def test_promtool_accepts_the_exposition(
    client: httpx.AsyncClient, week: World, tenancy: Tenancy
) -> None:
    # G-35: the text parses and lints clean, but for the unit of the names the seed fixes:
    # promtool would have GPU-hours in seconds (its lint exits 3 for that alone, 1 for text
    # it cannot parse).
    text = (await get(client, tenancy.admin_token, "/goodput/metrics")).text
    checked = await asyncio.to_thread(
        subprocess.run,
        ["promtool", "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
    )
    problems = set((checked.stdout + checked.stderr).splitlines())
    seed_names = {
        f'{m} use base unit "seconds" instead of "hours"'
        for m in ("astraeus_goodput_gpu_hours", "astraeus_run_goodput_gpu_hours")
    }
    assert checked.returncode in (0, 3) and problems <= seed_names, problems


async def test_a_figure_is_explained_by_its_worker_intervals(
    client: httpx.AsyncClient, week: World, tenancy: Tenancy
) -> None:
    # DESIGN §4 invariant 4: the intervals behind a ledger figure add up to it
    by_run = (await get(client, tenancy.member_token, "/goodput", by="run")).json()
    sweep = next(r for r in by_run["ledgers"] if r["name"] == "sweep-7")
    for category, hours in sweep["gpu_hours"].items():
        found = await get(
            client,
            tenancy.member_token,
            "/goodput/intervals",
            by="run",
            name="sweep-7",
            category=category,
        )
        intervals = found.json()["intervals"]
        assert sum(i["gpu_hours"] for i in intervals) == pytest.approx(hours)
        assert all(i["worker"] == "sweep-7-0" and i["category"] == category for i in intervals)
    waits = (
        await get(
            client,
            tenancy.member_token,
            "/goodput/intervals",
            by="run",
            name="sweep-7",
            category="waiting",
        )
    ).json()["intervals"]
    assert [(w["held"], w["machine"], w["gpus"]) for w in waits] == [(False, None, 4)]
    # Another workspace's token: nothing of it, the same as for a name that does not exist.
    other = await get(client, tenancy.other_token, "/goodput/intervals", by="run", name="llm")
    assert other.status_code == 404
    missing = await get(client, tenancy.member_token, "/goodput/intervals", by="run")
    assert missing.status_code == 400 and missing.json()["errors"][0]["field"] == "name"


async def test_the_exposition_shows_how_far_behind_each_slurm_import_is(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38: a cluster whose import is behind shows how far (a frozen import, a failing
    # command), and what it set aside; every member of the organisation sees its clusters'
    now = clock.now()
    async with db.transaction() as session:
        org = await session.scalar(select(Organization.id).where(Organization.name == "default"))
        assert org is not None
        for name, imported, error_at, quarantined in (
            ("hpc", now - timedelta(minutes=5), now - timedelta(minutes=1), {"job 7": "no id"}),
            ("lab", now - timedelta(seconds=20), None, {}),
            ("new", None, None, {}),
        ):
            cluster = Cluster(organization_id=org, name=name, slurm={}, created_at=now)
            session.add(cluster)
            await session.flush()
            session.add(
                SlurmImport(
                    cluster_id=cluster.id,
                    since=now - timedelta(hours=1),
                    imported_at=imported,
                    error="squeue failed: slurm_load_jobs error" if error_at else None,
                    error_at=error_at,
                    unmapped={},
                    quarantined=quarantined,
                )
            )
    for token in (tenancy.admin_token, tenancy.other_token):
        text = (await get(client, token, "/goodput/metrics")).text
        shown = {
            (s.name, s.labels["cluster"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("astraeus_slurm_")
        }
        assert shown == {
            ("astraeus_slurm_import_lag_seconds", "hpc"): 300.0,  # frozen, then failing
            ("astraeus_slurm_import_lag_seconds", "lab"): 20.0,
            ("astraeus_slurm_import_lag_seconds", "new"): 3600.0,  # never read: since when
            ("astraeus_slurm_import_failing", "hpc"): 1.0,
            ("astraeus_slurm_import_failing", "lab"): 0.0,
            ("astraeus_slurm_import_failing", "new"): 0.0,
            ("astraeus_slurm_records_quarantined", "hpc"): 1.0,
            ("astraeus_slurm_records_quarantined", "lab"): 0.0,
            ("astraeus_slurm_records_quarantined", "new"): 0.0,
        }
    # another organisation's member sees none of them
    foreign = (await get(client, tenancy.foreign_token, "/goodput/metrics")).text
    assert "astraeus_slurm" not in foreign
