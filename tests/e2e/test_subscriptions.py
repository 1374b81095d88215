"""GraphQL subscriptions over a real WebSocket against `astraeus up` with its local agent: a
worker's log lines reach the client as they are written, and the workspace's events as they
happen (issue 6; seed L-9, L-47)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from backend.cli.astra.client import EXIT_FAILED
from backend.cli.astra.graphql_ws import PROTOCOL, init_message, subscribe, websocket_url
from tests.e2e.live import Server, running
from tests.support.processes import ASTRA, submit

FOLLOW = """subscription($w: String!, $tail: Int!) {
  followLog(worker: $w, tail: $tail) { text archived missed ended } }"""
EVENTS = """subscription($name: String) {
  events(name: $name) { id kind state reason run worker workspace createdAt } }"""
# A worker that writes when it writes each line, then ends.
TICKER = (
    "import time\n"
    "time.sleep(2)\n"
    "for i in range(8):\n"
    "    print(f'line {i} at {time.time():.6f}', flush=True)\n"
    "    time.sleep(0.4)\n"
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    with running(tmp_path_factory.mktemp("subscriptions") / "data") as live:
        yield live


def spec(name: str) -> dict[str, object]:
    return {
        "name": name,
        "gpus": 1,
        "restart_policy": "never",
        "command": ["python3", "-c", TICKER],
    }


async def until_running(live: tuple[Server, str], worker: str) -> None:
    import httpx

    server, token = live
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(base_url=server.url) as client:
        while time.monotonic() < deadline:
            task = await client.get(
                f"/v1/tasks/{worker}", headers={"Authorization": f"Bearer {token}"}
            )
            if task.status_code == 200 and task.json()["status"] == "Running":
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"{worker} never ran")


async def test_a_followed_log_shows_each_line_as_it_is_written(
    live: tuple[Server, str],
) -> None:
    server, token = live
    submit(live, spec("ticker"))
    await until_running(live, "ticker-0")
    lines: list[str] = []
    delays: list[float] = []
    last: dict[str, object] = {}
    async for result in subscribe(server.url, token, FOLLOW, w="ticker-0", tail=0):
        assert "errors" not in result, result
        chunk = result["data"]["followLog"]
        arrived = time.time()
        for line in chunk["text"].splitlines():
            lines.append(line)
            delays.append(arrived - float(line.rsplit(" at ", 1)[1]))
        last = chunk
    assert [line.split(" at ")[0] for line in lines] == [f"line {i}" for i in range(8)]
    assert last["ended"] is True  # the worker ended: the last chunk says so, then complete
    assert max(delays) < 2.0, delays  # each line within 2 s of being written (issue 8)


async def test_the_workspaces_events_as_they_happen(live: tuple[Server, str]) -> None:
    server, token = live
    seen: list[dict[str, object]] = []

    async def watch() -> None:
        async for result in subscribe(server.url, token, EVENTS, name="evented"):
            event = result["data"]["events"]
            seen.append(event)
            if (event["kind"], event["state"]) == ("run.state", "Completed"):
                return

    watcher = asyncio.ensure_future(watch())
    await asyncio.sleep(0.5)  # subscribed: from now on
    submit(live, spec("evented"))
    await asyncio.wait_for(watcher, timeout=60)
    kinds = [(e["kind"], e["state"]) for e in seen]
    assert kinds[0] == ("run.state", "Pending") and seen[0]["reason"] == "Run created"
    assert ("run.state", "Running") in kinds and kinds[-1] == ("run.state", "Completed")
    assert ("worker.state", "Running") in kinds  # its worker's changes too
    assert all(e["run"] == "evented" and e["workspace"] == "default" for e in seen)
    ids = [e["id"] for e in seen]
    assert len(ids) == len(set(ids))  # each once (in order: Pending first, Completed last)


async def test_a_websocket_without_a_valid_token_is_closed(live: tuple[Server, str]) -> None:
    server, _ = live
    for token in (None, "astx_nope"):
        async with connect(websocket_url(server.url), subprotocols=[PROTOCOL]) as ws:
            await ws.send(init_message(token))
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403


async def test_following_a_worker_not_placed_is_an_error(live: tuple[Server, str]) -> None:
    server, token = live
    results = [r async for r in subscribe(server.url, token, FOLLOW, w="nobody-0", tail=0)]
    assert results[0]["errors"][0]["message"].startswith("No worker or run named 'nobody-0'")
    bad = [r async for r in subscribe(server.url, token, FOLLOW, w="ticker-0", tail=-1)]
    assert "tail" in bad[0]["errors"][0]["message"]


def test_astra_logs_follows_a_worker_to_its_end(live: tuple[Server, str]) -> None:
    # issue 7: `logs -f` prints lines as they come, then how the worker ended; its exit code
    server, token = live
    env = {**server.env_for(token), "HOME": str(server.log.parent)}
    failing = TICKER + "raise SystemExit(3)\n"
    for name, code in (("followed", 0), ("followed-fail", EXIT_FAILED)):
        command = TICKER if code == 0 else failing
        submit(
            live,
            {
                "name": name,
                "gpus": 1,
                "restart_policy": "never",
                "command": ["python3", "-c", command],
            },
        )
        asyncio.run(until_running(live, f"{name}-0"))
        done = subprocess.run(
            [ASTRA, "astraeus", "logs", name, "-f"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = done.stdout.splitlines()
        # the log, a blank line, then how it ended (seed L-11); a failure's end goes to stderr
        printed = lines[:-2] if code == 0 else lines[:-1]
        assert lines[len(printed)] == ""
        assert [line.split(" at ")[0] for line in printed] == [f"line {i}" for i in range(8)]
        if code == 0:
            assert (done.returncode, lines[-1]) == (0, f"{name}-0: Completed — Exited with code 0")
        else:
            assert done.returncode == EXIT_FAILED
            assert done.stderr.startswith(f"{name}-0: Failed — Exited with code 3")
    tail = subprocess.run(
        [ASTRA, "astraeus", "logs", "followed", "--tail", "2"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert [line.split(" at ")[0] for line in tail.stdout.splitlines()] == ["line 6", "line 7"]


def test_astra_gpus_lists_the_local_agents_gpus(live: tuple[Server, str]) -> None:
    # seed L-39: `gpu-07/0  NVIDIA H100 80GB HBM3  97%  ok  held by llama-sft`
    server, token = live
    env = {**server.env_for(token), "HOME": str(server.log.parent)}
    done = subprocess.run([ASTRA, "astraeus", "gpus"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and all(
        re.fullmatch(r"\S+/\d+  .+  (\d+%|—)  ok  (free|held by \S+)", line) for line in lines
    ), lines
