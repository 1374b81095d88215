"""Pure rules of the machines domain: what a machine may say about itself when it registers.
No database, no clock."""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backend.metrics import rules as metric_rules

# A machine's name: a host name (letters, digits, '-', '.', '_'), beginning and ending with a
# letter or a digit, as a DNS name is at most.
NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
MAX_NAME = 253
MAX_POOL = 63
MAX_CPU_CORES = 4096.0
MAX_MEMORY_BYTES = 64 * 2**40  # 64 TiB
MAX_GPUS = 64
MAX_GPU_INDEX = 1023
MAX_GPU_MEMORY_BYTES = 4 * 2**40
MAX_UUID = 96
MAX_MODEL = 128
MAX_HEALTH_REASON = 500
MAX_VERSION = 64
MAX_KNOWN_WORKERS = 10_000
# What a machine says of its workers, kept to what its sentences can hold (a worker's and a
# run's reason are at most 1 000 characters): the name it waits for (a secret, a drive, an
# image reference), the engine's words (``detail``) and an old agent's sentence (``reason``). A
# failure snapshot's tail is cut where the snapshot is made (backend/lifecycle/endings.py
# snapshot_output: its last 16 KiB, saying when more came), whoever sent it.
MAX_WAITS_ON = 400
MAX_DETAIL = 300
MAX_WORKER_REASON = 300
# The address other machines reach this one at (a gang's MASTER_ADDR): an IP address, or a host
# name as DNS has them (labels of letters, digits and '-', at most 63 each, 253 in all).
MAX_ADDRESS = 253
LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class GpuFacts:
    index: int
    uuid: str
    model: str
    memory_bytes: int
    health_reason: str


@dataclass(frozen=True)
class MachineFacts:
    """What an agent's Hello says of its machine."""

    name: str
    pool: str
    cpu_cores: float
    memory_bytes: int
    gpus: tuple[GpuFacts, ...]
    agent_version: str
    known_workers: int
    advertise_address: str = ""
    executor: str = ""
    unmeasured_metrics: tuple[str, ...] = ()


def name_problem(field: str, name: str, longest: int = MAX_NAME) -> str | None:
    if not name:
        return f"{field} must not be empty"
    if len(name) > longest:
        return f"{field} must be at most {longest} characters (got {len(name)})"
    if not NAME.fullmatch(name):
        return (
            f"{field} may hold only letters, digits, '-', '.' and '_', beginning and ending with "
            "a letter or a digit"
        )
    return None


def registration_problem(facts: MachineFacts) -> str | None:
    """The first thing wrong with what a machine says of itself, as a sentence naming the field
    and its bound; None when all of it is within bounds."""
    checks = (
        name_problem("machine", facts.name),
        name_problem("pool", facts.pool, MAX_POOL) if facts.pool else None,
        _cpu_problem(facts.cpu_cores),
        _bounded("memory_bytes", facts.memory_bytes, MAX_MEMORY_BYTES, "64 TiB"),
        _text("agent_version", facts.agent_version, MAX_VERSION),
        (
            f"workers must list at most {MAX_KNOWN_WORKERS} (got {facts.known_workers})"
            if facts.known_workers > MAX_KNOWN_WORKERS
            else None
        ),
        _gpus_problem(facts.gpus),
        address_problem(facts.advertise_address) if facts.advertise_address else None,
        executor_problem(facts.executor, facts.unmeasured_metrics),
    )
    return next((problem for problem in checks if problem), None)


# How an agent runs workers (Hello.executor); empty: an agent before it said, host processes.
# "slurm": it runs none, it watches the workers Slurm runs on its node (backend/slurm/).
SLURM = "slurm"
EXECUTORS = ("process", "docker", SLURM)


def executor_refusal(executor: str, cluster: str, run_by_slurm: bool) -> str | None:
    """Why an agent of this executor may not join this cluster, or None: a Slurm-backed
    cluster's nodes are Slurm's to run (their agents only watch), and an agent that only
    watches has nothing to watch where Astraeus schedules."""
    if run_by_slurm and executor != SLURM:
        return (
            f"Cluster {cluster} is run by Slurm: the agent on each of its nodes watches the "
            "jobs Slurm runs there and runs none of its own (astraeus agent --executor slurm)"
        )
    if not run_by_slurm and executor == SLURM:
        return (
            f"Cluster {cluster} is scheduled by Astraeus: its agents run the workers placed on "
            "them (--executor process or docker); --executor slurm is for the nodes of a "
            "cluster Slurm runs"
        )
    return None


def executor_problem(executor: str, unmeasured: tuple[str, ...]) -> str | None:
    """What is wrong with the executor an agent names or the metrics it says it cannot measure
    (each must be one of the seed's metrics, once), or None."""
    if executor and executor not in EXECUTORS:
        return f"executor must be one of {', '.join(EXECUTORS)} (got {executor[:40]!r})"
    if len(unmeasured) > len(metric_rules.CATALOGUE):
        return (
            f"unmeasured_metrics must list at most {len(metric_rules.CATALOGUE)} metrics "
            f"(got {len(unmeasured)})"
        )
    for i, name in enumerate(unmeasured):
        if name not in metric_rules.BY_NAME:
            return f"unmeasured_metrics[{i}] is not a metric of this server (got {name[:80]!r})"
        if name in unmeasured[:i]:
            return f"unmeasured_metrics[{i}] repeats {name}"
    return None


# The parts of a worker's sandbox a machine's agent may enforce (proto Isolation), in the words
# `machines` shows them in.
ISOLATION_PARTS = {
    "unprivileged_user": "its own unprivileged user",
    "private_tmp": "a private /tmp and /var/tmp",
    "private_shm": "a private /dev/shm",
    "hidden_processes": "only its own processes in /proc",
    "private_ipc": "its own IPC namespace",
    "process_limit": "a process limit",
    "uid_handover": "its user id cleaned before another workspace gets it",
}


def isolation_not_enforced(executor: str | None, isolation: dict[str, Any] | None) -> list[str]:
    """The parts of the sandbox a machine's agent said it does not enforce (none said: every
    part, but a Slurm node's, whose workers Slurm runs)."""
    if executor == SLURM:
        return []
    enforced = set((isolation or {}).get("enforced") or [])
    return [part for part in ISOLATION_PARTS if part not in enforced]


def isolation_sentence(executor: str | None, isolation: dict[str, Any] | None) -> str:
    """What of its workers' sandbox a machine enforces, and what not, for people."""
    if executor == SLURM:
        return "Slurm's own (its cgroup and job_container settings)"
    if isolation is None:
        return "Not reported: its agent is older than the sandbox (issue 37): nothing is enforced"
    enforced = set(isolation.get("enforced") or [])
    said = []
    for part, words in ISOLATION_PARTS.items():
        if part in enforced:
            limit = int(isolation.get("pids_max") or 0)
            said.append(
                f"at most {limit} processes and threads"
                if part == "process_limit" and limit
                else words
            )
    missing = [ISOLATION_PARTS[p] for p in isolation_not_enforced(executor, isolation)]
    text = f"Enforced: {', '.join(said)}" if said else "Nothing enforced"
    return text + (f". Not enforced: {', '.join(missing)}" if missing else "")


def address_problem(address: str, field: str = "advertise_address") -> str | None:
    """Why ``address`` is not one other machines can be told to reach (an IP address or a host
    name), or None. It goes into workloads' environment as MASTER_ADDR: nothing else passes."""
    if len(address) > MAX_ADDRESS:
        return f"{field} must be at most {MAX_ADDRESS} characters (got {len(address)})"
    try:  # a zone (fe80::1%eth0) names an interface of this machine: no use to the others
        ipaddress.ip_address(address)
        return None if "%" not in address else f"{field} must not name a zone (got {address!r})"
    except ValueError:
        pass
    labels = address.removesuffix(".").split(".")
    if address and all(LABEL.fullmatch(label) for label in labels):
        return None
    return (
        f"{field} must be an IP address or a host name (labels of letters, digits and '-', "
        f"at most 63 characters each), got {address[:80]!r}"
    )


def _cpu_problem(cores: float) -> str | None:
    if not math.isfinite(cores) or not 0 < cores <= MAX_CPU_CORES:
        return f"cpu_cores must be a number above 0 and at most {MAX_CPU_CORES:g} (got {cores})"
    return None


def _bounded(field: str, value: int, most: int, said: str) -> str | None:
    if not 0 < value <= most:
        return f"{field} must be above 0 and at most {most} ({said}) (got {value})"
    return None


def _text(field: str, value: str, longest: int) -> str | None:
    if len(value) > longest:
        return f"{field} must be at most {longest} characters (got {len(value)})"
    return None


def _gpus_problem(gpus: tuple[GpuFacts, ...]) -> str | None:
    if len(gpus) > MAX_GPUS:
        return f"gpus must list at most {MAX_GPUS} GPUs (got {len(gpus)})"
    seen: set[int] = set()
    for i, gpu in enumerate(gpus):
        field = f"gpus[{i}]"
        if gpu.index > MAX_GPU_INDEX:
            return f"{field}.index must be at most {MAX_GPU_INDEX} (got {gpu.index})"
        if gpu.index in seen:
            return f"{field}.index repeats GPU {gpu.index}"
        seen.add(gpu.index)
        problem = (
            _text(f"{field}.uuid", gpu.uuid, MAX_UUID)
            or _text(f"{field}.model", gpu.model, MAX_MODEL)
            or _text(f"{field}.health_reason", gpu.health_reason, MAX_HEALTH_REASON)
            or (
                f"{field}.memory_bytes must be at most {MAX_GPU_MEMORY_BYTES} (4 TiB) "
                f"(got {gpu.memory_bytes})"
                if gpu.memory_bytes > MAX_GPU_MEMORY_BYTES
                else None
            )
        )
        if problem:
            return problem
    return None


class FaultKind(StrEnum):
    """A GPU fault's kind, as its machine's agent reports it (proto GpuFaultKind, from the NVML
    reading that showed it); a row remapping pending or failed is one kind here."""

    XID = "xid"
    ECC = "ecc"
    REMAP = "remap"
    OTHER = "other"  # an agent that names no kind (one before kinds were sent)
