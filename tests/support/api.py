"""Calls of the API in this process: GraphQL and REST with a token."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from backend.access import service as access
from backend.db import Database
from backend.metrics import service as metrics
from backend.metrics.service import RangeParams
from tests.support import FakeClock


async def graphql(
    client: httpx.AsyncClient, token: str, query: str, **variables: Any
) -> dict[str, Any]:
    answer = await client.post(
        "/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


RUN_FIELDS = """name state reason priority createdBy spec
  workers { name rank state reason gpus gpuIds restarts restartAt exitCode lastFailure straggler }
  history { transitionAt state reason } taskCounts { state count }
  goodput { allocatedGpuHours productiveGpuHours goodput }"""


CREATE = f"""mutation($spec: JSON!, $ws: String) {{
  createRun(spec: $spec, workspace: $ws) {{
    run {{ {RUN_FIELDS} }}
    errors {{ code field message }}
  }}
}}"""


async def gql(client: httpx.AsyncClient, token: str | None, query: str, **variables: Any) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = await client.post(
        "/graphql", json={"query": query, "variables": variables}, headers=headers
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def query(
    db: Database, clock: FakeClock, token: str, metric: str, *match: str, **params: str
) -> dict[str, Any]:
    async with db.read() as session:
        principal = await access.authenticate(session, token)
        answer = await metrics.range_query(
            session,
            principal,
            RangeParams(metric=metric, match=match, **params),
            now=clock.now(),
            retention=timedelta(days=15),
        )
    return answer.to_json()


async def get(client: httpx.AsyncClient, token: str, path: str, **params: Any) -> httpx.Response:
    return await client.get(
        f"/v1{path}", params=params, headers={"Authorization": f"Bearer {token}"}
    )
