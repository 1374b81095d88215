"""A Slurm cluster seen as its users see it (issue 25), all real processes: `astraeus up`
(its import actor reading Slurm every second), `astraeus agent --executor slurm` on the node
of a real Slurm that puts jobs in control groups, and a job submitted with plain `sbatch`.
The job's output is read as any worker's log, with `astra astraeus logs` and the REST shim
(seed L-2, L-3: kept on the machine that runs it, fetched on request), while it runs and after
(L-14, L-19: archived, its last lines kept on the node)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.e2e.live import ASTRAEUS, serving
from tests.support.http import HTTP
from tests.support.processes import ASTRA
from tests.support.slurm import SlurmCluster
from tests.support.slurm import marks as slurm_marks

pytestmark = slurm_marks()

TICKER = "#!/bin/bash\nfor i in $(seq 1 40); do echo tick $i; sleep 0.5; done\n"


def _until(what: str, check: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds}s for {what}"
        time.sleep(0.5)


def test_a_plain_sbatch_jobs_output_is_read_with_astra_logs_from_its_node(  # issue 25, seed L-10
    slurm_cgroups: SlurmCluster, tmp_path: Path
) -> None:
    cluster = slurm_cgroups
    account = f"live{uuid.uuid4().hex[:6]}"
    cluster.account(account)
    with serving(tmp_path / "data", local_agent=False, slurm_import_interval="1s") as (server, _):
        server.cli("cluster", "create", "hpc", "--slurm", "--slurm-conf", str(cluster.conf))
        server.cli("cluster", "account", "hpc", account, "--workspace", "default")
        token = server.cli("token", "create", "--agent", "--cluster", "hpc", "--name", "node")
        agent = subprocess.Popen(
            [
                ASTRAEUS,
                "agent",
                "--server",
                f"127.0.0.1:{server.agent_port}",
                "--token",
                token.strip(),
                "--name",
                cluster.node,
                "--data-dir",
                str(tmp_path / "agent"),
                "--executor",
                "slurm",
                "--slurm-conf",
                str(cluster.conf),
                "--simulate-gpus",
                "2",
            ],
            env=server.env,
            stdout=(tmp_path / "agent.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        try:
            script = tmp_path / "ticker.sh"
            script.write_text(TICKER)
            job = cluster.sbatch(
                "-A",
                account,
                "-J",
                "ticker",
                "--gres=gpu:1",
                "-o",
                str(tmp_path / "out"),
                str(script),
            )
            worker = f"ticker-{job}-0"
            env = server.env_for(server.admin_token)

            def logs() -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [ASTRA, "astraeus", "logs", worker, "--tail", "3"],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )

            def ticking() -> bool:
                said = logs()
                return said.returncode == 0 and "tick" in said.stdout

            _until("the job's output through `astra astraeus logs`", ticking)
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            cluster.run("scancel", job)

            def archived() -> dict[str, object]:
                answer = HTTP.get(
                    f"{server.url}/v1/tasks/{worker}/logs",
                    params={"tail": 2},
                    headers={"Authorization": f"Bearer {server.admin_token}"},
                    timeout=20,
                )
                return dict(answer.json()) if answer.status_code == 200 else {}

            _until("its archived log", lambda: bool(archived().get("archived")))
            answer = archived()
            assert answer["task_name"] == worker
            ticked, cancelled = str(answer["logs"]).splitlines()
            assert ticked.startswith("tick ")  # and then Slurm's own line, in the job's output
            assert cancelled.startswith(f"slurmstepd-{cluster.node}: error: *** JOB {job} ON ")
            assert "CANCELLED AT" in cancelled

            def stopped() -> bool:  # the import, every second, reads its end
                answer = HTTP.get(
                    f"{server.url}/v1/jobs/ticker-{job}",
                    headers={"Authorization": f"Bearer {server.admin_token}"},
                    timeout=20,
                ).json()
                return bool(answer["status"] == "Stopped")

            _until("the run stopped", stopped)
        finally:
            agent.terminate()
            agent.wait(timeout=15)
