"""``GET /v1/metrics/range``: the seed's curl, every refused parameter named with its reason,
and what another workspace's token gets (seed L-40, L-41)."""

from __future__ import annotations

import httpx
import pytest

from backend.db import Database
from tests.metrics.conftest import HOUR, MINUTE, SECOND, T0, Placed, at, ingest, series
from tests.support import FakeClock, Tenancy, row_counts
from tests.support.api import auth

URL = "/v1/metrics/range"
UTIL = "task_gpu_utilization_ratio"


@pytest.fixture
async def sampled(db: Database, clock: FakeClock, placed: Placed) -> None:
    clock.moment = at(T0 + HOUR)
    await ingest(
        db,
        placed.gpu07,
        series("llama-sft-0", UTIL, [0.5] * 360, gpu=0)
        + series("llama-sft-0", UTIL, [0.25] * 180 + [1.0] * 180, gpu=1),
    )


async def test_the_seeds_curl_answers_the_last_hour_by_gpu(
    client: httpx.AsyncClient, tenancy: Tenancy, sampled: None
) -> None:
    # seed L-40, L-41: the seed's own line, answered as {metric, kind, unit, start, end, step,
    # series: [{labels, points: [[ms, value], …]}]}
    # $ curl -sS -G "$API/metrics/range" --data-urlencode metric=task_gpu_utilization_ratio \
    #     --data-urlencode match=task:llama-sft-0 --data-urlencode by=gpu \
    #     --data-urlencode agg=max --data-urlencode start=$(( $(date +%s) - 3600 ))
    start = str((T0 + HOUR) // 1000 - 3600)
    answer = await client.get(
        URL,
        params={
            "metric": UTIL,
            "match": "task:llama-sft-0",
            "by": "gpu",
            "agg": "max",
            "start": start,
        },
        headers=auth(tenancy.member_token),
    )
    assert answer.status_code == 200
    body = answer.json()
    assert {k: body[k] for k in ("metric", "kind", "start", "end", "step")} == {
        "metric": UTIL,
        "kind": "gauge",
        "start": T0,
        "end": T0 + HOUR,
        "step": 15 * SECOND,
    }
    first, second = body["series"]
    assert first["labels"] == {"gpu": "0"} and second["labels"] == {"gpu": "1"}
    assert first["points"][0] == [T0, 0.5] and len(first["points"]) == 240
    assert second["points"][119] == [T0 + 30 * MINUTE - 15 * SECOND, 0.25]
    assert second["points"][120] == [T0 + 30 * MINUTE, 1.0]


async def test_times_may_be_rfc_3339_and_match_repeats(
    client: httpx.AsyncClient, tenancy: Tenancy, sampled: None
) -> None:
    answer = await client.get(
        URL,
        params=[
            ("metric", UTIL),
            ("match", "gpu:0"),
            ("match", "gpu:1"),
            ("start", "2026-10-01T00:00:00Z"),
            ("end", "2026-10-01T00:59:59.999+00:00"),
            ("step", "30m"),
        ],
        headers=auth(tenancy.member_token),
    )
    assert answer.status_code == 200
    assert answer.json()["series"] == [
        {"labels": {}, "points": [[T0, 0.375], [T0 + 30 * MINUTE, 0.75]]}
    ]


@pytest.mark.parametrize(
    ("params", "errors"),
    [
        ({}, [("metric", "is required")]),
        (
            {"metric": "gpu_util"},
            [("metric", "is not a metric Astraeus keeps: one of task_cpu_usage_cores, ")],
        ),
        ({"metric": UTIL, "match": "task"}, [("match", "'task' must be label:value, such as ")]),
        ({"metric": UTIL, "match": "pod:x"}, [("match", "'pod' is not a label: one of run, ")]),
        ({"metric": UTIL, "match": "gpu:first"}, [("match", "gpu:first must name a GPU index")]),
        (
            {"metric": "task_cpu_usage_cores", "by": "gpu"},
            [("by", "task_cpu_usage_cores is not per GPU: it has no gpu label")],
        ),
        ({"metric": UTIL, "by": "gpu,namespace"}, [("by", "'namespace' is not a label: ")]),
        ({"metric": UTIL, "agg": "p99"}, [("agg", "must be sum, avg, max or min")]),
        ({"metric": UTIL, "rate": "yes"}, [("rate", "must be true or false")]),
        (
            {"metric": UTIL, "rate": "true"},
            [("rate", "task_gpu_utilization_ratio is a gauge: a rate is of a counter")],
        ),
        ({"metric": UTIL, "start": "yesterday"}, [("start", "must be Unix seconds, Unix ")]),
        ({"metric": UTIL, "end": "2026-10-01T00:00:00"}, [("end", "needs a time zone, such as")]),
        ({"metric": UTIL, "start": str(T0 + 2 * HOUR)}, [("start", "must be before end")]),
        ({"metric": UTIL, "step": "fast"}, [("step", "must be a duration such as 30s, 15m")]),
        ({"metric": UTIL, "step": "0"}, [("step", "must be at least 1s")]),
        (
            {"metric": UTIL, "start": "0", "step": "1s"},
            [("step", "gives 1790816401 points over this range: at most 11000")],
        ),
        (
            {"metric": UTIL, "agg": "median", "step": "-1m"},
            [("agg", "must be sum, avg, max or min"), ("step", "must not be negative")],
        ),
    ],
)
async def test_a_bad_parameter_is_a_400_naming_the_field_and_why(
    client: httpx.AsyncClient,
    db: Database,
    tenancy: Tenancy,
    sampled: None,
    params: dict[str, str],
    errors: list[tuple[str, str]],
) -> None:
    before = await row_counts(db)
    answer = await client.get(URL, params=params, headers=auth(tenancy.member_token))
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "INVALID_PARAMETER"
    assert [e["field"] for e in body["errors"]] == [field for field, _ in errors]
    for got, (_, reason) in zip(body["errors"], errors, strict=True):
        assert got["reason"].startswith(reason), got["reason"]
    assert await row_counts(db) == before


async def test_another_workspaces_token_gets_404_for_the_run_and_no_series(
    client: httpx.AsyncClient, tenancy: Tenancy, sampled: None
) -> None:
    # seed L-41: in a workspace, only its own workers' series.
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        named = await client.get(
            URL, params={"metric": UTIL, "match": "run:llama-sft"}, headers=auth(outsider)
        )
        assert named.status_code == 404 and named.json()["code"] == "JOB_NOT_FOUND"
        worker = await client.get(
            URL, params={"metric": UTIL, "match": "task:llama-sft-0"}, headers=auth(outsider)
        )
        assert worker.status_code == 404 and worker.json()["code"] == "TASK_NOT_FOUND"
        everything = await client.get(URL, params={"metric": UTIL}, headers=auth(outsider))
        assert everything.status_code == 200 and everything.json()["series"] == []
    # Bob may not name Alice's workspace; an org admin may.
    bob = await client.get(
        URL, params={"metric": UTIL, "workspace": "default"}, headers=auth(tenancy.other_token)
    )
    assert bob.status_code == 404 and bob.json()["code"] == "WORKSPACE_NOT_FOUND"
    admin = await client.get(
        URL, params={"metric": UTIL, "workspace": "default"}, headers=auth(tenancy.admin_token)
    )
    assert admin.status_code == 200 and len(admin.json()["series"]) == 1


async def test_an_unknown_run_and_a_missing_token(
    client: httpx.AsyncClient, tenancy: Tenancy, sampled: None
) -> None:
    missing = await client.get(
        URL, params={"metric": UTIL, "match": "run:nope"}, headers=auth(tenancy.member_token)
    )
    assert missing.status_code == 404
    assert missing.json() == {
        "code": "JOB_NOT_FOUND",
        "message": "No run named 'nope' in workspace 'default'.",
    }
    anonymous = await client.get(URL, params={"metric": UTIL})
    assert anonymous.status_code == 401 and anonymous.json()["code"] == "UNAUTHENTICATED"
