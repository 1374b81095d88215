"""The database: engines, sessions, retries, bulk writes and portable column types, one
module each. Callers import a thing from the module it lives in; the package re-exports only
its front door, the ``Database`` handle, and ``UTCDateTime``, which the migrations name as
``backend.db.UTCDateTime``.

- ``types``: the portable column types and the tables' metadata (naming convention);
- ``engine``: URLs, SQLite's pragmas and transactions, the pool's pings, the driver connection;
- ``sessions``: ``Database``, its transactions, units of work and read sessions;
- ``retries``: what an error says (contention, the database away), a unit tried again;
- ``bulk``: many rows at once (binary COPY, UPDATE from arrays);
- ``commit_jobs``: jobs sent once the transaction that asked for them commits;
- ``commit_signals``: in-process listeners told a commit added rows to a table.
"""

from backend.db import (
    commit_jobs,  # noqa: F401  (its listeners send jobs after each commit)
    commit_signals,  # noqa: F401  (and tell of rows added)
)
from backend.db.sessions import Database
from backend.db.types import UTCDateTime

__all__ = ["Database", "UTCDateTime"]
