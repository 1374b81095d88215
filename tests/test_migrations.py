"""The migrations are the schema: the same files build SQLite and PostgreSQL, with no drift."""

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from backend import migrations
from backend.db import sync_url
from backend.models import Base


def head() -> str | None:
    return ScriptDirectory.from_config(migrations.alembic_config("sqlite://")).get_current_head()


def test_the_migrated_schema_matches_the_models(database_url: str) -> None:
    engine = create_engine(sync_url(database_url))
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
        assert context.get_current_revision() == head()
    engine.dispose()


def test_migrations_go_down_and_up_again(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/roundtrip.db"
    migrations.upgrade(url)
    migrations.upgrade(url)  # a second upgrade changes nothing
    from alembic import command

    command.downgrade(migrations.alembic_config(url), "base")
    engine = create_engine(sync_url(url))
    assert inspect(engine).get_table_names() == ["alembic_version"]
    engine.dispose()
    migrations.upgrade(url)
    assert migrations.current(url) == head()
