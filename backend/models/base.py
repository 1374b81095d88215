"""The declarative base every table derives from, and the shared column helpers."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from backend.db.types import BigId, UTCDateTime, metadata


class Base(DeclarativeBase):
    metadata = metadata
    type_annotation_map = {datetime: UTCDateTime()}


class HasId:
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)


class HasCreatedAt:
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
