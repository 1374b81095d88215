"""A real server stopped while a real agent's worker steps: what the agent measured meanwhile
reaches the server when it is back, in order, once (issue 20; seed L-34)."""

from __future__ import annotations

import time

from tests.support import WORKLOAD_PYTHON
from tests.support.processes import Cluster

STEPS = (
    "import time, astraeus_progress\n"
    "for i in range(56):\n"
    "    astraeus_progress.report(i)\n"
    "    time.sleep(0.5)\n"
)


def test_samples_taken_while_the_server_is_away_arrive_when_it_is_back(cluster: Cluster) -> None:
    cluster.agent("m1").start()
    cluster.submit(
        name="stepper", gpus=1, restart_policy="never", command=[WORKLOAD_PYTHON, "-c", STEPS]
    )
    cluster.wait("running", lambda: cluster.status("stepper") == "Running")
    time.sleep(3)
    assert cluster.server.process is not None
    cluster.server.process.kill()  # kill -9: the agent just loses its stream
    cluster.server.process.wait()
    away_from = time.time()
    time.sleep(14)
    away_to = time.time()
    cluster.server.start()
    cluster.wait("completed", lambda: cluster.status("stepper") == "Completed", seconds=90)

    busy = cluster.get(
        "/metrics/range?metric=task_gpu_utilization_ratio&match=run:stepper"
        f"&start={int(away_from * 1000) - 60_000}&end={int(time.time() * 1000)}&step=1s"
    )
    points = busy["series"][0]["points"]
    during = [(t, v) for t, v in points if away_from * 1000 + 1000 <= t <= away_to * 1000 - 1000]
    # One sample a second (--sample 1) while the server was away: every one of them arrived.
    assert len(during) >= 10, (len(during), away_to - away_from)
    assert all(v == 0.95 for _, v in during)  # the workload stepped throughout
    times = [t for t, _ in points]
    assert times == sorted(times) and len(times) == len(set(times))
