"""goodput open intervals

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import backend.db

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TIME = backend.db.UTCDateTime(timezone=True)
COLUMNS = (
    "worker_name",
    "run_id",
    "workspace_id",
    "cluster_id",
    "start_at",
    "category",
    "held",
    "machine_id",
    "pool_id",
)


def upgrade() -> None:
    op.create_table(
        "goodput_open_intervals",
        sa.Column("worker_id", BIG, autoincrement=False, nullable=False),
        sa.Column("worker_name", sa.String(length=80), nullable=False),
        sa.Column("run_id", BIG, nullable=False),
        sa.Column("workspace_id", BIG, nullable=False),
        sa.Column("cluster_id", BIG, nullable=False),
        sa.Column("phase", sa.String(length=32), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("phase_machine_id", BIG, nullable=True),
        sa.Column("start_at", TIME, nullable=False),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("held", sa.Boolean(), nullable=False),
        sa.Column("machine_id", BIG, nullable=True),
        sa.Column("pool_id", BIG, nullable=True),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_goodput_open_intervals")),
        postgresql_with={"fillfactor": 50},
    )
    with op.batch_alter_table("goodput_intervals", schema=None) as batch_op:
        batch_op.create_index(
            "ix_goodput_intervals_worker_id_end_at", ["worker_id", "end_at"], unique=False
        )
    _open_what_was_counted()


def _open_what_was_counted() -> None:
    """Before this table the tick wrote every interval whole: the intervals that end at its
    mark become the open ones, with the phase their worker was last counted in."""
    bind = op.get_bind()
    marks = sa.table("accounting_marks", sa.column("id"), sa.column("counted_until", TIME))
    mark = bind.execute(sa.select(marks.c.counted_until).where(marks.c.id == 1)).scalar()
    if mark is None:
        return
    intervals = sa.table(
        "goodput_intervals",
        sa.column("id"),
        sa.column("worker_id"),
        sa.column("end_at", TIME),
        *(sa.column(c) for c in COLUMNS[:4]),
        sa.column("start_at", TIME),
        *(sa.column(c) for c in COLUMNS[5:]),
    )
    transitions = sa.table(
        "state_transitions",
        sa.column("id"),
        sa.column("worker_id"),
        sa.column("transition_at", TIME),
        sa.column("phase"),
        sa.column("gpus"),
        sa.column("machine_id"),
    )
    opened = sa.table(
        "goodput_open_intervals",
        sa.column("worker_id"),
        sa.column("phase"),
        sa.column("gpus"),
        sa.column("phase_machine_id"),
        *(sa.column(c) for c in COLUMNS[:4]),
        sa.column("start_at", TIME),
        *(sa.column(c) for c in COLUMNS[5:]),
    )
    latest = (
        sa.select(
            transitions.c.worker_id,
            transitions.c.phase,
            transitions.c.gpus,
            transitions.c.machine_id,
            sa.func.row_number()
            .over(
                partition_by=transitions.c.worker_id,
                order_by=(transitions.c.transition_at.desc(), transitions.c.id.desc()),
            )
            .label("n"),
        )
        .where(transitions.c.phase.is_not(None), transitions.c.transition_at < mark)
        .subquery()
    )
    rows = bind.execute(
        sa.select(
            intervals,
            latest.c.phase,
            latest.c.gpus.label("phase_gpus"),
            latest.c.machine_id.label("phase_machine_id"),
        )
        .join(latest, (latest.c.worker_id == intervals.c.worker_id) & (latest.c.n == 1))
        .where(intervals.c.end_at == mark, latest.c.phase != "ended")
    ).all()
    if not rows:
        return
    bind.execute(
        opened.insert(),
        [
            {
                "worker_id": r.worker_id,
                "phase": r.phase,
                "gpus": r.phase_gpus,
                "phase_machine_id": r.phase_machine_id,
                **{c: getattr(r, c) for c in COLUMNS},
            }
            for r in rows
        ],
    )
    ids = [r.id for r in rows]
    for i in range(0, len(ids), 500):
        bind.execute(intervals.delete().where(intervals.c.id.in_(ids[i : i + 500])))


def downgrade() -> None:
    bind = op.get_bind()
    marks = sa.table("accounting_marks", sa.column("id"), sa.column("counted_until", TIME))
    mark = bind.execute(sa.select(marks.c.counted_until).where(marks.c.id == 1)).scalar()
    if mark is not None:  # the open intervals become whole ones again, ending at the mark
        opened = sa.table(
            "goodput_open_intervals",
            sa.column("worker_id"),
            sa.column("gpus"),
            *(sa.column(c) for c in COLUMNS),
        )
        intervals = sa.table(
            "goodput_intervals",
            sa.column("worker_id"),
            sa.column("gpus"),
            sa.column("end_at", TIME),
            *(sa.column(c) for c in COLUMNS),
        )
        bind.execute(
            intervals.insert().from_select(
                ["worker_id", "gpus", *COLUMNS, "end_at"],
                sa.select(
                    opened.c.worker_id,
                    opened.c.gpus,
                    *(opened.c[c] for c in COLUMNS),
                    sa.literal(mark, TIME),
                ),
            )
        )
    with op.batch_alter_table("goodput_intervals", schema=None) as batch_op:
        batch_op.drop_index("ix_goodput_intervals_worker_id_end_at")
    op.drop_table("goodput_open_intervals")
