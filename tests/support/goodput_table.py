"""The seed's goodput table as a test reads it back (seed G-24 … G-26): its layout, and each
printed row checked against a REST ledger, at the table's decimals (issue 36)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from tests.support.processes import SEED_BLOCK

PARTS = ("idle", "stalled", "starting", "restart", "failure", "preemption")


def seed_layout(name: str, values: list[str]) -> str:
    """A row laid out as the seed's block lays out its rows: the name, then each figure
    right-aligned to the end of its column's header."""
    header = SEED_BLOCK.splitlines()[1]
    ends = [m.end() for m in re.finditer(r"\S+", header)][1:]
    row = name
    for value, end in zip(values, ends, strict=True):
        row += value.rjust(end - len(row))
    return row


def decimals_of(ledgers: list[dict[str, Any]]) -> int:
    """The seed's one decimal where a table's smallest HELD is 10 GPU-hours or more; below, as
    many as keep it to three significant digits (at most 6)."""
    held = [x["allocated_gpu_hours"] for x in ledgers if x["allocated_gpu_hours"] > 0]
    smallest = min(held, default=10.0)
    return next(d for d in range(1, 7) if smallest >= 10.0 ** (2 - d) or d == 6)


def checked_row(line: str, name: str, ledger: dict[str, Any], decimals: int) -> None:
    """A printed row is the REST ledger in the seed's columns (HELD USED GOODPUT IDLE STALLED
    START RESTART FAILURE PREEMPT WAITING), laid out as the seed's rows: each figure to the
    table's decimals, off by less than its last digit, the row adding up as printed (HELD =
    USED + IDLE + … + PREEMPT)."""
    values = line.split()[-10:]
    assert line == seed_layout(name, values)
    held, used, goodput, *parts, waiting = values
    api = [ledger["allocated_gpu_hours"], ledger["productive_gpu_hours"]]
    api += [ledger["held_gpu_hours"][c] for c in PARTS] + [ledger["waiting_gpu_hours"]]
    unit = Decimal(10) ** -decimals
    for value, exact in zip([held, used, *parts, waiting], api, strict=True):
        assert len(value.partition(".")[2]) == decimals, (value, decimals)
        assert abs(Decimal(value) - Decimal(repr(exact))) < unit, (name, value, exact)
    assert Decimal(held) == Decimal(used) + sum(Decimal(part) for part in parts)
    share = ledger.get("goodput")
    assert goodput == ("-" if share is None else f"{share:.0%}")


def checked_table(lines: list[str], header: str, rows: list[tuple[str, dict[str, Any]]]) -> int:
    """A printed table: the seed's title, ``header`` (its columns), a row per ledger (the TOTAL
    among them), the blank line and the seed's footer; its decimals."""
    seed = SEED_BLOCK.splitlines()
    assert lines[:2] + lines[-2:] == [seed[0], header, seed[5], seed[6]]
    assert len(lines) == 4 + len(rows), lines
    decimals = decimals_of([ledger for _, ledger in rows])
    for line, (name, ledger) in zip(lines[2:-2], rows, strict=True):
        checked_row(line, name, ledger, decimals)
    return decimals
