"""Machines' GPUs in GraphQL (seed L-39)."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import strawberry

from backend.machines.health import MachineHealth
from backend.machines.rules import FaultKind
from backend.machines.views import GpuView, MachineView, PoolView
from backend.schema.common import UserError
from backend.schema.idle import IdlePolicy


@strawberry.type(
    description="A GPU of a machine the workspace's runs may use: its model, utilisation now, "
    "health, and which run holds it."
)
class Gpu:
    machine: str
    index: int
    model: str
    memory_bytes: float = strawberry.field(description="Bytes (a float: GraphQL Int is 32-bit).")
    health: str = strawberry.field(description="ok, or why not (XID, ECC, remapped rows).")
    health_reason: str
    utilization: float | None = strawberry.field(
        description="0 to 1, its holder's newest sample (the last two minutes); 0 when free; "
        "null when not sampled or held by another workspace."
    )
    held_by: str | None = strawberry.field(description="The run of this workspace holding it.")
    held_elsewhere: bool = strawberry.field(description="Held by a run of another workspace.")
    line: str = strawberry.field(
        description="As `astra astraeus gpus` prints it: gpu-07/0  NVIDIA H100 80GB HBM3  97%  "
        "ok  held by llama-sft"
    )

    @classmethod
    def of(cls, view: GpuView) -> Gpu:
        return cls(**dataclasses.asdict(view), line=view.line)


@strawberry.type(description="A machine of the organisation's clusters (its admins').")
class MachineInfo:
    name: str
    cluster: str
    pool: str | None
    state: str = strawberry.field(description="ready, draining or lost.")
    reason: str
    cpu_cores: float
    memory_bytes: float = strawberry.field(description="Bytes (a float: GraphQL Int is 32-bit).")
    gpus: int
    unhealthy_gpus: int
    last_seen_at: datetime | None
    address: str | None = strawberry.field(
        description="Where the other machines reach it (its agent's --advertise-address, or "
        "the local address of its connection to the server): a gang's MASTER_ADDR when its "
        "rank 0 runs here. Null for an agent that did not say."
    )
    executor: str | None = strawberry.field(
        default=None,
        description="How its agent runs workers: process (host processes, which take no run "
        "that names an image) or docker (containers). Null until its agent says.",
    )
    isolation: str = strawberry.field(
        default="",
        description="What of its workers' sandbox its agent enforces, and what not: their own "
        "user, private /tmp and /dev/shm, only their own processes in /proc, their own IPC, a "
        "process limit, user ids cleaned between workspaces (as its agent found the machine).",
    )
    isolation_not_enforced: list[str] = strawberry.field(
        default_factory=list,
        description="The parts its agent does not enforce (unprivileged_user, private_tmp, "
        "private_shm, hidden_processes, private_ipc, process_limit, uid_handover); empty for a "
        "Slurm node (Slurm's own settings apply).",
    )

    @classmethod
    def of(cls, view: MachineView) -> MachineInfo:
        fields = dataclasses.asdict(view)
        fields["isolation_not_enforced"] = list(view.isolation_not_enforced)
        return cls(**fields)


@strawberry.type(description="A pool of the organisation's clusters (its admins').")
class PoolInfo:
    name: str
    cluster: str
    machines: int
    gpus: int
    unhealthy_gpus: int
    price_per_gpu_hour: float | None = strawberry.field(
        description="What a GPU-hour of its machines costs (setPoolPrice); null: no price."
    )
    currency: str | None = strawberry.field(description="ISO 4217, with its price.")
    idle_policy: IdlePolicy | None = strawberry.field(
        description="The idle policy a run submitted to it without its own takes "
        "(setPoolIdlePolicy); null: none."
    )

    @classmethod
    def of(cls, view: PoolView) -> PoolInfo:
        return cls(
            name=view.name,
            cluster=view.cluster,
            machines=view.machines,
            gpus=view.gpus,
            unhealthy_gpus=view.unhealthy_gpus,
            price_per_gpu_hour=view.gpu_hour_price,
            currency=view.currency,
            idle_policy=IdlePolicy.stored(view.idle_policy),
        )


@strawberry.type(description="How many of one kind.")
class KindCount:
    kind: str
    count: int


@strawberry.type(description="GPU-hours held on a machine in one category.")
class LostTime:
    category: str = strawberry.field(description="failure, restart or stalled.")
    gpu_hours: float


@strawberry.type(
    description="A machine's health over a period: the GPU time lost on it, its workers' "
    "failures by kind, its GPU faults, how that compares with its pool, and what to do."
)
class MachineHealthRow:
    machine: str
    cluster: str
    pool: str | None
    lost_gpu_hours: float = strawberry.field(
        description="GPU-hours held on it in failure, restart and stalled, every workspace's."
    )
    lost: list[LostTime]
    failure_count: int = strawberry.field(
        description="Attempts that failed or stalled on it (not a rank that died of a lost peer)."
    )
    failures: list[KindCount] = strawberry.field(
        description="By kind: program, out_of_memory, signal, command_not_found, gpu_fault, "
        "machine_lost, stalled, other."
    )
    fault_count: int
    gpu_faults: list[KindCount] = strawberry.field(description=f"By kind: {', '.join(FaultKind)}.")
    last_fault: str | None = strawberry.field(description="The newest GPU fault's sentence.")
    unhealthy_gpus: int = strawberry.field(description="Its GPUs unhealthy now.")
    pool_median_failures: float | None = strawberry.field(
        description="The median failures of its pool's other machines; null: alone in its pool."
    )
    vs_pool: float | None = strawberry.field(
        description="Its failures over that median; null when the median is 0 or none."
    )
    action: str = strawberry.field(
        description="drain: …, watch: … or none (e.g. drain: 5× its pool's failures this week)."
    )

    @classmethod
    def of(cls, h: MachineHealth) -> MachineHealthRow:
        return cls(
            machine=h.name,
            cluster=h.cluster,
            pool=h.pool,
            lost_gpu_hours=h.lost / 3600,
            lost=[
                LostTime(category=c.value, gpu_hours=s / 3600)
                for c, s in h.lost_gpu_seconds.items()
            ],
            failure_count=h.failure_count,
            failures=[KindCount(kind=k, count=n) for k, n in sorted(h.failures.items())],
            fault_count=h.fault_count,
            gpu_faults=[KindCount(kind=k, count=n) for k, n in sorted(h.gpu_faults.items())],
            last_fault=h.last_fault,
            unhealthy_gpus=h.unhealthy_gpus,
            pool_median_failures=h.pool_median_failures,
            vs_pool=h.vs_pool,
            action=h.action,
        )


@strawberry.type(description="A pool's price per GPU-hour, as its organisation's admins set it.")
class PoolPrice:
    cluster: str
    pool: str
    price_per_gpu_hour: float | None = strawberry.field(description="Null: no price.")
    currency: str | None


@strawberry.type
class PoolPricePayload:
    price: PoolPrice | None
    errors: list[UserError]


@strawberry.type(description="The organisation's machines, worst first, over whole UTC hours.")
class MachineHealthReport:
    start: datetime
    end: datetime
    machines: list[MachineHealthRow]
