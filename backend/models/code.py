from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, UTCDateTime
from backend.models.base import Base, HasId


class CodeArchive(HasId, Base):
    """A run's code as `astra astraeus submit --workdir` packed and uploaded it (issue 41): a
    gzip'd tar named by its SHA-256, stored once per workspace (the same content uploaded twice
    is this one row) and only for that workspace: another's token never learns it exists, and
    a machine gets it only for a worker placed on it whose run names it. Its bytes are in
    ``code_chunks``, a chunk a row, so that neither an upload nor a machine's fetch holds it
    whole in memory."""

    __tablename__ = "code_archives"
    __table_args__ = (
        Index("uq_code_archives_workspace_id_digest", "workspace_id", "digest", unique=True),
    )

    workspace_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE")
    )
    digest: Mapped[str] = mapped_column(String(64))  # SHA-256 of the archive, hex
    archive_bytes: Mapped[int] = mapped_column(BigInteger)  # the gzip'd tar's size
    size: Mapped[int] = mapped_column(BigInteger)  # its files' bytes, unpacked
    files: Mapped[int] = mapped_column(Integer)
    chunks: Mapped[int] = mapped_column(Integer)
    uploaded_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # The last upload of it or run submitted with it: what the retention counts from.
    used_at: Mapped[datetime] = mapped_column(UTCDateTime())


class CodeChunk(Base):
    """One piece of an archive's bytes, in order (``seq`` from 0), at most CHUNK_BYTES each."""

    __tablename__ = "code_chunks"

    archive_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("code_archives.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
