"""The console in a real headless Chromium (Debian's, driven by Playwright) against a live
server: the goodput page's figures are the API's (issue 8; seed G-19 … G-23).

Screenshots go to a temporary folder, or to $ASTRAEUS_SCREENSHOTS (`make screenshots` sets
docs/screenshots) at 1280 by 800.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from backend.cli.astra.goodput import cells, decimals_for
from tests.e2e.browser import NEEDS_CHROMIUM, console_dir, screenshots, sign_in
from tests.e2e.live import Server, serving_seed_week
from tests.support import Tenancy
from tests.support.http import HTTP

pytestmark = [NEEDS_CHROMIUM]


@pytest.fixture(scope="module")
def seed_week(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Tenancy]]:
    data_dir = tmp_path_factory.mktemp("console") / "data"
    with serving_seed_week(data_dir, console_dir=console_dir()) as found:
        yield found


def as_printed(ledgers: list[dict[str, Any]]) -> list[dict[str, str]]:
    """REST ledgers' figures as `astra astraeus goodput` prints them, one table's decimals for
    all (backend/cli/astra/goodput.py cells): the console writes the same (issue 36)."""
    shaped = [
        {
            "allocatedGpuHours": ledger["allocated_gpu_hours"],
            "productiveGpuHours": ledger["productive_gpu_hours"],
            "waitingGpuHours": ledger["waiting_gpu_hours"],
            "goodput": ledger["goodput"],
            "gpuHours": [
                {"category": c, "heldGpuHours": v} for c, v in ledger["held_gpu_hours"].items()
            ],
        }
        for ledger in ledgers
    ]
    decimals = decimals_for(shaped)
    return [with_thousands(cells(ledger, decimals)) for ledger in shaped]


def with_thousands(figures: dict[str, str]) -> dict[str, str]:
    """The CLI's figures with the console's thousands separator (1,234.5)."""
    return {k: v if k == "GOODPUT" else f"{Decimal(v):,}" for k, v in figures.items()}


def near_percent(text: str, ratio: float) -> bool:
    return abs(float(text.rstrip("%")) - ratio * 100) <= 0.5


def test_the_goodput_page_shows_the_apis_figures(
    seed_week: tuple[Server, Tenancy], page: Any, tmp_path: Path
) -> None:
    # seed G-19: goodput, GPU time held, productive, not productive (with the biggest loss),
    # waiting; seed G-20: then a row per run with a bar of where its time went (per machine,
    # pool and workspace: the test after this one)
    server, tenancy = seed_week
    sign_in(page, server, tenancy.member_token)
    page.locator('tr[data-row="sweep-7"]').wait_for()
    start = (datetime.now(UTC) - timedelta(days=7)).isoformat()
    api = HTTP.get(
        f"{server.url}/v1/goodput",
        params={"by": "run", "start": start},
        headers={"Authorization": f"Bearer {tenancy.member_token}"},
    ).json()

    total = api["total"]
    printed, *rows_printed = as_printed([total, *api["ledgers"]])
    summary = page.locator(".summary")
    assert near_percent(summary.locator('[data-figure="goodput"]').inner_text(), total["goodput"])
    held = summary.locator('[data-figure="held"]').inner_text()
    assert held == f"{printed['HELD']} GPU-h"
    productive = summary.locator('[data-figure="productive"]').inner_text()
    assert productive == f"{printed['USED']} GPU-h"
    # not productive is held less used, as printed (issue 36: the figures agree)
    not_productive = Decimal(printed["HELD"].replace(",", "")) - Decimal(
        printed["USED"].replace(",", "")
    )
    shown = summary.locator('[data-figure="not-productive"]').inner_text()
    assert shown.startswith(f"{not_productive:,} GPU-h")
    biggest = max(
        (c for c in total["held_gpu_hours"] if c != "productive"),
        key=lambda c: total["held_gpu_hours"][c],
    )
    assert f"biggest loss: {biggest.capitalize()}" in shown
    waiting = summary.locator('[data-figure="waiting"]').inner_text()
    assert waiting == f"{printed['WAITING']} GPU-h"

    rows = page.locator("tr[data-row]")
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.row)") == ["llm", "sweep-7"]
    for ledger, figures in zip(api["ledgers"], rows_printed, strict=True):
        row = page.locator(f'tr[data-row="{ledger["name"]}"]')
        assert row.locator('[data-figure="held"]').inner_text() == figures["HELD"]
        assert row.locator('[data-figure="used"]').inner_text() == figures["USED"]
        assert near_percent(row.locator('[data-figure="goodput"]').inner_text(), ledger["goodput"])
        assert row.locator('[data-figure="waiting"]').inner_text() == figures["WAITING"]
        # the bar's idle segment says the CLI's IDLE
        idle = row.locator(".segment-idle")
        if ledger["held_gpu_hours"].get("idle", 0) > 0:
            assert idle.get_attribute("title") == f"Idle: {figures['IDLE']} GPU-hours"
        # one segment per category with time in it, waiting last
        shown_parts = row.locator(".segment").evaluate_all("ss => ss.map(s => s.dataset.category)")
        held_parts = [c for c, v in ledger["held_gpu_hours"].items() if v > 0]
        expected = [c for c in CATEGORY_ORDER if c in held_parts]
        expected += ["waiting"] if ledger["waiting_gpu_hours"] > 0 else []
        assert shown_parts == expected
    page.screenshot(path=str(screenshots(tmp_path) / "goodput.png"), full_page=True)


CATEGORY_ORDER = ("productive", "idle", "stalled", "starting", "restart", "failure", "preemption")


def bar_of(row: Any) -> list[str]:
    """The categories of a row's bar, in the order drawn."""
    return list(row.locator(".segment").evaluate_all("ss => ss.map(s => s.dataset.category)"))


def bar_expected(ledger: dict[str, Any]) -> list[str]:
    """One segment per category with held time in it, in the table's order, waiting last."""
    held = [c for c in CATEGORY_ORDER if ledger["held_gpu_hours"].get(c, 0) > 0]
    return held + (["waiting"] if ledger["waiting_gpu_hours"] > 0 else [])


@pytest.mark.parametrize(
    ("by", "names"),
    [
        ("MACHINE", ["gpu-07", "gpu-08"]),
        ("POOL", ["h100"]),
        ("WORKSPACE", ["default"]),
    ],
)
def test_a_row_per_machine_pool_or_workspace_with_its_bar(
    seed_week: tuple[Server, Tenancy], page: Any, by: str, names: list[str]
) -> None:
    # seed G-20: a row per run, machine, pool or workspace, with a bar of where its time went:
    # the rows the API has by that scope, each with its figures and its bar's segments
    server, tenancy = seed_week
    sign_in(page, server, tenancy.member_token)
    page.locator('tr[data-row="sweep-7"]').wait_for()
    page.get_by_label("By", exact=True).select_option(by)
    page.locator(f'tr[data-row="{names[0]}"]').wait_for()
    start = (datetime.now(UTC) - timedelta(days=7)).isoformat()
    api = HTTP.get(
        f"{server.url}/v1/goodput",
        params={"by": by.lower(), "start": start},
        headers={"Authorization": f"Bearer {tenancy.member_token}"},
    ).json()
    assert [r["name"] for r in api["ledgers"]] == names
    rows = page.locator("tr[data-row]")
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.row)") == names
    _, *printed = as_printed([api["total"], *api["ledgers"]])
    for ledger, figures in zip(api["ledgers"], printed, strict=True):
        row = page.locator(f'tr[data-row="{ledger["name"]}"]')
        assert row.locator('[data-figure="held"]').inner_text() == figures["HELD"]
        assert row.locator('[data-figure="used"]').inner_text() == figures["USED"]
        assert bar_of(row) == bar_expected(ledger)
        assert len(bar_of(row)) >= 2  # productive and at least one loss


def test_a_runs_page_shows_its_own_goodput_and_bar(
    seed_week: tuple[Server, Tenancy], page: Any, tmp_path: Path
) -> None:
    # seed G-23: a run's page shows its own goodput and bar under Goodput: llm's, as
    # GET /runs/llm/goodput has it
    server, tenancy = seed_week
    own = HTTP.get(
        f"{server.url}/v1/runs/llm/goodput",
        headers={"Authorization": f"Bearer {tenancy.member_token}"},
    ).json()
    sign_in(page, server, tenancy.member_token)
    page.goto(f"{server.url}/o/default/w/default/runs/llm")
    section = page.get_by_role("region", name="Goodput of the run")
    section.get_by_role("heading", name="Goodput", exact=True).wait_for()
    [printed] = as_printed([own])
    summary = section.locator(".summary")
    assert near_percent(summary.locator('[data-figure="goodput"]').inner_text(), own["goodput"])
    assert summary.locator('[data-figure="held"]').inner_text() == f"{printed['HELD']} GPU-h"
    productive = summary.locator('[data-figure="productive"]').inner_text()
    assert productive == f"{printed['USED']} GPU-h"
    assert bar_of(section) == bar_expected(own)
    assert {"productive", "stalled", "failure"} <= set(bar_of(section))  # llm's week
    page.screenshot(path=str(screenshots(tmp_path) / "run-goodput.png"), full_page=True)


def test_a_segment_opens_the_intervals_behind_it(
    seed_week: tuple[Server, Tenancy], page: Any, tmp_path: Path
) -> None:
    # issue 8: click a bar segment to see the worker intervals behind it (seed G-19)
    server, tenancy = seed_week
    sign_in(page, server, tenancy.member_token)
    page.locator('tr[data-row="sweep-7"] .segment-preemption').click()
    panel = page.get_by_role("region", name="Preemption intervals of sweep-7")
    panel.locator("tbody tr").first.wait_for()
    intervals = HTTP.get(
        f"{server.url}/v1/goodput/intervals",
        params={"by": "run", "name": "sweep-7", "category": "preemption"},
        headers={"Authorization": f"Bearer {tenancy.member_token}"},
    ).json()["intervals"]
    held = [i for i in intervals if i["held"]]
    cells = panel.locator("tbody tr td:first-child").all_inner_texts()
    # one worker's preemption; the interval is cut in two when it crosses a UTC hour, which
    # it does when the seed week was played at some minutes of the hour
    assert cells == [i["worker"] for i in held] and set(cells) == {"sweep-7-0"}
    assert 1 <= len(cells) <= 2
    page.screenshot(path=str(screenshots(tmp_path) / "goodput-intervals.png"), full_page=True)
    page.keyboard.press("Escape")
    assert panel.count() == 0


def test_by_week_shows_the_last_eight_weeks(seed_week: tuple[Server, Tenancy], page: Any) -> None:
    # seed G-21: By week (8) shows the last eight weeks
    server, tenancy = seed_week
    sign_in(page, server, tenancy.member_token)
    page.get_by_role("tab", name="By week (8)").click()
    weeks = page.locator("section[aria-label^='Week ']")
    weeks.nth(7).wait_for()
    assert weeks.count() == 8
    newest = weeks.first.get_attribute("aria-label")
    assert newest == f"Week {datetime.now(UTC).strftime('%G-W%V')}"


def test_a_wrong_token_is_told_so(seed_week: tuple[Server, Tenancy], page: Any) -> None:
    server, _ = seed_week
    page.goto(f"{server.url}/")
    page.get_by_label("API token").fill("astx_" + "9" * 40)
    page.get_by_role("button", name="Sign in").click()
    assert "A valid API token is required" in page.get_by_role("alert").inner_text()


def test_the_goodput_page_by_keyboard(seed_week: tuple[Server, Tenancy], page: Any) -> None:
    # issue 8: keyboard reachable: Tab to a bar's segment, Enter opens its intervals, Escape
    # closes them
    server, tenancy = seed_week
    sign_in(page, server, tenancy.member_token)
    page.locator('tr[data-row="sweep-7"]').wait_for()
    target = "sweep-7 Preemption"
    for _ in range(60):
        page.keyboard.press("Tab")
        label = page.evaluate("document.activeElement.getAttribute('aria-label') || ''")
        if label.startswith(target):
            break
    else:
        raise AssertionError("Tab never reached sweep-7's preemption segment")
    page.keyboard.press("Enter")
    panel = page.get_by_role("region", name="Preemption intervals of sweep-7")
    panel.locator("tbody tr").first.wait_for()
    page.keyboard.press("Escape")
    assert panel.count() == 0


def test_a_laptop_screen_keeps_the_figures_in_view(
    seed_week: tuple[Server, Tenancy], browser: Any
) -> None:
    # issue 8: usable on a laptop screen: at 1024 by 640 the menu goes above the page and
    # nothing is wider than the window
    server, tenancy = seed_week
    context = browser.new_context(viewport={"width": 1024, "height": 640})
    try:
        page = context.new_page()
        sign_in(page, server, tenancy.member_token)
        page.locator('tr[data-row="sweep-7"]').wait_for()
        assert page.evaluate("document.documentElement.scrollWidth") <= 1024
        assert page.locator(".summary").is_visible()
        # long sentences wrap instead of widening the page
        page.get_by_role("link", name="Events").click()
        page.get_by_role("table", name="Events").locator("tbody tr").first.wait_for()
        assert page.evaluate("document.documentElement.scrollWidth") <= 1024
    finally:
        context.close()


def test_the_chart_over_time_opens_an_hours_intervals(
    seed_week: tuple[Server, Tenancy], page: Any, tmp_path: Path
) -> None:
    # issue 23: the goodput page's stacked chart of the seed's week, hour by hour; a click on
    # an hour opens the worker intervals behind it
    server, tenancy = seed_week
    headers = {"Authorization": f"Bearer {tenancy.member_token}"}
    sign_in(page, server, tenancy.member_token)
    chart = page.get_by_role("figure", name="default, hour by hour")
    chart.locator("canvas").wait_for()
    series = HTTP.get(
        f"{server.url}/v1/goodput/series",
        # the page's period: the last 7 days, to the hour
        params={"by": "workspace", "name": "default", "start": days_ago(7)},
        headers=headers,
    ).json()
    assert chart.get_attribute("data-points") == str(len(series["points"])) == "169"
    busiest = max(series["points"], key=lambda p: p["allocated_gpu_hours"])
    assert busiest["allocated_gpu_hours"] > 0

    # the middle of the busiest hour, where uPlot's plotting area puts it
    box = chart.locator(".u-over").bounding_box()
    first, last = (to_seconds(series["start"]), to_seconds(series["end"]))
    middle = (to_seconds(busiest["start"]) + to_seconds(busiest["end"])) / 2
    page.mouse.click(
        box["x"] + box["width"] * (middle - first) / (last - first), box["y"] + box["height"] / 2
    )
    panel = page.get_by_role("region", name="All intervals of default")
    panel.locator("tbody tr").first.wait_for()
    intervals = HTTP.get(
        f"{server.url}/v1/goodput/intervals",
        params={
            "by": "workspace",
            "name": "default",
            "start": busiest["start"],
            "end": busiest["end"],
        },
        headers=headers,
    ).json()["intervals"]
    assert panel.locator("tbody tr td:first-child").all_inner_texts() == [
        i["worker"] for i in intervals
    ]
    shown = {c.lower() for c in panel.locator('[data-figure="category"]').all_inner_texts()}
    assert shown == {i["category"] if i["held"] else "waiting" for i in intervals}
    page.screenshot(path=str(screenshots(tmp_path) / "goodput-over-time.png"), full_page=True)


def days_ago(days: int) -> str:
    return (datetime.now(UTC) - timedelta(days=days)).isoformat()


def to_seconds(moment: str) -> float:
    return datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp()


def test_a_run_that_restarted_without_checkpoints_shows_its_rework_unknown(
    seed_week: tuple[Server, Tenancy], page: Any
) -> None:
    # issue 23: llm fails and restarts in the seed's week, and its steps come without
    # checkpoints: its page says its rework is unknown, not 0, with the restart the API lists
    server, tenancy = seed_week
    rework = HTTP.get(
        f"{server.url}/v1/runs/llm/goodput",
        headers={"Authorization": f"Bearer {tenancy.member_token}"},
    ).json()["rework"]
    assert rework["gpu_hours"] is None and len(rework["redos"]) == 1
    sign_in(page, server, tenancy.member_token)
    page.goto(f"{server.url}/o/default/w/default/runs/llm")
    figure = page.locator('[data-figure="rework"]')
    figure.wait_for()
    assert figure.inner_text().startswith("Rework unknown — it restarted without reporting")
    restarts = page.get_by_role("table", name="Restarts and the steps they redid")
    [row] = restarts.locator("tbody tr").all_inner_texts()
    cells = row.split("\t")
    assert cells[1] == "unknown" and cells[-1] == "unknown"  # back to: no checkpoint reported
    assert cells[2] == str(rework["redos"][0]["reached_step"])


def test_a_priced_pool_shows_what_the_week_cost(
    seed_week: tuple[Server, Tenancy], page: Any
) -> None:
    # issue 23: an admin prices h100 at 2.50 USD a GPU-hour; the goodput page shows the money
    # by run, as goodputCost answers it; taken away again after
    server, tenancy = seed_week

    def gql(token: str, query: str, **variables: Any) -> dict[str, Any]:
        answer = HTTP.post(
            f"{server.url}/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        assert "errors" not in answer, answer
        return dict(answer["data"])

    price = """mutation($p: Float) { setPoolPrice(cluster: "local", pool: "h100",
        pricePerGpuHour: $p) { errors { message } } }"""
    assert gql(tenancy.admin_token, price, p=2.5)["setPoolPrice"]["errors"] == []
    try:
        sign_in(page, server, tenancy.member_token)
        table = page.get_by_role("table", name="Cost")
        table.locator('tr[data-row="TOTAL"]').wait_for()
        cost = gql(
            tenancy.member_token,
            "query($s: DateTime) { goodputCost(by: RUN, start: $s) { currency "
            "rows { name held lost } total { held lost } } }",
            s=days_ago(7),
        )["goodputCost"]
        assert cost["currency"] == "USD"
        for row in cost["rows"]:
            shown = table.locator(f'tr[data-row="{row["name"]}"]')
            assert shown.locator('[data-figure="held-cost"]').inner_text() == f"${row['held']:,.2f}"
            assert shown.locator('[data-figure="lost-cost"]').inner_text() == f"${row['lost']:,.2f}"
        total = table.locator('tr[data-row="TOTAL"] [data-figure="held-cost"]').inner_text()
        assert total == f"${cost['total']['held']:,.2f}"
    finally:
        gql(tenancy.admin_token, price, p=None)
