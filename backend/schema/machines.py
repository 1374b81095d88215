"""Machines' GPUs in GraphQL (seed L-39)."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import strawberry

from backend.machines.views import GpuView, MachineView, PoolView


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

    @classmethod
    def of(cls, view: MachineView) -> MachineInfo:
        return cls(**dataclasses.asdict(view))


@strawberry.type(description="A pool of the organisation's clusters (its admins').")
class PoolInfo:
    name: str
    cluster: str
    machines: int
    gpus: int
    unhealthy_gpus: int

    @classmethod
    def of(cls, view: PoolView) -> PoolInfo:
        return cls(**dataclasses.asdict(view))
