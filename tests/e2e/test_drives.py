"""Drives on the default install: `astraeus up` with no setting of ours (issue 36).

Before, every drive mount failed there: the server refused a relative path ("must be an
absolute path") and the agent, allowed no folder of the machine, refused an absolute one. Now
one rule holds for every machine, checked at submission: a relative path is under the worker's
own folder (every agent can put it there, touching nothing of the machine's); an absolute one
is where the machine's owner allows mounts (--mount-root, ASTRAEUS_AGENT_MOUNT_ROOTS), and a
machine that allows none says how to allow some. And a drive mounted read-only was writable by
the workload: now writing, creating, removing or changing anything in it fails, and the drive's
files are as they were.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.identity import WorkloadUsers, workload_dir
from tests.e2e.live import Server, running
from tests.support import WORKLOAD_PYTHON
from tests.support.http import HTTP
from tests.support.processes import job_when_ended, submit

# In the worker's own folder (its working folder), as a user writes it; and by its variable.
WRITER = (
    "import os\n"
    "open('ref/weights.bin', 'w').write('v1')\n"
    "open(os.path.join(os.environ['ASTRAEUS_DRIVE_REF'], 'notes.txt'), 'w').write('kept')\n"
    "print('wrote', sorted(os.listdir('ref')), flush=True)\n"
)
READER = (
    "import errno, os\n"
    "def attempt(what, act):\n"
    "    try:\n"
    "        act()\n"
    "        print(what, 'done', flush=True)\n"
    "    except OSError as error:\n"
    "        print(what, errno.errorcode[error.errno], flush=True)\n"
    "weights = 'models/ref/weights.bin'\n"
    "print('read', open(weights).read(), flush=True)\n"
    "attempt('write', lambda: open(weights, 'a').write('x'))\n"
    "attempt('create', lambda: open('models/ref/new.txt', 'x'))\n"
    "attempt('unlink', lambda: os.unlink(weights))\n"
    "attempt('chmod', lambda: os.chmod(weights, 0o777))\n"
    "by_variable = os.path.join(os.environ['ASTRAEUS_DRIVE_REF'], 'notes.txt')\n"
    "attempt('write by its variable', lambda: open(by_variable, 'w').write('gone'))\n"
    "attempt('write the other drive', lambda: open('out/result.txt', 'w').write('0.93'))\n"
)
OUTSIDE = (
    "mounts[0].path must be relative (under the worker's own folder) or under a folder this "
    "machine allows (none: its agent's --mount-root or ASTRAEUS_AGENT_MOUNT_ROOTS names them)"
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    with running(tmp_path_factory.mktemp("drives") / "data") as live:
        roots = ("ASTRAEUS_AGENT_MOUNT_ROOTS", "ASTRAEUS_AGENT_FILL_FROM_ROOTS")
        assert not any(k in live[0].env for k in roots)  # the default
        yield live


def run(live: tuple[Server, str], name: str, program: str, mounts: list[Any]) -> dict[str, Any]:
    spec = {"name": name, "command": [WORKLOAD_PYTHON, "-c", program], "mounts": mounts}
    submit(live, {**spec, "restart_policy": "never"})
    return job_when_ended(live, name)


def drive(server: Server, name: str) -> Path:
    """The drive's folder on the machine (one workspace: the first admin's)."""
    [workspace] = (workload_dir(server.data_dir / "agent", WorkloadUsers()) / "drives").iterdir()
    return workspace / name


def logs(live: tuple[Server, str], worker: str) -> list[str]:
    server, token = live
    answer = HTTP.get(
        f"{server.url}/v1/tasks/{worker}/logs",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    return list(answer.json()["logs"].splitlines())


def found(folder: Path) -> list[tuple[str, int, int, bytes]]:
    return [
        (p.name, p.lstat().st_mode, p.lstat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.iterdir())
        if stat.S_ISREG(p.lstat().st_mode)
    ]


@pytest.fixture(scope="module")
def written(live: tuple[Server, str]) -> dict[str, Any]:
    return run(live, "writer", WRITER, [{"drive": "ref", "path": "ref"}])


def test_a_relative_mount_works_on_the_default_install(
    live: tuple[Server, str], written: dict[str, Any]
) -> None:
    assert written["status"] == "Completed", written
    assert logs(live, "writer-0") == ["wrote ['notes.txt', 'weights.bin']"]
    folder = drive(live[0], "ref")
    assert [(n, data) for n, _, _, data in found(folder)] == [
        ("notes.txt", b"kept"),
        ("weights.bin", b"v1"),
    ]


def test_a_read_only_drive_refuses_writes(
    live: tuple[Server, str], written: dict[str, Any]
) -> None:
    before = found(drive(live[0], "ref"))
    mounts = [
        {"drive": "ref", "path": "models/ref", "read_only": True},
        {"drive": "out", "path": "out"},
    ]
    job = run(live, "reader", READER, mounts)
    assert job["status"] == "Completed", job
    assert logs(live, "reader-0") == [
        "read v1",
        "write EROFS",
        "create EROFS",
        "unlink EROFS",
        "chmod EROFS",
        "write by its variable EROFS",
        "write the other drive done",
    ]
    assert found(drive(live[0], "ref")) == before
    assert (drive(live[0], "out") / "result.txt").read_text() == "0.93"


def test_an_absolute_path_the_machine_does_not_allow_says_how_to_allow_it(
    live: tuple[Server, str], written: dict[str, Any]
) -> None:
    job = run(live, "elsewhere", "print('never')", [{"drive": "ref", "path": "/srv/ref"}])
    assert (job["status"], job["reason"]) == (
        "Failed",
        f"Worker elsewhere-0 failed on local: {OUTSIDE}; the gang does not run without it",
    )
    assert not os.path.lexists("/srv/ref")


def test_a_mount_path_that_climbs_out_is_refused_at_submission(live: tuple[Server, str]) -> None:
    server, token = live
    spec = {
        "name": "climber",
        "command": ["true"],
        "mounts": [{"drive": "ref", "path": "data"}, {"drive": "ref", "path": "../../etc/x"}],
    }
    answer = HTTP.post(
        f"{server.url}/graphql",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "query": "mutation($s: JSON!) { createRun(spec: $s) { run { name } "
            "errors { field message } } }",
            "variables": {"s": spec},
        },
        timeout=30,
    ).json()
    assert answer["data"]["createRun"] == {
        "run": None,
        "errors": [{"field": "mounts[1].path", "message": "must not contain '..'"}],
    }
    runs = HTTP.get(
        f"{server.url}/v1/jobs/climber", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert runs.status_code == 404
