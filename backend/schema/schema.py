"""The root of the GraphQL schema."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from pathlib import Path

import strawberry
from graphql import GraphQLError
from strawberry.extensions import MaskErrors, ParserCache, SchemaExtension, ValidationCache
from strawberry.extensions.field_extension import FieldExtension
from strawberry.permission import PermissionExtension

from backend.db import database_away
from backend.errors import AstraeusError, DatabaseUnavailable
from backend.resolvers import events as event_resolvers
from backend.resolvers import goodput as goodput_resolvers
from backend.resolvers import metrics as metric_resolvers
from backend.resolvers import operations as operation_resolvers
from backend.resolvers import runs as run_resolvers
from backend.resolvers import secrets as secret_resolvers
from backend.resolvers import webhooks as webhook_resolvers
from backend.resolvers.context import Info
from backend.resolvers.permissions import IsAuthenticated
from backend.schema.events import Event, EventPage, LogChunk, MetricRange
from backend.schema.goodput import GoodputInterval, GoodputReport, GoodputWeek
from backend.schema.machines import Gpu, MachineInfo, PoolInfo
from backend.schema.operations import (
    Alert,
    MachinePayload,
    ThresholdPayload,
    WorkerAttention,
)
from backend.schema.runs import CreateRunPayload, Run, RunPayload
from backend.schema.secrets import Secret, SecretPayload
from backend.schema.viewer import Viewer
from backend.schema.webhooks import CreateWebhookPayload, Webhook, WebhookPayload

SDL_PATH = Path(__file__).resolve().parents[2] / "schema.graphql"


def _authenticated() -> list[FieldExtension]:
    return [PermissionExtension(permissions=[IsAuthenticated()])]


@strawberry.type
class Query:
    @strawberry.field(extensions=_authenticated())
    def viewer(self, info: Info) -> Viewer:
        return Viewer.from_principal(info.context.require_principal())

    run: Run | None = strawberry.field(
        resolver=run_resolvers.run,
        extensions=_authenticated(),
        description="A run of the workspace (org admins may name another workspace).",
    )
    runs: list[Run] = strawberry.field(
        resolver=run_resolvers.list_runs,
        extensions=_authenticated(),
        description="The workspace's runs that have not ended; all: true adds ended and deleted.",
    )
    gpus: list[Gpu] = strawberry.field(
        resolver=run_resolvers.gpus,
        extensions=_authenticated(),
        description="Every GPU the workspace's runs may use, by machine and index (seed L-39).",
    )
    events: EventPage = strawberry.field(
        resolver=event_resolvers.events_page,
        extensions=_authenticated(),
        description=(
            "The workspace's events, newest first: of one run (name) or kind; limit 1 to 500 "
            "(50), before an id for the next page (seed L-44, L-46)."
        ),
    )
    metric_range: MetricRange = strawberry.field(
        resolver=metric_resolvers.metric_range,
        extensions=_authenticated(),
        description=(
            "One metric's series over time, of the workspace's workers: match label:value "
            "(repeatable), by, agg (sum, avg, max, min), rate, start, end, step (seed L-40)."
        ),
    )
    machines: list[MachineInfo] = strawberry.field(
        resolver=run_resolvers.machines,
        extensions=_authenticated(),
        description=(
            "Organisation admins: every machine of its clusters, its pool, state and reason, "
            "GPUs and unhealthy ones, last heard from."
        ),
    )
    pools: list[PoolInfo] = strawberry.field(
        resolver=run_resolvers.pools,
        extensions=_authenticated(),
        description="Organisation admins: its pools, with their machines and GPUs.",
    )
    attention: list[WorkerAttention] = strawberry.field(
        resolver=operation_resolvers.attention,
        extensions=_authenticated(),
        description="The workspace's workers stalled now, then its stragglers now.",
    )
    alerts_firing: list[Alert] = strawberry.field(
        resolver=operation_resolvers.alerts_firing,
        extensions=_authenticated(),
        description="Threshold alerts firing: the workspace's; all the organisation's for admins.",
    )
    secrets: list[Secret] = strawberry.field(
        resolver=secret_resolvers.list_secrets,
        extensions=_authenticated(),
        description="The workspace's secrets: names and whether they are set, never values.",
    )
    goodput: GoodputReport = strawberry.field(
        resolver=goodput_resolvers.goodput,
        extensions=_authenticated(),
        description=(
            "Where the GPU time went: a ledger per run, machine, pool or workspace over whole "
            "UTC hours (the last 7 days by default, at most 400), most held first."
        ),
    )
    goodput_weekly: list[GoodputWeek] = strawberry.field(
        resolver=goodput_resolvers.goodput_weekly,
        extensions=_authenticated(),
        description="The last ISO weeks (Monday, UTC), this one included, oldest first.",
    )
    goodput_intervals: list[GoodputInterval] = strawberry.field(
        resolver=goodput_resolvers.goodput_intervals,
        extensions=_authenticated(),
        description="The worker intervals behind a ledger figure, earliest first.",
    )
    webhooks: list[Webhook] = strawberry.field(
        resolver=webhook_resolvers.list_webhooks,
        extensions=_authenticated(),
        description="The workspace's webhooks and their latest deliveries; never their secrets.",
    )


@strawberry.type
class Mutation:
    create_run: CreateRunPayload = strawberry.mutation(
        resolver=run_resolvers.create_run,
        extensions=_authenticated(),
        description="Submit a run from its specification (JSON).",
    )
    stop_run: RunPayload = strawberry.mutation(
        resolver=run_resolvers.stop_run,
        extensions=_authenticated(),
        description="Wind a run down; it ends Stopped.",
    )
    delete_run: RunPayload = strawberry.mutation(
        resolver=run_resolvers.delete_run,
        extensions=_authenticated(),
        description="Delete a run with its workers and their logs; it stays listed as Deleted.",
    )
    run_again: CreateRunPayload = strawberry.mutation(
        resolver=run_resolvers.run_again,
        extensions=_authenticated(),
        description="Submit a run's specification again under a new name.",
    )
    drain_machine: MachinePayload = strawberry.mutation(
        resolver=operation_resolvers.drain_machine,
        extensions=_authenticated(),
        description=(
            "Organisation admins: the machine takes no new work; its runs are preempted and "
            "placed again elsewhere."
        ),
    )
    set_threshold: ThresholdPayload = strawberry.mutation(
        resolver=operation_resolvers.set_threshold,
        extensions=_authenticated(),
        description="Organisation admins: change one of a cluster's alert thresholds.",
    )
    set_secret: SecretPayload = strawberry.mutation(
        resolver=secret_resolvers.set_secret,
        extensions=_authenticated(),
        description=(
            "Set a secret's value; without a value, declare it external: workers naming it "
            "wait while Preparing ('waiting for external secret …') until it is set."
        ),
    )
    delete_secret: SecretPayload = strawberry.mutation(
        resolver=secret_resolvers.delete_secret,
        extensions=_authenticated(),
        description="Delete a secret; runs already started keep what they were given.",
    )
    create_webhook: CreateWebhookPayload = strawberry.mutation(
        resolver=webhook_resolvers.create_webhook,
        extensions=_authenticated(),
        description=(
            "Send the workspace's events from now on to an http(s) URL, those of the kinds "
            "named (and the kinds under them) or every kind. The answer holds the signing "
            "secret, shown this once."
        ),
    )
    delete_webhook: WebhookPayload = strawberry.mutation(
        resolver=webhook_resolvers.delete_webhook,
        extensions=_authenticated(),
        description="Delete a webhook: nothing more is sent to it, not even deliveries due.",
    )


@strawberry.type
class Subscription:
    follow_log: AsyncGenerator[LogChunk, None] = strawberry.subscription(
        resolver=event_resolvers.follow_log,
        extensions=_authenticated(),
        description=(
            "A worker's log as its machine writes it (a run's name: its first worker), "
            "beginning with its last tail lines (0 to 10 000), until the worker ends: the last "
            "chunk says ended. A machine that is not connected, or goes first, is an error."
        ),
    )
    events: AsyncGenerator[Event, None] = strawberry.subscription(
        resolver=event_resolvers.events_feed,
        extensions=_authenticated(),
        description=(
            "The workspace's events as they happen (run and worker state changes with their "
            "reasons, deletions, alerts), from now or after an event id, oldest first; of one "
            "run (name) or kind (run.state; run: every run event)."
        ),
    )


class DatabaseErrors(SchemaExtension):
    """An error of the database being away, wherever a resolver met it, is said as such, with
    the code DATABASE_UNAVAILABLE (the caller may try again), instead of being masked."""

    def on_operation(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        if result is None or not result.errors:
            return
        result.errors = [_said(error) for error in result.errors]


def _said(error: GraphQLError) -> GraphQLError:
    original = error.original_error
    if original is None:
        return error
    if not isinstance(original, DatabaseUnavailable) and not database_away(original):
        return error
    away = DatabaseUnavailable()
    return GraphQLError(away.message, nodes=error.nodes, path=error.path, original_error=away)


def _should_mask(error: GraphQLError) -> bool:
    """Errors the caller can act on are shown; anything unexpected is masked."""
    original = error.original_error
    if original is None:
        return False  # syntax and validation errors
    if isinstance(original, AstraeusError):
        return False
    return not (isinstance(original, GraphQLError) and (error.extensions or {}).get("code"))


schema = strawberry.Schema(
    query=Query,
    mutation=Mutation,
    subscription=Subscription,
    extensions=[
        lambda: MaskErrors(should_mask_error=_should_mask),
        DatabaseErrors,  # inside MaskErrors: it says these before MaskErrors looks
        lambda: ParserCache(maxsize=256),
        lambda: ValidationCache(maxsize=256),
    ],
)


def sdl() -> str:
    return schema.as_str() + "\n"
