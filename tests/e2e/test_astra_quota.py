"""`astra astraeus quota show | set` and `astra astraeus threshold show` against a live server
(issue 21, seed L-62): each tried with a token of another workspace and another organisation."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from backend import migrations
from backend.cli.astra.client import EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_USAGE
from backend.db import Database
from tests.e2e.live import Server, serving
from tests.support import FakeClock, Tenancy, make_tenancy

ASTRA = str(Path(sys.executable).parent / "astra")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Tenancy]]:
    data_dir = tmp_path_factory.mktemp("astra-quota") / "data"
    data_dir.mkdir(parents=True)
    url = f"sqlite:///{data_dir / 'astraeus.db'}"
    migrations.upgrade(url)

    async def tenancy() -> Tenancy:
        db = Database.from_url(url)
        try:
            return await make_tenancy(db, FakeClock(datetime.now(UTC)))
        finally:
            await db.dispose()

    found = asyncio.run(tenancy())
    with serving(data_dir, local_agent=False, run_jobs="false") as (server, _):
        yield server, found


def astra(server: Server, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = server.env_for(token)
    env["HOME"] = str(server.log.parent)
    return subprocess.run(
        [ASTRA, "astraeus", *args], env=env, capture_output=True, text=True, check=False
    )


def test_quota_set_by_admins_and_shown_to_each_its_own(live: tuple[Server, Tenancy]) -> None:
    # seed L-62
    server, t = live
    done = astra(server, t.admin_token, "quota", "set", "4", "--workspace", "default")
    assert (done.returncode, done.stdout) == (0, "default's GPU quota on local: 4 GPUs\n")
    assert astra(server, t.admin_token, "quota", "set", "1", "--workspace", "team-b").stdout == (
        "team-b's GPU quota on local: 1 GPU\n"
    )
    mine = astra(server, t.member_token, "quota", "show")
    assert (mine.returncode, mine.stdout) == (0, "default's GPU quota on local: 4 GPUs\n")
    as_json = json.loads(astra(server, t.other_token, "quota", "show", "--json").stdout)
    assert as_json == {"workspace": "team-b", "cluster": "local", "gpus": 1}
    admin = astra(server, t.admin_token, "quota", "show", "--workspace", "team-b")
    assert admin.stdout == "team-b's GPU quota on local: 1 GPU\n"

    # Another workspace's member is refused default's; another organisation's, team-b's.
    for token, workspace in ((t.other_token, "default"), (t.foreign_token, "team-b")):
        theirs = astra(server, token, "quota", "show", "--workspace", workspace)
        assert theirs.returncode == EXIT_REFUSED, theirs
        assert "own workspace's quota" in theirs.stderr
        write = astra(server, token, "quota", "set", "9", "--workspace", workspace)
        assert write.returncode == EXIT_REFUSED, write
        assert "admins" in write.stderr
    foreign = astra(server, t.foreign_token, "quota", "show")
    assert foreign.stdout == "default has no GPU quota on local\n"  # its own organisation's

    lifted = astra(server, t.admin_token, "quota", "set", "none", "--workspace", "default")
    assert lifted.stdout == "default has no GPU quota on local\n"
    assert astra(server, t.member_token, "quota", "show").stdout == lifted.stdout


def test_quota_bad_input_names_the_field(live: tuple[Server, Tenancy]) -> None:
    server, t = live
    negative = astra(server, t.admin_token, "quota", "set", "-1", "--workspace", "default")
    assert negative.returncode == EXIT_USAGE and "gpus" in negative.stderr
    missing = astra(server, t.admin_token, "quota", "set", "--workspace", "default")
    assert missing.returncode == EXIT_USAGE and "GPU count" in missing.stderr
    nowhere = astra(server, t.admin_token, "quota", "show", "--cluster", "nowhere")
    assert nowhere.returncode == EXIT_NOT_FOUND
    assert "No cluster named 'nowhere'" in nowhere.stderr


def test_threshold_show_is_the_admins(live: tuple[Server, Tenancy]) -> None:
    server, t = live
    shown = astra(server, t.admin_token, "threshold", "show")
    assert shown.returncode == 0, shown
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["NAME", "VALUE", "DEFAULT", "SET"]
    assert lines[1].split() == ["goodput_drop.below", "0.5", "0.5", "default"]
    assert lines[-1].split() == ["slurm_import_lag", "300", "300", "default"]  # issue 38
    assert len(lines) == 8
    for token in (t.member_token, t.other_token, t.foreign_token):
        refused = astra(server, token, "threshold", "show")
        assert refused.returncode == EXIT_REFUSED
        assert "Only the organisation's admins read a cluster's alert thresholds." in (
            refused.stderr
        )
