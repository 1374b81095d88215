"""Preparing a worker: drives filled once from their source, exposed to processes; the seed's
reasons while waiting (seed L-64, L-65)."""

from __future__ import annotations

import os
from pathlib import Path

from agent import prepare


def payload(tmp_path: Path, **mount: object) -> dict[str, object]:
    return {
        "workspace_id": 7,
        "mounts": [{"drive": "training-data", "path": str(tmp_path / "mnt"), **mount}],
    }


def test_the_reasons_are_the_seeds_words() -> None:
    assert prepare.waiting_for_secret("hf-token") == "waiting for external secret hf-token"
    assert prepare.waiting_for_drive("data") == "Waiting for drive data to be filled"


def test_a_drive_is_filled_once_from_its_source(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "shards").mkdir(parents=True)
    (source / "shards" / "0.bin").write_bytes(b"\x00" * 10)
    spec = payload(tmp_path, fill_from=str(source))
    [(drive, from_, folder)] = prepare.drives_to_fill(spec, tmp_path / "drives")
    assert (drive, from_) == ("training-data", source)
    assert folder == tmp_path / "drives" / "7" / "training-data"
    assert prepare.fill_drive(from_, folder) is None
    assert (folder / "shards" / "0.bin").read_bytes() == b"\x00" * 10
    assert prepare.drives_to_fill(spec, tmp_path / "drives") == []  # filled: not again


def test_a_missing_source_is_said_plainly(tmp_path: Path) -> None:
    problem = prepare.fill_drive(tmp_path / "nowhere", tmp_path / "drives" / "1" / "data")
    assert (
        problem
        == f"Could not fill drive data: {tmp_path / 'nowhere'} is not a folder on this machine"
    )


def test_a_process_finds_its_drive_by_variable_and_at_its_path(tmp_path: Path) -> None:
    variables = prepare.expose_drives(payload(tmp_path), tmp_path / "drives")
    folder = tmp_path / "drives" / "7" / "training-data"
    assert variables == {"ASTRAEUS_DRIVE_TRAINING_DATA": str(folder)}
    assert (tmp_path / "mnt").resolve() == folder.resolve()


def test_secret_files_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    credentials = [{"secret": "hf-token", "file": "token.txt"}, {"secret": "x", "env": "X"}]
    prepare.write_secret_files(credentials, {"hf-token": "hf_abc", "x": "y"}, tmp_path / "s")
    written = tmp_path / "s" / "token.txt"
    assert written.read_text() == "hf_abc"
    assert os.stat(written).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["token.txt"]
