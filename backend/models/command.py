from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, PortableJSON
from backend.models.base import Base, HasCreatedAt, HasId


class AgentCommand(HasId, HasCreatedAt, Base):
    """What a machine's agent must do (start, release, stop, delete a worker): an outbox.

    Written in the same transaction as the decision; the machine's stream delivers it and the
    agent acknowledges it, so nothing is lost when either side restarts.
    """

    __tablename__ = "agent_commands"
    __table_args__ = (Index("ix_agent_commands_machine_id_acked_at", "machine_id", "acked_at"),)

    machine_id: Mapped[int] = mapped_column(BigId, ForeignKey("machines.id", ondelete="CASCADE"))
    # The worker's name, for people: two workspaces' workers may share it on one machine.
    worker_name: Mapped[str] = mapped_column(String(80))
    # The worker's id, kept when the worker row is deleted (a delete command outlives it):
    # what the agent keys everything of the worker by.
    target_worker_id: Mapped[int | None] = mapped_column(BigId)
    worker_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("workers.id", ondelete="SET NULL")
    )
    # start | release | stop | delete
    kind: Mapped[str] = mapped_column(String(16))
    payload: Mapped[dict[str, Any]] = mapped_column(PortableJSON, default=dict)
    acked_at: Mapped[datetime | None]
