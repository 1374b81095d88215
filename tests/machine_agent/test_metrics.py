"""What the agent samples and reads of its workers' progress."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from astraeus.agent.v1 import agent_pb2

from agent import cgroups
from agent.cgroups import WorkerCgroup
from agent.executor import ProcessWorker
from agent.gpus import GpuCounters, GpuFault, health_change
from agent.logs import WorkerLog
from agent.metrics import ProgressReport, Sampler, read_progress
from agent.start import StartSpec
from tests.support import WORKLOAD_PYTHON
from tests.support.processes import Cluster


def worker(tmp_path: Path, **payload: object) -> ProcessWorker:
    w = ProcessWorker(
        41,
        StartSpec.from_json({"worker": "w-0", "attempt": 1, **payload}),
        WorkerLog(tmp_path / "logs", "41"),
        tmp_path / "workers" / "41",
    )
    w.keep()
    w.log.begin()
    w.home.mkdir(mode=0o700)  # as start() makes it: the workload's own folder, progress in it
    w.started = True
    return w


def test_progress_is_the_sdks_json_or_a_bare_step(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    path.write_text("120\n")
    assert read_progress(path) == ProgressReport(step=120)
    path.write_text(json.dumps({"step": 7, "loss": 1.5, "checkpoint_step": 5}))
    assert read_progress(path) == ProgressReport(step=7, loss=1.5, checkpoint_step=5)
    path.write_text('{"step": ')  # half written: read next time
    assert read_progress(path) is None


def test_a_simulated_gpu_is_busy_while_its_workload_steps(tmp_path: Path) -> None:
    now = [1000.0]
    sampler = Sampler(None, clock=lambda: now[0])
    w = worker(tmp_path, gpu_ids=[2, 3])

    def utilisation() -> list[tuple[int, float]]:
        look = sampler.look([w])
        return [(s.gpu, s.value) for s in look.samples if s.metric == "task_gpu_utilization_ratio"]

    assert utilisation() == [(2, 0.0), (3, 0.0)]  # nothing reported yet: idle
    w.progress_file.write_text("1")
    assert utilisation() == [(2, 0.95), (3, 0.95)]
    now[0] += 60  # no new step for a minute: idle again
    assert utilisation() == [(2, 0.0), (3, 0.0)]


def test_a_workload_can_say_how_busy_each_simulated_gpu_is(tmp_path: Path) -> None:
    # For rehearsals and tests (seed L-39's `97%` and `96%`): one figure, or one per GPU.
    now = [1000.0]
    sampler = Sampler(None, clock=lambda: now[0])
    w = worker(tmp_path, gpu_ids=[2, 3])
    w.progress_file.write_text(json.dumps({"step": 1, "gpu_utilization": [0.97, 0.96]}))
    look = sampler.look([w])
    values = [(s.gpu, s.value) for s in look.samples if s.metric == "task_gpu_utilization_ratio"]
    assert values == [(2, 0.97), (3, 0.96)]
    w.progress_file.write_text(json.dumps({"step": 2, "gpu_utilization": [0.5]}))
    look = sampler.look([w])
    values = [(s.gpu, s.value) for s in look.samples if s.metric == "task_gpu_utilization_ratio"]
    assert values == [(2, 0.5), (3, 0.95)]  # the second not said: busy while it steps
    assert read_progress(w.progress_file) == ProgressReport(step=2, gpu_utilization=(0.5,))


def test_progress_and_output_are_reported_once_each_time_they_change(tmp_path: Path) -> None:
    sampler = Sampler(None)
    w = worker(tmp_path)
    w.progress_file.write_text(json.dumps({"step": 3, "loss": 0.5}))
    look = sampler.look([w])
    assert [(p.worker_id, p.attempt, p.step, p.loss) for p in look.progress] == [(41, 1, 3, 0.5)]
    assert sampler.look([w]).progress == []  # nothing new
    w.log.append(b"a line\n")
    [output] = sampler.look([w]).progress
    assert not output.HasField("step")  # output alone: progress without a step


def test_a_group_no_process_has_joined_yet_is_not_sampled(tmp_path: Path) -> None:
    # The worker's process joins its group itself (agent/enter.py), a moment after it starts:
    # an empty group's memory (0) is not the worker's.
    group = tmp_path / "group"
    group.mkdir()
    (group / "memory.usage_in_bytes").write_text("4448256\n")
    (group / "cgroup.procs").write_text("")
    w = worker(tmp_path)
    w.cgroup = WorkerCgroup(1, group, None)
    sampler = Sampler(None)
    assert [s.metric for s in sampler.look([w]).samples] == []
    (group / "cgroup.procs").write_text("4242\n")
    used = [s.value for s in sampler.look([w]).samples if s.metric == "task_memory_used_bytes"]
    assert used == [4448256.0]


def test_gpu_faults_are_named_once_by_the_reading_that_showed_them() -> None:
    healthy = GpuCounters()
    assert health_change(healthy, GpuCounters(xid=79)) == GpuFault(
        agent_pb2.GPU_FAULT_KIND_XID, "XID 79: the GPU reported a fatal error"
    )
    assert health_change(healthy, GpuCounters(xid=13)) is None  # an application's own error
    assert health_change(healthy, GpuCounters(uncorrected_ecc=2)) == GpuFault(
        agent_pb2.GPU_FAULT_KIND_ECC, "ECC: 2 uncorrectable memory error(s)"
    )
    assert health_change(GpuCounters(uncorrected_ecc=2), GpuCounters(uncorrected_ecc=2)) is None
    assert health_change(healthy, GpuCounters(remap_failed=True)) == GpuFault(
        agent_pb2.GPU_FAULT_KIND_ROW_REMAP_FAILED,
        "Row remapping failed: the GPU's memory needs service",
    )
    assert health_change(healthy, GpuCounters(remap_pending=True)) == GpuFault(
        agent_pb2.GPU_FAULT_KIND_ROW_REMAP_PENDING, "Row remapping pending: the GPU must be reset"
    )
    pending = GpuCounters(remap_pending=True)
    assert health_change(pending, pending) is None


def test_a_gpu_fault_is_sent_with_its_kind_and_its_words() -> None:
    fault = GpuFault(agent_pb2.GPU_FAULT_KIND_ECC, "ECC: 1 uncorrectable memory error(s)")
    sent = agent_pb2.GpuHealth.FromString(fault.message(3).SerializeToString())
    assert (sent.index, sent.healthy, sent.kind, sent.reason) == (
        3,
        False,
        agent_pb2.GPU_FAULT_KIND_ECC,
        "ECC: 1 uncorrectable memory error(s)",
    )


def _v1_group(tmp_path: Path, **files: str) -> WorkerCgroup:
    group = tmp_path / "group"
    group.mkdir()
    for name, text in files.items():
        (group / name.replace("__", ".")).write_text(text)
    return WorkerCgroup(1, group, group)


def test_a_workers_start_and_end_are_sampled_besides_the_looks(tmp_path: Path) -> None:
    # seed L-52: a worker that lives a second, between two looks, still has a curve.
    now = [1000.0]
    sampler = Sampler(None, clock=lambda: now[0])
    w = worker(tmp_path, memory_limit_bytes=64 * 2**20)
    w.cgroup = _v1_group(
        tmp_path,
        cgroup__procs="4242\n",
        memory__usage_in_bytes="3000000\n",
        memory__max_usage_in_bytes="67100000\n",
        memory__oom_control="oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
        cpuacct__usage="0\n",
    )
    other = worker(tmp_path / "other")
    other.worker_id = 42
    sampler.look([w, other])
    first = sampler.started(w)
    assert {(s.metric, s.value) for s in first.samples} == {
        ("task_memory_used_bytes", 3000000.0),
        ("task_memory_limit_bytes", 64.0 * 2**20),
        ("task_oom_kills_total", 0.0),
    }
    assert set(sampler.seen) == {41, 42}  # a look at one worker forgets no other
    # Killed for memory 1.5 s later: its group is emptied, its charge was at its peak.
    (w.cgroup.memory / "cgroup.procs").write_text("")
    (w.cgroup.memory / "memory.usage_in_bytes").write_text("20000\n")
    (w.cgroup.memory / "memory.oom_control").write_text("oom_kill 1\n")
    (w.cgroup.memory / "cpuacct.usage").write_text("750000000\n")
    w.exited.set()
    now[0] += 5  # noticed later than it ended
    sampler.look([w, other])  # a look between the end and its samples forgets nothing
    last = sampler.ended(w, oom_killed=True, at_ms=1_001_500)
    assert [(s.metric, s.at_ms, s.value) for s in last] == [
        ("task_cpu_usage_cores", 1_001_500, 0.5),
        ("task_memory_used_bytes", 1_001_500, 67100000.0),
        ("task_memory_limit_bytes", 1_001_500, 64.0 * 2**20),
        ("task_oom_kills_total", 1_001_500, 1.0),
    ]
    assert 41 not in sampler.seen and 41 not in sampler.oom_kills_sent


def test_an_end_not_for_memory_is_sampled_with_what_is_still_charged(tmp_path: Path) -> None:
    sampler = Sampler(None, clock=lambda: 2000.0)
    w = worker(tmp_path)
    w.cgroup = _v1_group(tmp_path, memory__usage_in_bytes="20000\n", memory__max_usage_in_bytes="9")
    w.exited.set()
    assert [(s.metric, s.value) for s in sampler.ended(w, oom_killed=False)] == [
        ("task_memory_used_bytes", 20000.0),
        ("task_oom_kills_total", 0.0),
    ]
    # A container measured by its engine, killed for memory: at its limit as it ended.
    box = worker(tmp_path / "box", memory_limit_bytes=2**30)
    box.exited.set()
    assert [(s.metric, s.value) for s in sampler.ended(box, oom_killed=True)] == [
        ("task_memory_used_bytes", 2.0**30),
        ("task_memory_limit_bytes", 2.0**30),
        ("task_oom_kills_total", 1.0),
    ]


# issue 36; seed L-34: task_oom_kills_total counts processes killed for memory, each once.
def test_the_groups_own_count_is_sent_at_the_end_never_one_more(tmp_path: Path) -> None:
    sampler = Sampler(None, clock=lambda: 3000.0)
    w = worker(tmp_path, memory_limit_bytes=2**30)
    oom = "oom_kill_disable 0\nunder_oom 0\noom_kill {}\n"
    w.cgroup = _v1_group(tmp_path, cgroup__procs="4242\n", memory__oom_control=oom.format(1))
    [seen] = [s.value for s in sampler.look([w]).samples if s.metric == "task_oom_kills_total"]
    assert seen == 1.0  # a child killed, the main process lives on
    # Its main process killed for memory too: the group counted both.
    (w.cgroup.memory / "memory.oom_control").write_text(oom.format(2))
    w.exited.set()
    kills = [s.value for s in sampler.ended(w, oom_killed=True) if s.metric.startswith("task_oom")]
    assert kills == [2.0]


def test_a_kill_the_engine_saw_is_counted_once(tmp_path: Path) -> None:
    sampler = Sampler(None, clock=lambda: 3000.0)

    def kills(box: ProcessWorker, *, killed: bool = False, seen: bool = False) -> list[float]:
        box.exited.set()
        samples = sampler.ended(box, oom_killed=killed, oom_kill_seen=seen)
        return [s.value for s in samples if s.metric == "task_oom_kills_total"]

    # A container's child killed while its command went on and exited 0; no look saw it.
    assert kills(worker(tmp_path / "a"), seen=True) == [1.0]
    # One a look counted already (the engine's figure): not counted again.
    counted = worker(tmp_path / "b")
    sampler.look([counted], readings={41: {"task_oom_kills_total": 1.0}})
    assert kills(counted, seen=True) == [1.0]
    # Then its command killed as well: one more, which no look sees.
    killed = worker(tmp_path / "c")
    sampler.look([killed], readings={41: {"task_oom_kills_total": 1.0}})
    assert kills(killed, killed=True, seen=True) == [2.0]
    assert kills(worker(tmp_path / "d")) == []  # nothing known: nothing said


# A second and a half of life (two buckets of the range query's finest step, a second): the
# first at 30 MiB, the second killed for memory as it ends.
BRIEF = "import time; x = bytearray(30 * 2**20); time.sleep(1.5)"
KILLED = "import time; time.sleep(1.5); x = bytearray(400 * 2**20)"


def _memory_samples(cluster: Cluster, run: str, metric: str) -> list[tuple[int, float]]:
    now_ms = int(time.time() * 1000)
    answer = cluster.get(
        f"/metrics/range?metric={metric}&match=run:{run}"
        f"&start={now_ms - 120_000}&end={now_ms + 1000}&step=1s"
    )
    return [(int(t), v) for series in answer["series"] for t, v in series["points"]]


@pytest.mark.skipif(not cgroups.available(), reason="no writable cgroup hierarchy here")
def test_a_worker_living_a_second_has_samples_at_its_start_and_end(cluster: Cluster) -> None:
    # seed L-52: no look every few seconds comes in its life (one a minute here), yet a worker
    # killed for memory a second in has its memory at its start and at its end, at its limit.
    cluster.agent("m1", "--sample", "60").start()
    for name, command in (("brief", BRIEF), ("killed", KILLED)):
        cluster.submit(
            name=name,
            gpus=1,
            memory_bytes=64 * 2**20,
            restart_policy="never",
            command=[WORKLOAD_PYTHON, "-c", command],
        )
    cluster.wait(
        "both ended",
        lambda: {cluster.status("brief"), cluster.status("killed")} == {"Completed", "Failed"},
    )
    [killed] = cluster.workers("killed")
    assert killed["reason"] == "OOMKilled: the container exceeded its memory limit"
    for run in ("brief", "killed"):
        cluster.wait(
            f"{run}'s end sampled",
            lambda run=run: len(_memory_samples(cluster, run, "task_memory_used_bytes")) >= 2,
            seconds=20,
        )
        memory = _memory_samples(cluster, run, "task_memory_used_bytes")
        limit = _memory_samples(cluster, run, "task_memory_limit_bytes")
        assert len(memory) == 2 and len(limit) == 2, (run, memory, limit)
        (start, first), (end, last) = memory
        assert 1 <= (end - start) / 1000 <= 10, memory  # its life, start to end (a slow start)
        assert {v for _, v in limit} == {64.0 * 2**20}
        if run == "killed":
            assert first < 32 * 2**20 and last > 60 * 2**20, memory  # at its limit as it died
