"""`--workdir`'s packing (issue 41): the files git would commit (every `.gitignore`, deeper ones
winning, and `.astraeusignore` last), never `.git/`; the same content the same bytes and digest
whatever the files' times; refusals that say what to do (nothing left, over the limit with the
biggest files named, a link to outside)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from backend.cli.astra.workdir import Packed, WorkdirRefused, pack


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def contents(packed: Packed) -> dict[str, str]:
    out = {}
    with tarfile.open(fileobj=io.BytesIO(packed.archive), mode="r:gz") as tar:
        for member in tar.getmembers():
            assert (member.mtime, member.uid, member.gid, member.uname) == (0, 0, 0, "")
            if member.issym():
                out[member.name] = f"-> {member.linkname}"
            else:
                extracted = tar.extractfile(member)
                assert extracted is not None
                out[member.name] = extracted.read().decode()
    return out


def test_what_git_would_commit_is_packed(tmp_path: Path) -> None:
    root = write(
        tmp_path / "repo",
        {
            "train.py": "print('train')",
            ".gitignore": "*.pt\n__pycache__/\ndata/\n!keep.pt\n",
            "keep.pt": "kept",
            "model.pt": "big",
            "__pycache__/train.cpython-311.pyc": "x",
            "data/shard-0": "rows",
            "src/lib.py": "lib",
            "src/.gitignore": "*.log\n!model.pt\n",
            "src/model.pt": "re-included deeper",
            "src/run.log": "noise",
            ".git/HEAD": "ref: refs/heads/main",
            ".astraeusignore": "notebooks/\n",
            "notebooks/scratch.ipynb": "{}",
            "configs/base.yaml": "lr: 0.1",
        },
    )
    packed = pack(root)
    assert contents(packed) == {
        ".astraeusignore": "notebooks/\n",
        ".gitignore": "*.pt\n__pycache__/\ndata/\n!keep.pt\n",
        "configs/base.yaml": "lr: 0.1",
        "keep.pt": "kept",
        "src/.gitignore": "*.log\n!model.pt\n",
        "src/lib.py": "lib",
        "src/model.pt": "re-included deeper",
        "train.py": "print('train')",
    }
    assert (packed.files, len(packed.digest)) == (8, 64)


def test_the_same_content_is_the_same_archive_whatever_its_times(tmp_path: Path) -> None:
    files = {"train.py": "print(1)", "lib/util.py": "x = 1"}
    first = pack(write(tmp_path / "a", files))
    again = write(tmp_path / "b", files)
    os.utime(again / "train.py", (1_000_000_000, 1_000_000_000))
    second = pack(again)
    assert (first.archive, first.digest) == (second.archive, second.digest)
    (again / "train.py").write_text("print(2)")
    assert pack(again).digest != first.digest


def test_an_executable_stays_one_and_a_link_inside_is_kept(tmp_path: Path) -> None:
    root = write(tmp_path / "repo", {"run.sh": "#!/bin/sh\n", "lib/a.py": "a"})
    (root / "run.sh").chmod(0o700)
    (root / "lib" / "b.py").symlink_to("a.py")
    packed = pack(root)
    with tarfile.open(fileobj=io.BytesIO(packed.archive), mode="r:gz") as tar:
        modes = {m.name: m.mode for m in tar.getmembers()}
    assert modes["run.sh"] == 0o755 and modes["lib/a.py"] == 0o644
    assert contents(packed)["lib/b.py"] == "-> a.py"


def test_a_link_to_outside_is_refused(tmp_path: Path) -> None:
    root = write(tmp_path / "repo", {"train.py": "x"})
    (root / "data").symlink_to("/etc")
    with pytest.raises(WorkdirRefused) as refused:
        pack(root)
    assert str(refused.value) == (
        f"--workdir {root}: data links to /etc, outside the folder: the machine that runs it "
        "would not have it (copy it in, or leave the link out in .astraeusignore)"
    )


def test_a_folder_of_ignored_files_only_is_refused(tmp_path: Path) -> None:
    root = write(tmp_path / "repo", {".astraeusignore": "*\n", "a.pt": "x"})
    with pytest.raises(WorkdirRefused) as refused:
        pack(root)
    assert str(refused.value) == (
        f"--workdir {root}: nothing to send: it has no file that .gitignore or .astraeusignore "
        "leaves in"
    )


def test_over_the_limit_names_the_biggest_files(tmp_path: Path) -> None:
    root = write(tmp_path / "repo", {"train.py": "x" * 10})
    (root / "weights.bin").write_bytes(b"\0" * 3 * 2**20)
    (root / "cache").mkdir()
    (root / "cache" / "a.npy").write_bytes(b"\0" * 2**20)
    with pytest.raises(WorkdirRefused) as refused:
        pack(root, limit=2 * 2**20)
    assert str(refused.value) == (
        f"--workdir {root}: 4.0 MiB to send, over the limit of 2.0 MiB: its biggest files are "
        "weights.bin (3.0 MiB), cache/a.npy (1.0 MiB); leave out what the run does not need in "
        ".astraeusignore (as in .gitignore), or put data on a drive"
    )  # train.py, under a hundredth of the whole, is not what to leave out
    (root / ".astraeusignore").write_text("*.bin\n")
    assert pack(root, limit=2 * 2**20).files == 3
