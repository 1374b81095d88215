from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.crypto import EncryptedText
from backend.db.types import BigId, UTCDateTime
from backend.models.base import Base, HasCreatedAt, HasId


class Secret(HasId, HasCreatedAt, Base):
    """A workspace's credential, given to the workers of its runs that name it.

    Its value is sent only to the agent of a machine running such a worker, over the
    machine's stream; no API answer carries it. An external secret is declared without a value
    (a secret manager fills it in later); until then its workers wait while "Preparing".
    """

    __tablename__ = "secrets"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)

    workspace_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(63))
    # Encrypted at rest (backend/crypto.py).
    value: Mapped[str | None] = mapped_column(EncryptedText())
    external: Mapped[bool]
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
