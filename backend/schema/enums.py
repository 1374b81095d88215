"""GraphQL enums of the domain's states, categories and failure kinds.

Each member is spelled as its value is today on the wire (``Running``, ``productive``,
``out_of_memory``), so the console and the seeds' outputs read the same strings; each is a
``StrEnum`` too, so code comparing it with the domain's values keeps working. Their members are
the domain enums' (backend/runs/rules.py, backend/accounting/rules.py, backend/runs/failures.py):
tests/graphql/test_enums.py fails when one drifts from them.
"""

from __future__ import annotations

from enum import StrEnum

import strawberry


@strawberry.enum(name="RunState", description="A run's state (seed: the lifecycle's states).")
class RunStateValue(StrEnum):
    Pending = "Pending"
    Preparing = "Preparing"
    Pulling = "Pulling"
    Starting = "Starting"
    Running = "Running"
    Completed = "Completed"
    Failed = "Failed"
    Stopped = "Stopped"
    Deleted = "Deleted"


@strawberry.enum(
    name="WorkerState",
    description="A worker's state: a run's, but Deleted, and with Stopping while it winds down.",
)
class WorkerStateValue(StrEnum):
    Pending = "Pending"
    Preparing = "Preparing"
    Pulling = "Pulling"
    Starting = "Starting"
    Running = "Running"
    Stopping = "Stopping"
    Completed = "Completed"
    Failed = "Failed"
    Stopped = "Stopped"


@strawberry.enum(
    name="LifeState",
    description="A state a history entry records: a run's or a worker's.",
)
class LifeStateValue(StrEnum):
    Pending = "Pending"
    Preparing = "Preparing"
    Pulling = "Pulling"
    Starting = "Starting"
    Running = "Running"
    Stopping = "Stopping"
    Completed = "Completed"
    Failed = "Failed"
    Stopped = "Stopped"
    Deleted = "Deleted"


@strawberry.enum(
    name="GoodputCategory",
    description="Where GPU time went (seed goodput.txt): the accounting's categories.",
)
class CategoryValue(StrEnum):
    productive = "productive"
    idle = "idle"
    stalled = "stalled"
    starting = "starting"
    restart = "restart"
    failure = "failure"
    preemption = "preemption"
    waiting = "waiting"


@strawberry.enum(
    name="FailureKind",
    description="What a failure or a wait means (seed: Debug a failed run, step 2; Debug a run "
    "that does not start).",
)
class FailureKindValue(StrEnum):
    program = "program"
    command_not_found = "command_not_found"
    out_of_memory = "out_of_memory"
    image_pull = "image_pull"
    time_limit = "time_limit"
    machine_lost = "machine_lost"
    retry_budget = "retry_budget"
    preempted = "preempted"
    stalled = "stalled"
    signal = "signal"
    unreadable = "unreadable"
    other = "other"
    machines = "machines"
    queue = "queue"
    plan = "plan"
    credential = "credential"
    drive = "drive"
    pulling = "pulling"
    barrier = "barrier"
    restart_loop = "restart_loop"
