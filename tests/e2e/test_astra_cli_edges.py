"""Issue 21: `astra astraeus` and `astraeus` at their edges, against a live server: a period
of 400 days, a reader that goes away, `gpus --json`'s fields, the weeks as one table, and the
server's commands before the first `astraeus up`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.cli.astra.main import EXIT_BROKEN_PIPE, GPUS
from tests.e2e.live import Server, running
from tests.support.http import HTTP

BIN = Path(sys.executable).parent
ASTRA = str(BIN / "astra")
ASTRAEUS = str(BIN / "astraeus")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    with running(tmp_path_factory.mktemp("astra-edges") / "data", local_agent=False) as live:
        yield live


def env(live: tuple[Server, str]) -> dict[str, str]:
    server, admin = live
    return {**server.env_for(admin), "HOME": str(server.log.parent)}


def astra(live: tuple[Server, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ASTRA, "astraeus", *args], env=env(live), capture_output=True, text=True)


def test_goodput_over_400_days(live: tuple[Server, str]) -> None:
    # seed G-32: a period is at most 400 days; 400 is (it said "a period is at most 400 days")
    done = astra(live, "goodput", "--days", "400")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("GPU-hours\n")
    over = astra(live, "goodput", "--days", "401")
    assert over.returncode != 0 and "a period is at most 400 days" in over.stderr


@pytest.mark.parametrize(
    "args", [("events", "--limit", "200"), ("goodput",), ("goodput", "--weeks", "8")]
)
def test_a_reader_that_went_away_ends_it_quietly(
    live: tuple[Server, str], args: tuple[str, ...]
) -> None:
    # `astra astraeus events --limit 200 | head -1` printed a BrokenPipeError's traceback:
    # the pipe's reader is gone before astra writes, as `head` is once it has its line
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [ASTRA, "astraeus", *args],
            env=env(live),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == EXIT_BROKEN_PIPE  # 128 + SIGPIPE, as a shell reports `head`'s


def test_events_into_head_as_a_user_types_it(live: tuple[Server, str]) -> None:
    shell = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {ASTRA} astraeus events --limit 200 | head -1"],
        env=env(live),
        capture_output=True,
        text=True,
    )
    assert len(shell.stdout.splitlines()) == 1  # the header: no run has an event yet
    assert "Traceback" not in shell.stderr and "BrokenPipe" not in shell.stderr


def test_gpus_json_gives_the_fields(live: tuple[Server, str]) -> None:
    # `gpus --json` was [{"line": …}] alone
    done = astra(live, "gpus", "--json")
    assert done.returncode == 0, done.stderr
    gpus = json.loads(done.stdout)
    assert isinstance(gpus, list)
    query = '{ __type(name: "Gpu") { fields { name } } }'
    server, admin = live
    known = HTTP.post(
        f"{server.url}/graphql",
        json={"query": query},
        headers={"Authorization": f"Bearer {admin}"},
    ).json()["data"]["__type"]["fields"]
    asked = set(GPUS.strip("{} ").split("{", 1)[1].split())
    assert asked == {f["name"] for f in known}  # every field of a GPU, not its line alone


def test_goodput_weeks_are_one_table(live: tuple[Server, str]) -> None:
    # seed G-25 `astra astraeus goodput --weeks 8 --by pool`: eight tables, seven empty, were
    # printed; one table of the seed's block, a row per week at least
    done = astra(live, "goodput", "--weeks", "8", "--by", "pool")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert done.stdout.count("GPU-hours") == 1
    assert lines[1].split()[:3] == ["WEEK", "POOL", "HELD"]
    weeks = [line.split()[0] for line in lines[2:-3]]
    assert len(weeks) == 8 and all("-W" in week for week in weeks)
    assert lines[-3].startswith("TOTAL ") and lines[-1].startswith("USED = productive")


@pytest.mark.parametrize(
    "args",
    [
        ("workspace", "create", "team-b"),
        ("token", "create", "--user", "alice", "--workspace", "team-b"),
    ],
)
def test_the_server_commands_before_the_first_up(tmp_path: Path, args: tuple[str, ...]) -> None:
    # `astraeus workspace create team-b` before `astraeus up` printed SQLAlchemy's traceback
    # ('unable to open database file')
    data = tmp_path / "data"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")} | {
        "ASTRAEUS_DATA_DIR": str(data),
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        [ASTRAEUS, *args], env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "sqlalchemy" not in done.stderr.lower()
    assert done.stderr == (
        f"astraeus: there is no Astraeus data in {data} yet: start it with `astraeus up` "
        "(it makes the database and the admin token), then run this again\n"
    )
    assert not (data / "astraeus.db").exists()  # nothing made behind `up`'s back
