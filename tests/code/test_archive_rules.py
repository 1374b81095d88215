"""What a code archive may hold (issue 41): the server reads each upload through tarfile, never
extracting it, and refuses what a machine must not unpack — names leaving the folder, links
out of it, devices, hard links — and what is too much."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from backend.cli.astra.workdir import pack
from backend.code import rules
from backend.code.rules import ArchiveRefused, check_archive, hex_of, upload_limit
from tests.support.archives import crafted, entry


def archive(*entries: tarfile.TarInfo, data: bytes = b"print('hi')\n") -> io.BytesIO:
    return io.BytesIO(crafted(*entries, data=data))


def test_a_packed_folder_is_read_through_with_its_files_and_size(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "pkg" / "model.py").write_text("x = 1\n")
    (tmp_path / "latest").symlink_to("pkg/model.py")
    packed = pack(tmp_path)
    facts = check_archive(io.BytesIO(packed.archive), limit=2**20)
    assert (facts.files, facts.size) == (2, len("print('hi')\n") + len("x = 1\n"))


@pytest.mark.parametrize(
    ("entries", "said"),
    [
        ([entry("../evil.py")], "the entry '../evil.py' would be unpacked outside its folder"),
        ([entry("/etc/cron.d/x")], "the entry '/etc/cron.d/x' would be unpacked outside"),
        ([entry("a/../../x")], "the entry 'a/../../x' would be unpacked outside its folder"),
        (
            [entry("train.py"), entry("root", tarfile.SYMTYPE, "/")],
            "the link 'root' points outside its folder ('/')",
        ),
        (
            [entry("train.py"), entry("a/up", tarfile.SYMTYPE, "../../etc/passwd")],
            "the link 'a/up' points outside its folder ('../../etc/passwd')",
        ),
        (
            [entry("train.py"), entry("hard", tarfile.LNKTYPE, "train.py")],
            "the entry 'hard' is not a file, a folder or a link",
        ),
        (
            [entry("train.py"), entry("null", tarfile.CHRTYPE)],
            "the entry 'null' is not a file, a folder or a link",
        ),
        ([entry("pipe", tarfile.FIFOTYPE)], "the entry 'pipe' is not a file, a folder or a link"),
        ([entry("src/", tarfile.DIRTYPE)], "it holds no file"),
    ],
)
def test_an_archive_a_machine_must_not_unpack_is_refused_saying_why(
    entries: list[tarfile.TarInfo], said: str
) -> None:
    with pytest.raises(ArchiveRefused) as refused:
        check_archive(archive(*entries), limit=2**20)
    assert str(refused.value).startswith(said)


def test_not_a_gzipped_tar_and_too_much_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ArchiveRefused, match="it is not a gzip'd tar"):
        check_archive(io.BytesIO(b"PK\x03\x04 a zip"), limit=2**20)
    with pytest.raises(ArchiveRefused, match="it is not a gzip'd tar"):  # cut short
        check_archive(io.BytesIO(archive(entry("a.py")).getvalue()[:40]), limit=2**20)
    # a gzip bomb: a few KiB that unpack past the limit, found from the headers alone
    with pytest.raises(ArchiveRefused, match=r"its files are over the limit of 1\.0 MiB unpacked"):
        check_archive(archive(entry("zeros.bin"), data=b"\0" * (2 * 2**20)), limit=2**20)
    monkeypatch.setattr(rules, "MAX_ENTRIES", 3)
    many = [entry(f"f{i}.py") for i in range(4)]
    with pytest.raises(ArchiveRefused, match="it holds more than 3 entries"):
        check_archive(archive(*many), limit=2**20)


def test_a_digest_is_sha256_and_64_hexadecimal_digits() -> None:
    digest = "ab" * 32
    assert hex_of(f"sha256:{digest}") == digest
    assert hex_of(digest.upper()) == digest
    for wrong in ("sha256:" + "g" * 64, "md5:" + digest, digest[:-1], "", "sha256:"):
        assert hex_of(wrong) is None
    # an upload of files that do not compress may be a little larger than they are
    assert upload_limit(100 * 2**20) > 100 * 2**20
