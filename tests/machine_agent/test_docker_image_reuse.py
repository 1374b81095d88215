"""Later runs on a machine reuse the image an earlier one pulled (seed L-66): real containers,
only where a Docker engine's socket exists. The advice a run pulling its image gets is checked
without one: tests/graphql/test_failure_advice.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import docker
from agent.docker import ContainerWorker
from agent.logs import WorkerLog
from agent.start import StartSpec

IMAGE = "busybox:1.36"

needs_engine = pytest.mark.skipif(
    not docker.on_engine(),
    reason=(
        "seed L-66: an image pulled once and reused by later runs needs a Docker engine (none "
        "here); the advice for a run pulling its image is checked in "
        "tests/graphql/test_failure_advice.py"
    ),
)


def worker(tmp_path: Path, worker_id: int) -> ContainerWorker:
    start = StartSpec(worker=f"e2e-reuse-{worker_id}", image=IMAGE, attempt=1)
    key = str(worker_id)
    return ContainerWorker(
        worker_id, start, WorkerLog(tmp_path / "logs", key), tmp_path / "workers" / key
    )


@needs_engine
async def test_a_later_run_on_the_machine_reuses_the_image_without_pulling(
    tmp_path: Path,
) -> None:
    # seed L-66: the first worker has the image on the machine (pulled if it was not); the
    # next one, of another run, finds it there: it never reports Pulling
    first = worker(tmp_path, 9030)
    first.keep()
    assert await first.prepare() is None
    assert await first.engine.image(IMAGE) is not None
    reports: list[str] = []

    async def report(done: str) -> None:
        reports.append(done)

    later = worker(tmp_path, 9031)
    later.keep()
    assert await later.prepare(report) is None
    assert reports == []
    first.release()
    later.release()
    await docker.removals_done()
