"""Code archives as an attacker crafts them (issue 41): a gzip'd tar of whatever entries, for
the server's checks (tests/code) and the agent's unpacking (tests/machine_agent)."""

from __future__ import annotations

import gzip
import io
import tarfile


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    """An entry of any name and kind (a file, a folder, a link to ``link``, a device …)."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def crafted(*entries: tarfile.TarInfo, data: bytes = b"print('hi')\n") -> bytes:
    """The entries in a gzip'd tar, each file holding ``data``."""
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for each in entries:
            if each.isfile():
                each.size = len(data)
                tar.addfile(each, io.BytesIO(data))
            else:
                tar.addfile(each)
    return buffer.getvalue()
