"""Events and followed logs in GraphQL (seed L-43 … L-47, L-9)."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import cast

import strawberry
from strawberry.scalars import JSON

from backend.events.rules import EventView


@strawberry.type(
    description=(
        "Something that happened in the workspace: a state change and its reason, a "
        "deletion, an alert."
    )
)
class Event:
    id: strawberry.ID = strawberry.field(
        description="Opaque, the same every time (it counts nothing): a reader resumes after "
        "the last it saw (events(after: this)), and dedupes by it."
    )
    kind: str = strawberry.field(
        description="run.state, worker.state, run.deleted, alert.firing, …"
    )
    state: str | None
    reason: str
    run: str | None
    worker: str | None
    workspace: str
    created_at: datetime = strawberry.field(
        description="When it happened (a stall: from the worker's last progress)."
    )
    found_at: datetime = strawberry.field(
        description="When it was found: after createdAt for a stall, else the same. Events "
        "are listed in the order they were found."
    )
    data: JSON

    @classmethod
    def of(cls, view: EventView, shown_id: str) -> Event:
        """``shown_id``: its id as the API shows it (backend/ids.py)."""
        return cls(
            **{
                **dataclasses.asdict(view),
                "id": strawberry.ID(shown_id),
                "found_at": view.found_at or view.created_at,
                "data": cast(JSON, view.data),
            }
        )


@strawberry.type(description="Lines of a followed log as the machine wrote them.")
class LogChunk:
    text: str
    archived: bool = strawberry.field(description="From a container that no longer exists.")
    missed: int = strawberry.field(
        description="Lines dropped before these, because the reader fell behind."
    )
    ended: bool = strawberry.field(description="The worker ended: the last chunk.")
    behind: float = strawberry.field(
        default=0.0,
        description="Seconds the server was behind on its work as it handed these lines on: "
        "they arrive that late (0: it keeps up). No text and behind: a notice alone, the "
        "server is slowed and its lines will come late.",
    )


@strawberry.type(description="A page of events, newest first.")
class EventPage:
    events: list[Event]
    next_before: strawberry.ID | None = strawberry.field(
        description="Ask again with before: this for the next page; null: no more."
    )


@strawberry.type(description="One series of a metric: its labels and [time in ms, value] points.")
class MetricSeries:
    labels: JSON
    points: list[list[float]]


@strawberry.type(description="A metric over a range (as GET /v1/metrics/range answers).")
class MetricRange:
    metric: str
    kind: str = strawberry.field(description="gauge or counter.")
    unit: str
    start: float = strawberry.field(description="Unix time in ms.")
    end: float
    step: float = strawberry.field(description="Milliseconds between points.")
    series: list[MetricSeries]
    unmeasured: list[str] = strawberry.field(
        default_factory=list,
        description="The workers in scope whose machine's agent does not measure this metric "
        "(its Hello said so: e.g. network bytes where workers share the host's network).",
    )
    not_measured: str | None = strawberry.field(
        default=None,
        description='Why, as the console says it instead of an empty chart ("Not measured: '
        "this machine's agent runs processes on the host's network\"); null when every "
        "worker's machine measures it.",
    )
