"""`astraeus up` starts its local agent again when it dies, and its machine is not lost while
the server itself is fine (issue 17)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

from agent import instance
from agent.identity import WorkloadUsers, workload_dir
from backend.cli.local_agent import restart_backoff
from tests.e2e.live import Api, running, serving
from tests.support import WORKLOAD_PYTHON
from tests.support.waiting import alive, wait_for

TICKS = (
    "import os, time\n"
    "for i in range(120):\n"
    "    print(f'tick {i} pid {os.getpid()}', flush=True)\n"
    "    time.sleep(1)\n"
)
LEASE_S = 16  # over the agent's heartbeat (10 s), so that only a missing agent loses the machine


def agents_of(up: int) -> set[int]:
    """The live `astraeus agent` children of the `up` process (each thread has its own)."""
    found = set()
    for children in Path(f"/proc/{up}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for pid in children.read_text().split():
                with contextlib.suppress(OSError):
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    if b" agent " in command:  # a zombie's command line is empty
                        found.add(int(pid))
    return found


class TickerApi(Api):
    def workers(self) -> list[tuple[str, str]]:
        run = self.graphql('{ run(name: "ticker") { workers { state reason } } }')["run"]
        return [(w["state"], w["reason"]) for w in run["workers"]]

    def machines(self) -> list[tuple[str, str]]:
        return [
            (m["name"], m["state"]) for m in self.graphql("{ machines { name state } }")["machines"]
        ]

    def ticks(self) -> list[str]:
        return list(self.get("/tasks/ticker-0/logs?tail=1000")["logs"].splitlines())


def test_restart_delays_double_from_1s_to_30s_and_start_over_after_60s_up() -> None:
    restarts = restart_backoff()
    delays = [restarts.wait(0.5), *(restarts.wait(2) for _ in range(6))]
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert restarts.wait(59.9) == 30
    assert restarts.wait(60) == 1


def test_a_killed_local_agent_is_started_again_and_its_worker_and_machine_go_on(
    tmp_path: Path,
) -> None:
    # issue 17
    with running(tmp_path / "data", lease_time=f"{LEASE_S}s", scheduler_interval="1s") as live:
        server, token = live
        api = TickerApi(server, token)
        assert server.process is not None
        up = server.process.pid
        created = api.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }",
            s={
                "name": "ticker",
                "gpus": 1,
                "restart_policy": "never",
                "command": [WORKLOAD_PYTHON, "-c", TICKS],
            },
        )
        assert created["createRun"]["errors"] == []
        wait_for("the run running", lambda: api.get("/jobs/ticker")["status"] == "Running", 30)
        wait_for("its first tick", lambda: len(api.ticks()) >= 1, 10)
        workloads = workload_dir(server.data_dir / "agent", WorkloadUsers())
        (pid_file,) = workloads.glob("workers/*/worker.pid")
        worker_pid = int(pid_file.read_text())

        before = api.workers()
        assert [state for state, _ in before] == ["Running"], before
        (first,) = agents_of(up)
        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        wait_for("another agent", lambda: len(agents_of(up) - {first}) == 1, 10)
        (second,) = agents_of(up)
        assert "local agent exited with code -9; starting it again in 1s" in server.log.read_text()

        # Past a whole lease after the kill: the machine stays, the worker runs on.
        while time.monotonic() < killed + LEASE_S + 2:
            assert api.workers() == before  # never "Machine lost: its lease expired"
            assert api.machines() == [("local", "ready")]
            time.sleep(0.5)
        assert api.get("/jobs/ticker")["status"] == "Running"
        os.kill(worker_pid, 0)  # the same worker process, never started again
        ticks = api.ticks()
        assert len(ticks) >= LEASE_S + 2, ticks
        assert ticks == [f"tick {i} pid {worker_pid}" for i in range(len(ticks))]
        assert agents_of(up) == {second}

        # Killed -9, `up` leaves the agent it started again measuring, named in its data
        # folder (issue 36: tests/e2e/test_up_crash.py); the block's end ends it.
        server.process.kill()
        server.process.wait()
        assert alive(second) and instance.holder(server.data_dir / "agent") == second
        printed = server.log.read_text()
        assert len(re.findall("starting it again", printed)) == 1, printed
    assert not alive(second)


def test_an_agent_ending_with_up_is_not_started_again(tmp_path: Path) -> None:
    # issue 17: Ctrl-C in a terminal reaches `up` and its agent at once
    with serving(tmp_path / "data") as (server, _):
        assert server.process is not None
        up = server.process.pid
        wait_for("the agent", lambda: len(agents_of(up)) == 1, 10)
        (agent,) = agents_of(up)
        server.process.send_signal(signal.SIGINT)
        os.kill(agent, signal.SIGINT)
        assert server.process.wait(timeout=15) == 0
        assert not alive(agent)
        assert "starting it again" not in server.log.read_text()
