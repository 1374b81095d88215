"""A restart on the Docker executor starts a new container (seed L-18), whose log replaces the
last one's (seed L-20): real containers, only where a Docker engine's socket exists. Without
one, the same seed rows are checked on the process agent, a restart being a new process there:
tests/logs/test_on_the_machine.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import docker
from agent.docker import ContainerWorker
from agent.executor import EndCause, Exit
from agent.logs import WorkerLog
from agent.start import StartSpec

IMAGE = "busybox:1.36"

needs_engine = pytest.mark.skipif(
    not docker.on_engine(),
    reason=(
        "seed L-18, L-20: a new container for each attempt needs a Docker engine (none here); "
        "the process agent's restart (a new process, its log replacing the last) is checked in "
        "tests/logs/test_on_the_machine.py"
    ),
)


def attempt(tmp_path: Path, number: int, script: str) -> ContainerWorker:
    """Worker 9020's attempt ``number``, as the agent makes one for each start command: the
    same worker (its id, its log's folder), a new attempt."""
    start = StartSpec(
        worker="e2e-restart", image=IMAGE, attempt=number, command=("sh", "-c", script)
    )
    return ContainerWorker(
        9020, start, WorkerLog(tmp_path / "logs", "9020"), tmp_path / "workers" / "9020"
    )


async def release(worker: ContainerWorker) -> None:
    worker.release()
    await docker.removals_done()


@needs_engine
async def test_a_restart_starts_a_new_container_whose_log_replaces_the_last(
    tmp_path: Path,
) -> None:
    # seed L-18: a restart starts a new container; seed L-20: its log replaces what is shown
    first = attempt(tmp_path, 1, "echo first attempt; exit 1")
    first.keep()
    assert await first.prepare() is None
    await first.start()
    assert await first.wait() == Exit(1, EndCause.EXITED)
    before = first.container_id
    assert before is not None
    await release(first)

    second = attempt(tmp_path, 2, "echo next attempt")
    second.keep()
    assert await second.prepare() is None
    await second.start()
    assert await second.wait() == Exit(0, EndCause.EXITED)
    assert second.container_id is not None and second.container_id != before
    assert second.log.tail(10) == ("next attempt\n", False)
    await release(second)
