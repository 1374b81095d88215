"""A user id goes to another workspace only once nothing of the last is left (issue 37 N2), and
two installs never give out the same ids (N9): agent/uid_handover.py, on real files, processes
and locks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import uid_handover
from agent.uid_handover import Ledger, RangeTaken, claim_range, clean, hand_over, processes_of
from tests.support.sandboxed import uid_range, workload_uids

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="files and processes of another user")


@pytest.fixture
def uid() -> int:
    return uid_range(workload_uids())[0]  # an id no other test or agent gives out


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    place = tmp_path / "shared"
    place.mkdir()
    place.chmod(0o1777)
    return place


def test_the_ledger_remembers_which_workspace_last_ran_under_an_id(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / uid_handover.LEDGER)
    ledger.record(3_000_001, 7)
    again = Ledger(tmp_path / uid_handover.LEDGER)
    assert again.same_workspace(3_000_001, 7)
    assert not again.same_workspace(3_000_001, 8)
    assert not again.same_workspace(3_000_002, 7)  # never used: no record, handed over
    assert (tmp_path / uid_handover.LEDGER).stat().st_mode & 0o777 == 0o600


@as_root
def test_what_an_id_owns_in_a_shared_place_goes_and_nothing_else(shared: Path, uid: int) -> None:
    mine = shared / "checkpoint.pt"
    mine.write_text("a's")
    os.chown(mine, uid, uid)
    folder = shared / "cache"
    folder.mkdir()
    (folder / "inner").write_text("a's too")
    os.chown(folder, uid, uid)
    open_folder = shared / "open"  # another's, anyone may write: the id could have, inside
    open_folder.mkdir()
    open_folder.chmod(0o1777)
    deep = open_folder / "left.txt"
    deep.write_text("a's")
    os.chown(deep, uid, uid)
    theirs = shared / "theirs.txt"
    theirs.write_text("root's")
    target = shared / "target"
    target.write_text("root's, behind a link of the id's")
    link = shared / "link"
    link.symlink_to(target)
    os.chown(link, uid, uid, follow_symlinks=False)
    assert clean(shared, uid) == []
    assert sorted(p.name for p in shared.iterdir()) == ["open", "target", "theirs.txt"]
    assert list(open_folder.iterdir()) == []
    assert target.read_text() == "root's, behind a link of the id's"


@as_root
def test_every_process_of_an_id_is_killed(uid: int) -> None:
    def become() -> None:
        os.setsid()
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    left = subprocess.Popen(["sleep", "600"], preexec_fn=become)
    try:
        assert processes_of(uid) == [left.pid]
        assert hand_over(uid, []) == []
        assert left.wait(timeout=10) == -9
        assert processes_of(uid) == []
    finally:
        left.kill()


@pytest.fixture
def claims(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "claims"


def _hold_elsewhere(uids: str, data_dir: Path, folder: Path) -> subprocess.Popen[bytes]:
    """An agent of another install holding its claim, in a process of its own."""
    code = (
        "import sys, time; from pathlib import Path; from agent.uid_handover import claim_range;"
        f"claim_range(({uids.replace('-', ',')}), Path({str(data_dir)!r}), Path({str(folder)!r}));"
        "print('held', flush=True); time.sleep(600)"
    )
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert other.stdout is not None and other.stdout.readline() == b"held\n"
    return other


def test_a_range_overlapping_a_live_claim_is_refused_naming_both(
    claims: Path, tmp_path: Path
) -> None:
    # issue 37 N9
    other = _hold_elsewhere("3000000-3000999", tmp_path / "first", claims)
    try:
        with pytest.raises(RangeTaken) as refused:
            claim_range((3_000_500, 3_001_499), tmp_path / "second", claims)
        assert str(refused.value) == (
            "astraeus agent: workload user ids 3000500-3001499 overlap 3000000-3000999, "
            f"claimed on this machine by the agent of data folder {tmp_path / 'first'} "
            f"(pid {other.pid}): two installs would run workloads as the same users; give this "
            "one a range of its own (--workload-uids FIRST-LAST)"
        )
        held = claim_range((3_001_000, 3_001_999), tmp_path / "third", claims)  # beside it
        os.close(held)
    finally:
        other.kill()
        other.wait()


def test_a_claim_whose_agent_is_gone_is_no_claim(claims: Path, tmp_path: Path) -> None:
    other = _hold_elsewhere("3000000-3000999", tmp_path / "first", claims)
    other.kill()
    other.wait()
    time.sleep(0.05)
    held = claim_range((3_000_000, 3_000_999), tmp_path / "second", claims)
    assert [p.name for p in claims.glob("*.claim")] == [f"3000000-3000999.{os.getpid()}.claim"]
    os.close(held)
