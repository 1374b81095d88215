"""``astra astraeus goodput``: the seed's GPU-hours table (seed G-22 … G-26).

GPU-hours
RUN                              HELD     USED GOODPUT    IDLE STALLED   START RESTART …
llm                             323.1    300.1     93%     0.0     6.2     2.1     4.1 …
TOTAL                           469.6    412.5     88%    21.0     6.2     9.8     4.1 …

USED = productive (running, GPUs busy); GOODPUT = used / held; WAITING = asked for, not yet held
"""

from __future__ import annotations

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


def cells(ledger: dict[str, Any]) -> dict[str, str]:
    """A ledger (GraphQL's GoodputLedger) as the table's cells: HELD is every held part, USED
    productive, IDLE … PREEMPT held parts, WAITING everything not held, so a row adds up."""
    held = {c["category"]: c["heldGpuHours"] for c in ledger["gpuHours"]}
    goodput = ledger["goodput"]
    out = {
        "HELD": f"{ledger['allocatedGpuHours']:.1f}",
        "USED": f"{ledger['productiveGpuHours']:.1f}",
        "GOODPUT": "-" if goodput is None else f"{goodput * 100:.0f}%",
        "WAITING": f"{ledger['waitingGpuHours']:.1f}",
    }
    out |= {column: f"{held.get(category, 0.0):.1f}" for column, category in HELD_PARTS.items()}
    return out


def line(name: str, values: dict[str, str], width: int = NAME_WIDTH) -> str:
    return f"{name:<{width}}" + "".join(f"{values[c]:>{w}}" for c, w in COLUMNS)


def table(scope: str, rows: list[tuple[str, dict[str, Any]]], total: dict[str, Any] | None) -> str:
    """The title, the header named for the scope (RUN, MACHINE, POOL, WORKSPACE), a row each,
    the TOTAL row and the footer. The name column is the seed's, wider for a longer name."""
    width = max([NAME_WIDTH, *(len(name) + 1 for name, _ in rows)])
    out = [TITLE, line(scope.upper(), {c: c for c, _ in COLUMNS}, width)]
    out += [line(name, cells(ledger), width) for name, ledger in rows]
    if total is not None:
        out.append(line("TOTAL", cells(total), width))
    out += ["", FOOTER]
    return "\n".join(out)


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def rework_line(total: dict[str, Any], rework: dict[str, Any]) -> str:
    """The footer's rework line (issue 23), under the table: the part of USED that was steps
    done again after restarts, and the runs whose part is unknown. Only where some run's is
    known (it reported checkpoints and restarted): a table of runs that never report them is
    the seed's, to the line."""
    hours = rework["gpuHours"] or 0.0
    if hours <= 0:
        return ""
    used = total["productiveGpuHours"]
    share = f" ({hours / used:.1%})" if used > 0 else ""
    out = f"\nREWORK = {hours:.1f} GPU-hours of USED were steps done again after restarts{share}"
    if rework["unknownRuns"]:
        out += f"; unknown for {_runs(rework['unknownRuns'])} (no checkpoint reports)"
    return out


def run_rework_line(ledger: dict[str, Any], rework: dict[str, Any]) -> str:
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
        f"\nREWORK = {hours:.1f} GPU-hours of USED "
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
    width = max([NAME_WIDTH, *(len(name) + 1 for name, _ in rows)])
    header = f"{'WEEK':<{WEEK_WIDTH}}{scope.upper()}"
    out = [TITLE, line(header, {c: c for c, _ in COLUMNS}, width)]
    out += [line(name, cells(ledger), width) for name, ledger in rows]
    out.append(line("TOTAL", cells(summed([w["report"]["total"] for w in weeks])), width))
    out += ["", FOOTER]
    return "\n".join(out)


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
