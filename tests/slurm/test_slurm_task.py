"""A Slurm task's MASTER_PORT (agent/slurm_task.py): rank 0 takes a port free on its node and
writes it in the run's folder for this job instance; the other ranks wait for it, a bounded
time. No Slurm here: the functions and the module are run with Slurm's variables set by hand."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent import rendezvous, slurm_task
from agent.slurm_task import Master

ROOT = Path(__file__).parents[2]


@pytest.fixture(autouse=True)
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine-wide claims of these tests' ports in a folder of their own."""
    folder = tmp_path / "claims"
    monkeypatch.setattr(rendezvous, "claims_folder", lambda: folder)
    return folder


def slurm(rank: int, job: str = "12", restart: str | None = "1") -> dict[str, str]:
    env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_JOB_ID": job}
    if restart is not None:
        env["SLURM_RESTART_COUNT"] = restart
    return env


def taken(port: int) -> bool:
    """Whether a server (as gloo's TCPStore binds: SO_REUSEADDR) is refused the port."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            other.bind(("0.0.0.0", port))
            other.listen()
        except OSError:
            return True
    return False


def test_rank_0_holds_a_free_port_and_writes_it_for_this_job_instance(
    tmp_path: Path, claims: Path
) -> None:
    master = slurm_task.publish_master(tmp_path, slurm(0))
    assert master is not None and master.claim is not None
    written = json.loads((tmp_path / "master-12-1.json").read_text())
    assert written == {"addr": socket.gethostname(), "port": master.port}
    assert master.addr == socket.gethostname() and master.port > 0
    assert taken(master.port), "another program could take the port before the command"
    assert (claims / str(master.port)).exists()  # claimed machine-wide too
    master.claim.started()  # the command starts: the port is its own
    assert not taken(master.port)
    master.claim.end()
    assert not list(tmp_path.glob("*.partial"))


def test_a_restart_count_is_0_until_slurm_requeues_the_job(tmp_path: Path) -> None:
    assert slurm_task.master_file(tmp_path, slurm(1, restart=None)) == tmp_path / "master-12-0.json"
    assert slurm_task.master_file(tmp_path, slurm(1, "7", "2")) == tmp_path / "master-7-2.json"


def test_another_rank_waits_for_rank_0s_port_and_reads_it(tmp_path: Path) -> None:
    published: list[Master | None] = []
    # rank 0's task starts a little after this one (srun starts them together, not at once)
    later = threading.Timer(
        0.2, lambda: published.append(slurm_task.publish_master(tmp_path, slurm(0)))
    )
    later.start()
    try:
        found = slurm_task.await_master(tmp_path, slurm(1), wait_s=10)
    finally:
        later.join()
    (master,) = published
    assert master is not None and master.claim is not None
    master.claim.end()
    assert found == Master(socket.gethostname(), master.port)


def test_another_job_instances_port_is_never_read(tmp_path: Path) -> None:
    for name in ("master-11-1.json", "master-12-0.json", "master-12-2.json"):
        (tmp_path / name).write_text(json.dumps({"addr": "gpu-01", "port": 40001}))
    # job 12 requeued once: the instance before it (restart 0) and other jobs are not its
    assert slurm_task.await_master(tmp_path, slurm(1), wait_s=0.1) is None
    (tmp_path / "master-12-1.json").write_text(json.dumps({"addr": "gpu-02", "port": 40002}))
    assert slurm_task.await_master(tmp_path, slurm(1), wait_s=0.1) == Master("gpu-02", 40002)


def test_the_command_gets_torchruns_environment(tmp_path: Path) -> None:
    env = slurm(1) | {"SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2", "PATH": "/bin"}
    got = slurm_task.environment("ddp", Master("gpu-02", 40002), env)
    assert got == env | {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "gpu-02",
        "MASTER_PORT": "40002",
        "ASTRAEUS_RUN": "ddp",
        "ASTRAEUS_WORKER": "ddp-1",
    }


def test_a_rank_that_waited_too_long_for_rank_0_ends_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm_task, "MASTER_WAIT_S", 0.1)
    for name, value in slurm(1).items():
        monkeypatch.setenv(name, value)
    code = slurm_task.main(["--run-dir", str(tmp_path), "--run", "ddp", "--", "true"])
    assert code == 1
    end = json.loads((tmp_path / "1.end.json").read_text())
    said = "waited 0.1 s for rank 0's MASTER_PORT (master-12-1.json): none came\n"
    assert end["log_tail"] == said
    assert (end["node"], end["exit_code"], end["signal"]) == (
        socket.gethostname().split(".")[0],
        1,
        None,
    )
    assert not (tmp_path / "1.start.json").exists()  # the command never started


# Binds MASTER_PORT as rank 0's process does, says so, and keeps it until the other run's
# command has bound its own too: both listen at once.
BINDS = """
import os, pathlib, socket, sys, time
port = int(os.environ["MASTER_PORT"])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", port))
server.listen()
print(port, flush=True)
here, other = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
here.touch()
deadline = time.monotonic() + 4
while not other.exists():
    if time.monotonic() > deadline:
        sys.exit("the other run's command never bound its port")
    time.sleep(0.02)
"""


def test_two_runs_of_the_same_job_id_on_one_node_listen_on_two_ports(tmp_path: Path) -> None:
    # as two clusters' (or installs') runs whose ids, and so ports, were the same
    def task(run: str, other: str) -> subprocess.Popen[bytes]:
        folder = tmp_path / run
        folder.mkdir()
        env = os.environ | slurm(0, restart=None) | {"SLURM_NTASKS": "1"}
        env |= {"TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
        bound = [str(tmp_path / f"{run}.bound"), str(tmp_path / f"{other}.bound")]
        wrapper = [sys.executable, "-m", "agent.slurm_task", "--run-dir", str(folder), "--run", run]
        return subprocess.Popen(
            [*wrapper, "--", sys.executable, "-c", BINDS, *bound],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )

    first, second = task("a", "b"), task("b", "a")
    outputs = [p.communicate(timeout=10)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0]
    ports = [int(out) for out in outputs]
    assert ports[0] != ports[1]
    for run, port in zip(("a", "b"), ports, strict=True):
        written = json.loads((tmp_path / run / "master-12-0.json").read_text())
        assert written == {"addr": socket.gethostname(), "port": port}
        end = json.loads((tmp_path / run / "0.end.json").read_text())
        assert (end["exit_code"], end["log_tail"]) == (0, "")
