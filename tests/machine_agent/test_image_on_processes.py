"""`image` on a cluster whose agents run processes: the run does not start, and says why (issue
20). Before, the process executor ignored the image: a run naming one that does not exist
completed, run on the host."""

from __future__ import annotations

import time

from tests.support import WORKLOAD_PYTHON
from tests.support.processes import Cluster

SENTENCE = (
    "No machine runs containers: this cluster's agents run processes; drop image or add a "
    "machine with --executor docker"
)


def test_a_run_naming_an_image_stays_pending_with_the_reason(cluster: Cluster) -> None:
    cluster.agent("m1").start()
    cluster.submit(
        name="in-a-box",
        gpus=1,
        image="registry.invalid/no-such-image:1",
        command=[WORKLOAD_PYTHON, "-c", "print('ran on the host')"],
    )
    cluster.submit(name="on-the-host", gpus=1, command=[WORKLOAD_PYTHON, "-c", "print('ok')"])
    cluster.wait("on-the-host completed", lambda: cluster.status("on-the-host") == "Completed")
    time.sleep(2)  # passes after the machine joined
    job = cluster.get("/jobs/in-a-box")
    assert (job["status"], job["reason"]) == ("Pending", SENTENCE)
    machines = cluster.graphql("{ machines { name executor } }")["machines"]
    assert machines == [{"name": "m1", "executor": "process"}]
