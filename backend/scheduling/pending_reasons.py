"""A pending run's reasons machine by machine (Run.pendingReasons: "Read a pending reason"):
for each machine of the cluster, why a worker fits there or not; and, for a "No machine fits"
reason (backend/scheduling/rules.py), what is short on which machines.

Pure: the machines' room and the pending run come in as plain data, sentences come out.
"""

from __future__ import annotations

import math
from collections import defaultdict

from backend.scheduling.placement import (
    Ask,
    MachineRoom,
    Room,
    cores_text,
    gpus_text,
    memory_text,
)
from backend.words import counted

# How many machines a "No machine fits" reason names for one resource; the others are counted.
SHORT_NAMED = 3


def short_on(room: Room, ask: Ask) -> str:
    """What is short, machine by machine, where none takes a worker now: "cores short on a, b;
    GPUs and memory short on c" (the machines of the ask's pool whose agent takes its workers;
    the full numbers: Read a pending reason)."""
    by_short: dict[str, list[str]] = defaultdict(list)
    for m in room.machines.values():
        if (ask.pool is not None and m.pool != ask.pool) or not m.takes(ask):
            continue
        short = [
            what
            for what, lacking in (
                ("GPUs", len(m.free_gpus) < ask.gpus),
                ("cores", m.cpu_free < ask.cpu),
                ("memory", m.memory_free < ask.memory),
            )
            if lacking
        ]
        if short:
            by_short[" and ".join(short)].append(m.name)
    parts = []
    for what, names in by_short.items():
        named = ", ".join(names[:SHORT_NAMED])
        if len(names) > SHORT_NAMED:
            named += f" and {len(names) - SHORT_NAMED} more"
        parts.append(f"{what} short on {named}")
    return "; ".join(parts)


def machine_reasons(ask: Ask, machines: list[MachineRoom]) -> list[tuple[str, str]]:
    """Read a pending reason: for each machine of the cluster, why a worker fits there or not."""
    out = []
    for m in sorted(machines, key=lambda m: m.name):
        out.append((m.name, _machine_reason(ask, m)))
    return out


def _machine_reason(ask: Ask, m: MachineRoom) -> str:
    if m.state == "lost":
        return "lost: its lease expired"
    if m.state == "draining":
        return "draining: takes no new work"
    if m.state != "ready":
        return f"{m.state}: takes no work"
    if ask.pool is not None and m.pool != ask.pool:
        return f"not in pool {ask.pool}"
    if not m.takes(ask):
        return "runs processes, not containers: the run names an image"
    problems = []
    if len(m.free_gpus) < ask.gpus:
        sick = f" ({m.unhealthy_gpus} unhealthy)" if m.unhealthy_gpus else ""
        problems.append(
            f"{len(m.free_gpus)} of {gpus_text(m.healthy_gpus + m.unhealthy_gpus)} free{sick}, "
            f"a worker needs {ask.gpus}"
        )
    if m.cpu_free < ask.cpu:
        problems.append(
            f"{m.cpu_free:g} of {cores_text(m.cpu_total)} free, a worker needs {ask.cpu:g}"
        )
    if m.memory_free < ask.memory:
        problems.append(
            f"{memory_text(m.memory_free, math.floor)} of {memory_text(m.memory_total)} "
            f"memory free, a worker needs {memory_text(ask.memory, math.ceil)}"
        )
    if problems:
        return "; ".join(problems)
    fit = min(
        len(m.free_gpus) // ask.gpus if ask.gpus else ask.workers,
        int(m.cpu_free // ask.cpu) if ask.cpu else ask.workers,
        m.memory_free // ask.memory if ask.memory else ask.workers,
    )
    return f"room for {min(fit, ask.workers)} of its {counted(ask.workers, 'worker')}"
