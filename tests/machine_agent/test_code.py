"""A run's code on the machine (issue 41, agent/code.py): fetched once a digest over the agent's
channel and kept only when its SHA-256 is the digest (a server, or anything posing as one,
that sends other bytes is refused), unpacked by tarfile's data filter (nothing outside the
worker's folder), handed to the workload's user without following a link, and the cache kept
within its size, the least recently used going first."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc

from agent import code
from agent.config import AgentConfig
from agent.gpus import simulated
from agent.identity import WorkloadUsers
from backend.cli.astra.workdir import pack
from tests.support.archives import crafted, entry


def config(tmp_path: Path, server: str = "127.0.0.1:1") -> AgentConfig:
    return AgentConfig(
        server=server,
        token="astm_" + "x" * 40,
        machine="gpu-07",
        data_dir=tmp_path / "data",
        gpus=simulated(1, "gpu-07"),
        cpu_cores=8,
        memory_bytes=2**30,
        prepare_poll_seconds=0.05,
        users=WorkloadUsers(switch=False),
    )


def cache_server(found: AgentConfig) -> code.Server:
    """The server as the agent's preparation reaches it (agent/preparation.py)."""
    return code.Server(
        lambda: found.transport.channel(found.server), found.kept_credential, found.machine
    )


def archive(folder: Path, name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> Path:
    """A train.py, and beside it one crafted entry."""
    path = folder / "crafted.tar.gz"
    path.write_bytes(crafted(entry("train.py"), entry(name, kind, link)))
    return path


@pytest.mark.parametrize(
    ("name", "kind", "link"),
    [
        ("../escaped.py", tarfile.REGTYPE, ""),
        ("out", tarfile.SYMTYPE, "/etc"),
        ("up", tarfile.SYMTYPE, "../../.."),
        ("null", tarfile.CHRTYPE, ""),
    ],
)
def test_an_archive_that_would_leave_its_folder_is_not_unpacked(
    tmp_path: Path, name: str, kind: bytes, link: str
) -> None:
    into = tmp_path / "worker" / "code"
    into.parent.mkdir()
    with pytest.raises(code.CodeRefused, match="its code could not be unpacked"):
        code.unpack(archive(tmp_path, name, kind, link), into)
    assert not into.exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["crafted.tar.gz", "worker"]


def test_an_absolute_name_is_unpacked_inside_its_folder(tmp_path: Path) -> None:
    into = tmp_path / "worker" / "code"
    into.parent.mkdir()
    absolute = f"{tmp_path}/absolute.py"
    code.unpack(archive(tmp_path, absolute), into)
    assert (into / absolute.lstrip("/")).is_file()  # its leading / stripped
    assert not Path(absolute).exists()


def test_code_is_unpacked_and_handed_to_the_workloads_user_without_following_links(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "train.py").write_text("print('hi')\n")
    (project / "run.sh").write_text("#!/bin/sh\n")
    (project / "run.sh").chmod(0o755)
    (project / "pkg" / "model.py").write_text("x = 1\n")
    (project / "model").symlink_to("pkg/model.py")
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(pack(project).archive)
    staged, home = tmp_path / "worker" / "code", tmp_path / "home" / "code"
    staged.parent.mkdir()
    home.parent.mkdir()
    code.unpack(archive, staged)
    outside = tmp_path / "outside.txt"
    outside.write_text("the agent's")
    code.hand_over(staged, home, (54321, 54321))
    assert not staged.exists()
    found = {str(p.relative_to(home)): p.lstat() for p in home.rglob("*")}
    assert sorted(found) == ["model", "pkg", "pkg/model.py", "run.sh", "train.py"]
    assert {(s.st_uid, s.st_gid) for s in found.values()} == {(54321, 54321)}
    assert home.lstat().st_uid == 54321
    assert os.readlink(home / "model") == "pkg/model.py"
    assert found["run.sh"].st_mode & 0o777 == 0o755 and found["train.py"].st_mode & 0o777 == 0o644
    assert outside.stat().st_uid == os.getuid()


def test_the_cache_keeps_to_its_size_the_least_recently_used_going_first(tmp_path: Path) -> None:
    cache = code.CodeCache(tmp_path / "code", cache_server(config(tmp_path)), limit=250)
    cache.root.mkdir(parents=True)
    for age, name in enumerate(("c" * 64, "b" * 64, "a" * 64)):  # c the oldest
        path = cache.path(name)
        path.write_bytes(b"\0" * 100)
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    newest = cache.path("d" * 64)
    newest.write_bytes(b"\0" * 100)
    cache.unpacking[cache.path("c" * 64).name] += 1  # being unpacked for a worker: it stays
    cache._evict(keep=newest)
    assert sorted(p.name[:1] for p in cache.root.glob("*.tar.gz")) == ["c", "d"]


class Posing(agent_pb2_grpc.AgentServicer):
    """Anything answering as the server: it sends ``data`` for whatever is asked."""

    def __init__(self, data: bytes, status: grpc.StatusCode | None = None) -> None:
        self.data, self.status, self.asked = data, status, 0

    async def FetchCode(
        self, request: agent_pb2.CodeRequest, context: Any
    ) -> AsyncIterator[agent_pb2.CodeChunk]:
        self.asked += 1
        if self.status is not None:
            await context.abort(self.status, "No such code for a worker of this machine.")
        yield agent_pb2.CodeChunk(data=self.data, archive_bytes=len(self.data))


async def fetched(tmp_path: Path, answer: Posing, digest: str) -> tuple[Path | str, list[Any]]:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(answer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    told: list[Any] = []
    try:
        found = config(tmp_path, f"127.0.0.1:{port}")
        cache = code.CodeCache(found.code_root, cache_server(found), 0.05)
        try:
            return await cache.archive(7, 1, digest, lambda *a: told.append(a)), told
        except code.CodeRefused as refused:
            return str(refused), told
    finally:
        await server.stop(None)


async def test_bytes_whose_sha256_is_not_the_digest_are_never_kept(tmp_path: Path) -> None:
    good = b"the archive"
    digest = "sha256:" + hashlib.sha256(good).hexdigest()
    other = Posing(b"another archive")
    said, _ = await fetched(tmp_path, other, digest)
    assert said == f"its code {digest[:19]}… arrived 3 times with another SHA-256 than its digest"
    assert other.asked == 3
    assert list((tmp_path / "data" / "code").iterdir()) == []  # nothing kept, no partial left

    path, told = await fetched(tmp_path, Posing(good), digest)
    assert isinstance(path, Path) and path.read_bytes() == good
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert told == [(0, 0), (len(good), len(good))]
    # kept: the next worker of that code fetches nothing
    again, _ = await fetched(tmp_path, Posing(b"", grpc.StatusCode.NOT_FOUND), digest)
    assert again == path


async def test_a_refusal_ends_the_wait_at_once_saying_what_the_server_said(tmp_path: Path) -> None:
    digest = "sha256:" + "e" * 64
    refusing = Posing(b"", grpc.StatusCode.NOT_FOUND)
    said, _ = await fetched(tmp_path, refusing, digest)
    assert said == (
        f"its code {digest[:19]}… could not be fetched: the server said No such code for a "
        "worker of this machine."
    )
    assert refusing.asked == 1
    with pytest.raises(code.CodeRefused, match="is not sha256: and 64 hexadecimal digits"):
        code.hex_of("sha256:../../etc")
    await asyncio.sleep(0)
