"""Range queries: steps, labels kept, aggregation, counter rates, matches, and what another
workspace sees (seed L-40, L-41)."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from backend.db import Database
from backend.errors import NotFound
from backend.models import Run
from tests.metrics.conftest import HOUR, MINUTE, T0, Placed, at, ingest, series
from tests.support import FakeClock, Tenancy
from tests.support.api import query

END = T0 + 2 * MINUTE - 1  # two whole one-minute steps from T0


def minutes(**params: str) -> dict[str, str]:
    return {"start": str(T0), "end": str(END), "step": "1m", **params}


@pytest.fixture
async def gpus(db: Database, placed: Placed, clock: FakeClock) -> None:
    """llama-sft-0's GPU 0 busy 25% then 75%, its GPU 1 at 50%, over two minutes."""
    clock.moment = at(T0 + HOUR)
    util = "task_gpu_utilization_ratio"
    await ingest(
        db,
        placed.gpu07,
        series("llama-sft-0", util, [0.25] * 6 + [0.75] * 6, gpu=0)
        + series("llama-sft-0", util, [0.5] * 12, gpu=1),
    )


async def test_by_gpu_each_gpu_is_a_series_of_one_minute_means(
    db: Database, clock: FakeClock, tenancy: Tenancy, gpus: None
) -> None:
    # seed L-35: per GPU (gpu label); L-41: the answer's shape, times in ms
    answer = await query(
        db, clock, tenancy.member_token, "task_gpu_utilization_ratio", **minutes(by="gpu")
    )
    assert answer == {
        "metric": "task_gpu_utilization_ratio",
        "kind": "gauge",
        "unit": "0–1",  # noqa: RUF001 - the seed's table writes it so
        "start": T0,
        "end": END,
        "step": 60_000,
        "series": [
            {"labels": {"gpu": "0"}, "points": [[T0, 0.25], [T0 + MINUTE, 0.75]]},
            {"labels": {"gpu": "1"}, "points": [[T0, 0.5], [T0 + MINUTE, 0.5]]},
        ],
        "unmeasured": [],  # every worker's machine measures it
        "not_measured": None,
    }


@pytest.mark.parametrize(
    ("agg", "first", "second"),
    [("avg", 0.375, 0.625), ("max", 0.5, 0.75), ("min", 0.25, 0.5), ("sum", 0.75, 1.25)],
)
async def test_labels_not_kept_are_combined_with_agg(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    gpus: None,
    agg: str,
    first: float,
    second: float,
) -> None:
    answer = await query(
        db, clock, tenancy.member_token, "task_gpu_utilization_ratio", **minutes(agg=agg)
    )
    assert answer["series"] == [{"labels": {}, "points": [[T0, first], [T0 + MINUTE, second]]}]


async def test_a_sum_adds_each_series_mean_not_its_samples(
    db: Database, clock: FakeClock, tenancy: Tenancy, placed: Placed
) -> None:
    # llama-sft-1 reports twice as often as llama-sft-0: a sum must not count it twice.
    clock.moment = at(T0 + HOUR)
    cpu = "task_cpu_usage_cores"
    await ingest(db, placed.gpu07, series("llama-sft-0", cpu, [2.0] * 6))
    await ingest(db, placed.gpu08, series("llama-sft-1", cpu, [4.0] * 12, every=5000))
    total = await query(db, clock, tenancy.member_token, cpu, **minutes(agg="sum"))
    assert total["series"] == [{"labels": {}, "points": [[T0, 6.0]]}]
    by_run = await query(db, clock, tenancy.member_token, cpu, **minutes(by="run"))
    assert by_run["series"] == [{"labels": {"run": "llama-sft"}, "points": [[T0, 3.0]]}]
    by_machine = await query(db, clock, tenancy.member_token, cpu, **minutes(by="machine,task"))
    assert by_machine["series"] == [
        {"labels": {"machine": "gpu-07", "task": "llama-sft-0"}, "points": [[T0, 2.0]]},
        {"labels": {"machine": "gpu-08", "task": "llama-sft-1"}, "points": [[T0, 4.0]]},
    ]


@pytest.fixture
async def traffic(db: Database, placed: Placed, clock: FakeClock) -> None:
    """llama-sft-0 receives 100 B/s, and its counter restarts from zero after 50 s (a new
    container); llama-sft-1 receives 50 B/s."""
    clock.moment = at(T0 + HOUR)
    received = "task_network_receive_bytes_total"
    first = [1000.0 * i for i in range(6)] + [1000.0 * i for i in range(1, 7)]
    await ingest(db, placed.gpu07, series("llama-sft-0", received, first))
    await ingest(db, placed.gpu08, series("llama-sft-1", received, [500.0 * i for i in range(12)]))


async def test_the_rate_of_a_counter_is_per_second_across_a_restart(
    db: Database, clock: FakeClock, tenancy: Tenancy, traffic: None
) -> None:
    # seed L-40: rate, the per-second rate of a counter (…_total)
    metric = "task_network_receive_bytes_total"
    answer = await query(db, clock, tenancy.member_token, metric, **minutes(rate="true", by="task"))
    assert answer["kind"] == "counter" and answer["unit"] == "bytes/s"
    assert answer["series"] == [
        {"labels": {"task": "llama-sft-0"}, "points": [[T0, 100.0], [T0 + MINUTE, 100.0]]},
        {"labels": {"task": "llama-sft-1"}, "points": [[T0, 50.0], [T0 + MINUTE, 50.0]]},
    ]
    # A counter's workers add up by default.
    summed = await query(db, clock, tenancy.member_token, metric, **minutes(rate="true"))
    assert summed["series"] == [{"labels": {}, "points": [[T0, 150.0], [T0 + MINUTE, 150.0]]}]


async def test_without_rate_a_counter_reads_as_its_last_value(
    db: Database, clock: FakeClock, tenancy: Tenancy, traffic: None
) -> None:
    metric = "task_network_receive_bytes_total"
    answer = await query(db, clock, tenancy.member_token, metric, **minutes(by="task"))
    assert answer["unit"] == "bytes"
    assert answer["series"] == [
        {"labels": {"task": "llama-sft-0"}, "points": [[T0, 5000.0], [T0 + MINUTE, 6000.0]]},
        {"labels": {"task": "llama-sft-1"}, "points": [[T0, 2500.0], [T0 + MINUTE, 5500.0]]},
    ]


async def test_the_automatic_step_answers_the_last_hour_in_at_most_300_points(
    db: Database, clock: FakeClock, tenancy: Tenancy, placed: Placed
) -> None:
    # seed L-40: start, end, step default to the last hour, now, automatic
    clock.moment = at(T0 + HOUR)
    cpu = "task_cpu_usage_cores"
    await ingest(db, placed.gpu07, series("llama-sft-0", cpu, [1.0] * 360))  # 10 s apart
    answer = await query(db, clock, tenancy.member_token, cpu)
    assert (answer["start"], answer["end"], answer["step"]) == (T0, T0 + HOUR, 15_000)
    points = answer["series"][0]["points"]
    assert len(points) == 240 and points[0] == [T0, 1.0] and points[-1] == [T0 + HOUR - 15_000, 1.0]
    day = await query(db, clock, tenancy.member_token, cpu, start=str((T0 + HOUR) // 1000 - 86400))
    assert day["step"] == 300_000
    assert day["series"][0]["points"] == [[T0 + i * 300_000, 1.0] for i in range(12)]


async def test_matches_narrow_the_series(
    db: Database, clock: FakeClock, tenancy: Tenancy, placed: Placed, gpus: None
) -> None:
    util = "task_gpu_utilization_ratio"
    await ingest(db, placed.gpu08, series("llama-sft-1", util, [1.0] * 12, gpu=3))
    token = tenancy.member_token
    one_gpu = await query(db, clock, token, util, "task:llama-sft-0", "gpu:1", **minutes())
    assert one_gpu["series"] == [{"labels": {}, "points": [[T0, 0.5], [T0 + MINUTE, 0.5]]}]
    two = await query(
        db, clock, token, util, "task:llama-sft-0", "worker:llama-sft-1", **minutes(by="worker")
    )
    assert [s["labels"] for s in two["series"]] == [
        {"worker": "llama-sft-0"},
        {"worker": "llama-sft-1"},
    ]
    machine = await query(db, clock, token, util, "machine:gpu-08", **minutes(by="gpu"))
    assert machine["series"] == [
        {"labels": {"gpu": "3"}, "points": [[T0, 1.0], [T0 + MINUTE, 1.0]]}
    ]
    run = await query(db, clock, token, util, "run:llama-sft", **minutes(agg="max"))
    assert run["series"] == [{"labels": {}, "points": [[T0, 1.0], [T0 + MINUTE, 1.0]]}]


async def test_another_workspace_sees_none_of_the_series(
    db: Database, clock: FakeClock, tenancy: Tenancy, placed: Placed, gpus: None
) -> None:
    # seed L-41: in a workspace, only its own workers' series.
    await ingest(db, placed.gpu09, series("sweep-7-0", "task_gpu_utilization_ratio", [0.9], gpu=0))
    util = "task_gpu_utilization_ratio"
    mine = await query(db, clock, tenancy.other_token, util, **minutes(by="task"))
    assert mine["series"] == [{"labels": {"task": "sweep-7-0"}, "points": [[T0, 0.9]]}]
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        with pytest.raises(NotFound) as run:
            await query(db, clock, outsider, util, "run:llama-sft", **minutes())
        assert run.value.code == "JOB_NOT_FOUND"
        with pytest.raises(NotFound) as worker:
            await query(db, clock, outsider, util, "task:llama-sft-0", **minutes())
        assert worker.value.code == "TASK_NOT_FOUND"
    foreign = await query(db, clock, tenancy.foreign_token, util, **minutes())
    assert foreign["series"] == []


async def test_a_run_ended_before_the_range_is_not_read_unless_within_the_slack(
    db: Database, clock: FakeClock, tenancy: Tenancy, gpus: None
) -> None:
    """The scope (one statement with the samples): a run that ended over 5 minutes before the
    range is not read, named or not; one that ended within the slack is (its last samples
    may carry the agent's clock). Named labels all apply: a run and a worker of it, that
    worker."""
    util = "task_gpu_utilization_ratio"
    token = tenancy.member_token
    for ended, read in ((T0 - 6 * MINUTE, False), (T0 - 4 * MINUTE, True)):
        async with db.transaction() as session:
            await session.execute(
                update(Run).where(Run.name == "llama-sft").values(ended_at=at(ended))
            )
        every = await query(db, clock, token, util, **minutes(by="task"))
        named = await query(db, clock, token, util, "run:llama-sft", **minutes(by="task"))
        both = await query(
            db, clock, token, util, "run:llama-sft", "task:llama-sft-0", **minutes(by="gpu")
        )
        expected = [{"task": "llama-sft-0"}] if read else []
        assert [s["labels"] for s in every["series"]] == expected
        assert [s["labels"] for s in named["series"]] == expected
        assert [s["labels"] for s in both["series"]] == (
            [{"gpu": "0"}, {"gpu": "1"}] if read else []
        )
    with pytest.raises(NotFound) as other:
        await query(db, clock, token, util, "run:llama-sft", "task:sweep-7-0", **minutes())
    assert other.value.code == "TASK_NOT_FOUND"  # another workspace's worker: absent
