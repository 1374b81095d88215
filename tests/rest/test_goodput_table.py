"""The seed's goodput table, reproduced in shape by a real week of two runs (compressed to
minutes): llm stalls, fails, restarts; sweep-7 waits, idles, is preempted by a drain.

    RUN      HELD  USED GOODPUT IDLE STALLED START RESTART FAILURE PREEMPT WAITING
    llm     323.1 300.1   93%    0.0   6.2    2.1    4.1    12.7    0.0     0.0
    sweep-7 146.5 112.4   77%   21.0   0.0    7.7    0.0     0.0    3.3    18.0
    TOTAL   469.6 412.5   88%   21.0   6.2    9.8    4.1    12.7    3.3    18.0

Every column of every row is checked against the ledger it comes from, and every row adds up
(DESIGN §4: HELD = USED + IDLE + STALLED + START + RESTART + FAILURE + PREEMPT).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.accounting.seed_week import play_seed_week
from tests.lifecycle.world import World
from tests.support import SEED_TIME, Tenancy

COLUMNS = ("HELD", "USED", "IDLE", "STALLED", "START", "RESTART", "FAILURE", "PREEMPT", "WAITING")


def columns(ledger: dict[str, Any]) -> dict[str, float]:
    """A ledger as the seed's table shows it (GPU-hours)."""
    held = ledger["held_gpu_hours"]
    return {
        "HELD": ledger["allocated_gpu_hours"],
        "USED": ledger["productive_gpu_hours"],
        "IDLE": held["idle"],
        "STALLED": held["stalled"],
        "START": held["starting"],
        "RESTART": held["restart"],
        "FAILURE": held["failure"],
        "PREEMPT": held["preemption"],
        "WAITING": ledger["waiting_gpu_hours"],
    }


async def test_a_week_of_llm_and_sweep_7_has_the_seeds_shape(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # seed G-24 (the table's columns and TOTAL row), G-1 … G-15 (each category)
    # seed G-11 (sweep-7's drain: PREEMPT, exactly its 30 s of 8 GPUs), G-12 (sweep-7's first
    # wait: WAITING, not in HELD), G-13 (HELD is every held part), G-14 (GOODPUT = USED / HELD)
    await play_seed_week(world)

    answer = await client.get(
        "/v1/goodput",
        params={"by": "run", "start": SEED_TIME.isoformat()},
        headers={"Authorization": f"Bearer {tenancy.member_token}"},
    )
    body = answer.json()
    table = {r["name"]: columns(r) for r in body["ledgers"]}
    total = columns(body["total"])
    assert list(table) == ["llm", "sweep-7"]
    llm, sweep = table["llm"], table["sweep-7"]
    # The seed's shape: which columns are empty and which are not, row by row.
    # llm's IDLE: its ranks' first seconds after the restart, before its first sample of that
    # minute; 0.0 at the table's precision in the seed.
    assert llm["IDLE"] < 0.01 * llm["HELD"]
    assert [c for c in COLUMNS if llm[c] > 0.001 and c != "IDLE"] == [
        "HELD",
        "USED",
        "STALLED",
        "START",
        "RESTART",
        "FAILURE",
        "WAITING",
    ]  # its WAITING: the 10 s before the restart, 0.0 at the table's precision in the seed
    assert llm["WAITING"] < 0.05 * llm["HELD"]
    assert [c for c in COLUMNS if sweep[c] > 0.001] == [
        "HELD",
        "USED",
        "IDLE",
        "START",
        "PREEMPT",
        "WAITING",
    ]
    for row in (llm, sweep, total):
        parts = ("USED", "IDLE", "STALLED", "START", "RESTART", "FAILURE", "PREEMPT")
        assert row["HELD"] == pytest.approx(sum(row[c] for c in parts))
    for column in COLUMNS:  # the TOTAL row
        assert total[column] == pytest.approx(llm[column] + sweep[column])
    for ledger, row in (
        (body["ledgers"][0], llm),
        (body["ledgers"][1], sweep),
        (body["total"], total),
    ):
        assert ledger["goodput"] == pytest.approx(row["USED"] / row["HELD"])
    # Exact figures where the scenario fixes them: llm's barrier, 2 minutes of 8 GPUs less the
    # part of the first minute before it was placed; sweep-7's drain, 30 s of 8 GPUs.
    assert sweep["PREEMPT"] == pytest.approx(8 * 30 / 3600)
    assert llm["FAILURE"] == pytest.approx(4 * 40 / 3600)  # llm-0 stopped with the gang
