"""What a machine says it enforces of its workers' sandbox (issue 37), in the words `machines`
shows: every part, some parts, none (an agent that is not root), or nothing said."""

from __future__ import annotations

from backend.machines.rules import (
    ISOLATION_PARTS,
    isolation_not_enforced,
    isolation_sentence,
)

EVERY = {"enforced": list(ISOLATION_PARTS), "pids_max": 8192}


def test_a_machine_that_enforces_every_part_says_each_and_its_limit() -> None:
    assert isolation_not_enforced("process", EVERY) == []
    assert isolation_sentence("process", EVERY) == (
        "Enforced: its own unprivileged user, a private /tmp and /var/tmp, a private /dev/shm, "
        "only its own processes in /proc, its own IPC namespace, at most 8192 processes and "
        "threads, its user id cleaned before another workspace gets it"
    )


def test_a_machine_without_a_part_says_which_it_does_not_enforce() -> None:
    # a kernel before 5.8 (no hidepid=invisible) and no pids controller
    some = {
        "enforced": [
            "unprivileged_user",
            "private_tmp",
            "private_shm",
            "private_ipc",
            "uid_handover",
        ],
        "pids_max": 0,
    }
    assert isolation_not_enforced("process", some) == ["hidden_processes", "process_limit"]
    assert isolation_sentence("process", some).endswith(
        ". Not enforced: only its own processes in /proc, a process limit"
    )


def test_an_agent_that_is_not_root_enforces_nothing_and_says_so() -> None:
    none = {"enforced": [], "pids_max": 0}
    assert isolation_not_enforced("process", none) == list(ISOLATION_PARTS)
    assert isolation_sentence("process", none).startswith("Nothing enforced. Not enforced: ")


def test_an_agent_before_the_sandbox_is_taken_to_enforce_nothing() -> None:
    assert isolation_not_enforced("process", None) == list(ISOLATION_PARTS)
    assert "nothing is enforced" in isolation_sentence("process", None)


def test_a_slurm_node_has_slurms_own() -> None:
    assert isolation_not_enforced("slurm", None) == []
    assert (
        isolation_sentence("slurm", None) == "Slurm's own (its cgroup and job_container settings)"
    )
