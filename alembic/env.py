"""Alembic environment: the same migrations run on SQLite (embedded) and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import create_engine, pool

from alembic import context
from backend.config import get_settings
from backend.db.engine import install_sqlite_pragmas, sync_url
from backend.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("database_url") or get_settings().resolved_database_url
    return sync_url(str(url))


def run_migrations_offline() -> None:
    context.configure(
        url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    install_sqlite_pragmas(engine)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(connection: object) -> None:
    # Batch mode lets ALTERs run on SQLite, which rebuilds the table instead.
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
