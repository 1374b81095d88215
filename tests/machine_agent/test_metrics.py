"""What the agent samples and reads of its workers' progress."""

from __future__ import annotations

import json
from pathlib import Path

from agent.cgroups import WorkerCgroup
from agent.executor import ProcessWorker
from agent.gpus import GpuCounters, health_change
from agent.logs import WorkerLog
from agent.metrics import ProgressReport, Sampler, read_progress


def worker(tmp_path: Path, **payload: object) -> ProcessWorker:
    w = ProcessWorker(
        41,
        {"worker": "w-0", "attempt": 1, **payload},
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


def test_gpu_faults_are_named_once() -> None:
    healthy = GpuCounters()
    assert health_change(healthy, GpuCounters(xid=79)) == ("XID 79: the GPU reported a fatal error")
    assert health_change(healthy, GpuCounters(xid=13)) is None  # an application's own error
    assert health_change(healthy, GpuCounters(uncorrected_ecc=2)) == (
        "ECC: 2 uncorrectable memory error(s)"
    )
    assert health_change(GpuCounters(uncorrected_ecc=2), GpuCounters(uncorrected_ecc=2)) is None
    assert health_change(healthy, GpuCounters(remap_failed=True)) == (
        "Row remapping failed: the GPU's memory needs service"
    )
