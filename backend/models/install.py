"""What belongs to the install as a whole, not to an organisation."""

from __future__ import annotations

from sqlalchemy import LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base


class InstallKey(Base):
    """A key every process of the install shares through its database (issue 37 N8: ``ids``,
    the key the API's ids are shown with). Made by migration 0033, or by the first process to
    need it where the tables were made otherwise; never changed: the ids shown stay the same."""

    __tablename__ = "install_keys"

    name: Mapped[str] = mapped_column(String(40), primary_key=True)
    value: Mapped[bytes] = mapped_column(LargeBinary)
