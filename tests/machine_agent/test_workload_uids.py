"""Which user id of the agent's range a worker runs as (agent/identity.py): its own, the same
at every attempt, so that what an attempt wrote (a checkpoint in a shared folder with the
sticky bit) the next can replace (issue 36: a DDP run resumed from its checkpoint, then failed
every save, "Operation not permitted", once other runs had let lower ids go)."""

from __future__ import annotations

import hashlib

import pytest

from agent.identity import NO_FREE_UID, WorkloadUsers, local_name, uid_seed
from agent.start import StartSpec

USERS = WorkloadUsers(uids=(2_000_000, 2_000_009), switch=True)


def test_a_worker_runs_as_its_own_id_whatever_other_workers_have_let_go() -> None:
    assert USERS.free_uid(set(), 7) == 2_000_007
    assert USERS.free_uid({2_000_000, 2_000_001}, 7) == 2_000_007
    assert USERS.free_uid(set(), 23) == 2_000_003  # its seed, modulo the range


def test_a_worker_whose_id_is_taken_runs_as_the_next_free_one_around_the_range() -> None:
    assert USERS.free_uid({2_000_007}, 7) == 2_000_008
    assert USERS.free_uid({2_000_008, 2_000_009}, 8) == 2_000_000


def test_a_range_all_taken_says_so() -> None:
    with pytest.raises(LookupError, match="No user id is free") as refused:
        USERS.free_uid(set(range(2_000_000, 2_000_010)), 3)
    assert str(refused.value) == NO_FREE_UID


KEY = "Z3lS0Nbz6fntndMhehv97A"  # a worker's opaque id, as the server sends it (worker_key)


def test_a_worker_sent_its_opaque_id_is_named_and_seated_by_it_not_by_its_number() -> None:
    # issue 37 N8: its folder, control group and user id would tell its workload its number
    keyed = StartSpec(worker_key=KEY)
    assert local_name(41, keyed) == KEY
    seed = uid_seed(41, keyed)
    assert seed == uid_seed(99, keyed)  # the key alone: every attempt, machine
    assert seed == int.from_bytes(hashlib.sha256(KEY.encode()).digest()[:8], "big") != 41
    # a server that sends none (or something else): the number, as before
    for kept in ({}, {"worker_key": "../../etc"}, {"worker_key": 7}, {"worker_key": "a" * 23}):
        spec = StartSpec.from_json(kept)
        assert local_name(41, spec) == "41" and uid_seed(41, spec) == 41
