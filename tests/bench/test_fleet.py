"""The fleet simulator (bench/fleet.py) itself, against a live `astraeus serve`: five simulated
machines join with one join token of five uses, each gets its own credential and stream, holds
its lease, and runs the workers it is given to their end (one of them failing)."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from bench.common import ADMIN_URL
from bench.fleet import Fleet, database_figures, serving, submit


def _postgres() -> bool:
    try:
        psycopg.connect(ADMIN_URL, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


pytestmark = pytest.mark.skipif(not _postgres(), reason="no PostgreSQL at " + ADMIN_URL)


def test_five_simulated_machines_join_hold_their_leases_and_run_workers() -> None:
    with serving() as (server, database):

        async def play() -> tuple[Fleet, list[str], dict[str, str]]:
            fleet = Fleet(f"127.0.0.1:{server.agent_port}", server.join_token(5), 5, gpus=2)
            await fleet.start()
            await fleet.all_connected(30)
            specs = [
                {
                    "name": f"sim-{i}",
                    "gpus": 2,
                    "command": ["simulated"],
                    "environment": {"SIM_SECONDS": "3", "SIM_EXIT": "1" if i == 0 else "0"},
                    "restart_policy": "never",
                }
                for i in range(5)
            ]
            _, errors = await submit(server.url, server.admin, specs, clients=2)
            states: dict[str, str] = {}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with psycopg.connect(database) as conn:
                    states = dict(conn.execute("SELECT name, state FROM runs").fetchall())
                if len(states) == 5 and all(s in ("Completed", "Failed") for s in states.values()):
                    break
                await asyncio.sleep(0.5)
            await fleet.close()
            return fleet, errors, states

        fleet, errors, states = asyncio.run(play())
        c = fleet.counters
        assert errors == []
        assert (c.joined, c.welcomed, c.streams_lost, c.errors) == (5, 5, 0, [])
        assert len({m.credential for m in fleet.machines}) == 5
        assert (c.started, c.running, c.exited) == (5, 5, 5)
        assert c.lines >= 5 * 2
        assert states == {f"sim-{i}": "Failed" if i == 0 else "Completed" for i in range(5)}
        figures = database_figures(database)
        assert (figures["machines_not_ready"], figures["workers_lost_to_leases"]) == (0, 0)
