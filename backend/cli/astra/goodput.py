"""``astra astraeus goodput``: the seed's GPU-hours table (seed G-22 … G-26).

GPU-hours
RUN                              HELD     USED GOODPUT    IDLE STALLED   START RESTART …
llm                             323.1    300.1     93%     0.0     6.2     2.1     4.1 …
TOTAL                           469.6    412.5     88%    21.0     6.2     9.8     4.1 …

USED = productive (running, GPUs busy); GOODPUT = used / held; WAITING = asked for, not yet held
"""

from __future__ import annotations

import math
from typing import Any

TITLE = "GPU-hours"
FOOTER = (
    "USED = productive (running, GPUs busy); GOODPUT = used / held; "
    "WAITING = asked for, not yet held"
)
# (header, width): the name column, then right-aligned numbers, as the seed prints them.
NAME_WIDTH = 32
COLUMNS = (
    ("HELD", 5),
    ("USED", 9),
    ("GOODPUT", 8),
    ("IDLE", 8),
    ("STALLED", 8),
    ("START", 8),
    ("RESTART", 8),
    ("FAILURE", 8),
    ("PREEMPT", 8),
    ("WAITING", 8),
)
# The held part of these categories, by column.
HELD_PARTS = {
    "IDLE": "idle",
    "STALLED": "stalled",
    "START": "starting",
    "RESTART": "restart",
    "FAILURE": "failure",
    "PREEMPT": "preemption",
}
LEDGER_FIELDS = """allocatedGpuHours productiveGpuHours waitingGpuHours goodput
  gpuHours { category heldGpuHours }"""


# Decimals of a table's GPU-hours: the seed's one from 10 GPU-hours held; under that, as many as
# keep the smallest HELD to three significant digits, so that USED over HELD is GOODPUT to a
# point or two (issue 36: "HELD 0.2 USED 0.0 GOODPUT 15%"), down to a GPU-second (0.000278).
# One count for the whole table: its columns stay comparable, row to row.
MAX_DECIMALS = 6


def decimals_for(ledgers: list[dict[str, Any]]) -> int:
    """The decimals a table of these ledgers prints: 1 where its smallest HELD (above 0) is 10
    GPU-hours or more, 2 from 1, 3 from 0.1, and so on, at most 6."""
    held = [ledger["allocatedGpuHours"] for ledger in ledgers if ledger["allocatedGpuHours"] > 0]
    if not held:
        return 1
    smallest = min(held)
    return next((d for d in range(1, MAX_DECIMALS) if smallest >= 10.0 ** (2 - d)), MAX_DECIMALS)


def _apportioned(total: float, parts: list[float], decimals: int) -> list[int] | None:
    """The total and its parts in units of the last decimal, the parts adding up to the total
    (each rounded down, then one more to those with the largest remainders); None when the parts
    do not add up to the total in the first place (the seed's own example rows)."""
    if abs(sum(parts) - total) > 1e-9 * max(1.0, abs(total)):
        return None
    scale = 10**decimals
    scaled = [part * scale for part in parts]
    units = [math.floor(s + 1e-9) for s in scaled]
    whole = round(total * scale)
    short = whole - sum(units)
    if not 0 <= short <= len(parts):
        return None
    by_remainder = sorted(range(len(parts)), key=lambda i: units[i] - scaled[i])
    for i in by_remainder[:short]:
        units[i] += 1
    return [whole, *units]


def cells(ledger: dict[str, Any], decimals: int = 1) -> dict[str, str]:
    """A ledger (GraphQL's GoodputLedger) as the table's cells: HELD is every held part, USED
    productive, IDLE … PREEMPT held parts, WAITING everything not held. A row adds up as
    printed: HELD = USED + IDLE + STALLED + START + RESTART + FAILURE + PREEMPT, to its last
    digit (each part rounded so that they make HELD rounded)."""
    held = {c["category"]: c["heldGpuHours"] for c in ledger["gpuHours"]}
    columns = ["HELD", "USED", *HELD_PARTS]
    figures = [
        ledger["allocatedGpuHours"],
        ledger["productiveGpuHours"],
        *(held.get(c, 0.0) for c in HELD_PARTS.values()),
    ]
    units = _apportioned(figures[0], figures[1:], decimals)
    shown = (
        [f"{figure:.{decimals}f}" for figure in figures]
        if units is None
        else [f"{unit / 10**decimals:.{decimals}f}" for unit in units]
    )
    goodput = ledger["goodput"]
    return {
        "GOODPUT": "-" if goodput is None else f"{goodput * 100:.0f}%",
        "WAITING": f"{ledger['waitingGpuHours']:.{decimals}f}",
        **dict(zip(columns, shown, strict=True)),
    }


def _widths(rows: list[dict[str, str]]) -> dict[str, int]:
    """The seed's column widths, wider where a figure needs it: two spaces before each figure
    (HELD's are the name column's)."""
    widths = {}
    for column, width in COLUMNS:
        longest = max(len(row[column]) for row in rows)
        widths[column] = max(width, longest if column == "HELD" else longest + 2)
    return widths


def _table(header: str, rows: list[tuple[str, dict[str, Any]]], decimals: int) -> list[str]:
    """The header named for the scope, a line per ledger (the TOTAL's among them), to widths
    that fit them all."""
    shown = [(name, cells(ledger, decimals)) for name, ledger in rows]
    widths = _widths([values for _, values in shown])
    width = max([NAME_WIDTH, *(len(name) + 1 for name, _ in rows)])

    def line(name: str, values: dict[str, str]) -> str:
        return f"{name:<{width}}" + "".join(f"{values[c]:>{widths[c]}}" for c, _ in COLUMNS)

    return [line(header, {c: c for c, _ in COLUMNS}), *(line(n, v) for n, v in shown)]


def table(
    scope: str,
    rows: list[tuple[str, dict[str, Any]]],
    total: dict[str, Any] | None,
    decimals: int | None = None,
) -> str:
    """The title, the header named for the scope (RUN, MACHINE, POOL, WORKSPACE), a row each,
    the TOTAL row and the footer. The name column is the seed's, wider for a longer name; the
    figures have the table's decimals (decimals_for)."""
    every = rows + ([("TOTAL", total)] if total is not None else [])
    if decimals is None:
        decimals = decimals_for([ledger for _, ledger in every])
    return "\n".join([TITLE, *_table(scope.upper(), every, decimals), "", FOOTER])


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def rework_line(total: dict[str, Any], rework: dict[str, Any], decimals: int = 1) -> str:
    """The footer's rework line (issue 23), under the table: the part of USED that was steps
    done again after restarts, and the runs whose part is unknown, to the table's decimals.
    Only where some run's is known (it reported checkpoints and restarted): a table of runs
    that never report them is the seed's, to the line."""
    hours = rework["gpuHours"] or 0.0
    if hours <= 0:
        return ""
    used = total["productiveGpuHours"]
    share = f" ({hours / used:.1%})" if used > 0 else ""
    out = f"\nREWORK = {hours:.{decimals}f} GPU-hours of USED were steps done again after "
    out += f"restarts{share}"
    if rework["unknownRuns"]:
        out += f"; unknown for {_runs(rework['unknownRuns'])} (no checkpoint reports)"
    return out


def run_rework_line(ledger: dict[str, Any], rework: dict[str, Any], decimals: int = 1) -> str:
    """A run's own rework under its row: how much of USED, how many steps, from which
    checkpoints (only when it is known and there is some, as ``rework_line``)."""
    hours = rework["gpuHours"] or 0.0
    redos = rework["redos"]
    if hours <= 0 or not redos:
        return ""
    steps = sum(r["stepsRedone"] or 0 for r in redos)
    checkpoints = ", ".join(f"{r['checkpointStep']:.0f}" for r in redos)
    restarts = "1 restart" if len(redos) == 1 else f"{len(redos)} restarts"
    return (
        f"\nREWORK = {hours:.{decimals}f} GPU-hours of USED "
        f"({hours / ledger['productiveGpuHours']:.1%}): {steps:.0f} steps done again after "
        f"{restarts}, back to checkpoint {checkpoints}"
    )


def summed(ledgers: list[dict[str, Any]]) -> dict[str, Any]:
    """Ledgers added up as one (the weeks' TOTAL): goodput is the sum's used over held."""
    held: dict[str, float] = {}
    for ledger in ledgers:
        for part in ledger["gpuHours"]:
            held[part["category"]] = held.get(part["category"], 0.0) + part["heldGpuHours"]
    allocated = sum(ledger["allocatedGpuHours"] for ledger in ledgers)
    productive = sum(ledger["productiveGpuHours"] for ledger in ledgers)
    return {
        "allocatedGpuHours": allocated,
        "productiveGpuHours": productive,
        "waitingGpuHours": sum(ledger["waitingGpuHours"] for ledger in ledgers),
        "goodput": productive / allocated if allocated > 0 else None,
        "gpuHours": [{"category": c, "heldGpuHours": h} for c, h in held.items()],
    }


WEEK_WIDTH = 10  # "2026-W40" and two spaces


def weekly_table(scope: str, weeks: list[dict[str, Any]]) -> str:
    """The last weeks as one table of the seed's block (issue 21: not a table a week, most of
    them empty): a row per week and name, oldest week first; a week with nothing to show is
    one row of its week, so every week asked for is there; the TOTAL of them all."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for week in weeks:
        report = week["report"]
        named = [(f"{week['week']:<{WEEK_WIDTH}}{r['name']}", r["ledger"]) for r in report["rows"]]
        rows += named or [(week["week"], report["total"])]
    rows.append(("TOTAL", summed([w["report"]["total"] for w in weeks])))
    decimals = decimals_for([ledger for _, ledger in rows])
    header = f"{'WEEK':<{WEEK_WIDTH}}{scope.upper()}"
    return "\n".join([TITLE, *_table(header, rows, decimals), "", FOOTER])


COST_FOOTER = (
    "USED = productive; LOST = held, not used productively; a GPU-hour costs its pool's price "
    "(astra astraeus price set)"
)
COST_COLUMNS = (
    ("HELD", 10, None),
    ("USED", 10, "productive"),
    ("IDLE", 10, "idle"),
    ("STALLED", 10, "stalled"),
    ("START", 10, "starting"),
    ("RESTART", 10, "restart"),
    ("FAILURE", 10, "failure"),
    ("PREEMPT", 10, "preemption"),
    ("LOST", 10, None),
)


def _money(row: dict[str, Any]) -> dict[str, str]:
    by = {c["category"]: c["amount"] for c in row["byCategory"]}
    out = {"HELD": f"{row['held']:.2f}", "LOST": f"{row['lost']:.2f}"}
    for column, _, category in COST_COLUMNS:
        if category is not None:
            out[column] = f"{by.get(category, 0.0):.2f}"
    return out


def cost_table(scope: str, cost: dict[str, Any]) -> str:
    """``goodput --cost``: the GPU time held on priced pools as money, a row each and the
    TOTAL, in the organisation's currency (issue 23)."""
    if cost["currency"] is None:
        return (
            "No pool has a price: an organisation admin sets one with "
            "astra astraeus price set <pool> <amount>"
        )
    rows = [(r["name"], _money(r)) for r in cost["rows"]]
    width = max([NAME_WIDTH, *(len(name) + 1 for name, _ in rows)])

    def money_line(name: str, values: dict[str, str]) -> str:
        return f"{name:<{width}}" + "".join(f"{values[c]:>{w}}" for c, w, _ in COST_COLUMNS)

    out = [
        f"Cost ({cost['currency']})",
        money_line(scope.upper(), {c: c for c, _, _ in COST_COLUMNS}),
    ]
    out += [money_line(name, values) for name, values in rows]
    out.append(money_line("TOTAL", _money(cost["total"])))
    out += ["", COST_FOOTER]
    return "\n".join(out)
