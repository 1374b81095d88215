"""GraphQL enums of the domain's states, categories and failure kinds.

Each is made from the domain's enums (backend/runs/rules.py, backend/accounting/rules.py,
backend/runs/failures.py), so its members are theirs and never drift. Each member is named as
its value is today on the wire (``Running``, ``productive``, ``out_of_memory``), so the console
and the seeds' outputs read the same strings; each is a ``StrEnum`` too, so code comparing it
with the domain's values keeps working.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, TypeAlias

import strawberry

from backend.accounting.rules import Category
from backend.lifecycle.states import RunState, WorkerState
from backend.runs.failures import FailureKind


def _spelled_as_values(name: str, description: str, *domains: type[StrEnum]) -> type[StrEnum]:
    """The GraphQL enum ``name`` of the domains' values in their order (one shared by two, once),
    each member named as its value."""
    values = dict.fromkeys(member.value for domain in domains for member in domain)
    # mypy reads only an enum of literal members; this one is typed StrEnum (TYPE_CHECKING below)
    made = StrEnum(f"{name}Value", [(value, value) for value in values])  # type: ignore[misc]
    return strawberry.enum(made, name=name, description=description)


if TYPE_CHECKING:  # made at run time, from the domains' enums
    RunStateValue: TypeAlias = StrEnum
    WorkerStateValue: TypeAlias = StrEnum
    LifeStateValue: TypeAlias = StrEnum
    CategoryValue: TypeAlias = StrEnum
    FailureKindValue: TypeAlias = StrEnum
else:
    RunStateValue = _spelled_as_values(
        "RunState", "A run's state (seed: the lifecycle's states).", RunState
    )
    WorkerStateValue = _spelled_as_values(
        "WorkerState",
        "A worker's state: a run's, but Deleted, and with Stopping while it winds down.",
        WorkerState,
    )
    LifeStateValue = _spelled_as_values(
        "LifeState",
        "A state a history entry records: a run's or a worker's.",
        WorkerState,
        RunState,
    )
    CategoryValue = _spelled_as_values(
        "GoodputCategory",
        "Where GPU time went (seed goodput.txt): the accounting's categories.",
        Category,
    )
    FailureKindValue = _spelled_as_values(
        "FailureKind",
        "What a failure or a wait means (seed: Debug a failed run, step 2; Debug a run that does "
        "not start).",
        FailureKind,
    )
