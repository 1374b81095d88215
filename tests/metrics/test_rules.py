"""The pure rules of range requests: times, the automatic step, how series are combined."""

from __future__ import annotations

import pytest

from backend.errors import InvalidInput
from backend.metrics import rules
from backend.metrics.rules import RangeParams, parse_range, parse_time
from tests.metrics.conftest import DAY, HOUR, MINUTE, SECOND, T0


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        (str(T0 // 1000), T0),  # Unix seconds, as the seed's $(date +%s)
        (f"{T0 // 1000}.25", T0 + 250),
        (str(T0), T0),  # Unix milliseconds
        ("2026-10-01T00:00:00Z", T0),
        ("2026-10-01T02:00:00+02:00", T0),
        ("2026-10-01T00:00:00.5z", T0 + 500),
    ],
)
def test_a_time_is_seconds_milliseconds_or_rfc_3339(text: str, ms: int) -> None:
    assert rules.parse_time(text) == ms


@pytest.mark.parametrize(
    ("span", "step"),
    [
        (5 * MINUTE, 2 * SECOND),
        (HOUR, 15 * SECOND),
        (6 * HOUR, 2 * MINUTE),
        (DAY, 5 * MINUTE),
        (7 * DAY, HOUR),
        (30 * DAY, 3 * HOUR),
        (400 * DAY, 2 * DAY),
    ],
)
def test_the_automatic_step_is_the_finest_nice_one_within_300_points(span: int, step: int) -> None:
    assert rules.auto_step(T0, T0 + span) == step
    assert rules.points(T0, T0 + span, step) <= rules.AUTO_POINTS


def test_the_automatic_step_never_goes_under_its_floor() -> None:
    assert rules.auto_step(T0, T0 + 5 * MINUTE, min_step_ms=MINUTE) == MINUTE


def test_start_moves_back_to_a_whole_step_so_every_point_covers_one() -> None:
    request = parse_range(
        RangeParams("task_cpu_usage_cores", start=str(T0 + 7 * SECOND), step="1m"), T0 + HOUR
    )
    assert (request.start_ms, request.end_ms, request.step_ms) == (T0, T0 + HOUR, MINUTE)


@pytest.mark.parametrize(
    ("metric", "agg", "rate", "within", "combined", "unit"),
    [
        ("task_memory_used_bytes", None, None, "avg", "avg", "bytes"),
        ("task_memory_used_bytes", "sum", None, "avg", "sum", "bytes"),
        ("task_gpu_utilization_ratio", "max", None, "max", "max", "0–1"),  # noqa: RUF001
        ("task_oom_kills_total", None, None, "max", "sum", "count"),
        ("task_network_transmit_bytes_total", None, "true", "rate", "sum", "bytes/s"),
        ("task_network_transmit_bytes_total", "max", "1", "rate", "max", "bytes/s"),
    ],
)
def test_how_series_are_summarised_then_combined(
    metric: str, agg: str | None, rate: str | None, within: str, combined: str, unit: str
) -> None:
    request = parse_range(RangeParams(metric, agg=agg, rate=rate), T0)
    assert (request.within_series, request.agg, request.unit) == (within, combined, unit)


def test_labels_take_the_rest_shims_words_and_keep_the_callers() -> None:
    request = parse_range(
        RangeParams(
            "task_gpu_utilization_ratio",
            match=("job:llama-sft", "task:llama-sft-0", "gpu:3", "gpu:1", "gpu:3"),
            by="Task, gpu,task",
        ),
        T0,
    )
    assert request.matches == {"run": ("llama-sft",), "worker": ("llama-sft-0",), "gpu": ("3", "1")}
    assert [(g.name, g.label) for g in request.by] == [("task", "worker"), ("gpu", "gpu")]
    assert request.gpus == (1, 3)
    whole = parse_range(RangeParams("task_gpu_utilization_ratio"), T0)
    assert whole.gpus == rules.GPU_SLOTS
    assert parse_range(RangeParams("task_cpu_usage_cores"), T0).gpus == (rules.NO_GPU,)


def test_every_refusal_is_said_at_once() -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_range(RangeParams(None, match=("x",), by="pod", agg="p50", start="soon"), T0)
    assert [f.field for f in refused.value.fields] == ["metric", "match", "by", "agg", "start"]


def test_a_name_match_names_of_no_worker_in_scope_are_missing() -> None:
    found = [
        rules.ScopedWorker(1, "llama-sft-0", "llama-sft", None),
        rules.ScopedWorker(2, "llama-sft-1", "llama-sft", None),
    ]
    named = parse_range(
        RangeParams("task_cpu_usage_cores", match=("run:llama-sft", "task:llama-sft-1")), T0
    )
    assert rules.missing_names(named, found) == (None, None)
    unknown = parse_range(RangeParams("task_cpu_usage_cores", match=("job:x", "task:y-0")), T0)
    assert rules.missing_names(unknown, found) == ("x", "y-0")


@pytest.mark.parametrize(
    "raw",
    [
        "1000-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "0001-01-01T00:00:00+14:00",
        "3000-01-01T00:00:00Z",
        "99999999999999999999999",
        "-1",
        "1e309",
        "nan",
    ],
)
def test_a_time_outside_1970_to_2999_is_refused_by_its_bound(raw: str) -> None:
    with pytest.raises(ValueError, match=r"^must be a time from 1970 to 2999$"):
        parse_time(raw)


def test_the_last_time_of_2999_is_read() -> None:
    assert parse_time("2999-12-31T23:59:59Z") == 32_503_679_999_000
    assert parse_time("0") == 0
