"""The Docker executor: what it asks the engine and how it reads the engine's answers.

The engine's answers here are the shapes the Docker Engine API documents (ContainerInspect's
State, ContainerStatsResponse, CreateImageInfo progress lines, the multiplexed log stream,
ContainerSummary); no fake engine answers anything. The last tests run real containers and
only where a Docker engine's socket exists (skipped on machines without one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from agent import docker
from agent import engine as engines
from agent.docker import ContainerWorker, is_container_folder
from agent.engine_answers import (
    CpuReading,
    EngineError,
    FrameError,
    FrameReader,
    PullProgress,
    api_version,
    container_environment,
    create_body,
    exit_of,
    image_reference,
    new_output,
    orphans,
    pull_failed,
    since_param,
    stats_metrics,
    timestamp_ns,
    worker_filters,
)
from agent.executor import SDK, EndCause, Exit, ProcessWorker
from agent.logs import WorkerLog
from agent.start import StartSpec

# A start as payload.json keeps it (agent/start.py).
START = StartSpec.from_json(
    {
        "worker": "llama-sft-1",
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "command": ["torchrun", "train.py", "--steps", "1000"],
        "user": "1000:1000",
        "environment": {"WANDB_MODE": "offline"},
        "mounts": [
            {"drive": "datasets", "path": "/data", "read_only": True},
            {"drive": "checkpoints", "path": "/ckpt", "read_only": False},
        ],
        "cpu": 7.5,
        "memory_limit_bytes": 64 * 2**30,
        "run": "llama-sft",
        "rank": 1,
        "attempt": 3,
        "gpu_ids": [4, 6],
        "astraeus_environment": {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "gpu-07",
            "MASTER_PORT": "29500",
            "CUDA_VISIBLE_DEVICES": "4,6",
            "ASTRAEUS_RUN": "llama-sft",
            "ASTRAEUS_WORKER": "llama-sft-1",
        },
    }
)


# --- the create body ---------------------------------------------------------------------


def test_the_agent_chosen_user_wins_over_the_specs_and_setuid_gives_nothing() -> None:
    # issue 17: an agent running as root names the container's user (never root)
    body = create_body(
        "default-41",
        START,
        run_folder=Path("/var/lib/astraeus/workers/41/run"),
        drives=Path("/var/lib/astraeus/drives"),
        user="2000001:2100002",
    )
    assert body["User"] == "2000001:2100002"
    assert body["HostConfig"]["SecurityOpt"] == ["no-new-privileges"]
    assert body["Labels"]["astraeus.worker"] == "default-41"


def test_a_start_payload_becomes_the_create_body() -> None:
    body = create_body(
        "41",
        START,
        run_folder=Path("/var/lib/astraeus/workers/41/run"),
        drives=Path("/var/lib/astraeus/drives"),
        image_env=["PATH=/usr/local/bin:/usr/bin", "PYTHONPATH=/opt/lib"],
    )
    assert body == {
        "Image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "Cmd": ["torchrun", "train.py", "--steps", "1000"],
        "User": "1000:1000",
        "Env": [
            "WANDB_MODE=offline",
            "RANK=1",
            "WORLD_SIZE=2",
            "LOCAL_RANK=0",
            "MASTER_ADDR=gpu-07",
            "MASTER_PORT=29500",
            "CUDA_VISIBLE_DEVICES=0,1",
            "ASTRAEUS_RUN=llama-sft",
            "ASTRAEUS_WORKER=llama-sft-1",
            "ASTRAEUS_PROGRESS_FILE=/astraeus/run/progress",
            "PYTHONPATH=/opt/lib:/astraeus/sdk",
            "PYTHONUNBUFFERED=1",
        ],
        # The worker's id, never its name: two workspaces may both run llama-sft-1 here.
        "Labels": {"astraeus.worker": "41", "astraeus.attempt": "3"},
        "Tty": False,
        "OpenStdin": False,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "HostConfig": {
            "NetworkMode": "host",
            "Init": True,
            "ShmSize": 8 * 2**30,
            "Binds": [
                "/var/lib/astraeus/workers/41/run:/astraeus/run",
                f"{SDK}:/astraeus/sdk:ro",
                "/var/lib/astraeus/drives/datasets:/data:ro",
                "/var/lib/astraeus/drives/checkpoints:/ckpt",
            ],
            "LogConfig": {"Type": "local", "Config": {}},
            "SecurityOpt": ["no-new-privileges"],
            "IpcMode": "private",
            "Memory": 64 * 2**30,
            "MemorySwap": 64 * 2**30,
            "NanoCpus": 7_500_000_000,
            "DeviceRequests": [
                {"Driver": "nvidia", "DeviceIDs": ["4", "6"], "Capabilities": [["gpu"]]}
            ],
        },
    }


# issue 36: one rule for mount paths, as the server checks them (backend/spec.py)
def test_a_relative_mount_path_is_under_the_containers_own_folder() -> None:
    mounts = [
        {"drive": "data", "path": "data", "read_only": True},
        {"drive": "out", "path": "./results/", "read_only": False},
        {"drive": "ckpt", "path": "/ckpt"},
    ]
    start = StartSpec.from_json({"image": "busybox:1.36", "mounts": mounts})
    body = create_body("40", start, run_folder=Path("/r"), drives=Path("/d"))
    assert body["HostConfig"]["Binds"][2:] == [
        "/d/data:/astraeus/run/data:ro",
        "/d/out:/astraeus/run/results",
        "/d/ckpt:/ckpt",
    ]


def test_a_bare_payload_asks_for_nothing_it_did_not_ask_for() -> None:
    start = StartSpec(image="busybox:1.36", attempt=1, astraeus_environment={"RANK": "0"})
    body = create_body("40", start, run_folder=Path("/r"), drives=Path("/d"))
    # No command: the image's own; no user, limits or GPUs: the engine's defaults.
    assert "Cmd" not in body and "User" not in body and "WorkingDir" not in body
    host = body["HostConfig"]
    assert {"Memory", "MemorySwap", "NanoCpus", "DeviceRequests"}.isdisjoint(host)
    assert host["Binds"] == ["/r:/astraeus/run", f"{SDK}:/astraeus/sdk:ro"]
    assert body["Env"] == [
        "RANK=0",
        "ASTRAEUS_PROGRESS_FILE=/astraeus/run/progress",
        "PYTHONPATH=/astraeus/sdk",
        "PYTHONUNBUFFERED=1",
    ]
    assert body["Labels"] == {"astraeus.worker": "40", "astraeus.attempt": "1"}


def test_the_runs_own_pythonpath_comes_before_the_images_and_the_sdk_last() -> None:
    start = StartSpec(environment={"PYTHONPATH": "/work/src"})
    env = container_environment(start, ["PYTHONPATH=/opt/lib"])
    assert env["PYTHONPATH"] == "/work/src:/astraeus/sdk"
    assert container_environment(StartSpec(), ["PATH=/bin"])["PYTHONPATH"] == "/astraeus/sdk"


def test_a_worker_without_gpus_keeps_cuda_visible_devices_empty() -> None:
    start = StartSpec(gpu_ids=(), astraeus_environment={"CUDA_VISIBLE_DEVICES": ""})
    assert container_environment(start)["CUDA_VISIBLE_DEVICES"] == ""


def test_the_container_is_found_again_by_its_labels() -> None:
    assert json.loads(worker_filters("41", 3)) == {
        "label": ["astraeus.worker=41", "astraeus.attempt=3"]
    }
    assert json.loads(worker_filters()) == {"label": ["astraeus.worker"]}


def test_containers_whose_workers_the_agent_no_longer_keeps_are_orphans() -> None:
    # ContainerSummary, as GET /containers/json?all=1 lists them (fields trimmed).
    listed = [
        {
            "Id": "8dfafdbc3a40",
            "Names": ["/astraeus-41-3"],
            "Image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "Labels": {"astraeus.worker": "41", "astraeus.attempt": "3"},
            "State": "running",
            "Status": "Up 2 hours",
        },
        {
            "Id": "9cd87474be90",
            "Names": ["/astraeus-17-1"],
            "Labels": {"astraeus.worker": "17", "astraeus.attempt": "1"},
            "State": "exited",
            "Status": "Exited (0) 3 minutes ago",
        },
        {"Id": "3176a2479c92", "Names": ["/someone-elses"], "Labels": {}, "State": "running"},
    ]
    assert orphans(listed, {"41"}) == ["9cd87474be90"]


# --- the image ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("busybox", ("busybox", "latest")),
        ("busybox:1.36", ("busybox", "1.36")),
        ("nvcr.io/nvidia/pytorch:24.05-py3", ("nvcr.io/nvidia/pytorch", "24.05-py3")),
        ("localhost:5000/team/trainer", ("localhost:5000/team/trainer", "latest")),
        ("localhost:5000/team/trainer:v2", ("localhost:5000/team/trainer", "v2")),
        (
            "ubuntu@sha256:45b23dee08af5e43a7fea6c4cf9c25ccf269ee113168c19722f87876677c5cb2",
            (
                "ubuntu",
                "sha256:45b23dee08af5e43a7fea6c4cf9c25ccf269ee113168c19722f87876677c5cb2",
            ),
        ),
    ],
)
def test_an_image_is_pulled_by_name_and_tag(image: str, expected: tuple[str, str]) -> None:
    assert image_reference(image) == expected


# POST /images/create?fromImage=nvcr.io/nvidia/pytorch&tag=24.05-py3, line by line.
PULL_LINES = [
    {"status": "Pulling from nvidia/pytorch", "id": "24.05-py3"},
    {"status": "Already exists", "progressDetail": {}, "id": "a8b1c5f80c2d"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "5a7813e071bf"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "c92b6e2d0a3f"},
    {"status": "Waiting", "progressDetail": {}, "id": "c92b6e2d0a3f"},
    {
        "status": "Downloading",
        "progressDetail": {"current": 500_000_000, "total": 2_000_000_000},
        "progress": "[============>          ]    500MB/2GB",
        "id": "5a7813e071bf",
    },
    {
        "status": "Downloading",
        "progressDetail": {"current": 100_000_000, "total": 1_400_000_000},
        "progress": "[=>                     ]    100MB/1.4GB",
        "id": "c92b6e2d0a3f",
    },
    {"status": "Verifying Checksum", "progressDetail": {}, "id": "5a7813e071bf"},
    {"status": "Download complete", "progressDetail": {}, "id": "5a7813e071bf"},
    {
        "status": "Extracting",
        "progressDetail": {"current": 32_768, "total": 2_000_000_000},
        "progress": "[>                      ]  32.77kB/2GB",
        "id": "5a7813e071bf",
    },
]


def test_pull_progress_says_how_far_the_download_is() -> None:
    # reported beside WAIT_IMAGE; the server writes "Pulling image …: 2.1 GB of 3.4 GB"
    progress = PullProgress("nvcr.io/nvidia/pytorch:24.05-py3")
    assert progress.done() == ""
    for line in PULL_LINES[:5]:
        progress.feed(line)
    assert progress.done() == ""  # no sizes yet
    for line in PULL_LINES[5:7]:
        progress.feed(line)
    assert progress.done() == "600.0 MB of 3.4 GB"
    for line in PULL_LINES[7:]:
        progress.feed(line)  # one layer downloaded; extracting is not downloading
    assert progress.done() == "2.1 GB of 3.4 GB"
    assert progress.error is None


def test_a_failed_pull_answers_200_and_says_so_in_its_last_line() -> None:
    progress = PullProgress("busybox:nope")
    progress.feed({"status": "Pulling from library/busybox", "id": "nope"})
    progress.feed(
        {
            "errorDetail": {
                "message": "manifest for busybox:nope not found: manifest unknown: manifest unknown"
            },
            "error": "manifest for busybox:nope not found: manifest unknown: manifest unknown",
        }
    )
    assert progress.error == (
        "manifest for busybox:nope not found: manifest unknown: manifest unknown"
    )


def test_a_failed_pull_is_the_seeds_err_image_pull_without_an_exit_code() -> None:
    # The engine's 404 to POST /images/create for a repository it cannot pull.
    message = (
        "pull access denied for llama, repository does not exist or may require "
        "'docker login': denied: requested access to the resource is denied\n"
    )
    assert pull_failed(message) == Exit(
        None,
        EndCause.IMAGE_PULL,
        detail="pull access denied for llama, repository does not exist or may require "
        "'docker login': denied: requested access to the resource is denied",
    )


async def test_a_worker_without_an_image_cannot_be_pulled(tmp_path: Path) -> None:
    worker = make_worker(tmp_path, {"command": ["true"], "attempt": 1})
    worker.keep()
    reasons: list[str] = []

    async def report(reason: str) -> None:
        reasons.append(reason)

    ended = await worker.prepare(report)
    assert ended == Exit(None, EndCause.IMAGE_PULL, detail="the run names no image")
    assert worker.ended() == ended  # written down for a restarted agent
    assert reasons == []  # nothing was pulled


# --- the end -------------------------------------------------------------------------------


def state(**given: Any) -> dict[str, Any]:
    """ContainerInspect's State, as the engine answers for an ended container."""
    base = {
        "Status": "exited",
        "Running": False,
        "Paused": False,
        "Restarting": False,
        "OOMKilled": False,
        "Dead": False,
        "Pid": 0,
        "ExitCode": 0,
        "Error": "",
        "StartedAt": "2026-10-01T03:02:11.402117Z",
        "FinishedAt": "2026-10-01T03:12:44.118202Z",
    }
    return base | given


def test_a_container_that_exited_ends_with_its_code() -> None:
    assert exit_of(state()) == Exit(0, EndCause.EXITED)
    assert exit_of(state(ExitCode=1)) == Exit(1, EndCause.EXITED)
    assert exit_of(state(ExitCode=137)) == Exit(137, EndCause.EXITED)  # killed, not OOM


def test_a_container_killed_for_memory_ends_oom_killed() -> None:
    # seed L-52: "OOMKilled: the container exceeded its memory limit", exit code 137
    oom = exit_of(state(OOMKilled=True, ExitCode=137))
    assert oom == Exit(137, EndCause.OOM_KILLED)
    assert oom is not None and oom.oom_kill_seen


# issue 36: the engine's OOMKilled says a process of the container was killed, not which.
def test_a_child_killed_for_memory_leaves_the_containers_end_its_commands() -> None:
    for code in (0, 1):
        ended = exit_of(state(OOMKilled=True, ExitCode=code))
        assert ended == Exit(code, EndCause.EXITED)
        assert ended is not None and ended.oom_kill_seen  # counted: task_oom_kills_total
    plain = exit_of(state(ExitCode=0))
    assert plain is not None and not plain.oom_kill_seen


def test_a_container_whose_start_failed_ends_with_the_engines_code() -> None:
    failed = state(
        Status="created",
        ExitCode=127,
        Error="failed to create task for container: failed to create shim task: OCI runtime "
        'create failed: runc create failed: unable to start container process: exec: "trian.py": '
        "executable file not found in $PATH: unknown",
        StartedAt="0001-01-01T00:00:00Z",
        FinishedAt="0001-01-01T00:00:00Z",
    )
    assert exit_of(failed) == Exit(127, EndCause.EXITED)


def test_a_container_never_started_has_no_end_yet() -> None:
    created = state(Status="created", StartedAt="0001-01-01T00:00:00Z")
    assert exit_of(created) is None


# --- logs --------------------------------------------------------------------------------


def frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(payload)) + payload


def test_log_frames_are_demultiplexed_however_the_chunks_cut_them() -> None:
    big = b"x" * 70_000 + b"\n"
    stream = (
        frame(1, b"step 1\n")
        + frame(2, b"warning: slow\n")
        + frame(1, b"")
        + frame(1, big)
        + frame(1, b"step 2\n")
    )
    expected = [(1, b"step 1\n"), (2, b"warning: slow\n"), (1, b""), (1, big), (1, b"step 2\n")]
    for cut in (1, 3, 7, 8, 9, 4096, len(stream)):
        reader = FrameReader()
        frames = []
        for start in range(0, len(stream), cut):
            frames += reader.feed(stream[start : start + cut])
        assert frames == expected, cut
        assert reader.buffer == b""


def test_a_stream_that_is_not_multiplexed_is_refused() -> None:
    # A container with a TTY answers raw bytes; ours never has one.
    with pytest.raises(FrameError):
        FrameReader().feed(b"plain text output\n")


def test_engine_timestamps_are_epoch_nanoseconds() -> None:
    assert timestamp_ns("2026-10-01T03:12:44.118202301Z") == 1790824364_118202301
    assert timestamp_ns("2026-10-01T05:12:44.118202301+02:00") == 1790824364_118202301
    assert timestamp_ns("2026-10-01T03:12:44.5Z") == 1790824364_500000000
    assert timestamp_ns("2026-10-01T03:12:44Z") == 1790824364_000000000
    assert since_param(1790824364_000000042) == "1790824364.000000042"


def stamped(stream: int, at: str, text: bytes) -> tuple[int, bytes]:
    return stream, at.encode() + b" " + text


def test_log_entries_already_copied_are_left_out() -> None:
    t1, t2, t3 = (
        "2026-10-01T03:12:44.000000001Z",
        "2026-10-01T03:12:44.000000002Z",
        "2026-10-01T03:12:45.000000000Z",
    )
    frames = [
        stamped(1, t1, b"step 1\n"),
        stamped(2, t2, b"a very long line cut by the engine "),
        stamped(2, t3, b"ends here\n"),
    ]
    data, after, errors = new_output(frames, None)
    assert data == b"step 1\na very long line cut by the engine ends here\n"
    assert after == timestamp_ns(t3) and errors == []
    # Asked again since t1 (the engine includes it): only what came after is new.
    data, after, _ = new_output(frames, timestamp_ns(t1))
    assert data == b"a very long line cut by the engine ends here\n"
    assert new_output(frames, timestamp_ns(t3)) == (b"", timestamp_ns(t3), [])


def test_the_engines_own_errors_in_the_log_stream_are_not_the_workers_output() -> None:
    frames = [(3, b"error from daemon in stream: log file is closed\n")]
    assert new_output(frames, None) == (
        b"",
        None,
        ["error from daemon in stream: log file is closed"],
    )


# --- metrics -----------------------------------------------------------------------------

# ContainerStatsResponse on cgroup v1, as the Engine API documents it (per-CPU figures cut).
STATS_V1: dict[str, Any] = json.loads("""
{"read": "2015-01-08T22:57:31.547920715Z", "pids_stats": {"current": 3},
 "networks": {
   "eth0": {"rx_bytes": 5338, "rx_dropped": 0, "rx_errors": 0, "rx_packets": 36,
            "tx_bytes": 648, "tx_dropped": 0, "tx_errors": 0, "tx_packets": 8},
   "eth5": {"rx_bytes": 4641, "rx_dropped": 0, "rx_errors": 0, "rx_packets": 26,
            "tx_bytes": 690, "tx_dropped": 0, "tx_errors": 0, "tx_packets": 9}},
 "memory_stats": {
   "stats": {"total_pgmajfault": 0, "cache": 0, "rss": 6537216, "total_rss": 6537216,
             "total_inactive_file": 0, "hierarchical_memory_limit": 67108864},
   "max_usage": 6651904, "usage": 6537216, "failcnt": 0, "limit": 67108864},
 "blkio_stats": {},
 "cpu_stats": {
   "cpu_usage": {"total_usage": 100215355, "usage_in_kernelmode": 30000000,
                 "usage_in_usermode": 50000000},
   "system_cpu_usage": 739306590000000, "online_cpus": 4,
   "throttling_data": {"periods": 0, "throttled_periods": 0, "throttled_time": 0}}}
""")

# The same on cgroup v2, one-shot (no earlier reading), host network (no "networks").
STATS_V2: dict[str, Any] = json.loads("""
{"name": "/astraeus-41-3",
 "id": "8dfafdbc3a40c4c3a4e3c1ca7a4b1b2c5a0e7f4d1e3b8a9c6d2f0e1b7a3c5d9e",
 "read": "2026-10-01T03:12:40.000000000Z", "preread": "0001-01-01T00:00:00Z",
 "pids_stats": {"current": 12, "limit": 4611686018427387903},
 "blkio_stats": {"io_service_bytes_recursive": null}, "num_procs": 0, "storage_stats": {},
 "cpu_stats": {
   "cpu_usage": {"total_usage": 4000000000, "usage_in_kernelmode": 500000000,
                 "usage_in_usermode": 3500000000},
   "system_cpu_usage": 739306590000000, "online_cpus": 16,
   "throttling_data": {"periods": 0, "throttled_periods": 0, "throttled_time": 0}},
 "precpu_stats": {
   "cpu_usage": {"total_usage": 0, "usage_in_kernelmode": 0, "usage_in_usermode": 0},
   "throttling_data": {"periods": 0, "throttled_periods": 0, "throttled_time": 0}},
 "memory_stats": {
   "usage": 3221225472,
   "stats": {"anon": 2147483648, "file": 1073741824, "inactive_file": 536870912,
             "active_file": 536870912, "kernel_stack": 196608, "slab": 4194304},
   "failcnt": 2, "limit": 68719476736}}
""")


def test_stats_on_cgroup_v1_give_memory_and_network_but_no_oom_count() -> None:
    metrics, reading = stats_metrics(STATS_V1, None, 67108864)
    assert metrics == {
        "task_memory_used_bytes": 6537216.0,
        "task_memory_limit_bytes": 67108864.0,
        # failcnt counts every time v1's limit was reached, not OOM kills: absent
        "task_network_receive_bytes_total": 5338.0 + 4641.0,
        "task_network_transmit_bytes_total": 648.0 + 690.0,
    }
    assert reading == CpuReading(100215355, timestamp_ns("2015-01-08T22:57:31.547920715Z"))


def test_stats_on_cgroup_v2_with_the_hosts_network() -> None:
    first, reading = stats_metrics(STATS_V2, None, None)
    # No CPU figure from one reading; no limit asked; no network of its own: absent, not 0.
    assert first == {"task_memory_used_bytes": 3_221_225_472.0, "task_oom_kills_total": 2.0}
    later = json.loads(json.dumps(STATS_V2))
    later["read"] = "2026-10-01T03:12:45.000000000Z"
    later["cpu_stats"]["cpu_usage"]["total_usage"] = 4_000_000_000 + 37_500_000_000
    del later["memory_stats"]["failcnt"]  # the engine leaves it out when it is 0
    second, after = stats_metrics(later, reading, 64 * 2**30)
    assert second == {
        "task_cpu_usage_cores": 7.5,  # 37.5 CPU-seconds in 5 seconds
        "task_memory_used_bytes": 3_221_225_472.0,
        "task_memory_limit_bytes": float(64 * 2**30),
        "task_oom_kills_total": 0.0,
    }
    assert after == CpuReading(41_500_000_000, timestamp_ns("2026-10-01T03:12:45Z"))


def test_api_version_is_ours_where_the_engine_has_it() -> None:
    assert api_version("1.47", "1.24") == "1.47"
    assert api_version("1.51", "1.24") == "1.47"  # newer engine: the version we know
    assert api_version("1.52", "1.48") == "1.48"  # it no longer speaks ours: its oldest
    assert api_version("1.43", "1.12") == "1.43"
    with pytest.raises(EngineError):
        api_version("1.41", "1.12")


# --- the worker's folder -----------------------------------------------------------------


def make_worker(
    tmp_path: Path, payload: dict[str, Any], worker_id: int = 40, name: str = "w-0"
) -> ContainerWorker:
    """A worker as the agent makes one: known by its id, its name in its start."""
    key = str(worker_id)
    return ContainerWorker(
        worker_id,
        StartSpec.from_json({"worker": name, **payload}),
        WorkerLog(tmp_path / "logs", key),
        tmp_path / "workers" / key,
    )


def test_a_kept_worker_is_taken_back_with_its_container(tmp_path: Path) -> None:
    worker = make_worker(tmp_path, {"image": "busybox:1.36", "attempt": 2})
    worker.keep()
    assert worker.progress_file == tmp_path / "workers/40/run/progress"
    assert worker.progress_file.parent.stat().st_mode & 0o777 == 0o777  # any container user
    waiting = ContainerWorker.adopt(worker.folder, tmp_path / "logs")
    assert waiting is not None and not waiting.started  # at the barrier
    (worker.folder / "container").write_text("8dfafdbc3a40")
    running = ContainerWorker.adopt(worker.folder, tmp_path / "logs")
    assert running is not None
    assert (running.started, running.container_id, running.attempt) == (True, "8dfafdbc3a40", 2)
    assert (running.worker_id, running.name) == (40, "w-0")
    assert ContainerWorker.adopt(tmp_path / "workers" / "nothing", tmp_path / "logs") is None
    # A restarted agent tells a container's folder from a process's.
    process = ProcessWorker(42, StartSpec(attempt=1), worker.log, tmp_path / "workers" / "42")
    process.keep()
    assert is_container_folder(worker.folder) and not is_container_folder(process.folder)


# --- with a real engine ------------------------------------------------------------------

needs_engine = pytest.mark.skipif(not docker.on_engine(), reason="no Docker engine here")
IMAGE = "busybox:1.36"


async def _run(
    tmp_path: Path, worker_id: int, name: str, **payload: Any
) -> tuple[ContainerWorker, Exit]:
    worker = make_worker(tmp_path, {"image": IMAGE, "attempt": 1, **payload}, worker_id, name)
    worker.keep()
    assert await worker.prepare() is None
    await worker.start()
    ended = await worker.wait()
    return worker, ended


@needs_engine
async def test_a_container_runs_with_its_environment_progress_and_log(tmp_path: Path) -> None:
    script = 'echo "out $RANK"; echo err >&2; echo 5 > "$ASTRAEUS_PROGRESS_FILE"; exit 3'
    worker, ended = await _run(
        tmp_path,
        9001,
        "e2e-exit",
        command=["sh", "-c", script],
        astraeus_environment={"RANK": "1"},
        memory_limit_bytes=64 * 2**20,
    )
    assert ended == Exit(3, EndCause.EXITED)
    text, archived = worker.log.tail(10)
    # stdout and stderr reach the engine through two pipes: their lines may swap places.
    assert sorted(text.splitlines()) == ["err", "out 1"] and not archived
    assert worker.progress_file.read_text() == "5\n"
    container = worker.container_id
    assert container is not None
    await release(worker)
    with pytest.raises(EngineError) as gone:
        await worker.engine.call("GET", f"/containers/{container}/json")
    assert gone.value.status == 404


@needs_engine
async def test_a_command_not_in_the_image_ends_127_with_the_engines_message(
    tmp_path: Path,
) -> None:
    worker, ended = await _run(tmp_path, 9002, "e2e-127", command=["trian.py"])
    assert ended == Exit(127, EndCause.EXITED)
    # The init execs the command: its message is the log ("exec trian.py failed: No such …").
    assert "trian.py" in worker.log.snapshot()
    await release(worker)


@needs_engine
async def test_a_start_the_engine_refuses_ends_the_worker_with_its_message(
    tmp_path: Path,
) -> None:
    worker, ended = await _run(tmp_path, 9003, "e2e-refused", command=["true"], user="no-such-user")
    assert ended == Exit(128, EndCause.EXITED)  # the engine's code for a failed start
    assert "no-such-user" in worker.log.snapshot()
    await release(worker)


@needs_engine
async def test_a_container_over_its_memory_limit_ends_oom_killed(tmp_path: Path) -> None:
    worker, ended = await _run(
        tmp_path, 9004, "e2e-oom", command=["tail", "/dev/zero"], memory_limit_bytes=32 * 2**20
    )
    assert ended == Exit(137, EndCause.OOM_KILLED)
    await release(worker)


@needs_engine
async def test_an_image_that_cannot_be_pulled_ends_err_image_pull(tmp_path: Path) -> None:
    worker = make_worker(
        tmp_path, {"image": "astraeus-tests/no-such-image:nope", "attempt": 1}, 9005, "e2e-pull"
    )
    worker.keep()
    reports: list[str] = []

    async def report(done: str) -> None:
        reports.append(done)

    ended = await worker.prepare(report)
    assert ended is not None and ended.code is None
    assert ended.cause == EndCause.IMAGE_PULL and ended.detail, ended
    assert reports[0] == ""  # pulling, before the engine says any size


@needs_engine
async def test_a_stopped_container_ends_on_sigterm(tmp_path: Path) -> None:
    worker = make_worker(
        tmp_path, {"image": IMAGE, "attempt": 1, "command": ["sleep", "300"]}, 9006, "e2e-stop"
    )
    worker.keep()
    await worker.prepare()
    await worker.start()
    await worker.stop()
    assert worker.ended() == Exit(143, EndCause.EXITED)  # SIGTERM, through the init
    await release(worker)


@needs_engine
async def test_a_restarted_agent_takes_the_container_back_without_repeating_its_log(
    tmp_path: Path,
) -> None:
    script = "echo one; echo two; sleep 3; echo three"
    worker = make_worker(
        tmp_path,
        {"image": IMAGE, "attempt": 1, "command": ["sh", "-c", script]},
        9007,
        "e2e-adopt",
    )
    worker.keep()
    await worker.prepare()
    await worker.start()
    for _ in range(100):
        if worker.log.tail(10)[0] == "one\ntwo\n":
            break
        await asyncio.sleep(0.05)
    assert worker.copying is not None
    worker.copying.cancel()  # the agent dies
    taken = ContainerWorker.adopt(worker.folder, tmp_path / "logs")
    assert taken is not None and taken.started
    assert await taken.wait() == Exit(0, EndCause.EXITED)
    assert taken.log.tail(10) == ("one\ntwo\nthree\n", False)
    await release(taken)


@needs_engine
async def test_a_running_container_is_sampled_through_the_engine(tmp_path: Path) -> None:
    worker = make_worker(
        tmp_path,
        {
            "image": IMAGE,
            "attempt": 1,
            "command": ["sh", "-c", "while :; do :; done"],
            "memory_limit_bytes": 64 * 2**20,
        },
        9008,
        "e2e-sample",
    )
    worker.keep()
    await worker.prepare()
    await worker.start()
    first = await worker.sample()
    # No CPU figure from one reading; the host's network: no network bytes.
    expected = {"task_memory_used_bytes", "task_memory_limit_bytes"}
    assert set(first) == expected | ({"task_oom_kills_total"} if cgroup_v2() else set())
    assert 0 < first["task_memory_used_bytes"] <= first["task_memory_limit_bytes"] == 64 * 2**20
    await asyncio.sleep(1.5)
    busy = await worker.sample()
    assert 0.5 < busy["task_cpu_usage_cores"] < 1.5  # one shell spinning on one core
    await worker.stop()
    assert await worker.sample() == {}  # ended: nothing to sample
    await release(worker)


@needs_engine
async def test_containers_left_by_released_workers_are_removed_as_orphans(tmp_path: Path) -> None:
    worker, _ = await _run(tmp_path, 9009, "e2e-orphan", command=["true"])
    assert worker.container_id is not None
    worker.container_id = None  # released, but its removal never ran (the agent stopped)
    worker.release()
    others = await worker.engine.containers(worker_filters())
    # labelled <install>-<worker id>: this install's worker 9009 is no longer kept
    kept = {c["Labels"]["astraeus.worker"] for c in others} - {worker.key}
    assert len(await engines.remove_orphans(worker.engine, kept, worker.install)) == 1
    assert await worker.engine.containers(worker_filters("9009")) == []


async def release(worker: ContainerWorker) -> None:
    worker.release()
    await docker.removals_done()
    if worker.container_id is not None:
        assert await worker.engine.containers(worker_filters(str(worker.worker_id))) == []


def cgroup_v2() -> bool:
    return Path("/sys/fs/cgroup/cgroup.controllers").exists()


@needs_engine
async def test_a_container_that_ended_while_the_agent_was_away_keeps_its_log_and_end(
    tmp_path: Path,
) -> None:
    payload = {"image": IMAGE, "attempt": 1, "command": ["sh", "-c", "echo a; echo b; exit 4"]}
    worker = make_worker(tmp_path, payload, 9010, "e2e-away")
    worker.keep()
    await worker.prepare()
    await worker.start()
    assert worker.copying is not None and worker.container_id is not None
    worker.copying.cancel()  # the agent dies at once
    await worker.engine.call("POST", f"/containers/{worker.container_id}/wait", limit=30.0)
    taken = ContainerWorker.adopt(worker.folder, tmp_path / "logs")
    assert taken is not None
    assert await taken.wait() == Exit(4, EndCause.EXITED)
    assert taken.log.tail(10) == ("a\nb\n", False)
    await release(taken)


def test_a_container_of_a_run_with_code_starts_in_its_copy_in_the_run_folder() -> None:
    # issue 41: the code unpacked while it prepared is in its run folder (agent/code.py)
    shipped = dataclasses.replace(START, code="sha256:" + "a" * 64)
    body = create_body("w", shipped, run_folder=Path("/r"), drives=Path("/d"))
    assert body["WorkingDir"] == "/astraeus/run/code"
    assert "/r:/astraeus/run" in body["HostConfig"]["Binds"]
    chosen = dataclasses.replace(shipped, working_dir="/src")
    assert (
        create_body("w", chosen, run_folder=Path("/r"), drives=Path("/d"))["WorkingDir"] == "/src"
    )
    assert "WorkingDir" not in create_body("w", START, run_folder=Path("/r"), drives=Path("/d"))
    # kept in payload.json: a restarted agent starts it with its code too
    assert StartSpec.from_json(shipped.to_json()).code == shipped.code
