"""Which user id of the agent's range a worker runs as (agent/identity.py): its own, the same
at every attempt, so that what an attempt wrote (a checkpoint in a shared folder with the
sticky bit) the next can replace (issue 36: a DDP run resumed from its checkpoint, then failed
every save, "Operation not permitted", once other runs had let lower ids go)."""

from __future__ import annotations

import pytest

from agent.identity import NO_FREE_UID, WorkloadUsers

USERS = WorkloadUsers(uids=(2_000_000, 2_000_009), switch=True)


def test_a_worker_runs_as_its_own_id_whatever_other_workers_have_let_go() -> None:
    assert USERS.free_uid(set(), 7) == 2_000_007
    assert USERS.free_uid({2_000_000, 2_000_001}, 7) == 2_000_007
    assert USERS.free_uid(set(), 23) == 2_000_003  # its server id, modulo the range


def test_a_worker_whose_id_is_taken_runs_as_the_next_free_one_around_the_range() -> None:
    assert USERS.free_uid({2_000_007}, 7) == 2_000_008
    assert USERS.free_uid({2_000_008, 2_000_009}, 8) == 2_000_000


def test_a_range_all_taken_says_so() -> None:
    with pytest.raises(LookupError, match="No user id is free") as refused:
        USERS.free_uid(set(range(2_000_000, 2_000_010)), 3)
    assert str(refused.value) == NO_FREE_UID
