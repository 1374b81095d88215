"""A run's code packed to ship with it (issue 41, `--workdir`): the files of a folder as a user's
git would commit them — what its `.gitignore` files (the folder's and each subfolder's, git's own
rules, deeper ones winning) and its `.astraeusignore` leave out is left out, and `.git/` always —
in a gzip'd tar whose bytes are the same for the same content (entries sorted, no times, owners
or umask of this machine), so that its SHA-256 names it: the same folder twice is one copy.

Refused with a sentence that says what to do: a folder of nothing but ignored files; one over the
limit (100 MiB unless set), naming its biggest files; a link to outside the folder (the machine
that runs it would not have what it points at).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pathspec

from backend.cli.astra.client import EXIT_NOT_FOUND, EXIT_USAGE, Api, CliError, cli_config

DEFAULT_LIMIT = 100 * 2**20
# The limit as a setting, in MiB: this variable, else the config file's "workdir_limit_mib".
LIMIT_VARIABLE = "ASTRA_WORKDIR_LIMIT_MIB"
GITIGNORE = ".gitignore"
ASTRAEUSIGNORE = ".astraeusignore"
BIGGEST_SHOWN = 5


class WorkdirRefused(ValueError):
    """The folder cannot be sent as it is: the message says why and what to do."""


@dataclass(frozen=True)
class Packed:
    archive: bytes  # gzip'd tar, the same bytes for the same content
    digest: str  # its SHA-256, hex
    size: int  # the files' bytes, unpacked
    files: int


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def pack(folder: Path, limit: int = DEFAULT_LIMIT) -> Packed:
    folder = folder.resolve()
    if not folder.is_dir():
        raise WorkdirRefused(f"--workdir {folder}: not a folder")
    kept = sorted(_kept(folder))
    files = [(name, path) for name, path in kept if not path.is_symlink()]
    if not files:
        raise WorkdirRefused(
            f"--workdir {folder}: nothing to send: it has no file that {GITIGNORE} or "
            f"{ASTRAEUSIGNORE} leaves in"
        )
    sizes = {name: path.stat().st_size for name, path in files}
    total = sum(sizes.values())
    if total > limit:
        biggest = sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:BIGGEST_SHOWN]
        # those that matter: a file of under a hundredth of the whole is not what to leave out
        biggest = biggest[:1] + [(n, size) for n, size in biggest[1:] if size * 100 >= total]
        shown = ", ".join(f"{name} ({mib(size)})" for name, size in biggest)
        raise WorkdirRefused(
            f"--workdir {folder}: {mib(total)} to send, over the limit of {mib(limit)}: its "
            f"biggest files are {shown}; leave out what the run does not need in "
            f"{ASTRAEUSIGNORE} (as in {GITIGNORE}), or put data on a drive"
        )
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=6) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, path in kept:
            tar.addfile(*_entry(folder, name, path))
    archive = buffer.getvalue()
    return Packed(archive, hashlib.sha256(archive).hexdigest(), total, len(files))


def _entry(folder: Path, name: str, path: Path) -> tuple[tarfile.TarInfo, io.BufferedReader | None]:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if path.is_symlink():
        target = Path(os.readlink(path))
        resolved = (path.parent / target).resolve()
        if target.is_absolute() or not resolved.is_relative_to(folder):
            raise WorkdirRefused(
                f"--workdir {folder}: {name} links to {target}, outside the folder: the machine "
                "that runs it would not have it (copy it in, or leave the link out in "
                f"{ASTRAEUSIGNORE})"
            )
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, str(target), 0o777
        return info, None
    mode = path.stat().st_mode
    info.size = path.stat().st_size
    info.mode = 0o755 if mode & stat.S_IXUSR else 0o644
    return info, path.open("rb")


Rules = list[tuple[str, pathspec.GitIgnoreSpec]]


def _kept(folder: Path) -> Iterator[tuple[str, Path]]:
    """Each regular file and link of the folder git would keep (its name in the folder, POSIX),
    under its `.gitignore` files and its `.astraeusignore`; `.git/` never."""
    own_file = folder / ASTRAEUSIGNORE
    own = (
        pathspec.GitIgnoreSpec.from_lines(own_file.read_text().splitlines())
        if own_file.is_file()
        else None
    )
    yield from _walk(folder, "", [], own)


def _walk(
    folder: Path, prefix: str, rules: Rules, own: pathspec.GitIgnoreSpec | None
) -> Iterator[tuple[str, Path]]:
    here = folder / prefix if prefix else folder
    ignore = here / GITIGNORE
    if ignore.is_file():  # a deeper .gitignore comes later: its word wins
        rules = [
            *rules,
            (prefix, pathspec.GitIgnoreSpec.from_lines(ignore.read_text().splitlines())),
        ]
    for entry in sorted(here.iterdir(), key=lambda p: p.name):
        name = f"{prefix}{entry.name}"
        if entry.is_dir() and not entry.is_symlink():
            if entry.name == ".git" or _ignored(rules, own, name + "/"):
                continue  # (as git: nothing under a folder left out comes back)
            yield from _walk(folder, name + "/", rules, own)
        elif (entry.is_file() or entry.is_symlink()) and not _ignored(rules, own, name):
            yield name, entry


def _ignored(rules: Rules, own: pathspec.GitIgnoreSpec | None, name: str) -> bool:
    """Whether the last rule that speaks of ``name`` (relative to its file's folder) leaves it
    out; `.astraeusignore`, the user's word for this run, last of all."""
    verdict = False
    for base, spec in [*rules, *([("", own)] if own is not None else [])]:
        if base and not name.startswith(base):
            continue
        found = spec.check_file(name[len(base) :]).include
        if found is not None:
            verdict = found
    return verdict


def limit_from(env: dict[str, str], config: dict[str, object]) -> int:
    """The most bytes a --workdir may send: the setting (MiB), else 100 MiB."""
    given = env.get(LIMIT_VARIABLE) or config.get("workdir_limit_mib")
    if given is None or given == "":
        return DEFAULT_LIMIT
    try:
        found = float(str(given))
    except ValueError:
        found = 0.0
    if not found > 0:
        raise WorkdirRefused(f"{LIMIT_VARIABLE}: must be a number of MiB over 0, not {given!r}")
    return int(found * 2**20)


def ship(api: Api, folder: Path, limit: int) -> tuple[str, str]:
    """The folder packed and uploaded to the workspace unless it has it already (the same
    content is one copy): its digest, and a line that says what was sent."""
    packed = pack(folder, limit)
    digest = f"sha256:{packed.digest}"
    try:
        api.get(f"/code/{digest}")
        done = "already stored"
    except CliError as missing:
        if missing.exit_code != EXIT_NOT_FOUND:
            raise
        api.put(f"/code/{digest}", packed.archive, "application/gzip")
        done = "uploaded"
    files = f"{packed.files} file" + ("" if packed.files == 1 else "s")
    size = f"{packed.size / 1024:.1f} KiB" if packed.size < 2**20 else mib(packed.size)
    return digest, f"astra: code {digest} ({files}, {size}) {done}"


def attach(api: Api, spec: Any, folder: Path) -> str:
    """`astra astraeus submit --workdir FOLDER`: the folder shipped and named in the spec's
    ``code``; the line that says what was sent. Refused as a usage error, nothing sent."""
    if not isinstance(spec, dict):
        raise CliError("astra: the specification must be a JSON object", EXIT_USAGE)
    try:
        limit = limit_from(dict(os.environ), cli_config())
        spec["code"], said = ship(api, folder, limit)
    except WorkdirRefused as refused:
        raise CliError(f"astra: {refused}", EXIT_USAGE) from None
    return said
