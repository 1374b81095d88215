from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base, HasCreatedAt, HasId


class Organization(HasId, HasCreatedAt, Base):
    """Who pays for the GPUs: owns clusters and workspaces."""

    __tablename__ = "organizations"

    name: Mapped[str] = mapped_column(String(63), unique=True)
