"""A run's code on this machine (issue 41, ``astra astraeus submit --workdir``).

While a worker prepares, its run's archive is fetched from the server over the agent's own
authenticated channel (FetchCode, the machine's credential), its SHA-256 checked against the
digest its start named, and kept by digest in ``<data>/code/`` (the agent's alone, 0700): the
same code for another worker, of this run or a later one, is not fetched again. The least
recently used archives go once the cache is over its size. It is then unpacked into the worker's
runtime folder (``code/``, the agent's until its start), by the standard library's ``data``
filter (no absolute name, none leaving the folder, no link out of it, no device; no
set-user-id bits), and at its start moved into the worker's own folder and made its user's
(agent/executor.py, agent/docker.py), where its command starts. It goes with the worker's
folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger("astraeus.agent")

FOLDER = "code"  # in a worker's runtime folder, then in its own (home/, a container's run/)
PREFIX = "sha256:"
CACHE_BYTES = 4 * 2**30  # the archives kept, at most (the one in use beyond it)
MIB = 2**20
# Answers of the server after which trying again cannot help: the code is not this worker's.
REFUSED = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)
MISMATCHES_ALLOWED = 3


class CodeRefused(Exception):
    """The worker cannot have its code: the message says why (its end's detail)."""


# Told how far a fetch is: bytes received, of how many (0 before the first chunk).
Progress = Callable[[int, int], None]


def hex_of(digest: str) -> str:
    """The hex SHA-256 a start's ``code`` names; CodeRefused if it names none."""
    hex_digest = digest.removeprefix(PREFIX)
    if len(hex_digest) != 64 or not all(c in "0123456789abcdef" for c in hex_digest):
        raise CodeRefused(f"its code {digest[:80]!r} is not sha256: and 64 hexadecimal digits")
    return hex_digest


def mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"


@dataclass(frozen=True)
class Server:
    """Where archives come from: a channel to the server, the machine's credential, its name."""

    channel: Callable[[], grpc.aio.Channel]
    credential: Callable[[], str | None]
    machine: str


class CodeCache:
    """The archives this machine has fetched into ``root``, by digest, and the fetches under
    way (one a digest, whichever workers wait for it); a failed fetch is tried again every
    ``retry_s``."""

    def __init__(
        self, root: Path, server: Server, retry_s: float = 2.0, limit: int = CACHE_BYTES
    ) -> None:
        self.root = root
        self.server = server
        self.retry_s = retry_s
        self.limit = limit
        self.fetching: dict[str, asyncio.Task[Path]] = {}
        # Archives being unpacked now, by digest: never evicted meanwhile.
        self.unpacking: Counter[str] = Counter()

    def path(self, hex_digest: str) -> Path:
        return self.root / f"{hex_digest}.tar.gz"

    async def unpack(
        self, worker_id: int, attempt: int, digest: str, into: Path, progress: Progress
    ) -> None:
        """The worker's code, from the cache or fetched for it now, unpacked into ``into``."""
        archive = await self.archive(worker_id, attempt, digest, progress)
        self.unpacking[archive.name] += 1
        try:
            await asyncio.to_thread(unpack, archive, into)
        finally:
            self.unpacking[archive.name] -= 1
            if not self.unpacking[archive.name]:
                del self.unpacking[archive.name]

    async def archive(self, worker_id: int, attempt: int, digest: str, progress: Progress) -> Path:
        """The archive on this machine: kept already, or fetched for this worker now."""
        hex_digest = hex_of(digest)
        kept = self.path(hex_digest)
        if kept.exists():
            with contextlib.suppress(OSError):
                os.utime(kept)  # used now: the last to go
            return kept
        task = self.fetching.get(hex_digest)
        if task is None:
            task = asyncio.create_task(self._fetch(worker_id, attempt, hex_digest, progress))
            self.fetching[hex_digest] = task
            task.add_done_callback(lambda _: self.fetching.pop(hex_digest, None))
        # A worker stopped while it waits leaves the fetch to the others (and to the cache).
        return await asyncio.shield(task)

    async def _fetch(
        self, worker_id: int, attempt: int, hex_digest: str, progress: Progress
    ) -> Path:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)
        mismatches = 0
        while True:
            try:
                path = await self._fetch_once(worker_id, attempt, hex_digest, progress)
            except grpc.aio.AioRpcError as error:
                if error.code() in REFUSED:
                    raise CodeRefused(
                        f"its code {PREFIX}{hex_digest[:12]}… could not be fetched: the server "
                        f"said {error.details()}"
                    ) from None
                log.warning("code %s: fetch failed (%s), trying again", hex_digest[:12], error)
            except _Mismatch:
                mismatches += 1
                if mismatches >= MISMATCHES_ALLOWED:
                    raise CodeRefused(
                        f"its code {PREFIX}{hex_digest[:12]}… arrived {mismatches} times with "
                        "another SHA-256 than its digest"
                    ) from None
            else:
                self._evict(keep=path)
                return path
            await asyncio.sleep(self.retry_s)

    async def _fetch_once(
        self, worker_id: int, attempt: int, hex_digest: str, progress: Progress
    ) -> Path:
        credential = self.server.credential() or ""
        request = agent_pb2.CodeRequest(
            worker_id=worker_id,
            attempt=attempt,
            digest=PREFIX + hex_digest,
            machine=self.server.machine,
        )
        partial = self.root / f".{hex_digest}.{os.getpid()}.partial"
        digest = hashlib.sha256()
        received = 0
        try:
            async with self.server.channel() as channel:
                call = agent_pb2_grpc.AgentStub(channel).FetchCode(
                    request, metadata=(("authorization", f"Bearer {credential}"),)
                )
                with _private(partial) as out:
                    progress(0, 0)
                    async for chunk in call:
                        digest.update(chunk.data)
                        await asyncio.to_thread(out.write, chunk.data)
                        received += len(chunk.data)
                        progress(received, chunk.archive_bytes)
            if digest.hexdigest() != hex_digest:
                raise _Mismatch()
            partial.replace(self.path(hex_digest))
        finally:
            partial.unlink(missing_ok=True)
        log.info("code %s fetched: %s", hex_digest[:12], mib(received))
        return self.path(hex_digest)

    def _evict(self, keep: Path) -> None:
        """The least recently used archives go until the cache is within its size (``keep``,
        the one just fetched, stays whatever its size)."""
        kept = []
        for path in self.root.glob("*.tar.gz"):
            with contextlib.suppress(OSError):
                found = path.stat()
                kept.append((found.st_mtime, found.st_size, path))
        total = sum(size for _, size, _ in kept)
        for _, size, path in sorted(kept):
            if total <= self.limit:
                break
            if path != keep and path.name not in self.unpacking:
                path.unlink(missing_ok=True)
                total -= size


class _Mismatch(Exception):
    pass


@contextlib.contextmanager
def _private(path: Path) -> Iterator[IO[bytes]]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        yield out


def unpack(archive: Path, into: Path) -> None:
    """The archive unpacked into ``into`` (made anew, the agent's, 0700), by tarfile's ``data``
    filter: an entry it refuses (a name or link leaving the folder, a device) is the worker's
    end, CodeRefused."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(mode=0o700)
    started = time.monotonic()
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError, EOFError) as error:
        shutil.rmtree(into, ignore_errors=True)
        raise CodeRefused(f"its code could not be unpacked: {error}") from None
    log.debug("unpacked %s in %.2f s", archive.name, time.monotonic() - started)


def hand_over(staged: Path, target: Path, owner: tuple[int, int] | None) -> None:
    """The unpacked code moved to where the workload finds it, and made its user's (every entry,
    never following a link)."""
    shutil.rmtree(target, ignore_errors=True)
    staged.replace(target)
    if owner is None:
        target.chmod(0o755)
        return
    uid, gid = owner
    os.lchown(target, uid, gid)
    for parent, folders, files in os.walk(target):
        for name in (*folders, *files):
            os.lchown(os.path.join(parent, name), uid, gid)
