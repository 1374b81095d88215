"""A one-worker run's reasons say "1 worker", never "1 workers" (issue 36), as the seed's
two-worker ones say "2 workers" (L-61, L-63)."""

from __future__ import annotations

from backend.scheduling.pending_reasons import machine_reasons
from backend.scheduling.rules import Quota
from backend.words import counted
from tests.support.scheduling import CLUSTER, ask, machine, run_plan


def test_a_count_names_one_or_many() -> None:
    assert [counted(n, "worker") for n in (0, 1, 2)] == ["0 workers", "1 worker", "2 workers"]
    assert counted(1, "GPU") == "1 GPU" and counted(3, "other") == "3 others"


def test_one_worker_over_its_quota_is_one_worker() -> None:
    quotas = {1: Quota("vision", CLUSTER, 2)}
    result = run_plan([ask(10, "llm", workers=1, gpus=4)], [machine(1, "n", gpus=16)], None, quotas)
    assert result.reasons == {
        10: "Cannot plan workers: 1 worker of 4 GPUs is more than vision's quota of 2 GPUs "
        "on gpu-east"
    }


def test_a_machine_with_room_for_a_one_worker_run_says_one_worker() -> None:
    reasons = machine_reasons(ask(10, "llm", workers=1, gpus=2), [machine(1, "node-a")])
    assert reasons == [("node-a", "room for 1 of its 1 worker")]
