"""`astra astraeus goodput` prints the seed's table to the column (seed G-22 … G-26)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.cli.astra.goodput import decimals_for, table
from tests.support.processes import SEED_BLOCK


def ledger(
    held: float, used: float, goodput: float, waiting: float, **parts: float
) -> dict[str, Any]:
    categories = ("idle", "stalled", "starting", "restart", "failure", "preemption")
    return {
        "allocatedGpuHours": held,
        "productiveGpuHours": used,
        "waitingGpuHours": waiting,
        "goodput": goodput,
        "gpuHours": [{"category": c, "heldGpuHours": parts.get(c, 0.0)} for c in categories],
    }


def test_the_seeds_block_to_the_character() -> None:
    # The seed's own figures (its rows do not add up one by one, its TOTAL does: DESIGN §4).
    rows = [
        (
            "llm",
            ledger(323.1, 300.1, 0.929, 0.0, stalled=6.2, starting=2.1, restart=4.1, failure=12.7),
        ),
        (
            "sweep-7",
            ledger(146.5, 112.4, 0.767, 18.0, idle=21.0, starting=7.7, preemption=3.3),
        ),
    ]
    total = ledger(
        469.6,
        412.5,
        0.878,
        18.0,
        idle=21.0,
        stalled=6.2,
        starting=9.8,
        restart=4.1,
        failure=12.7,
        preemption=3.3,
    )
    assert table("run", rows, total) == SEED_BLOCK


def test_nothing_held_shows_no_goodput_and_other_scopes_name_their_column() -> None:
    printed = table("machine", [("gpu-07", ledger(0.0, 0.0, None, 2.0))], None).splitlines()  # type: ignore[arg-type]
    assert printed[1].startswith("MACHINE ")
    assert printed[2].split() == [
        "gpu-07",
        "0.0",
        "0.0",
        "-",
        "0.0",
        "0.0",
        "0.0",
        "0.0",
        "0.0",
        "0.0",
        "2.0",
    ]


def test_a_name_longer_than_the_column_widens_it_for_every_row() -> None:
    name = "a-run-name-of-forty-characters-or-so-xyz"
    printed = table("run", [(name, ledger(10.0, 10.0, 1.0, 0.0)), ("b", ledger(0, 0, 0, 0))], None)
    header, first, second = printed.splitlines()[1:4]
    assert first.startswith(name + " ") and first.split()[1] == "10.0"
    # right-aligned under HELD on every row
    assert header.index("HELD") + 4 == first.index("10.0") + 4 == second.index("0.0") + 3


def test_the_footer_tells_the_rework_where_some_is_known() -> None:
    # issue 23: rework is a part of USED, under the seed's footer; a table whose runs never
    # report checkpoints stays the seed's block to the line
    from backend.cli.astra.goodput import rework_line, run_rework_line

    total = ledger(469.6, 412.5, 0.878, 18.0)
    assert rework_line(total, {"gpuHours": None, "unknownRuns": 1}) == ""
    assert rework_line(total, {"gpuHours": 0.0, "unknownRuns": 0}) == ""
    assert rework_line(total, {"gpuHours": 4.125, "unknownRuns": 2}) == (
        "\nREWORK = 4.1 GPU-hours of USED were steps done again after restarts (1.0%); "
        "unknown for 2 runs (no checkpoint reports)"
    )
    own = ledger(300.1, 300.1, 1.0, 0.0)
    redos = [{"checkpointStep": 400.0, "stepsRedone": 100.0}]
    assert run_rework_line(own, {"gpuHours": 3.0, "redos": redos}) == (
        "\nREWORK = 3.0 GPU-hours of USED (1.0%): 100 steps done again after 1 restart, "
        "back to checkpoint 400"
    )
    assert run_rework_line(own, {"gpuHours": None, "redos": redos}) == ""


def test_machines_worst_is_a_line_a_machine_worst_first() -> None:
    # issue 23: `astra astraeus machines --worst`
    from backend.cli.astra.machines import worst

    rows = [
        {
            "machine": "gpu-07",
            "pool": "h100",
            "lostGpuHours": 12.44,
            "failureCount": 5,
            "failures": [{"kind": "out_of_memory", "count": 1}, {"kind": "program", "count": 4}],
            "faultCount": 0,
            "vsPool": 5.0,
            "action": "drain: 5× its pool's failures this week",
        },
        {
            "machine": "gpu-08",
            "pool": None,
            "lostGpuHours": 0.0,
            "failureCount": 0,
            "failures": [],
            "faultCount": 0,
            "vsPool": None,
            "action": "none",
        },
    ]
    header, first, second, blank, footer = worst(rows).splitlines()
    assert header.split() == [
        "MACHINE",
        "POOL",
        "LOST",
        "FAILURES",
        "FAULTS",
        "VS",
        "POOL",
        "ACTION",
    ]
    assert first.split("  ")[0] == "gpu-07"
    assert "12.4" in first and "5 (out_of_memory 1, program 4)" in first and "5.0×" in first
    assert first.endswith("drain: 5× its pool's failures this week")
    assert second.split()[:6] == ["gpu-08", "-", "0.0", "0", "0", "-"]
    assert header.index("ACTION") == first.index("drain") == second.index("none")
    assert blank == "" and footer.startswith(
        "LOST = GPU-hours held in failure, restart and stalled"
    )


def test_the_cost_table_is_money_by_held_category() -> None:
    # issue 23: `astra astraeus goodput --by run --cost`
    from backend.cli.astra.goodput import cost_table

    def row(name: str, held: float, **amounts: float) -> dict[str, Any]:
        return {
            "name": name,
            "held": held,
            "lost": held - amounts.get("productive", 0.0),
            "byCategory": [{"category": c, "amount": a} for c, a in amounts.items()],
        }

    cost = {
        "currency": "USD",
        "rows": [row("llm", 100.0, productive=90.0, stalled=4.0, failure=6.0)],
        "total": row("TOTAL", 100.0, productive=90.0, stalled=4.0, failure=6.0),
    }
    title, header, llm, total, blank, footer = cost_table("run", cost).splitlines()
    assert title == "Cost (USD)"
    assert header.split() == [
        "RUN",
        "HELD",
        "USED",
        "IDLE",
        "STALLED",
        "START",
        "RESTART",
        "FAILURE",
        "PREEMPT",
        "LOST",
    ]
    assert llm.split() == [
        "llm",
        "100.00",
        "90.00",
        "0.00",
        "4.00",
        "0.00",
        "0.00",
        "6.00",
        "0.00",
        "10.00",
    ]
    assert total.split()[0] == "TOTAL" and header.index("LOST") + 4 == llm.index("10.00") + 5
    assert blank == "" and footer.startswith("USED = productive; LOST = held")
    assert cost_table("run", {"currency": None, "rows": [], "total": {}}).startswith(
        "No pool has a price"
    )


def small_ledger(**seconds: int) -> dict[str, Any]:
    """A ledger from GPU-seconds by category, as the server's are (whole GPU-seconds)."""
    hours = {c: s / 3600 for c, s in seconds.items()}
    held = sum(v for c, v in hours.items() if c != "waiting")
    used = hours.get("productive", 0.0)
    parts = {c: v for c, v in hours.items() if c not in ("productive", "waiting")}
    return ledger(held, used, used / held if held else None, hours.get("waiting", 0.0), **parts)  # type: ignore[arg-type]


def test_a_small_run_shows_enough_digits_for_used_over_held_to_be_its_goodput() -> None:
    # issue 36: "HELD 0.2 USED 0.0 GOODPUT 15%" (a 2-rank run of a few minutes on a laptop)
    run = small_ledger(productive=108, idle=576, starting=36, waiting=12)
    header, row = table("run", [("llama-sft", run)], None).splitlines()[1:3]
    assert header.split() == [
        "RUN",
        "HELD",
        "USED",
        "GOODPUT",
        "IDLE",
        "STALLED",
        "START",
        "RESTART",
        "FAILURE",
        "PREEMPT",
        "WAITING",
    ]
    assert row.split() == [
        "llama-sft",
        "0.200",
        "0.030",
        "15%",
        "0.160",
        "0.000",
        "0.010",
        "0.000",
        "0.000",
        "0.000",
        "0.003",
    ]


def test_one_small_row_gives_the_whole_table_its_digits_and_columns_stay_aligned() -> None:
    big = ledger(323.1, 300.1, 0.929, 0.0, stalled=6.2, starting=2.1, restart=4.1, failure=10.6)
    small = small_ledger(productive=108, idle=576, starting=36)
    printed = table("run", [("llm", big), ("tiny", small)], None).splitlines()
    header, first, second = printed[1:4]
    assert first.split()[1:3] == ["323.100", "300.100"]
    assert second.split()[1:3] == ["0.200", "0.030"]
    for column in ("HELD", "USED", "IDLE", "WAITING"):
        end = header.index(column) + len(column)
        assert (
            first[end - 1] != " " and second[end - 1] != " " and first[end : end + 1] in (" ", "")
        )


@pytest.mark.parametrize(
    ("smallest", "decimals"),
    [(469.6, 1), (10.0, 1), (9.99, 2), (1.0, 2), (0.2, 3), (0.05, 4), (1 / 3600, 6)],
)
def test_the_smallest_held_keeps_three_digits(smallest: float, decimals: int) -> None:
    ledgers = [ledger(469.6, 1.0, 0.5, 0.0), ledger(smallest, 0.0, 0.0, 0.0), ledger(0, 0, 0, 9)]
    assert decimals_for(ledgers) == decimals


categories = st.sampled_from(["productive", "idle", "stalled", "starting", "restart", "failure"])


@given(st.dictionaries(categories, st.integers(0, 4 * 3600 * 24), min_size=1))
def test_every_row_adds_up_as_printed_and_its_used_over_held_is_its_goodput(
    seconds: dict[str, int],
) -> None:
    # DESIGN §4: HELD = USED + IDLE + STALLED + START + RESTART + FAILURE + PREEMPT, on every
    # row, to the last printed digit; and USED / HELD as printed is GOODPUT to a point or two
    # (each figure is off by less than a unit of its last digit, HELD has a hundred or more)
    run = small_ledger(**seconds)
    figures = table("run", [("r", run)], None).splitlines()[2].split()
    held, used, goodput, *parts = figures[1:10]
    assert Decimal(held) == Decimal(used) + sum(Decimal(p) for p in parts)
    if run["allocatedGpuHours"] > 0:
        assert abs(Decimal(used) / Decimal(held) * 100 - int(goodput.rstrip("%"))) <= 2


def test_the_weeks_and_one_runs_rework_take_the_tables_digits() -> None:
    from backend.cli.astra.goodput import run_rework_line, weekly_table

    week = small_ledger(productive=108, idle=576, starting=36)
    weeks = [
        {"week": "2026-W48", "report": {"rows": [], "total": ledger(0, 0, None, 0)}},  # type: ignore[arg-type]
        {
            "week": "2026-W49",
            "report": {"rows": [{"name": "local", "ledger": week}], "total": week},
        },
    ]
    lines = weekly_table("pool", weeks).splitlines()
    assert [line.split()[:4] for line in lines[2:5]] == [
        ["2026-W48", "0.000", "0.000", "-"],
        ["2026-W49", "local", "0.200", "0.030"],
        ["TOTAL", "0.200", "0.030", "15%"],
    ]
    redos = [{"checkpointStep": 400.0, "stepsRedone": 100.0}]
    assert run_rework_line(week, {"gpuHours": 0.012, "redos": redos}, 3) == (
        "\nREWORK = 0.012 GPU-hours of USED (40.0%): 100 steps done again after 1 restart, "
        "back to checkpoint 400"
    )
