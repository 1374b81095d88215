"""What a code archive must be: a gzip'd tar, named by its SHA-256, of regular files, folders
and links that stay inside it, within the size and count limits. The server checks each upload
so (tarfile's own reading, never an extraction), and each agent again as it unpacks: a name
like ``../../etc/cron.d/x`` or a link to ``/`` never reaches a machine."""

from __future__ import annotations

import posixpath
import re
import shutil
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

PREFIX = "sha256:"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
_DIGEST = re.compile(DIGEST_PATTERN)
_HEX = re.compile(r"^[0-9a-f]{64}$")
# A chunk of an archive's bytes a row (code_chunks) and a message to a machine (CodeChunk): a
# quarter of gRPC's default message limit.
CHUNK_BYTES = 1024 * 1024
# The most entries (files, folders, links) an archive may hold.
MAX_ENTRIES = 100_000
MIB = 2**20


class ArchiveRefused(ValueError):
    """The upload is not an archive a machine may unpack: the message says why."""


@dataclass(frozen=True)
class ArchiveFacts:
    size: int  # its files' bytes, unpacked
    files: int


def hex_of(digest: str) -> str | None:
    """The hex SHA-256 a digest names (``sha256:<64 hex>``, or the bare hex); None if it names
    none."""
    digest = digest.strip().lower()
    if _DIGEST.match(digest):
        return digest[len(PREFIX) :]
    return digest if _HEX.match(digest) else None


def digest_of(hex_digest: str) -> str:
    return PREFIX + hex_digest


def short(hex_digest: str) -> str:
    """As people read it: ``sha256:`` and its first 12 digits."""
    return f"{PREFIX}{hex_digest[:12]}"


def mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"


def upload_limit(unpacked_limit: int) -> int:
    """The most bytes an upload may be for files of ``unpacked_limit`` bytes: a tar's headers
    (512 bytes a file, its padding) and gzip's framing make an archive of files that do not
    compress a little larger than they are."""
    return unpacked_limit + unpacked_limit // 8 + MIB


def check_archive(archive: IO[bytes], limit: int) -> ArchiveFacts:
    """Read the archive through, as a stream, and say what it holds; ``ArchiveRefused`` when
    it is not a gzip'd tar, holds a name or link that leaves its folder, an entry other than
    a file, folder or link, more than MAX_ENTRIES entries or more than ``limit`` bytes of
    files."""
    size = files = entries = 0
    try:
        with tarfile.open(fileobj=archive, mode="r|gz") as tar:
            for member in tar:
                entries += 1
                if entries > MAX_ENTRIES:
                    raise ArchiveRefused(f"it holds more than {MAX_ENTRIES} entries")
                problem = member_problem(member)
                if problem is not None:
                    raise ArchiveRefused(problem)
                if member.isfile():
                    files += 1
                    size += member.size
                    if size > limit:
                        raise ArchiveRefused(
                            f"its files are over the limit of {mib(limit)} unpacked"
                        )
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise ArchiveRefused(f"it is not a gzip'd tar ({error})") from None
    if files == 0:
        raise ArchiveRefused("it holds no file")
    return ArchiveFacts(size, files)


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why an entry may not be unpacked, or None: its name must stay inside the folder it is
    unpacked in (relative, no ``..``), it must be a file, a folder or a link, and a link must
    point inside too."""
    name = member.name
    shown = repr(name[:200])
    if "\x00" in name or "\x00" in member.linkname:
        return f"the entry {shown} holds NUL"
    if member.isdir() and posixpath.normpath(name) == ".":
        return None  # the folder itself ("./"), as some tars begin
    if not _inside(name):
        return f"the entry {shown} would be unpacked outside its folder"
    if member.issym():
        target = posixpath.join(posixpath.dirname(name), member.linkname)
        if posixpath.isabs(member.linkname) or not _inside(target):
            return f"the link {shown} points outside its folder ({member.linkname[:200]!r})"
        return None
    if not (member.isfile() or member.isdir()):
        return f"the entry {shown} is not a file, a folder or a link"
    return None


def _inside(name: str) -> bool:
    if not name or posixpath.isabs(name):
        return False
    normal = posixpath.normpath(name)
    return normal != ".." and not normal.startswith("../") and normal != "."


def unpack(archive: IO[bytes], into: Path) -> None:
    """The archive unpacked into ``into`` (made anew, 0700), by tarfile's ``data`` filter (no
    absolute name, none leaving the folder, no link out of it, no device, no set-user-id bit):
    for a run on a Slurm cluster, whose nodes read the run's folder (backend/slurm)."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(mode=0o700, parents=True)
    archive.seek(0)
    try:
        with tarfile.open(fileobj=archive, mode="r:gz") as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        shutil.rmtree(into, ignore_errors=True)
        raise ArchiveRefused(f"it could not be unpacked: {error}") from None
