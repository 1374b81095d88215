"""The root of the GraphQL schema."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import strawberry
from graphql import GraphQLError
from strawberry.extensions import MaskErrors, SchemaExtension
from strawberry.permission import PermissionExtension
from strawberry.schema.config import StrawberryConfig
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.types import ExecutionContext

from backend.db.retries import contention, database_away
from backend.errors import ConflictRetry, DatabaseUnavailable
from backend.request.context import Info
from backend.resolvers import checkpoints as checkpoint_resolvers
from backend.resolvers import events as event_resolvers
from backend.resolvers import goodput as goodput_resolvers
from backend.resolvers import idle as idle_resolvers
from backend.resolvers import machine_identity as machine_identity_resolvers
from backend.resolvers import metrics as metric_resolvers
from backend.resolvers import operations as operation_resolvers
from backend.resolvers import runs as run_resolvers
from backend.resolvers import secrets as secret_resolvers
from backend.resolvers import tokens as token_resolvers
from backend.resolvers import webhooks as webhook_resolvers
from backend.resolvers.permissions import IsAuthenticated
from backend.schema.checkpoints import CheckpointAdvice
from backend.schema.common import BIG_INT, BigInt
from backend.schema.events import Event, EventPage, LogChunk, MetricRange
from backend.schema.goodput import (
    GoodputCost,
    GoodputInterval,
    GoodputReport,
    GoodputSeries,
    GoodputWeek,
)
from backend.schema.guards import bounds, expected, log_errors
from backend.schema.idle import IdleReport, PoolIdlePolicyPayload
from backend.schema.machine_identity import (
    JoinToken,
    JoinTokenPayload,
    MachineCredential,
    MachineCredentialPayload,
)
from backend.schema.machines import (
    Gpu,
    MachineHealthReport,
    MachineInfo,
    PoolInfo,
    PoolPricePayload,
)
from backend.schema.operations import (
    Alert,
    MachinePayload,
    PreemptionPolicyPayload,
    Quota,
    QuotaPayload,
    ThresholdPayload,
    ThresholdSetting,
    WorkerAttention,
    WorkspaceSettingsPayload,
)
from backend.schema.runs import CreateRunPayload, Run, RunPayload
from backend.schema.secrets import Secret, SecretPayload
from backend.schema.tokens import ApiToken, ApiTokenPayload
from backend.schema.viewer import Viewer
from backend.schema.webhooks import CreateWebhookPayload, Webhook, WebhookPayload

SDL_PATH = Path(__file__).resolve().parents[2] / "schema.graphql"


T = TypeVar("T")


def authenticated(root: type[T]) -> type[T]:
    """Every field of a root type asks for a valid API token (IsAuthenticated): said once here
    for all of them, not on each field; tests/graphql/test_schema.py checks none lacks it."""
    for field in root.__strawberry_definition__.fields:  # type: ignore[attr-defined]
        field.extensions = [*field.extensions, PermissionExtension(permissions=[IsAuthenticated()])]
    return root


@authenticated
@strawberry.type
class Query:
    @strawberry.field
    def viewer(self, info: Info) -> Viewer:
        return Viewer.from_principal(info.context.require_principal())

    run: Run | None = strawberry.field(
        resolver=run_resolvers.run,
        description="A run of the workspace (org admins may name another workspace).",
    )
    runs: list[Run] = strawberry.field(
        resolver=run_resolvers.list_runs,
        description="The workspace's runs that have not ended; all: true adds ended and deleted.",
    )
    gpus: list[Gpu] = strawberry.field(
        resolver=run_resolvers.gpus,
        description="Every GPU the workspace's runs may use, by machine and index (seed L-39).",
    )
    events: EventPage = strawberry.field(
        resolver=event_resolvers.events_page,
        description=(
            "The workspace's events, newest first: of one run (name) or kind; limit 1 to 500 "
            "(50), before an id for the next page (seed L-44, L-46)."
        ),
    )
    metric_range: MetricRange = strawberry.field(
        resolver=metric_resolvers.metric_range,
        description=(
            "One metric's series over time, of the workspace's workers: match label:value "
            "(repeatable), by, agg (sum, avg, max, min), rate, start, end, step (seed L-40)."
        ),
    )
    machines: list[MachineInfo] = strawberry.field(
        resolver=run_resolvers.machines,
        description=(
            "Organisation admins: every machine of its clusters, its pool, state and reason, "
            "GPUs and unhealthy ones, last heard from."
        ),
    )
    machine_health: MachineHealthReport = strawberry.field(
        resolver=run_resolvers.machine_health,
        description=(
            "Organisation admins: its machines ranked by the GPU time lost on them (failure, "
            "restart, stalled) over whole UTC hours (the last 7 days by default), with their "
            "workers' failures by kind, GPU faults (XID, ECC, remapped rows), their pool's "
            "median and the suggested action (drain, watch, none)."
        ),
    )
    join_tokens: list[JoinToken] = strawberry.field(
        resolver=machine_identity_resolvers.join_tokens,
        description="Organisation admins: the cluster's join tokens (legacy machine tokens too).",
    )
    machine_credentials: list[MachineCredential] = strawberry.field(
        resolver=machine_identity_resolvers.machine_credentials,
        description="Organisation admins: each machine's own credential in the cluster.",
    )
    pools: list[PoolInfo] = strawberry.field(
        resolver=run_resolvers.pools,
        description="Organisation admins: its pools, with their machines and GPUs.",
    )
    attention: list[WorkerAttention] = strawberry.field(
        resolver=operation_resolvers.attention,
        description="The workspace's workers stalled now, then its stragglers now.",
    )
    quota: Quota = strawberry.field(
        resolver=operation_resolvers.quota,
        description="A workspace's GPU quota on a cluster (gpus null: none): members read their "
        "own workspace's (workspace left out: the token's); admins any of the organisation's.",
    )
    quotas: list[Quota] = strawberry.field(
        resolver=operation_resolvers.quotas,
        description="Organisation admins: every workspace's GPU quota on a cluster.",
    )
    thresholds: list[ThresholdSetting] = strawberry.field(
        resolver=operation_resolvers.thresholds,
        description="Organisation admins: a cluster's alert thresholds as they apply now.",
    )
    alerts_firing: list[Alert] = strawberry.field(
        resolver=operation_resolvers.alerts_firing,
        description="Threshold alerts firing: the workspace's; all the organisation's for admins.",
    )
    checkpoint_advice: CheckpointAdvice = strawberry.field(
        resolver=checkpoint_resolvers.checkpoint_advice_of,
        description=(
            "How often a run should checkpoint (issue 41): its checkpoints' measured cost and "
            "interval, its machines' mean time between failures, the Young-Daly interval and "
            "the GPU-hours a week it would save; or why it cannot be estimated."
        ),
    )
    idle_report: IdleReport = strawberry.field(
        resolver=idle_resolvers.idle_report,
        description=(
            "What the workspace's idle policies did over the last days (7; 1 to 400): the "
            "GPU-hours their stops gave back and each stop and notice (issue 41)."
        ),
    )
    secrets: list[Secret] = strawberry.field(
        resolver=secret_resolvers.list_secrets,
        description="The workspace's secrets: names and whether they are set, never values.",
    )
    goodput: GoodputReport = strawberry.field(
        resolver=goodput_resolvers.goodput,
        description=(
            "Where the GPU time went: a ledger per run, machine, pool or workspace over whole "
            "UTC hours (the last 7 days by default, at most 400), most held first."
        ),
    )
    goodput_weekly: list[GoodputWeek] = strawberry.field(
        resolver=goodput_resolvers.goodput_weekly,
        description="The last ISO weeks (Monday, UTC), this one included, oldest first.",
    )
    goodput_series: GoodputSeries = strawberry.field(
        resolver=goodput_resolvers.goodput_series,
        description=(
            "Goodput over time: one run's, machine's, pool's or workspace's ledger (by name; "
            "without one, every row summed) each hour or UTC day of the period."
        ),
    )
    goodput_cost: GoodputCost = strawberry.field(
        resolver=goodput_resolvers.goodput_cost,
        description=(
            "Cost: the GPU time held on priced pools (setPoolPrice) as money, by workspace or "
            "run, over whole UTC hours (the last 7 days by default)."
        ),
    )
    goodput_intervals: list[GoodputInterval] = strawberry.field(
        resolver=goodput_resolvers.goodput_intervals,
        description="The worker intervals behind a ledger figure, earliest first.",
    )
    webhooks: list[Webhook] = strawberry.field(
        resolver=webhook_resolvers.list_webhooks,
        description="The workspace's webhooks and their latest deliveries; never their secrets.",
    )
    tokens: list[ApiToken] = strawberry.field(
        resolver=token_resolvers.list_tokens,
        description=(
            "API tokens, never their secrets: the caller's own; an organisation admin's: every "
            "user token of the organisation's workspaces."
        ),
    )


@authenticated
@strawberry.type
class Mutation:
    create_run: CreateRunPayload = strawberry.mutation(
        resolver=run_resolvers.create_run,
        description="Submit a run from its specification (JSON).",
    )
    stop_run: RunPayload = strawberry.mutation(
        resolver=run_resolvers.stop_run,
        description="Wind a run down; it ends Stopped.",
    )
    delete_run: RunPayload = strawberry.mutation(
        resolver=run_resolvers.delete_run,
        description="Delete a run with its workers and their logs; it stays listed as Deleted.",
    )
    run_again: CreateRunPayload = strawberry.mutation(
        resolver=run_resolvers.run_again,
        description="Submit a run's specification again under a new name.",
    )
    create_join_token: JoinTokenPayload = strawberry.mutation(
        resolver=machine_identity_resolvers.create_join_token,
        description=(
            "Organisation admins: a token `astraeus agent` exchanges once for the machine's own "
            "credential; `uses` machines may join with it until it `expires` (e.g. 24h)."
        ),
    )
    revoke_join_token: JoinTokenPayload = strawberry.mutation(
        resolver=machine_identity_resolvers.revoke_join_token,
        description=(
            "Organisation admins: no machine joins with it any more; a legacy machine token's "
            "streams are closed."
        ),
    )
    revoke_machine_credential: MachineCredentialPayload = strawberry.mutation(
        resolver=machine_identity_resolvers.revoke_machine_credential,
        description=(
            "Organisation admins: the machine is lost at once, its workers placed elsewhere, "
            "its stream closed; it joins again only with a new join token."
        ),
    )
    drain_machine: MachinePayload = strawberry.mutation(
        resolver=operation_resolvers.drain_machine,
        description=(
            "Organisation admins: the machine takes no new work; its runs are preempted and "
            "placed again elsewhere."
        ),
    )
    set_threshold: ThresholdPayload = strawberry.mutation(
        resolver=operation_resolvers.set_threshold,
        description="Organisation admins: change one of a cluster's alert thresholds.",
    )
    set_priority_ceiling: WorkspaceSettingsPayload = strawberry.mutation(
        resolver=operation_resolvers.set_priority_ceiling,
        description=(
            "Organisation admins: the highest priority a workspace's runs may ask for (0 to "
            "100; default 50)."
        ),
    )
    set_quota: QuotaPayload = strawberry.mutation(
        resolver=operation_resolvers.set_quota,
        description=(
            "Organisation admins: the most GPUs a workspace's runs may hold at once on a "
            "cluster (null or left out: no quota)."
        ),
    )
    set_pool_price: PoolPricePayload = strawberry.mutation(
        resolver=operation_resolvers.set_pool_price,
        description=(
            "Organisation admins: what a GPU-hour of a pool's machines costs, in a currency "
            "(ISO 4217, USD by default; one for the organisation), which turns GPU-hours into "
            "money on goodputCost (null or left out: no price)."
        ),
    )
    set_pool_idle_policy: PoolIdlePolicyPayload = strawberry.mutation(
        resolver=idle_resolvers.set_pool_idle_policy,
        description=(
            "Organisation admins: the idle policy a run submitted to the pool without its own "
            'takes, as a run\'s "idle" ({gpu_utilization_below, for, action}); null or left '
            "out: none. Applied at submission (issue 41)."
        ),
    )
    set_preemption_policy: PreemptionPolicyPayload = strawberry.mutation(
        resolver=operation_resolvers.set_preemption_policy,
        description=(
            "Organisation admins: whether a cluster's higher-priority runs may preempt runs of "
            "other workspaces holding more than their quota (otherwise only their own "
            "workspace's)."
        ),
    )
    set_secret: SecretPayload = strawberry.mutation(
        resolver=secret_resolvers.set_secret,
        description=(
            "Set a secret's value; without a value, declare it external: workers naming it "
            "wait while Preparing ('waiting for external secret …') until it is set."
        ),
    )
    delete_secret: SecretPayload = strawberry.mutation(
        resolver=secret_resolvers.delete_secret,
        description="Delete a secret; runs already started keep what they were given.",
    )
    revoke_token: ApiTokenPayload = strawberry.mutation(
        resolver=token_resolvers.revoke_token,
        description=(
            "Revoke an API token (its id or first characters): the caller's own; an "
            "organisation admin: any user token of the organisation. Requests with it are "
            "refused from now on, and its open subscriptions end within seconds."
        ),
    )
    create_webhook: CreateWebhookPayload = strawberry.mutation(
        resolver=webhook_resolvers.create_webhook,
        description=(
            "Send the workspace's events from now on to an http(s) URL, those of the kinds "
            "named (and the kinds under them) or every kind. The answer holds the signing "
            "secret, shown this once."
        ),
    )
    delete_webhook: WebhookPayload = strawberry.mutation(
        resolver=webhook_resolvers.delete_webhook,
        description="Delete a webhook: nothing more is sent to it, not even deliveries due.",
    )


@authenticated
@strawberry.type
class Subscription:
    follow_log: AsyncGenerator[LogChunk, None] = strawberry.subscription(
        resolver=event_resolvers.follow_log,
        description=(
            "A worker's log as its machine writes it (a run's name: its first worker; a failed "
            "run's, the worker that failed it), beginning with its last tail lines (0 to 10 000), "
            "until the worker ends: the last chunk says ended. A machine that is not connected, "
            "or goes first, is an error."
        ),
    )
    events: AsyncGenerator[Event, None] = strawberry.subscription(
        resolver=event_resolvers.events_feed,
        description=(
            "The workspace's events as they happen (run and worker state changes with their "
            "reasons, deletions, alerts), from now or after an event id, oldest first; of one "
            "run (name) or kind (run.state; run: every run event)."
        ),
    )


class DatabaseErrors(SchemaExtension):
    """An error of the database being away, wherever a resolver met it, is said as such, with
    the code DATABASE_UNAVAILABLE (the caller may try again), instead of being masked; a
    deadlock or serialisation failure that was not tried away is CONFLICT_RETRY (409)."""

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
    if contention(original):  # lost to other transactions: not the database being away
        retry = ConflictRetry()
        return GraphQLError(retry.message, nodes=error.nodes, path=error.path, original_error=retry)
    if not isinstance(original, DatabaseUnavailable) and not database_away(original):
        return error
    away = DatabaseUnavailable()
    return GraphQLError(away.message, nodes=error.nodes, path=error.path, original_error=away)


def _should_mask(error: GraphQLError) -> bool:
    """Errors the caller can act on are shown; anything unexpected is masked."""
    return not expected(error)


class ExecutionPerEvent(StrawberryGraphQLCoreExecutionContext):
    """A subscription's executor whose events each collect their fields afresh. graphql-core
    (3.3) makes each event's executor a shallow copy of the subscription's, so all of them
    shared one memo of collected subfields, keyed by the identity of lists each event makes
    anew and keeping them alive: a subscription's memory grew with every event or log chunk
    it delivered, as long as it lasted (issue 19: `serve` 134 -> 199 MB in 12 minutes)."""

    def build_per_event_executor(self, payload: Any) -> Any:
        executor = super().build_per_event_executor(payload)
        executor._relevant_sub_fields = {}
        return executor


class Schema(strawberry.Schema):
    def process_errors(
        self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None
    ) -> None:
        log_errors(errors, execution_context)


schema = Schema(
    query=Query,
    mutation=Mutation,
    subscription=Subscription,
    execution_context_class=ExecutionPerEvent,
    config=StrawberryConfig(scalar_map={BigInt: BIG_INT}),
    extensions=[
        lambda: MaskErrors(should_mask_error=_should_mask),
        DatabaseErrors,  # inside MaskErrors: it says these before MaskErrors looks
        *bounds(),  # parses and validates, off the event loop, remembering what it checked
    ],
)


def sdl() -> str:
    return schema.as_str() + "\n"
