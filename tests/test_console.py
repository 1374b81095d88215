"""The server serves the built console when there is one, and routes stay with the client."""

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from backend.app import create_app
from backend.config import Settings
from backend.db import Database


@pytest.fixture
async def console_client(
    settings: Settings, db: Database, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text("<!doctype html><div id=root></div>")
    (dist / "assets" / "app.js").write_text("console.log('astraeus')")
    app = create_app(settings.model_copy(update={"console_dir": dist}), database=db)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://a.test") as client:
            yield client


async def test_the_built_console_is_served(console_client: httpx.AsyncClient) -> None:
    index = await console_client.get("/")
    assert index.status_code == 200 and "id=root" in index.text
    asset = await console_client.get("/assets/app.js")
    assert asset.text == "console.log('astraeus')"


async def test_a_client_route_gets_the_console(console_client: httpx.AsyncClient) -> None:
    page = await console_client.get("/o/default/w/default/workers/local/llama-sft-1")
    assert page.status_code == 200 and "id=root" in page.text


async def test_api_paths_are_not_swallowed_by_the_console(
    console_client: httpx.AsyncClient,
) -> None:
    answer = await console_client.get("/v1/jobs/x")
    assert answer.status_code == 401 and answer.json()["code"] == "UNAUTHENTICATED"


async def test_without_a_built_console_the_root_says_how_to_build_it(
    client: httpx.AsyncClient,
) -> None:
    page = await client.get("/")
    assert page.status_code == 200 and "make up" in page.text
