"""Resolvers of webhooks: listed (never with their secrets), created (the secret shown once),
deleted."""

from __future__ import annotations

import strawberry
from sqlalchemy.ext.asyncio import AsyncSession

from backend import ids
from backend.errors import AstraeusError, NotFound
from backend.models import Webhook as WebhookRow
from backend.request.context import Info
from backend.resolvers.mutations import mutate
from backend.schema.common import UserError
from backend.schema.webhooks import CreateWebhookPayload, Webhook, WebhookPayload
from backend.webhooks import service as webhooks


async def list_webhooks(info: Info, workspace: str | None = None) -> list[Webhook]:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        try:
            rows = await webhooks.list_webhooks(session, principal, workspace=workspace)
        except NotFound:
            return []
    codec = await ids.codec(info.context.db)
    return [Webhook.from_model(r, codec) for r in rows]


async def create_webhook(
    info: Info, url: str, kinds: list[str] | None = None, workspace: str | None = None
) -> CreateWebhookPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> WebhookRow:
        return await webhooks.create_webhook(
            session,
            info.context.clock,
            principal,
            url,
            kinds or [],
            workspace=workspace,
            policy=info.context.webhook_policy,
        )

    # not through mutate: the ids' key is read (made, on a new install) only once a webhook is
    # made, so a refused one writes nothing
    try:  # tried again whole if it lost to another transaction (issue 19)
        row = await info.context.db.unit(work)
    except AstraeusError as error:
        return CreateWebhookPayload(webhook=None, secret=None, errors=UserError.from_error(error))
    codec = await ids.codec(info.context.db)
    return CreateWebhookPayload(
        webhook=Webhook.from_model(row, codec), secret=row.secret, errors=[]
    )


async def delete_webhook(
    info: Info, id: strawberry.ID, workspace: str | None = None
) -> WebhookPayload:
    principal = info.context.require_principal()
    codec = await ids.codec(info.context.db)
    number = codec.open(ids.Kind.WEBHOOK, str(id))

    async def work(session: AsyncSession) -> WebhookRow:
        if number is None:  # no webhook's id, as the API shows them
            raise NotFound("WEBHOOK_NOT_FOUND", f"No webhook {id}.")
        return await webhooks.delete_webhook(
            session, info.context.clock, principal, number, workspace=workspace
        )

    return await mutate(
        info,
        work,
        lambda row: WebhookPayload(webhook=Webhook.from_model(row, codec), errors=[]),
        lambda errors: WebhookPayload(webhook=None, errors=errors),
    )
