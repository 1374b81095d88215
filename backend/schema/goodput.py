"""Goodput in GraphQL: where the GPU time went, by run, machine, pool or workspace, by hour
range or by week, and the worker intervals behind a figure (seed goodput.txt)."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

import strawberry

from backend.accounting import costs, rework, rules
from backend.accounting.reports import Report, Row
from backend.accounting.series import Series
from backend.errors import FieldError, InvalidInput
from backend.schema.enums import CategoryValue

HOUR_SECONDS = 3600.0


@strawberry.enum(description="What a goodput report has a row for.")
class GoodputScope(Enum):
    WORKSPACE = "workspace"
    RUN = "run"
    MACHINE = "machine"
    POOL = "pool"


@strawberry.type(description="GPU-hours of one category: all of it, and its held part.")
class CategoryTime:
    category: CategoryValue = strawberry.field(
        description="productive, idle, stalled, starting, restart, failure, preemption, waiting."
    )
    gpu_hours: float
    held_gpu_hours: float


@strawberry.type(
    description="The seed's ledger: GPU-hours by category, held (allocated) and not (waiting)."
)
class GoodputLedger:
    gpu_hours: list[CategoryTime] = strawberry.field(
        description="Every category, in the seed's order, with its held part."
    )
    allocated_gpu_hours: float = strawberry.field(description="Every held part: HELD.")
    productive_gpu_hours: float = strawberry.field(description="USED.")
    lost_gpu_hours: float = strawberry.field(description="Asked for less productive.")
    waiting_gpu_hours: float = strawberry.field(description="Every part not held: WAITING.")
    goodput: float | None = strawberry.field(
        description="Productive over allocated; null when nothing was held."
    )
    biggest_loss: CategoryTime | None = strawberry.field(
        description="The category other than productive with the most GPU-hours, if any."
    )

    @classmethod
    def of(cls, ledger: rules.Ledger) -> GoodputLedger:
        times = [
            CategoryTime(
                category=CategoryValue(c.value),
                gpu_hours=(ledger.held[c] + ledger.not_held[c]) / HOUR_SECONDS,
                held_gpu_hours=ledger.held[c] / HOUR_SECONDS,
            )
            for c in rules.CATEGORIES
        ]
        losses = [t for t in times if t.category != rules.Category.PRODUCTIVE and t.gpu_hours > 0]
        return cls(
            gpu_hours=times,
            allocated_gpu_hours=ledger.allocated / HOUR_SECONDS,
            productive_gpu_hours=ledger.productive / HOUR_SECONDS,
            lost_gpu_hours=ledger.lost / HOUR_SECONDS,
            waiting_gpu_hours=ledger.waiting / HOUR_SECONDS,
            goodput=ledger.goodput,
            biggest_loss=max(losses, key=lambda t: t.gpu_hours, default=None),
        )


@strawberry.type(
    description="The rework inside productive time: GPU-hours of steps done again after "
    "restarts, from each restart until a worker reached its run's highest step again."
)
class Rework:
    gpu_hours: float | None = strawberry.field(
        description="The rework of the runs whose rework is known; a run's own is null "
        "(unknown, not 0) when it restarted without reporting checkpoints and steps."
    )
    unknown_runs: int = strawberry.field(
        description="How many runs restarted here without the reports that measure rework."
    )

    @classmethod
    def of(cls, found: rework.ScopeRework, one_run: bool) -> Rework:
        return cls(gpu_hours=found.shown_gpu_hours(one_run), unknown_runs=found.unknown_runs)


@strawberry.type(description="A restart of a run and the work it did again.")
class Redo:
    attempt: int
    restarted_at: datetime
    checkpoint_step: float | None = strawberry.field(
        description="The last checkpoint the run had reported: where it went back to."
    )
    reached_step: float | None = strawberry.field(
        description="The highest step the run had reported before the restart."
    )
    steps_redone: float | None
    until: datetime | None = strawberry.field(
        description="When a worker reached that step again (caughtUp), or the run restarted "
        "once more; null while it still redoes them."
    )
    caught_up: bool
    gpu_hours: float | None = strawberry.field(
        description="Productive GPU-hours spent redoing them; null when unknown."
    )


@strawberry.type(description="A run's rework since it was submitted: part of its productive time.")
class RunRework:
    gpu_hours: float | None = strawberry.field(
        description="Null (unknown, not 0) when a restart came without checkpoint or step reports."
    )
    redos: list[Redo]

    @classmethod
    def of(cls, found: rework.RunRework) -> RunRework:
        return cls(
            gpu_hours=found.gpu_hours,
            redos=[
                Redo(
                    attempt=r.attempt,
                    restarted_at=r.restarted_at,
                    checkpoint_step=r.checkpoint_step,
                    reached_step=r.reached_step,
                    steps_redone=r.steps_redone,
                    until=r.until,
                    caught_up=r.caught_up,
                    gpu_hours=None if r.gpu_seconds is None else r.gpu_seconds / HOUR_SECONDS,
                )
                for r in found.redos
            ],
        )


@strawberry.type(description="One run's, machine's, pool's or workspace's ledger.")
class GoodputRow:
    name: str
    ledger: GoodputLedger
    rework: Rework


MAX_ROWS = 10_000


@strawberry.type(description="A ledger per row over whole UTC hours, most held first.")
class GoodputReport:
    by: GoodputScope
    start: datetime
    end: datetime
    total: GoodputLedger = strawberry.field(description="Every row's ledger summed.")
    row_count: int = strawberry.field(description="How many rows the report has in all.")
    rework: Rework = strawberry.field(description="Every row's rework summed.")
    _rows: strawberry.Private[list[Row]]

    @strawberry.field(
        description="The rows, most held first: first (100 by default, at most 10 000) from "
        "offset. A page of a console shows some; the total counts them all."
    )
    def rows(self, first: int = 100, offset: int = 0) -> list[GoodputRow]:
        problems = []
        if not 0 <= first <= MAX_ROWS:
            problems.append(FieldError("first", f"must be from 0 to {MAX_ROWS}"))
        if offset < 0:
            problems.append(FieldError("offset", "must be 0 or more"))
        if problems:
            raise InvalidInput("INVALID_PARAMETER", problems)
        return [
            GoodputRow(
                name=r.name,
                ledger=GoodputLedger.of(r.ledger),
                rework=Rework.of(r.rework, self.by == GoodputScope.RUN),
            )
            for r in self._rows[offset : offset + first]
        ]

    @classmethod
    def of(cls, report: Report) -> GoodputReport:
        return cls(
            by=GoodputScope(report.by),
            start=report.period.start,
            end=report.period.end,
            total=GoodputLedger.of(report.total),
            row_count=len(report.rows),
            rework=Rework.of(report.rework, False),
            _rows=report.rows,
        )


@strawberry.enum(description="What a cost report has a row for.")
class CostScope(Enum):
    WORKSPACE = "workspace"
    RUN = "run"


@strawberry.type(description="Money of one held category.")
class CategoryCost:
    category: CategoryValue
    amount: float


@strawberry.type(description="A workspace's or run's GPU time on priced pools as money.")
class CostRowType:
    name: str
    by_category: list[CategoryCost] = strawberry.field(
        description="productive, idle, stalled, starting, restart, failure, preemption."
    )
    held: float = strawberry.field(description="Every held category's.")
    lost: float = strawberry.field(description="All but productive.")

    @classmethod
    def of(cls, row: costs.CostRow) -> CostRowType:
        return cls(
            name=row.name,
            by_category=[
                CategoryCost(category=CategoryValue(c.value), amount=v)
                for c, v in row.by_category.items()
            ],
            held=row.held,
            lost=row.lost,
        )


@strawberry.type(
    description="The GPU time held on priced pools over whole UTC hours as money: each "
    "interval's GPU-hours times its pool's price per GPU-hour (setPoolPrice)."
)
class GoodputCost:
    by: CostScope
    start: datetime
    end: datetime
    currency: str | None = strawberry.field(description="ISO 4217; null: no pool has a price.")
    rows: list[CostRowType] = strawberry.field(description="Most first.")
    total: CostRowType

    @classmethod
    def of(cls, found: costs.CostReport) -> GoodputCost:
        return cls(
            by=CostScope(found.by),
            start=found.period.start,
            end=found.period.end,
            currency=found.currency,
            rows=[CostRowType.of(r) for r in found.rows],
            total=CostRowType.of(found.total),
        )


@strawberry.type(description="One ISO week (Monday, UTC) of a weekly report.")
class GoodputWeek:
    week: str = strawberry.field(description="2026-W40")
    report: GoodputReport


@strawberry.type(
    description="Part of a worker's GPU time in one category: what a figure is made of."
)
class GoodputInterval:
    worker: str
    run: str | None
    machine: str | None
    start: datetime
    end: datetime
    category: CategoryValue
    held: bool
    gpus: int
    gpu_hours: float


@strawberry.enum(description="How long each point of a goodput series is.")
class GoodputStep(Enum):
    HOUR = "hour"
    DAY = "day"


@strawberry.type(description="One step of a goodput series: the ledger of [start, end).")
class GoodputPoint:
    start: datetime
    end: datetime
    ledger: GoodputLedger


@strawberry.type(
    description="Goodput over time: one run's, machine's, pool's or workspace's ledger (or "
    "the sum of every one the caller reads) each hour or UTC day, none left out."
)
class GoodputSeries:
    by: GoodputScope
    name: str | None = strawberry.field(description="The row's name; null: every row summed.")
    step: GoodputStep
    start: datetime
    end: datetime
    points: list[GoodputPoint] = strawberry.field(description="Oldest first.")
    total: GoodputLedger = strawberry.field(
        description="The points summed: the report's row (or total) for the same period."
    )

    @classmethod
    def of(cls, series: Series) -> GoodputSeries:
        return cls(
            by=GoodputScope(series.by),
            name=series.name,
            step=GoodputStep(series.step),
            start=series.period.start,
            end=series.period.end,
            points=[
                GoodputPoint(start=p.start, end=p.end, ledger=GoodputLedger.of(p.ledger))
                for p in series.points
            ],
            total=GoodputLedger.of(series.total),
        )
