"""Real PyTorch (CPU, gloo) workloads through `astraeus up`: the interpreter they run with.

The local agent runs workloads as users of their own when it runs as root (issue 17), and they
cannot reach an interpreter under /root, where the tests' virtual environment may point. Such a
user gets what a machine's users would have: a virtual environment of Debian's Python (the same
3.11, so the same wheels load) that sees the installed torch through a .pth file, with the
`torchrun` pip writes, in a folder every user can read. Without root the tests' own
environment is the workloads' too.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.live import running
from tests.workloads.ledger import Api

SCRIPTS = Path(__file__).parent / "scripts"
DEBIAN_PYTHON = Path("/usr/bin/python3")
TORCHRUN = "import sys\nfrom torch.distributed.run import main\nsys.exit(main())\n"


@dataclass(frozen=True)
class Workloads:
    """Where a workload's `python` and `torchrun` are (its PATH), and the scripts' folder."""

    bin: Path
    scripts: Path

    @property
    def path(self) -> str:
        return f"{self.bin}:/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, workloads: Workloads) -> Iterator[Api]:
    """`astraeus up` of a module's own, with its local agent, and the first admin's calls."""
    with running(tmp_path_factory.mktemp("workloads") / "data") as (server, token):
        yield Api(server, token)


def reachable_by_others(path: Path) -> bool:
    """Whether a user of its own (a workload's) can reach ``path``: every folder on the way
    searchable by others."""
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in [path, *path.parents])


def linked_copy(source: Path, target: Path) -> Path:
    """``source``'s tree at ``target``, hard-linked where it shares the file system (instant),
    copied where it does not."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, symlinks=True, copy_function=link)
    return target


@pytest.fixture(scope="session")
def workloads() -> Iterator[Workloads]:
    torch = pytest.importorskip("torch", reason="the [workloads] extra (make test installs it)")
    if os.geteuid() != 0:
        yield Workloads(Path(sys.executable).parent, SCRIPTS)
        return
    if not DEBIAN_PYTHON.exists():
        pytest.skip("workloads run as users of their own here and need /usr/bin/python3")
    version = subprocess.run(
        [str(DEBIAN_PYTHON), "-c", "import sys; print(*sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if tuple(map(int, version)) != sys.version_info[:2]:
        pytest.skip(f"/usr/bin/python3 is {'.'.join(version)}: torch's wheel is for 3.11")
    root = Path(tempfile.mkdtemp(prefix="astraeus-workloads-"))
    try:
        root.chmod(0o755)
        venv = root / "venv"
        subprocess.run([str(DEBIAN_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
        site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        packages = Path(torch.__file__).parent.parent
        if not reachable_by_others(packages):  # a checkout under a folder of mode 0700
            packages = linked_copy(packages, root / "site-packages")
        (site / "site-packages" / "torch.pth").write_text(f"{packages}\n")
        torchrun = venv / "bin" / "torchrun"
        torchrun.write_text(f"#!{venv / 'bin' / 'python'}\n{TORCHRUN}")
        torchrun.chmod(0o755)
        scripts = root / "scripts"
        shutil.copytree(SCRIPTS, scripts)
        for folder, _, files in os.walk(root):
            os.chmod(folder, 0o755)
            for name in files:
                path = Path(folder) / name
                if not path.is_symlink():
                    path.chmod(path.stat().st_mode | 0o444)
        yield Workloads(venv / "bin", scripts)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_folder() -> Iterator[Path]:
    """A folder every workload user may write (shared storage, as a cluster's scratch file
    system): where a run keeps its checkpoint between attempts."""
    folder = Path(tempfile.mkdtemp(prefix="astraeus-checkpoints-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
