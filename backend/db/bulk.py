"""Many rows written at once, the fastest way each dialect has: binary COPY and UPDATEs from
arrays on PostgreSQL, one executemany elsewhere."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from backend.db.commit_signals import rows_added
from backend.db.engine import driver_connection


async def copy_binary(
    session: AsyncSession,
    table: str,
    columns: Sequence[str],
    types: Sequence[str],
    rows: Iterable[Sequence[Any]],
) -> int:
    """Append rows with ``COPY … FROM STDIN (FORMAT BINARY)``, in the session's transaction.

    Binary COPY is the fastest way into PostgreSQL from Python: the client sends the values as
    they are, with no text to format or parse (PERFORMANCE.md: ~300k rows/s against ~35k for
    SQLAlchemy inserts). ``types`` are PostgreSQL type names, one per column. Returns the
    number of rows written."""
    pg = await driver_connection(session)
    statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
    async with pg.cursor() as cursor:
        async with cursor.copy(statement) as copy:
            copy.set_types(list(types))
            for row in rows:
                await copy.write_row(row)
        return cursor.rowcount


async def insert_many(session: AsyncSession, model: type[Any], rows: list[dict[str, Any]]) -> None:
    """Many new rows at once: binary COPY on PostgreSQL, one executemany elsewhere.

    History rows come by the thousand in a scheduling pass; COPY takes them an order of
    magnitude faster than INSERTs, and binary COPY sends the values as they are (issue 24: a
    first pass's 13 000 rows took 0.29 s by text COPY). Every row has the first row's keys."""
    if not rows:
        return
    table = model.__table__
    rows_added(session, table.name)
    if session.get_bind().dialect.name != "postgresql":
        await session.execute(table.insert(), rows)
        return
    columns = tuple(rows[0])
    values = operator.itemgetter(*columns)
    await copy_binary(
        session,
        table.name,
        columns,
        _pg_types(table, columns),
        (values(row) if len(columns) > 1 else (values(row),) for row in rows),
    )


async def update_many(
    session: AsyncSession, model: type[Any], changes: dict[int, dict[str, Any]]
) -> None:
    """Many rows changed at once: for each row's ``id``, the columns it changes and their new
    values (a column's attribute and its name are the same). On PostgreSQL one UPDATE from
    arrays for each set of columns changed, elsewhere one executemany for each (issue 24: the
    ORM's flush of a first pass's 4 803 changed runs and workers took 0.25 s). The session's
    own objects of those rows, where it holds some, take the new values as loaded: they agree
    with the database, and the session writes none of them again."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for row_id, values in changes.items():
        if values:
            groups.setdefault(tuple(values), []).append(row_id)
    table = model.__table__
    dialect = session.get_bind().dialect
    for columns, ids in groups.items():
        rows = [changes[i] for i in ids]
        if dialect.name == "postgresql":
            await _update_from_arrays(session, table, columns, ids, rows)
        else:
            await _update_each(session, table, columns, ids, rows)
    _as_loaded(session, model, changes)


async def _update_from_arrays(
    session: AsyncSession,
    table: Any,
    columns: tuple[str, ...],
    ids: list[int],
    rows: list[dict[str, Any]],
) -> None:
    dialect = session.get_bind().dialect
    types = _pg_types(table, columns)
    arrays: list[list[Any]] = [ids]
    for name, pg_type in zip(columns, types, strict=True):
        # An array holds values of one Python type: 1 and 2.5 both float, "a" and an enum str.
        process = table.c[name].type.dialect_impl(dialect).bind_processor(dialect)
        process = process or _ARRAY_VALUES.get(pg_type)
        values = [row[name] for row in rows]
        arrays.append([None if v is None else process(v) for v in values] if process else values)
    sets = ", ".join(f"{c} = v.{c}" for c in columns)
    # Binary arrays: a text array of 8 652 sentences takes psycopg and the server 0.06 s to write
    # and parse, the same in binary 0.01 s.
    casts = ", ".join(f"%b::{t}[]" for t in ("int8", *types))
    statement = (
        f"UPDATE {table.name} SET {sets} FROM unnest({casts}) AS v(id, {', '.join(columns)}) "
        f"WHERE {table.name}.id = v.id"
    )
    pg = await driver_connection(session)
    async with pg.cursor() as cursor:
        await cursor.execute(statement, arrays)


async def _update_each(
    session: AsyncSession,
    table: Any,
    columns: tuple[str, ...],
    ids: list[int],
    rows: list[dict[str, Any]],
) -> None:
    statement = (
        update(table)
        .where(table.c.id == bindparam("_id"))
        .values({c: bindparam(f"_{c}") for c in columns})
    )
    params = [
        {"_id": i, **{f"_{c}": row[c] for c in columns}} for i, row in zip(ids, rows, strict=True)
    ]
    await session.execute(statement, params)


def _as_loaded(session: AsyncSession, model: type[Any], changes: dict[int, dict[str, Any]]) -> None:
    identities = session.sync_session.identity_map
    if not len(identities):
        return
    for row_id, values in changes.items():
        held = identities.get(identity_key(model, row_id))
        if held is not None:
            for name, value in values.items():
                set_committed_value(held, name, value)


# The PostgreSQL type of each column type of ours, by its SQL there: what binary COPY sends,
# what an UPDATE's arrays are cast to.
_PG_TYPES = {
    "BIGINT": "int8",
    "INTEGER": "int4",
    "SMALLINT": "int2",
    "BOOLEAN": "bool",
    "FLOAT": "float8",
    "DOUBLE PRECISION": "float8",
    "TIMESTAMP WITH TIME ZONE": "timestamptz",
    "JSONB": "jsonb",
    "TEXT": "text",
}


_ARRAY_VALUES: dict[str, Callable[[Any], Any]] = {"float8": float, "text": str}


@functools.cache
def _pg_types(table: Any, columns: tuple[str, ...]) -> tuple[str, ...]:
    dialect = postgresql.dialect()
    sql = [table.c[name].type.compile(dialect=dialect) for name in columns]
    return tuple("text" if s.startswith("VARCHAR") else _PG_TYPES[s] for s in sql)
