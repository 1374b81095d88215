"""A busy Slurm site's day as its client commands print it, for bench/slurm_import.py (issue 38):
`sacct --json` and `sacct -P` of the day's window and of its cancelled jobs, the same of the
last minutes' window, `squeue --json --all` and `sinfo --json`, written to files once, and a
folder of fake `sacct`, `squeue` and `sinfo` that print them (`cat`) as their arguments ask,
so the import reads them through `SlurmSettings.bin` as it reads a real cluster.

The records are Debian's Slurm 22.05.8 output (openapi/dbv0.0.38 for sacct, v0.0.38 for
squeue and sinfo) with every field it prints, taken from a real one-node cluster
(tests/support/slurm.py) and filled with the day's values; printed as Slurm prints them (two
spaces of indent, "/" written "\\/"), about 3.3 KB a job in sacct's.

The day: jobs submitted over 24 hours, one in 500 requeued once (two records with
``--duplicates``), four arrays (5 000, 3 000, 2 000 and 1 000 tasks; the last still going at
the end of the day: some tasks running, its pending ones one record, "0x..." bitmap, as sacct
shows them), states as a site sees them (about 82% completed, 9% failed, 5% cancelled of which
some while pending or held, timeouts, out of memory, node failures), a few hundred running
and about 1 500 pending with Slurm's reasons at the end, over nodes of 8 GPUs in partitions
gpu and debug, accounts alpha to delta and ops.
"""

from __future__ import annotations

import json
import random
import shlex
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

DAY_START = datetime(2026, 12, 1, tzinfo=UTC)
NOW = DAY_START + timedelta(days=1)
CLUSTER = "site"
ACCOUNTS = ("alpha", "beta", "gamma", "delta", "ops")
ACCOUNT_WEIGHTS = (40, 25, 15, 15, 5)
NAMES = (
    "train",
    "eval",
    "preprocess",
    "llm-sft",
    "bert_base",
    "a|b",
    "sweep lr=3e-4",
    "\N{SCRIPT SMALL L}-test",
)
ARRAYS = ((5_000, 64), (3_000, 32), (2_000, 32), (1_000, 8))  # tasks, at most running at once
PENDING_REASONS = (
    ("Priority", 50),
    ("Resources", 25),
    ("AssocGrpGRES", 10),
    ("Dependency", 8),
    ("JobHeldUser", 4),
    ("BeginTime", 3),
)
ENDINGS = (
    ("COMPLETED", 820),
    ("FAILED", 90),
    ("CANCELLED", 50),
    ("TIMEOUT", 20),
    ("OUT_OF_MEMORY", 15),
    ("NODE_FAIL", 5),
)
GPUS_ASKED = ((1, 70), (2, 15), (4, 10), (8, 5))
MIN_JOB_AGE = 300  # s: how long slurmctld keeps an ended job (squeue lists it)
GPUS_PER_NODE = 8
SACCT_META = {
    "plugin": {"type": "openapi/dbv0.0.38", "name": "Slurm OpenAPI DB v0.0.38"},
    "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"},
}
CTLD_META = {
    "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
    "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"},
}


@dataclass
class Job:
    """One record of the day, as the generator decides it (times in epoch seconds, 0: none)."""

    raw: int
    name: str
    account: str
    user: str
    partition: str
    submit: int
    gpus: int
    limit: int  # minutes
    state: str = "COMPLETED"
    start: int = 0
    end: int = 0
    eligible: int = 0
    node: str = ""
    gpu_index: tuple[int, ...] = ()
    array_job: int = 0
    task: int | None = None
    pending_tasks: str | None = None  # an array's pending tasks, sacct's hex bitmap
    task_string: str = ""  # the same as squeue prints it ("909-1000%8")
    reason: str = "None"
    priority: int = 1000
    exit_code: int = 0
    signal: int = 0
    held: bool = False  # cancelled while held: never eligible, only in --state=CANCELLED

    def live(self) -> bool:
        return self.state in ("PENDING", "RUNNING")


@dataclass
class Day:
    """The documents written and the fake commands' folder."""

    folder: Path
    bin: Path
    jobs: int  # jobs Slurm has (an array's task each; its pending tasks not)
    records: int  # sacct's records of the day's window (requeued jobs twice)
    states: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # file -> bytes

    def calls(self) -> list[list[str]]:
        """The commands run since the last time asked (program path, then arguments)."""
        log = self.folder / "calls.log"
        if not log.exists():
            return []
        lines = log.read_text().splitlines()
        log.unlink()
        return [line.split("\t") for line in lines if line]


def _pick(rng: random.Random, weighted: tuple[tuple[Any, int], ...]) -> Any:
    return rng.choices([v for v, _ in weighted], [w for _, w in weighted])[0]


def _duration(rng: random.Random) -> int:
    """Seconds: a median of about 4 minutes, a long tail to hours."""
    return max(5, int(rng.lognormvariate(5.5, 1.1)))


def make_jobs(count: int, nodes: list[str], seed: int) -> list[Job]:
    """The day's job records, in the order of their raw ids."""
    rng = random.Random(seed)
    t0, now = int(DAY_START.timestamp()), int(NOW.timestamp())
    users = [f"u{n:02d}" for n in range(40)]
    out: list[Job] = []
    raw = 1000

    def new(submit: int, **kw: Any) -> Job:
        nonlocal raw
        raw += 1
        account = kw.pop("account", None) or _pick(
            rng, tuple(zip(ACCOUNTS, ACCOUNT_WEIGHTS, strict=True))
        )
        return Job(
            raw=raw,
            name=kw.pop("name", None) or rng.choice(NAMES),
            account=account,
            user=kw.pop("user", None) or rng.choice(users),
            partition="debug" if rng.random() < 0.05 else "gpu",
            submit=submit,
            gpus=kw.pop("gpus", None) or _pick(rng, GPUS_ASKED),
            limit=rng.choice((60, 240, 1440)),
            priority=rng.randint(1000, 20000),
            **kw,
        )

    starts = (2 * 3600, 8 * 3600, 14 * 3600, 16 * 3600)
    for (size, at_once), offset in zip(ARRAYS, starts, strict=True):
        _array(rng, out, new, min(size, count // 10), at_once, t0 + offset, now)
    tasks = sum(1 for j in out if j.pending_tasks is None)
    for _ in range(count - tasks):
        job = new(rng.randint(t0, now - 5))
        job.eligible = job.submit
        if job.submit > now - 3 * 3600 and rng.random() < 0.09:
            job.state, job.reason = "PENDING", _pick(rng, PENDING_REASONS)
            job.eligible = 0 if job.reason in ("JobHeldUser", "BeginTime") else job.submit
        else:
            _ran(rng, job, job.submit + int(rng.expovariate(1 / 90)), now)
        out.append(job)
    _place_running(out, nodes, rng)
    _number_by_submission(out)
    _requeue(rng, out)
    out.sort(key=lambda j: j.raw)
    return out


def _number_by_submission(jobs: list[Job]) -> None:
    """Raw ids in the order of submission, as slurmctld gives them (an array's tasks keep the
    array's id as theirs)."""
    order = sorted(jobs, key=lambda j: (j.submit, j.raw))
    new = {j.raw: 1001 + n for n, j in enumerate(order)}
    for job in jobs:
        job.raw, job.array_job = new[job.raw], new.get(job.array_job, 0)


def _ran(rng: random.Random, job: Job, start: int, now: int) -> None:
    """The job started at ``start`` (or waits still, if that is after ``now``) and ended."""
    if start >= now:
        job.state, job.reason = "PENDING", "Priority"
        return
    job.start = start
    ending = _pick(rng, ENDINGS)
    if ending == "CANCELLED" and rng.random() < 0.3:  # cancelled while it waited
        job.state, job.start, job.end, job.signal = "CANCELLED", 0, start, 15
        job.held = rng.random() < 0.5
        job.reason = "JobHeldUser" if job.held else "Priority"
        if job.held:
            job.eligible = 0
        return
    length = _duration(rng)
    if ending == "TIMEOUT":
        length = job.limit * 60
    end = start + length
    if end > now:
        job.state = "RUNNING"
        return
    job.state, job.end = ending, end
    job.exit_code = {"FAILED": rng.choice((1, 2, 3, 137)), "OUT_OF_MEMORY": 0}.get(ending, 0)
    job.signal = {"CANCELLED": 15, "OUT_OF_MEMORY": 9, "TIMEOUT": 15}.get(ending, 0)


def _array(
    rng: random.Random, out: list[Job], new: Any, size: int, at_once: int, submit: int, now: int
) -> None:
    """An array's tasks, ``at_once`` at a time; those not started by ``now`` as one record."""
    name, account, user, gpus = "sweep", "alpha", "u07", 1
    first = len(out)
    slot_end = [submit] * at_once
    waiting: list[int] = []
    for task in range(1, size + 1):
        slot = min(range(at_once), key=slot_end.__getitem__)
        start = slot_end[slot] + rng.randint(1, 20)
        if start >= now:
            waiting.append(task)
            continue
        job = new(submit, name=name, account=account, user=user, gpus=gpus, task=task)
        job.eligible = start
        _ran(rng, job, start, now)
        if job.state == "CANCELLED" and not job.start:
            job.state, job.start, job.held, job.signal = "COMPLETED", start, False, 0
            job.eligible, job.end = start, start + _duration(rng)
        slot_end[slot] = max(job.end, start) if job.state != "RUNNING" else now + 3600
        out.append(job)
    array_id = out[first].raw
    for job in out[first:]:
        job.array_job = array_id
    if waiting:
        pending = new(submit, name=name, account=account, user=user, gpus=gpus)
        pending.array_job, pending.state, pending.reason = array_id, "PENDING", "JobArrayTaskLimit"
        pending.eligible = submit
        bits = sum(1 << t for t in waiting)
        pending.pending_tasks = hex(bits)
        pending.task_string = f"{waiting[0]}-{waiting[-1]}%{at_once}"
        out.append(pending)


def _place_running(jobs: list[Job], nodes: list[str], rng: random.Random) -> None:
    """Running jobs packed on the nodes' GPUs; those that do not fit wait (Resources). Ended
    jobs ran on any node."""
    free = {n: list(range(GPUS_PER_NODE)) for n in nodes}
    for job in jobs:
        if job.state != "RUNNING":
            if job.start:
                job.node = rng.choice(nodes)
            continue
        node = next((n for n in nodes if len(free[n]) >= job.gpus), None)
        if node is None:
            job.state, job.start, job.reason = "PENDING", 0, "Resources"
            continue
        job.node, job.gpu_index = node, tuple(free[node][: job.gpus])
        del free[node][: job.gpus]


def _requeue(rng: random.Random, jobs: list[Job]) -> None:
    """One ended job in 500 ran once before and was queued again (a node failure): sacct
    --duplicates gives that instance as a record of its own."""
    for job in list(jobs):
        if job.state == "COMPLETED" and not job.array_job and rng.random() < 0.002:
            first = Job(**{**job.__dict__})
            first.state, first.end = "REQUEUED", job.start + (job.end - job.start) // 2
            job.start = first.end + 120
            job.end = max(job.end, job.start + 60)
            jobs.append(first)


# ---- as the commands print them ----


def _gres(count: int) -> dict[str, Any]:
    return {"type": "gres", "name": "gpu", "id": 1001, "count": count}


def _tres(job: Job, cpus: int, memory: int) -> list[dict[str, Any]]:
    return [
        {"type": "cpu", "name": None, "id": 1, "count": cpus},
        {"type": "mem", "name": None, "id": 2, "count": memory},
        {"type": "node", "name": None, "id": 4, "count": 1},
        {"type": "billing", "name": None, "id": 5, "count": cpus},
        _gres(job.gpus),
    ]


def sacct_record(job: Job) -> dict[str, Any]:
    """The job as `sacct --json` prints it (Slurm 22.05.8, every field)."""
    ran = bool(job.start) and bool(job.node)
    cpus, memory = 8 * job.gpus, 64000 * job.gpus
    now = int(NOW.timestamp())
    elapsed = ((job.end or now) - job.start) if job.start else 0
    if job.state == "FAILED":
        exit_json: dict[str, Any] = {"status": "FAILED", "return_code": job.exit_code}
    elif job.signal:
        exit_json = {
            "status": "SIGNALED",
            "return_code": None,
            "signal": {"signal_id": job.signal, "name": "TERM" if job.signal == 15 else "KILL"},
        }
    else:
        exit_json = {"status": "SUCCESS", "return_code": 0}
    return {
        "account": job.account,
        "comment": {"administrator": None, "job": None, "system": None},
        "allocation_nodes": 1 if ran else 0,
        "array": {
            "job_id": job.array_job,
            "limits": {"max": {"running": {"tasks": 0}}},
            "task": job.pending_tasks,
            "task_id": job.task,
        },
        "association": {
            "account": job.account,
            "cluster": CLUSTER,
            "partition": None,
            "user": job.user,
        },
        "cluster": CLUSTER,
        "constraints": "",
        "container": None,
        "derived_exit_code": {"status": "SUCCESS", "return_code": 0},
        "time": {
            "elapsed": elapsed,
            "eligible": job.eligible,
            "end": job.end,
            "start": _listed_start(job),
            "submission": job.submit,
            "suspended": 0,
            "system": {"seconds": elapsed // 50, "microseconds": 0},
            "limit": job.limit,
            "total": {"seconds": elapsed // 2, "microseconds": 0},
            "user": {"seconds": elapsed // 2, "microseconds": 0},
        },
        "exit_code": exit_json,
        "flags": ["CLEAR_SCHEDULING", "STARTED_ON_SCHEDULE"] if ran else [],
        "group": "users",
        "het": {"job_id": 0, "job_offset": None},
        "job_id": job.raw,
        "name": job.name,
        "mcs": {"label": ""},
        "nodes": job.node if ran else "None assigned",
        "partition": job.partition,
        "priority": job.priority,
        "qos": "normal",
        "required": {"CPUs": cpus, "memory": memory},
        "kill_request_user": job.user if job.state == "CANCELLED" else None,
        "reservation": {"id": 0, "name": 0},
        "state": {"current": job.state, "reason": job.reason},
        "steps": [],
        "tres": {
            "allocated": _tres(job, cpus, memory) if ran else [],
            "requested": _tres(job, cpus, memory),
        },
        "user": job.user,
        "wckey": {"wckey": "", "flags": []},
        "working_directory": f"/home/{job.user}/work",
    }


def _listed_start(job: Job) -> int | None:
    """Its start as accounting lists it: a job cancelled while it waited is dated started at
    its cancel by 22.05 (on no node), one cancelled while held has none (null)."""
    if job.held:
        return None
    if job.state == "CANCELLED" and not job.start:
        return job.end
    return job.start


def exit_line(job: Job) -> str:
    """The job's line of `sacct -X -P -n -o JobIDRaw,Start,ExitCode`."""
    listed = _listed_start(job)
    start = datetime.fromtimestamp(listed, UTC) if listed else None
    stamp = f"{start:%Y-%m-%dT%H:%M:%S}" if start else "Unknown"
    return f"{job.raw}|{stamp}|{job.exit_code}:{job.signal}"


def squeue_record(job: Job) -> dict[str, Any]:
    """The job as `squeue --json --all` prints it (Slurm 22.05.8, every field)."""
    running = job.state == "RUNNING"
    shown = bool(job.start)
    cpus, memory = 8 * job.gpus, 64000 * job.gpus
    tres = f"cpu={cpus},mem={memory}M,node=1,billing={cpus},gres/gpu={job.gpus}"
    return {
        "account": job.account,
        "accrue_time": job.eligible,
        "admin_comment": "",
        "array_job_id": job.array_job,
        "array_task_id": job.task,
        "array_max_tasks": 0,
        "array_task_string": job.task_string,
        "association_id": 4 + ACCOUNTS.index(job.account),
        "batch_features": "",
        "batch_flag": True,
        "batch_host": job.node if shown else "",
        "flags": [],
        "burst_buffer": "",
        "burst_buffer_state": "",
        "cluster": CLUSTER,
        "cluster_features": "",
        "command": "",
        "comment": "",
        "container": "",
        "contiguous": False,
        "core_spec": None,
        "thread_spec": None,
        "cores_per_socket": None,
        "billable_tres": float(cpus) if shown else None,
        "cpus_per_task": None,
        "cpu_frequency_minimum": None,
        "cpu_frequency_maximum": None,
        "cpu_frequency_governor": None,
        "cpus_per_tres": "",
        "deadline": 0,
        "delay_boot": 0,
        "dependency": "",
        "derived_exit_code": 0,
        "eligible_time": job.eligible,
        "end_time": job.end or (job.start + job.limit * 60 if running else 0),
        "excluded_nodes": "",
        "exit_code": job.exit_code,
        "features": "",
        "federation_origin": "",
        "federation_siblings_active": "",
        "federation_siblings_viable": "",
        "gres_detail": (
            [f"gpu:{job.gpus}(IDX:{','.join(map(str, job.gpu_index))})"] if running else []
        ),
        "group_id": 100,
        "group_name": "users",
        "job_id": job.raw,
        "job_resources": (
            {
                "nodes": job.node,
                "allocated_cores": cpus,
                "allocated_hosts": 1,
                "allocated_nodes": [
                    {
                        "sockets": {"0": {"cores": {str(c): "allocated" for c in range(cpus)}}},
                        "nodename": job.node,
                        "cpus_used": 0,
                        "memory_used": 0,
                        "memory_allocated": memory,
                    }
                ],
            }
            if shown
            else None
        ),
        "job_state": job.state,
        "last_sched_evaluation": int(NOW.timestamp()) - 30,
        "licenses": "",
        "max_cpus": 0,
        "max_nodes": 0,
        "mcs_label": "",
        "memory_per_tres": "",
        "name": job.name,
        "nodes": job.node if shown else "",
        "nice": None,
        "tasks_per_core": None,
        "tasks_per_node": 0,
        "tasks_per_socket": None,
        "tasks_per_board": 0,
        "cpus": cpus,
        "node_count": 1,
        "tasks": 1,
        "het_job_id": 0,
        "het_job_id_set": "",
        "het_job_offset": 0,
        "partition": job.partition,
        "prefer": "",
        "memory_per_node": None,
        "memory_per_cpu": 8000,
        "minimum_cpus_per_node": cpus,
        "minimum_tmp_disk_per_node": 0,
        "preempt_time": 0,
        "pre_sus_time": 0,
        "priority": job.priority,
        "profile": None,
        "qos": "normal",
        "reboot": False,
        "required_nodes": "",
        "requeue": True,
        "resize_time": 0,
        "restart_cnt": 0,
        "resv_name": "",
        "shared": None,
        "show_flags": ["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"],
        "sockets_per_board": 0,
        "sockets_per_node": None,
        "start_time": job.start,
        "state_description": "",
        "state_reason": job.reason,
        "standard_error": "",
        "standard_input": "/dev/null",
        "standard_output": "",
        "submit_time": job.submit,
        "suspend_time": 0,
        "system_comment": "",
        "time_limit": job.limit,
        "time_minimum": 0,
        "threads_per_core": None,
        "tres_bind": "",
        "tres_freq": "",
        "tres_per_job": "",
        "tres_per_node": f"gres:gpu:{job.gpus}",
        "tres_per_socket": "",
        "tres_per_task": "",
        "tres_req_str": tres,
        "tres_alloc_str": tres if shown else "",
        "user_id": 1000 + int(job.user[1:]),
        "user_name": job.user,
        "wckey": "",
        "current_working_directory": f"/home/{job.user}/work",
    }


def sinfo_record(name: str, busy: int) -> dict[str, Any]:
    """A node as `sinfo --json` prints it (Slurm 22.05.8, every field)."""
    now = int(NOW.timestamp())
    return {
        "architecture": "x86_64",
        "burstbuffer_network_address": "",
        "boards": 1,
        "boot_time": now - 30 * 86400,
        "comment": "",
        "cores": 32,
        "cpu_binding": 0,
        "cpu_load": 3100,
        "extra": "",
        "free_memory": 400000,
        "cpus": 64,
        "last_busy": now - 5,
        "features": "",
        "active_features": "",
        "gres": f"gpu:h100:{GPUS_PER_NODE}(S:0-1)",
        "gres_drained": "N/A",
        "gres_used": f"gpu:h100:{busy}(IDX:0-{max(busy - 1, 0)})",
        "mcs_label": "",
        "name": name,
        "next_state_after_reboot": "invalid",
        "address": name,
        "hostname": name,
        "state": "mixed" if 0 < busy < GPUS_PER_NODE else "allocated" if busy else "idle",
        "state_flags": [],
        "next_state_after_reboot_flags": [],
        "operating_system": "Linux 6.1.0-27-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.115-1",
        "owner": None,
        "partitions": ["gpu", "debug"],
        "port": 6818,
        "real_memory": 1024000,
        "reason": "",
        "reason_changed_at": 0,
        "reason_set_by_user": None,
        "slurmd_start_time": now - 30 * 86400,
        "sockets": 2,
        "threads": 1,
        "temporary_disk": 0,
        "weight": 1,
        "tres": f"cpu=64,mem=1000G,billing=64,gres/gpu={GPUS_PER_NODE}",
        "slurmd_version": "22.05.8",
        "alloc_memory": 64000 * busy,
        "alloc_cpus": 8 * busy,
        "idle_cpus": 64 - 8 * busy,
        "tres_used": f"cpu={8 * busy},mem={64000 * busy}M,gres/gpu={busy}",
        "tres_weighted": float(8 * busy),
    }


def printed(meta: dict[str, Any], key: str, records: list[dict[str, Any]]) -> str:
    """A document as Slurm prints it: two spaces of indent, "/" escaped."""
    head = json.dumps({"meta": meta, "errors": []}, indent=2)[:-2]
    body = ",\n".join(
        "    " + json.dumps(r, indent=2, ensure_ascii=False).replace("\n", "\n    ")
        for r in records
    )
    text = f'{head},\n  "{key}": [\n{body}\n  ]\n}}\n'
    return text.replace("/", "\\/")


def _in_window(job: Job, since: int, until: int) -> bool:
    """In sacct's window listing: eligible before its end, and not ended before its start
    (a job cancelled while held was never eligible: never listed so)."""
    if not job.eligible and not job.start:
        return False
    return (job.eligible or job.start) <= until and (not job.end or job.end >= since)


def _cancelled(job: Job, since: int, until: int) -> bool:
    """In the --state=CANCELLED listing: cancelled, its end inside the window."""
    return job.state == "CANCELLED" and since <= job.end <= until


def write(folder: Path, count: int, nodes: int, seed: int = 38, recent_s: int = 660) -> Day:
    """The day's documents and the fake commands, in ``folder``."""
    names = [f"gpu{n:03d}" for n in range(1, nodes + 1)]
    jobs = make_jobs(count, names, seed)
    t0, now = int(DAY_START.timestamp()), int(NOW.timestamp())
    until = now + 60
    files: dict[str, str] = {}
    windows = {"day": (t0, until), "recent": (now - recent_s, until)}
    for window, (since, end) in windows.items():
        for listing, keep in (("", _in_window), ("_ca", _cancelled)):
            chosen = [j for j in jobs if keep(j, since, end)]
            name = f"sacct_{window}{listing}"
            files[f"{name}.json"] = printed(SACCT_META, "jobs", [sacct_record(j) for j in chosen])
            files[f"{name}.txt"] = "".join(exit_line(j) + "\n" for j in chosen)
    files["sacct_none.json"] = printed(SACCT_META, "jobs", [])
    queued = [
        j
        for j in jobs
        if j.state != "REQUEUED" and (j.live() or (j.end and j.end >= now - MIN_JOB_AGE))
    ]
    files["squeue.json"] = printed(CTLD_META, "jobs", [squeue_record(j) for j in queued])
    busy = {n: 0 for n in names}
    for j in jobs:
        if j.state == "RUNNING":
            busy[j.node] += j.gpus
    files["sinfo.json"] = printed(CTLD_META, "nodes", [sinfo_record(n, busy[n]) for n in names])
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    fake = _fake_commands(folder, f"{DAY_START:%Y-%m-%dT%H:%M:%S}")
    states: dict[str, int] = {}
    for j in jobs:
        kind = j.state + (" (held)" if j.held else "") + (" array task" if j.task else "")
        states[kind] = states.get(kind, 0) + 1
    return Day(
        folder=folder,
        bin=fake,
        jobs=sum(1 for j in jobs if j.state != "REQUEUED" and j.pending_tasks is None),
        records=sum(1 for j in jobs if _in_window(j, t0, until)),
        states=states,
        sizes={n: len(t.encode()) for n, t in files.items()},
    )


def _fake_commands(folder: Path, day_start: str) -> Path:
    """sacct, squeue and sinfo that print the day's files (each call logged to calls.log)."""
    bin_ = folder / "bin"
    bin_.mkdir(exist_ok=True)
    d = shlex.quote(str(folder))
    log = f'printf "%s" "$0" >> {d}/calls.log; for a in "$@"; do printf "\\t%s" "$a"; done'
    log += f" >> {d}/calls.log; echo >> {d}/calls.log"
    scripts = {
        "sacct": f"""{log}
case " $* " in *" --json "*) ext=json ;; *) ext=txt ;; esac
case " $* " in *" --jobs="*) [ $ext = json ] && exec cat {d}/sacct_none.json; exit 0 ;; esac
case " $* " in *" --starttime={day_start} "*) w=day ;; *) w=recent ;; esac
case " $* " in *" --state=CANCELLED "*) w=${{w}}_ca ;; esac
exec cat {d}/sacct_$w.$ext
""",
        "squeue": f"{log}\nexec cat {d}/squeue.json\n",
        "sinfo": f"{log}\nexec cat {d}/sinfo.json\n",
    }
    for name, body in scripts.items():
        path = bin_ / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_
