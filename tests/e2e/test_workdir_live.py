"""A run's code shipped with it (issue 41, `astra astraeus submit --workdir`), live on `astraeus
up` and its local agent: a folder holding train.py runs on a machine that never had it (the
agent's own data folder, the workload's own working folder), as a user would submit it; what
.gitignore and .astraeusignore leave out never leaves the laptop; the same folder twice is
stored once; an oversized or ignored-only folder is refused before anything is sent; another
workspace can neither read it, name it in a run, nor fetch it; and a forged agent gets it for no
worker but its own."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc

from tests.e2e.live import Api, Server, serving
from tests.support import WORKLOAD_PYTHON
from tests.support.http import HTTP
from tests.support.processes import ASTRA
from tests.support.waiting import wait_for

TRAIN = """\
import os, pathlib, sys

files = sorted(str(p) for p in pathlib.Path(".").rglob("*") if p.is_file())
from helpers.words import greeting

print(greeting(), "from", pathlib.Path.cwd().name, flush=True)
print("files:", files, flush=True)
print("config:", open("config.json").read().strip(), flush=True)
print("owner is me:", os.stat("train.py").st_uid == os.getuid(), flush=True)
sys.exit(0)
"""


def workdir(root: Path) -> Path:
    """A user's project: code, a config, a data folder and a cache git ignores, a secret the
    user keeps out with .astraeusignore."""
    folder = root / "project"
    (folder / "helpers").mkdir(parents=True)
    (folder / "data").mkdir()
    (folder / "__pycache__").mkdir()
    (folder / "train.py").write_text(TRAIN)
    (folder / "helpers" / "__init__.py").write_text("")
    (folder / "helpers" / "words.py").write_text("def greeting():\n    return 'hello'\n")
    (folder / "config.json").write_text('{"lr": 0.001}\n')
    (folder / "data" / "shard-0.bin").write_bytes(b"\0" * 4096)
    (folder / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (folder / ".gitignore").write_text("data/\n__pycache__/\n")
    (folder / "wandb.key").write_text("secret\n")
    (folder / ".astraeusignore").write_text("wandb.key\n")
    return folder


class User(Api):
    def run(self, name: str) -> dict[str, Any]:
        found = self.graphql(
            "query($n: String!) { run(name: $n) { state reason spec "
            "code { digest size files archiveBytes stored } } }",
            n=name,
        )
        return dict(found["run"])

    def astra(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [ASTRA, "astraeus", *args],
            env=self.server.env_for(self.token),
            capture_output=True,
            text=True,
            check=check,
        )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, User, User]]:
    root = tmp_path_factory.mktemp("workdir")
    with serving(root / "data") as (server, _):
        server.cli("workspace", "create", "team-b")
        bob = server.cli("token", "create", "--workspace", "team-b", "--user", "bob").split()[-1]
        yield server, User(server, server.admin_token), User(server, bob)


def spec_file(root: Path, name: str) -> Path:
    path = root / f"{name}.json"
    path.write_text(json.dumps({"name": name, "command": [WORKLOAD_PYTHON, "train.py"]}))
    return path


def ended(user: User, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while (run := user.run(name))["state"] not in ("Completed", "Failed", "Stopped"):
        assert time.monotonic() < deadline, run
        time.sleep(0.5)
    return run


def test_a_folder_holding_train_py_runs_on_a_machine_that_never_had_it(
    live: tuple[Server, User, User], tmp_path: Path
) -> None:
    server, alice, _ = live
    folder = workdir(tmp_path)
    sent = alice.astra("submit", str(spec_file(tmp_path, "shipped")), "--workdir", str(folder))
    assert sent.stdout.startswith("shipped: Pending")
    said = sent.stderr.strip()
    assert said.startswith("astra: code sha256:") and said.endswith(" uploaded"), said
    assert "(6 files, 0.5 KiB)" in said  # the code, its config and both ignore files

    run = ended(alice, "shipped")
    assert run["state"] == "Completed", run
    code = run["code"]
    assert code["digest"] == run["spec"]["code"] and code["stored"] and code["files"] == 6
    log = alice.get("/tasks/shipped-0/logs?tail=100")["logs"].splitlines()
    assert log[0] == "hello from code"  # its command started in its own copy of the folder
    assert log[1] == (
        "files: ['.astraeusignore', '.gitignore', 'config.json', 'helpers/__init__.py', "
        "'helpers/words.py', 'train.py']"
    )  # no data/, no __pycache__/, no wandb.key
    assert log[2:] == ['config: {"lr": 0.001}', "owner is me: True"]
    job = alice.get("/jobs/shipped")
    assert job["code"] == {
        "digest": code["digest"],
        "size": code["size"],
        "files": 6,
        "stored": True,
    }
    # the machine keeps it by digest, the agent's alone; the worker's copy went with it
    cached = server.data_dir / "agent" / "code" / f"{code['digest'].removeprefix('sha256:')}.tar.gz"
    assert cached.is_file() and cached.stat().st_mode & 0o077 == 0
    assert (cached.parent.stat().st_mode & 0o777) == 0o700


def test_the_same_folder_twice_is_stored_once_and_run_again_keeps_it(
    live: tuple[Server, User, User], tmp_path: Path
) -> None:
    server, alice, _ = live
    folder = workdir(tmp_path)
    first = alice.astra("submit", str(spec_file(tmp_path, "twice-a")), "--workdir", str(folder))
    second = alice.astra("submit", str(spec_file(tmp_path, "twice-b")), "--workdir", str(folder))
    digest = first.stderr.split()[2]
    assert second.stderr.split()[2] == digest
    assert second.stderr.strip().endswith("already stored")
    with sqlite3.connect(server.data_dir / "astraeus.db") as db:
        rows = db.execute(
            "SELECT count(*) FROM code_archives WHERE digest = ?", (digest.removeprefix("sha256:"),)
        ).fetchone()
    assert rows == (1,)
    # Run again: the stored spec names the code, and a run of it ships it again
    again = alice.graphql(
        'mutation { runAgain(name: "twice-a", newName: "twice-again") { errors { message } } }'
    )
    assert again["runAgain"]["errors"] == []
    assert alice.run("twice-again")["code"]["digest"] == digest
    for name in ("twice-a", "twice-b", "twice-again"):
        assert ended(alice, name)["state"] == "Completed"


def test_an_oversized_or_ignored_only_folder_is_refused_before_anything_is_sent(
    live: tuple[Server, User, User], tmp_path: Path
) -> None:
    _, alice, _ = live
    empty = tmp_path / "ignored"
    (empty / "out").mkdir(parents=True)
    (empty / "out" / "model.pt").write_bytes(b"\0" * 10)
    (empty / ".gitignore").write_text("out/\n.gitignore\n")
    refused = alice.astra(
        "submit", str(spec_file(tmp_path, "nothing")), "--workdir", str(empty), check=False
    )
    assert refused.returncode == 2
    assert (
        "nothing to send: it has no file that .gitignore or .astraeusignore leaves in"
        in refused.stderr
    )

    big = tmp_path / "big"
    big.mkdir()
    (big / "train.py").write_text("print('hi')\n")
    (big / "weights.bin").write_bytes(b"\1" * (3 * 2**20))
    env = alice.server.env_for(alice.token) | {"ASTRA_WORKDIR_LIMIT_MIB": "2"}
    over = subprocess.run(
        [ASTRA, "astraeus", "submit", str(spec_file(tmp_path, "big")), "--workdir", str(big)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert over.returncode == 2
    assert (
        "3.0 MiB to send, over the limit of 2.0 MiB: its biggest files are weights.bin (3.0 MiB)"
        in over.stderr
    )
    for name in ("nothing", "big"):  # no run made
        assert alice.graphql("query($n: String!) { run(name: $n) { name } }", n=name)["run"] is None


def test_another_workspace_can_neither_read_name_nor_fetch_it(
    live: tuple[Server, User, User], tmp_path: Path
) -> None:
    server, alice, bob = live
    folder = workdir(tmp_path)
    sent = alice.astra("submit", str(spec_file(tmp_path, "private")), "--workdir", str(folder))
    digest = sent.stderr.split()[2]
    assert ended(alice, "private")["state"] == "Completed"

    assert (
        HTTP.get(f"{server.url}/v1/code/{digest}", headers=bob.headers, timeout=10).status_code
        == 404
    )
    assert alice.get(f"/code/{digest}")["digest"] == digest
    made = bob.graphql(
        "mutation($s: JSON!) { createRun(spec: $s) { errors { field message } } }",
        s={"name": "stolen", "command": [WORKLOAD_PYTHON, "train.py"], "code": digest},
    )["createRun"]["errors"]
    assert made == [
        {
            "field": "code",
            "message": f"no code {digest[:19]}… in this workspace: upload it first (astra "
            "astraeus submit --workdir FOLDER does both)",
        }
    ]
    # the same folder uploaded by team-b is its own copy, and its run works
    theirs = bob.astra("submit", str(spec_file(tmp_path, "theirs")), "--workdir", str(folder))
    assert theirs.stderr.split()[2] == digest and theirs.stderr.strip().endswith(" uploaded")
    assert ended(bob, "theirs")["state"] == "Completed"


def test_a_forged_agent_gets_the_code_for_no_worker_but_its_own(
    live: tuple[Server, User, User], tmp_path: Path
) -> None:
    server, alice, _ = live
    folder = workdir(tmp_path)
    (folder / "train.py").write_text("import time\ntime.sleep(600)\n")
    sent = alice.astra("submit", str(spec_file(tmp_path, "held")), "--workdir", str(folder))
    digest = sent.stderr.split()[2]
    wait_for("held running", lambda: alice.run("held")["state"] == "Running")
    with sqlite3.connect(server.data_dir / "astraeus.db") as db:
        worker_id, attempt = db.execute(
            "SELECT id, attempt FROM workers WHERE name = 'held-0'"
        ).fetchone()
    local = (server.data_dir / "agent" / "machine-credential").read_text().strip()
    join = server.cli("agent-token", "create", "--uses", "1", "--expires", "1h").strip()

    async def fetch(token: str, machine: str, **asked: Any) -> tuple[grpc.StatusCode, bytes]:
        request = {"worker_id": worker_id, "attempt": attempt, "digest": digest} | asked
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.agent_port}") as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            call = stub.FetchCode(
                agent_pb2.CodeRequest(machine=machine, **request),
                metadata=(("authorization", f"Bearer {token}"),),
            )
            data = b""
            try:
                async for chunk in call:
                    data += chunk.data
            except grpc.aio.AioRpcError as error:
                return error.code(), data
            return grpc.StatusCode.OK, data

    async def attacks() -> list[grpc.StatusCode]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.agent_port}") as channel:
            evil = await agent_pb2_grpc.AgentStub(channel).Join(
                agent_pb2.JoinRequest(machine="evil"),
                metadata=(("authorization", f"Bearer {join}"),),
            )
        return [
            (await fetch(evil.credential, "evil"))[0],  # a machine the worker is not on
            (await fetch(evil.credential, "local"))[0],  # posing as the worker's machine
            (await fetch(join, "local"))[0],  # a join token is no machine
            (await fetch(alice.token, "local"))[0],  # nor a user's token
            (await fetch(local, "local", attempt=attempt + 1))[0],  # not this attempt
            (await fetch(local, "local", worker_id=worker_id + 1000))[0],  # not its worker
            (await fetch(local, "local", digest="sha256:" + "0" * 64))[0],  # not its run's code
        ]

    assert asyncio.run(attacks()) == [
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.NOT_FOUND,
    ]
    # the machine the worker is on, for it: the archive whose SHA-256 is its digest
    code, data = asyncio.run(fetch(local, "local"))
    assert code == grpc.StatusCode.OK
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
    alice.astra("stop", "held")
