"""The secrets domain's entry point.

Users set a secret's value, or declare it external (to be filled in later by a secret
manager). Nothing here returns a value to a user; only ``values_for_worker`` does, for the
agent of the machine the worker is placed on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.clock import Clock
from backend.errors import FieldError, InvalidInput, NotFound
from backend.models import Secret
from backend.organizations import service as organizations
from backend.secrets import repository
from backend.spec import NAME_PATTERN, stored_spec

MAX_VALUE_BYTES = 64 * 1024


@dataclass(frozen=True)
class SecretValues:
    values: dict[str, str]
    missing: list[str]


def _check(name: str, value: str | None) -> None:
    problems = []
    if not re.match(NAME_PATTERN, name):
        problems.append(
            FieldError(
                "name",
                "must be lowercase letters, digits and '-', starting and ending with a letter "
                "or digit, at most 63 characters",
            )
        )
    if value is not None and len(value.encode()) > MAX_VALUE_BYTES:
        problems.append(FieldError("value", "must be at most 64 KiB"))
    if problems:
        raise InvalidInput("INVALID_SECRET", problems)


async def set_secret(
    session: AsyncSession,
    clock: Clock,
    principal: Principal,
    name: str,
    value: str | None,
    *,
    workspace: str | None = None,
) -> Secret:
    """Set a secret's value, or with no value declare it external (waited for)."""
    _check(name, value)
    ws = await organizations.workspace_for(session, principal, workspace)
    now = clock.now()
    row = await repository.secret_named(session, ws.id, name)
    if row is None:
        row = Secret(workspace_id=ws.id, name=name, created_at=now, external=value is None)
        repository.add(session, row)
    row.value = value
    row.external = value is None or row.external
    row.updated_at = now
    await session.flush()
    return row


async def list_secrets(
    session: AsyncSession, principal: Principal, *, workspace: str | None = None
) -> list[Secret]:
    ws = await organizations.workspace_for(session, principal, workspace)
    return await repository.secrets_of(session, ws.id)


async def delete_secret(
    session: AsyncSession, principal: Principal, name: str, *, workspace: str | None = None
) -> Secret:
    ws = await organizations.workspace_for(session, principal, workspace)
    row = await repository.secret_named(session, ws.id, name)
    if row is None:
        raise NotFound("SECRET_NOT_FOUND", f"No secret named '{name}'.")
    await repository.delete(session, row)
    return row


async def values_for_worker(
    session: AsyncSession, machine_id: int, worker_id: int, attempt: int
) -> SecretValues | None:
    """The values of the secrets a worker placed on this machine names; None if not placed here.

    Only the credentials of the worker's own run, only to the machine it is placed on, and only
    for the attempt it runs there now."""
    worker = await repository.placed_worker(session, machine_id, worker_id)
    if worker is None or worker.attempt != attempt:
        return None
    run = await repository.run_of(session, worker)
    assert run is not None
    names = [c.secret for c in stored_spec(run.spec).credentials]
    rows = await repository.secrets_named(session, run.workspace_id, names)
    values = {r.name: r.value for r in rows if r.value is not None}
    return SecretValues(values, [n for n in dict.fromkeys(names) if n not in values])


async def reencrypt(session: AsyncSession) -> int:
    """Every stored secret encrypted again with the first configured key (after a new key was
    put first, so that the old one can then be dropped): how many."""
    return await repository.rewrite_stored_secrets(session)
