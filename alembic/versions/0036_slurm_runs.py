"""slurm_runs: the Slurm job that runs a run, out of the run's specification (issue 38: Run
again of a run Astraeus submitted to Slurm; what Slurm says of a job, shown)

Each run's spec["slurm"] (its job id, submitted or imported, the job's name, account, user,
partition, priority, and how many of its changes were written) becomes its row here, and the
key leaves the specification.

Revision ID: 0036
Revises: 0035
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0036"
down_revision: str | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

RUNS = sa.table(
    "runs",
    sa.column("id", BIG_ID),
    sa.column("spec", _JSON),
    sa.column("external_id", sa.String),
)


def upgrade() -> None:
    slurm_runs = op.create_table(
        "slurm_runs",
        sa.Column("run_id", BIG_ID, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("submitted", sa.Boolean(), nullable=False),
        sa.Column("job_name", sa.String(length=256), nullable=False),
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("partition", sa.String(length=64), nullable=False),
        sa.Column("qos", sa.String(length=64), nullable=False),
        sa.Column("priority", sa.BigInteger(), nullable=True),
        sa.Column("cancelled_by", sa.String(length=64), nullable=True),
        sa.Column("applied", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_slurm_runs_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_slurm_runs")),
    )
    bind = op.get_bind()
    found = bind.execute(
        sa.select(RUNS.c.id, RUNS.c.spec, RUNS.c.external_id).where(
            RUNS.c.external_id.is_not(None)
        )
    ).all()
    rows: list[dict[str, Any]] = []
    for run_id, spec, external_id in found:
        spec = dict(spec or {})
        kept = spec.pop("slurm", None)
        if not isinstance(kept, dict):
            continue
        applied = kept.get("applied")  # (None: one made before it was kept)
        priority = kept.get("priority")
        rows.append(
            {
                "run_id": run_id,
                "job_id": str(kept.get("job_id") or external_id),
                "submitted": bool(kept.get("submitted")),
                "job_name": str(kept.get("job_name") or "")[:256],
                "account": str(kept.get("account") or "")[:64],
                "user": str(kept.get("user") or "")[:64],
                "partition": str(kept.get("partition") or "")[:64],
                "qos": "",
                "priority": priority if isinstance(priority, int) else None,
                "cancelled_by": None,
                "applied": applied if isinstance(applied, int) else None,
            }
        )
        bind.execute(RUNS.update().where(RUNS.c.id == run_id).values(spec=spec))
    if rows:
        op.bulk_insert(slurm_runs, rows)


def downgrade() -> None:
    bind = op.get_bind()
    kept = sa.table(
        "slurm_runs",
        *(
            sa.column(name)
            for name in (
                "run_id",
                "job_id",
                "submitted",
                "job_name",
                "account",
                "user",
                "partition",
                "priority",
                "applied",
            )
        ),
    )
    for row in bind.execute(sa.select(kept)).mappings().all():
        spec = bind.execute(sa.select(RUNS.c.spec).where(RUNS.c.id == row["run_id"])).scalar()
        slurm = {k: row[k] for k in row.keys() if k != "run_id"}
        bind.execute(
            RUNS.update()
            .where(RUNS.c.id == row["run_id"])
            .values(spec={**dict(spec or {}), "slurm": slurm})
        )
    op.drop_table("slurm_runs")
