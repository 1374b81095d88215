"""The goodput exposition, pure: ledgers in, Prometheus text out (seed G-35 … G-43), read back
with prometheus_client's own parser as a scraper would."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from backend.accounting.exposition import GAUGES, Exposition
from backend.accounting.rules import Category, Ledger


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def test_nothing_to_show_is_an_empty_text() -> None:
    assert Exposition().text() == ""


def test_a_ledger_is_its_ratio_and_its_hours_by_category_held_or_not() -> None:
    ledger = Ledger.of_sums(
        [("productive", True, 5400.0), ("idle", True, 1800.0), ("waiting", False, 900.0)]
    )
    out = Exposition()
    out.ledger("workspace", "default", "hour", ledger)
    found = families(out.text())
    assert list(found) == ["astraeus_goodput_ratio", "astraeus_goodput_gpu_hours"]
    base = {"scope": "workspace", "name": "default", "window": "hour"}
    assert found["astraeus_goodput_ratio"] == [(base, 0.75)]
    hours = {labels["category"]: v for labels, v in found["astraeus_goodput_gpu_hours"]}
    assert hours == {c.value: 0.0 for c in Category} | {
        "productive": 1.5,
        "idle": 0.5,
        "waiting": 0.25,
    }
    assert "# TYPE astraeus_goodput_ratio gauge\n" in out.text()
    assert f"# HELP astraeus_goodput_ratio {GAUGES['astraeus_goodput_ratio'][0]}\n" in out.text()


def test_a_run_that_held_nothing_has_hours_and_no_ratio() -> None:
    out = Exposition()
    out.run("default", "queued", Ledger.of_sums([("waiting", False, 3600.0)]))
    found = families(out.text())
    assert "astraeus_run_goodput_ratio" not in found
    assert (
        {"namespace": "default", "run": "queued", "category": "waiting"},
        1.0,
    ) in found["astraeus_run_goodput_gpu_hours"]


def test_gauges_come_in_one_order_whatever_order_they_were_added_in() -> None:
    out = Exposition()
    out.add("astraeus_threshold_alerts_firing", {"metric": "gpu_util"}, 2)
    out.add("astraeus_workers_stalled", {"namespace": "b"}, 1)
    out.add("astraeus_workers_stalled", {"namespace": "a"}, 0)
    found = families(out.text())
    assert list(found) == ["astraeus_workers_stalled", "astraeus_threshold_alerts_firing"]
    assert found["astraeus_workers_stalled"] == [
        ({"namespace": "b"}, 1.0),
        ({"namespace": "a"}, 0.0),
    ]


def test_label_values_are_escaped_and_values_rounded_to_nine_places() -> None:
    # a run's name comes from its user: quotes, backslashes and newlines read back whole
    name = 'we"ird\\run\nname'
    out = Exposition()
    out.add("astraeus_run_goodput_ratio", {"namespace": "ns", "run": name}, 1 / 3)
    assert families(out.text())["astraeus_run_goodput_ratio"] == [
        ({"namespace": "ns", "run": name}, 0.333333333)
    ]
