from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, PortableJSON
from backend.models.base import Base, HasCreatedAt, HasId


class Machine(HasId, HasCreatedAt, Base):
    """A GPU machine whose agent connects out to Astraeus and holds a lease."""

    __tablename__ = "machines"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)

    cluster_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("clusters.id", ondelete="CASCADE"), index=True
    )
    pool_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("pools.id", ondelete="SET NULL"), index=True
    )
    name: Mapped[str] = mapped_column(String(253))
    # The address other machines reach this one at (its agent's --advertise-address, or the
    # local address of its connection to the server): a gang's MASTER_ADDR when rank 0 is here.
    address: Mapped[str | None] = mapped_column(String(253))
    # How its agent runs workers ("process" or "docker"; None before its agent said) and the
    # metrics that executor cannot attribute to one worker (Hello.executor, .unmeasured_metrics).
    executor: Mapped[str | None] = mapped_column(String(16))
    unmeasured_metrics: Mapped[list[str] | None] = mapped_column(PortableJSON)
    # What of its workers' sandbox its agent enforces (Hello.isolation, .workload_pids_max):
    # {"enforced": [part, …], "pids_max": n}; None before its agent said (machines/rules.py).
    isolation: Mapped[dict[str, Any] | None] = mapped_column(PortableJSON)
    cpu_cores: Mapped[float] = mapped_column(Float, default=0.0)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # ready | draining | lost | removed
    state: Mapped[str] = mapped_column(String(16), default="ready")
    reason: Mapped[str] = mapped_column(String(500), default="")
    labels: Mapped[dict[str, Any]] = mapped_column(PortableJSON, default=dict)
    lease_expires_at: Mapped[datetime | None]
    last_seen_at: Mapped[datetime | None]


class LeaseCheck(Base):
    """When the machines' leases were last checked (one row). A check that finds the one
    before it long past gives every machine a whole lease instead of taking it for lost:
    while no check ran, the database (or every scheduler) was away, and an agent's heartbeats
    may not have been written either."""

    __tablename__ = "lease_checks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    checked_at: Mapped[datetime]
    previous_at: Mapped[datetime | None]


class Gpu(HasId, Base):
    """One GPU of a machine, as the agent reported it (NVML, or a simulated one)."""

    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("machine_id", "index"),)

    machine_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("machines.id", ondelete="CASCADE"), index=True
    )
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(96))
    model: Mapped[str] = mapped_column(String(128))
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # ok | unhealthy
    health: Mapped[str] = mapped_column(String(16), default="ok")
    health_reason: Mapped[str] = mapped_column(String(500), default="")
