"""The seeds walked live: every `curl`, `jq` and `astra` line of both seed pages, as written,
run by bash against `astraeus up`, each answer compared with the seed's block (issue 21).

One test per line, named by the line itself. Lines the seeds give inline ("astra astraeus runs
… -a", "GET $API/tasks?job=<run>", the Events address, /goodput/metrics, the admins' route)
are run as a user would write them for the seed's run. The data each line needs:

- goodput.txt: the seed week's two runs, llm and sweep-7 (tests/accounting/seed_week.py),
  played two hours ago into the server's database;
- logs-metrics-debugging.txt: llama-sft, two workers of two GPUs on three machines named as
  in the seed (gpu-07, gpu-08, gpu-09, simulated "NVIDIA H100 80GB HBM3"), running until the
  `logs -f` line lets it finish; and the failure the seed's `jq .last_failure` shows: a
  llama-sft whose rank 1 is killed for memory within a second (its own server: a run's name
  is its own), read as the seed's "Debug a failed run" says: its log, its last failure, its
  Memory chart near the limit.

The lines of a page run in the seed's order, except where the seed shows a run in two moments:
what it shows of llama-sft running comes before the `logs -f` that sees it complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent import cgroups
from tests.e2e.live import AgentProcess, Server, running, serving_seed_week
from tests.support import Tenancy, searchable
from tests.support.goodput_table import checked_table
from tests.support.http import HTTP

pytestmark = pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")

BIN = str(Path(sys.executable).parent)  # astra, as a user's PATH has it
MODEL = "NVIDIA H100 80GB HBM3"
ISO_Z = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"


def sh(server: Server, token: str, line: str, timeout: float = 60) -> str:
    """A seed's line, as written after its `$ `, run by bash with the seed's variables set;
    it must succeed (pipefail: curl's and jq's failures too)."""
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {line}"],
        env=user_env(server, token),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert (done.returncode, done.stderr) == (0, ""), (line, done.stdout, done.stderr)
    return done.stdout


def user_env(server: Server, token: str) -> dict[str, str]:
    api = f"{server.url}/v1"
    return {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "HOME": str(server.log.parent),
        "API": api,
        "ASTRA_TOKEN": token,
        "ASTRALYX_API": api,
        "ASTRALYX_TOKEN": token,
        "CONSOLE": server.url,
    }


Check = Callable[[Any, str], None]
SEED_IDS: dict[Check, str] = {}


def seed(checklist_id: str) -> Callable[[Check], Check]:
    """Names the seed checklist's line a case proves (shared/SEED-CHECKLIST.md): the case's id
    is that and the seed's line, e.g. `G-24 $ astra astraeus goodput --by run --days 7`."""

    def named(check: Check) -> Check:
        SEED_IDS[check] = checklist_id
        return check

    return named


def walk(page: Mapping[str, Check]) -> list[Any]:
    """A case per line of the page, in its order."""
    return [pytest.param(line, id=f"{SEED_IDS[check]} $ {line}") for line, check in page.items()]


def until(call: Callable[[], str], done: Callable[[str], bool], seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while True:
        found = call()
        if done(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.3)


# == goodput.txt ==============================================================================

# The seed's block, as printed on the page.
GOODPUT_BLOCK = """\
GPU-hours
RUN                              HELD     USED GOODPUT    IDLE STALLED   START RESTART FAILURE PREEMPT WAITING
llm                             323.1    300.1     93%     0.0     6.2     2.1     4.1    12.7     0.0     0.0
sweep-7                         146.5    112.4     77%    21.0     0.0     7.7     0.0     0.0     3.3    18.0
TOTAL                           469.6    412.5     88%    21.0     6.2     9.8     4.1    12.7     3.3    18.0

USED = productive (running, GPUs busy); GOODPUT = used / held; WAITING = asked for, not yet held"""  # noqa: E501
SEED_ROWS = GOODPUT_BLOCK.splitlines()
CATEGORIES = {
    "productive",
    "idle",
    "stalled",
    "starting",
    "restart",
    "failure",
    "preemption",
    "waiting",
}
LEDGER_FIELDS = {
    "gpu_hours",
    "allocated_gpu_hours",
    "productive_gpu_hours",
    "lost_gpu_hours",
    "waiting_gpu_hours",
}


def seed_layout(name: str, values: list[str]) -> str:
    """A row laid out as the seed's block lays its rows out: the name, then each figure
    right-aligned to the end of its column's header."""
    ends = [m.end() for m in re.finditer(r"\S+", SEED_ROWS[1])][1:]
    row = name
    for value, end in zip(values, ends, strict=True):
        row += value.rjust(end - len(row))
    return row


def assert_ledger(ledger: dict[str, Any]) -> None:
    """seed G-30: GPU-hours by category, allocated, productive, lost, waiting, and goodput
    (absent when nothing was held)."""
    assert set(ledger) >= LEDGER_FIELDS, ledger
    assert set(ledger["gpu_hours"]) == CATEGORIES
    if ledger["allocated_gpu_hours"] > 0:
        assert ledger["goodput"] == pytest.approx(
            ledger["productive_gpu_hours"] / ledger["allocated_gpu_hours"]
        )
    else:
        assert "goodput" not in ledger
    asked = sum(ledger["gpu_hours"].values())
    assert ledger["lost_gpu_hours"] == pytest.approx(asked - ledger["productive_gpu_hours"])


class SeedWeek:
    def __init__(self, server: Server, tenancy: Tenancy) -> None:
        self.server, self.tenancy = server, tenancy

    def sh(self, line: str, token: str | None = None) -> str:
        return sh(self.server, token or self.tenancy.member_token, line)

    def rest(self, path: str, **params: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.tenancy.member_token}"}
        answer = HTTP.get(f"{self.server.url}/v1{path}", params=params, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()


@pytest.fixture(scope="module")
def seed_week(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeedWeek]:
    with serving_seed_week(tmp_path_factory.mktemp("walk-goodput") / "data") as (server, t):
        yield SeedWeek(server, t)


@seed("G-24")
def by_run_days_7(week: SeedWeek, line: str) -> None:
    # seed G-24: the seed's title, columns, a row per run, TOTAL and its footer; the figures
    # are the week's own, each the REST API's
    printed = week.sh(line).splitlines()
    api = week.rest("/goodput", by="run", start=(datetime.now(UTC) - timedelta(days=7)).isoformat())
    assert [row["name"] for row in api["ledgers"]] == ["llm", "sweep-7"]
    rows = [*((row["name"], row) for row in api["ledgers"]), ("TOTAL", api["total"])]
    checked_table(printed, SEED_ROWS[1], rows)  # to the table's decimals (issue 36)


@seed("G-25")
def weeks_8_by_pool(week: SeedWeek, line: str) -> None:
    # seed G-25: one table of the seed's columns, a row per week and pool (a week without any:
    # the week alone), the weeks' TOTAL, the footer
    printed = week.sh(line).splitlines()
    weekly = week.rest("/goodput/weekly", weeks=8, by="pool")["weeks"]
    assert len(weekly) == 8
    rows: list[tuple[str, dict[str, Any]]] = []
    for one in weekly:
        named = [(f"{one['week']}  {row['name']}", row) for row in one["ledgers"]]
        rows += named or [(one["week"], one["total"])]
    header = seed_layout("WEEK      POOL", SEED_ROWS[1].split()[1:])
    # the weeks' rows, each the API's (issue 36: to the table's decimals); the TOTAL after them
    checked_table(printed[:-3] + printed[-2:], header, rows)
    assert printed[-3].startswith("TOTAL ")
    # the week two hours ago (two weeks when a week began since)
    assert {row["name"] for one in weekly for row in one["ledgers"]} == {"h100"}


@seed("G-26")
def run_llm(week: SeedWeek, line: str) -> None:
    # seed G-26: one run's own ledger since it was submitted, as one row of the seed's table
    ledger = week.rest("/runs/llm/goodput")
    checked_table(week.sh(line).splitlines(), SEED_ROWS[1], [("llm", ledger)])


@seed("G-27")
def goodput_by_machine(week: SeedWeek, line: str) -> None:
    # seed G-27, G-30, G-31, G-33: a ledger per machine the workspace's runs used
    answer = json.loads(week.sh(line))
    assert (answer["by"], answer["start"]) == ("machine", "2026-10-01T00:00:00.000000Z")
    assert [row["name"] for row in answer["ledgers"]] == ["gpu-07", "gpu-08"]
    for ledger in [*answer["ledgers"], answer["total"]]:
        assert_ledger(ledger)
    total = answer["total"]["allocated_gpu_hours"]
    assert sum(row["allocated_gpu_hours"] for row in answer["ledgers"]) == pytest.approx(total)


@seed("G-28")
def weekly_by_run(week: SeedWeek, line: str) -> None:
    # seed G-28: eight ISO weeks, the last this one, a ledger per run of each
    answer = json.loads(week.sh(line))
    assert answer["by"] == "run" and len(answer["weeks"]) == 8
    this_week = datetime.now(UTC).isocalendar()
    assert answer["weeks"][-1]["week"] == f"{this_week.year}-W{this_week.week:02d}"
    runs = [row["name"] for one in answer["weeks"] for row in one["ledgers"]]
    assert set(runs) == {"llm", "sweep-7"}
    for one in answer["weeks"]:
        for ledger in [*one["ledgers"], one["total"]]:
            assert_ledger(ledger)


@seed("G-29")
def run_goodput(week: SeedWeek, line: str) -> None:
    # seed G-29: llm's ledger since it was submitted
    answer = json.loads(week.sh(line))
    assert answer["run"] == "llm"
    assert_ledger(answer)
    assert answer["goodput"] > 0.5


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The exposition's samples by name and sorted labels."""
    out = {}
    for name, labels, value in re.findall(r"^(\w+)\{(.*)\} (\S+)$", text, re.MULTILINE):
        pairs = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels)))
        out[(name, pairs)] = float(value)
    return out


@seed("G-35")
def goodput_metrics(week: SeedWeek, line: str) -> None:
    # seed G-35 … G-41: the Prometheus text exposition, with the API token; every name and
    # label of the seed's table (the operators' threshold gauge is seen by an admin: below)
    text = week.sh(line)
    families = set(re.findall(r"^# TYPE (\S+) gauge$", text, re.MULTILINE))
    assert families >= {
        "astraeus_goodput_ratio",
        "astraeus_goodput_gpu_hours",
        "astraeus_run_goodput_gpu_hours",
        "astraeus_run_goodput_ratio",
        "astraeus_workers_stalled",
        "astraeus_runs_with_straggler",
    }
    assert "# TYPE astraeus_threshold_alerts_firing" not in text  # operators only
    gauges = samples(text)
    assert (
        gauges[
            (
                "astraeus_goodput_ratio",
                (("name", "default"), ("scope", "workspace"), ("window", "day")),
            )
        ]
        > 0
    )
    assert gauges[("astraeus_run_goodput_ratio", (("namespace", "default"), ("run", "llm")))] > 0
    assert gauges[("astraeus_workers_stalled", (("namespace", "default"),))] == 0
    categories = {
        dict(labels)["category"]
        for name, labels in gauges
        if name == "astraeus_goodput_gpu_hours" and dict(labels)["scope"] == "pool"
    }
    assert categories == CATEGORIES
    admin = week.sh(line, token=week.tenancy.admin_token)
    assert "# TYPE astraeus_threshold_alerts_firing gauge" in admin


@seed("G-34")
def organisation_goodput(week: SeedWeek, line: str) -> None:
    # seed G-34: the organisation's admins see every workspace's and machine's on a cluster;
    # a member is told it needs an organisation admin
    answer = json.loads(week.sh(line, token=week.tenancy.admin_token))
    assert {row["name"] for row in answer["ledgers"]} == {"default"}
    for ledger in [*answer["ledgers"], answer["total"]]:
        assert_ledger(ledger)
    refused = json.loads(week.sh(line))
    assert refused["code"] == "FORBIDDEN", refused
    assert "organisation admin" in refused["message"], refused


GOODPUT_PAGE: dict[str, Callable[[SeedWeek, str], None]] = {
    "astra astraeus goodput --by run --days 7": by_run_days_7,
    "astra astraeus goodput --weeks 8 --by pool": weeks_8_by_pool,
    "astra astraeus goodput --run llm": run_llm,
    'curl -sS "$ASTRALYX_API/goodput?by=machine&start=2026-10-01T00:00:00Z"'
    ' -H "Authorization: Bearer $ASTRALYX_TOKEN"': goodput_by_machine,
    'curl -sS "$ASTRALYX_API/goodput/weekly?weeks=8&by=run"'
    ' -H "Authorization: Bearer $ASTRALYX_TOKEN"': weekly_by_run,
    'curl -sS "$ASTRALYX_API/runs/llm/goodput" -H "Authorization: Bearer $ASTRALYX_TOKEN"': (
        run_goodput
    ),
    # "GET /goodput/metrics serves the same as Prometheus' text exposition … with your API token"
    'curl -sS "$ASTRALYX_API/goodput/metrics" -H "Authorization: Bearer $ASTRALYX_TOKEN"': (
        goodput_metrics
    ),
    # "(/organizations/<org>/clusters/<cluster>/goodput)"
    'curl -sS "$ASTRALYX_API/organizations/default/clusters/local/goodput?by=workspace"'
    ' -H "Authorization: Bearer $ASTRALYX_TOKEN"': organisation_goodput,
}


@pytest.mark.parametrize("line", walk(GOODPUT_PAGE))
def test_goodput_page(line: str, seed_week: SeedWeek) -> None:
    GOODPUT_PAGE[line](seed_week, line)


# == logs-metrics-debugging.txt: llama-sft running on three machines ==========================

# Each rank prints the seed's two lines, then steps with its GPUs busy (97% and 96%, the
# seed's `gpus` block) until the file named by its argument exists.
TRAIN = """\
import json, os, pathlib, sys, time
rank = os.environ["RANK"]
progress = pathlib.Path(os.environ["ASTRAEUS_PROGRESS_FILE"])
print(f"[rank{rank}]: step 1200 loss 1.873 lr 2.0e-05", flush=True)
print(f"[rank{rank}]: step 1210 loss 1.869 lr 2.0e-05", flush=True)
step = 1210
while not pathlib.Path(sys.argv[1]).exists():
    step += 1
    progress.write_text(json.dumps({"step": step, "gpu_utilization": [0.97, 0.96]}))
    time.sleep(0.5)
"""


class Llama:
    def __init__(self, server: Server, token: str, go: Path) -> None:
        self.server, self.token, self.go = server, token, go

    def sh(self, line: str, timeout: float = 60) -> str:
        return sh(self.server, self.token, line, timeout)

    def astra(self, *args: str) -> str:
        return self.sh(" ".join(["astra", "astraeus", *args]))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Llama]:
    """A live server, gpu-07, gpu-08 and gpu-09 of two GPUs each, and llama-sft, two workers
    of two GPUs, running on gpu-07 and gpu-08 (each machine joins before the next: they are
    placed in the seed's order)."""
    root = searchable(tmp_path_factory.mktemp("walk-llama"))  # the workers look for `go`
    with running(root / "data", local_agent=False) as (server, token):
        walk = Llama(server, token, root / "go")
        agents = [
            AgentProcess(server, name, root / name, gpus=2, model=MODEL)
            for name in ("gpu-07", "gpu-08", "gpu-09")
        ]
        try:
            for agent in agents:
                agent.start()
                name = agent.data_dir.name
                joined = until(lambda: walk.astra("gpus"), lambda out, n=name: n in out, 30)
                assert name in joined, agent.log.read_text()[-2000:]
            spec = {
                "name": "llama-sft",
                "workers": 2,
                "gpus": 2,
                "restart_policy": "never",
                "command": ["python3", "-c", TRAIN, str(walk.go)],
            }
            (root / "llama-sft.json").write_text(json.dumps(spec))
            walk.astra("submit", str(root / "llama-sft.json"))
            seen = until(lambda: walk.astra("status", "llama-sft"), lambda out: "Running —" in out)
            assert "Running — 2 of 2 workers running" in seen, seen
            yield walk
        finally:
            walk.go.touch()
            for agent in agents:
                agent.kill()


@seed("L-29")
def status(walk: Llama, line: str) -> None:
    # seed L-29: the run's state and sentence, a line per worker (name, state, machine, reason)
    assert walk.sh(line).splitlines() == [
        "llama-sft: Running — 2 of 2 workers running",
        "  llama-sft-0  Running  gpu-07  Container running",
        "  llama-sft-1  Running  gpu-08  Container running",
    ]


@seed("L-30")
def workers(walk: Llama, line: str) -> None:
    # seed L-30: the columns WORKER RANK STATE MACHINE REASON, laid out as the seed's
    assert walk.sh(line).splitlines() == [
        "WORKER                        RANK   STATE       MACHINE               REASON",
        "llama-sft-0                   0      Running     gpu-07                Container running",
        "llama-sft-1                   1      Running     gpu-08                Container running",
    ]


@seed("L-39")
def gpus(walk: Llama, line: str) -> None:
    # seed L-39: every GPU the workspace can see, the seed's three lines among them in order
    expected = [
        f"gpu-07/0  {MODEL}  97%  ok  held by llama-sft",
        f"gpu-07/1  {MODEL}  96%  ok  held by llama-sft",
        f"gpu-08/0  {MODEL}  97%  ok  held by llama-sft",
        f"gpu-08/1  {MODEL}  96%  ok  held by llama-sft",
        f"gpu-09/0  {MODEL}  0%  ok  free",
        f"gpu-09/1  {MODEL}  0%  ok  free",
    ]
    printed = until(lambda: walk.sh(line), lambda out: out.splitlines() == expected)
    assert printed.splitlines() == expected
    seed = [
        "gpu-07/0  NVIDIA H100 80GB HBM3  97%  ok  held by llama-sft",
        "gpu-07/1  NVIDIA H100 80GB HBM3  96%  ok  held by llama-sft",
        "gpu-09/0  NVIDIA H100 80GB HBM3  0%  ok  free",
    ]
    assert [row for row in expected if row in seed] == seed


@seed("L-40")
def metrics_range(walk: Llama, line: str) -> None:
    # seed L-40, L-41: llama-sft-0's GPU utilisation over the last hour, by GPU, the max of
    # each step: the first series is GPU 0's, [ms, value] points at its 97%
    printed = until(lambda: walk.sh(line), lambda out: json.loads(out) not in (None, {}))
    first = json.loads(printed)
    assert set(first) == {"labels", "points"}
    assert first["labels"] == {"gpu": "0"}
    points = first["points"]
    assert points and all(isinstance(ms, int) and len(p) == 2 for p in points for ms in p[:1])
    now_ms = time.time() * 1000
    assert all(now_ms - 3_700_000 <= ms <= now_ms + 60_000 for ms, _ in points)
    assert points[-1][1] == pytest.approx(0.97)


@seed("L-45")
def history(walk: Llama, line: str) -> None:
    # seed L-45: the run's history as the seed's three rows, each [time, state, reason]
    rows = [json.loads(row) for row in walk.sh(line).splitlines()]
    assert [row[1:] for row in rows] == [
        ["Pending", "Run created"],
        ["Starting", "Starting together: 0 of 2 ready"],
        ["Running", "2 of 2 workers running"],
    ]
    assert all(re.fullmatch(ISO_Z, row[0]) for row in rows), rows
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)


@seed("L-32")
def job(walk: Llama, line: str) -> None:
    # seed L-32: the run with status, history, task_counts and task_names
    answer = json.loads(walk.sh(line))
    assert {"status", "history", "task_counts", "task_names"} <= set(answer)
    assert answer["status"] == "Running"
    assert answer["task_names"] == ["llama-sft-0", "llama-sft-1"]
    assert answer["task_counts"]["Running"] == 2


@seed("L-33")
def tasks_of_job(walk: Llama, line: str) -> None:
    # seed L-33: its workers with status, exit_code, restarts, restart_at, last_failure,
    # placement and metrics
    answer = json.loads(walk.sh(line))
    tasks = answer["tasks"] if isinstance(answer, dict) else answer
    assert [t["name"] for t in tasks] == ["llama-sft-0", "llama-sft-1"]
    for task in tasks:
        assert {
            "status",
            "exit_code",
            "restarts",
            "restart_at",
            "last_failure",
            "placement",
            "metrics",
        } <= set(task), task
        assert (task["status"], task["exit_code"], task["last_failure"]) == ("Running", None, None)
    assert [t["placement"]["machine"] for t in tasks] == ["gpu-07", "gpu-08"]


@seed("L-31")
def runs(walk: Llama, line: str) -> None:
    # seed L-31: the workspace's runs that have not ended
    header, *rows = walk.sh(line).splitlines()
    assert header.split()[:2] == ["RUN", "STATE"], header
    assert [row.split()[:2] for row in rows] == [["llama-sft", "Running"]]


@seed("L-46")
def events(walk: Llama, line: str) -> None:
    # seed L-46: the workspace's events of the run, across clusters, at the console's address
    answer = json.loads(walk.sh(line))
    events = answer["events"]
    assert 1 < len(events) <= 50 and {e["run"] for e in events} == {"llama-sft"}
    assert ["run.state", "Running"] in [[e["kind"], e.get("state")] for e in events]


@seed("L-11")
def logs_follow(walk: Llama, line: str) -> None:
    # seed L-10, L-11: follows llama-sft-1 until it ends, then says how it ended; 0 as it
    # completed. The run is let finish a moment after the follow began.
    follow = subprocess.Popen(
        ["bash", "-c", line],
        env=user_env(walk.server, walk.token),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)
    walk.go.touch()
    out, err = follow.communicate(timeout=90)
    assert (follow.returncode, err) == (0, "")
    assert out.splitlines() == [
        "[rank1]: step 1200 loss 1.873 lr 2.0e-05",
        "[rank1]: step 1210 loss 1.869 lr 2.0e-05",
        "",
        "llama-sft-1: Completed — Exited with code 0",
    ]


@seed("L-10")
def logs_of_run(walk: Llama, line: str) -> None:
    # seed L-10: a run means its first worker
    assert walk.sh(line).splitlines() == [
        "[rank0]: step 1200 loss 1.873 lr 2.0e-05",
        "[rank0]: step 1210 loss 1.869 lr 2.0e-05",
    ]


@seed("L-10")
def logs_of_worker(walk: Llama, line: str) -> None:
    # seed L-10 and the debugging steps' "astra astraeus logs <worker>": <run>-<rank>
    assert walk.sh(line).splitlines() == [
        "[rank1]: step 1200 loss 1.873 lr 2.0e-05",
        "[rank1]: step 1210 loss 1.869 lr 2.0e-05",
    ]


@seed("L-31")
def runs_all(walk: Llama, line: str) -> None:
    # seed L-31: -a adds the ended ones
    assert walk.sh("astra astraeus runs").splitlines()[1:] == []
    header, *rows = walk.sh(line).splitlines()
    assert header.split()[:2] == ["RUN", "STATE"], header
    assert [row.split()[:2] for row in rows] == [["llama-sft", "Completed"]]


LLAMA_PAGE: dict[str, Callable[[Llama, str], None]] = {
    "astra astraeus status llama-sft": status,
    "astra astraeus workers llama-sft": workers,
    # "astra astraeus runs lists the workspace's runs that have not ended"
    "astra astraeus runs": runs,
    # "GET $API/jobs/<run> returns the run with status, history, task_counts and task_names"
    'curl -sS "$API/jobs/llama-sft" -H "Authorization: Bearer $ASTRA_TOKEN"': job,
    # "GET $API/tasks?job=<run> returns its workers with …"
    'curl -sS "$API/tasks?job=llama-sft" -H "Authorization: Bearer $ASTRA_TOKEN"': tasks_of_job,
    "astra astraeus gpus": gpus,
    'curl -sS -G "$API/metrics/range" -H "Authorization: Bearer $ASTRA_TOKEN" \\\n'
    "    --data-urlencode metric=task_gpu_utilization_ratio \\\n"
    "    --data-urlencode match=task:llama-sft-0 \\\n"
    "    --data-urlencode by=gpu --data-urlencode agg=max \\\n"
    "    --data-urlencode start=$(( $(date +%s) - 3600 )) | jq '.series[0]'": metrics_range,
    'curl -sS "$API/jobs/llama-sft" -H "Authorization: Bearer $ASTRA_TOKEN"'
    " | jq -c '.history[] | [.transition_at, .state, .reason]'": history,
    # "GET https://console.astralyx.cloud/api/v1/orgs/<org>/workspaces/<workspace>/events
    # ?name=<run>&limit=50"
    'curl -sS "$CONSOLE/api/v1/orgs/default/workspaces/default/events?name=llama-sft&limit=50"'
    ' -H "Authorization: Bearer $ASTRA_TOKEN"': events,
    # the run completes here: what follows sees it ended
    "astra astraeus logs llama-sft-1 -f": logs_follow,
    "astra astraeus logs llama-sft": logs_of_run,
    "astra astraeus logs llama-sft-1": logs_of_worker,
    "astra astraeus runs -a": runs_all,
}


@pytest.mark.parametrize("line", walk(LLAMA_PAGE))
def test_logs_page_llama_sft(line: str, llama: Llama) -> None:
    LLAMA_PAGE[line](llama, line)


# == logs-metrics-debugging.txt: llama-sft-1 killed for memory ================================

# Rank 1 logs its steps to 4410, then asks for more memory than its limit: the kernel kills it.
OOM = """\
import os, time
rank = int(os.environ["RANK"])
for step in range(4400, 4420, 10):
    print(f"[rank{rank}]: step {step} loss 1.402", flush=True)
    time.sleep(0.2)
if rank == 1:
    hog = bytearray(400 * 2**20)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Llama]:
    """`astraeus up` and its own machine, and llama-sft, failed: its rank 1 killed for memory."""
    probe = cgroups.create("probe", "astraeus-walk")
    if probe is None:
        pytest.skip("this machine gives the agent no control groups: no memory limit, no OOM")
    probe.remove()
    root = tmp_path_factory.mktemp("walk-oom")
    with running(root / "data") as (server, token):
        walk = Llama(server, token, root / "go")
        spec = {
            "name": "llama-sft",
            "workers": 2,
            "gpus": 1,
            "memory_bytes": 128 * 2**20,
            "restart_policy": "never",
            "command": ["python3", "-c", OOM],
        }
        (root / "llama-sft.json").write_text(json.dumps(spec))
        walk.astra("submit", str(root / "llama-sft.json"))
        ended = until(
            lambda: walk.astra("status", "llama-sft"),
            lambda out: out.startswith("llama-sft: Failed"),
            90,
        )
        # seed L-48: the run's reason names the worker, the machine and why
        assert ended.splitlines()[0] == (
            "llama-sft: Failed — Worker llama-sft-1 failed on local: OOMKilled: the container "
            "exceeded its memory limit; the gang does not run without it"
        ), ended
        yield walk


@seed("L-12")
def failure_logs(walk: Llama, line: str) -> None:
    # seed L-12, L-14: the last lines of the worker's log, kept on its machine
    # jq -r prints the text, which ends with its last line's newline, and a newline
    assert walk.sh(line) == "[rank1]: step 4400 loss 1.402\n[rank1]: step 4410 loss 1.402\n\n"
    # the answer jq read: {"task_name", "logs"}, "archived" as its process is gone
    answer = walk.sh(line.removesuffix(" | jq -r .logs"))
    assert json.loads(answer) == {
        "task_name": "llama-sft-1",
        "logs": "[rank1]: step 4400 loss 1.402\n[rank1]: step 4410 loss 1.402\n",
        "archived": True,
    }


@seed("L-22")
def last_failure(walk: Llama, line: str) -> None:
    # seed L-21, L-22, L-52: the seed's block, its fields in its order, as jq prints them
    printed = walk.sh(line)
    failure = json.loads(printed)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00", failure["failed_at"])
    assert failure["log_tail"].endswith("\n[rank1]: step 4410 loss 1.402\n")
    assert printed.splitlines() == [
        "{",
        '  "reason": "OOMKilled: the container exceeded its memory limit",',
        f'  "failed_at": "{failure["failed_at"]}",',
        '  "exit_code": 137,',
        f'  "log_tail": {json.dumps(failure["log_tail"])}',
        "}",
    ]


@seed("L-52")
def memory_near_the_limit(walk: Llama, line: str) -> None:
    # seed L-52 (Debug a failed run, steps 2 and 5): OOMKilled, look at "the Memory chart near
    # the limit". The seed's metrics line for llama-sft-1's memory: a worker killed within a
    # second still has its samples (taken as it started and as it ended), the last at its limit.
    limit = 128 * 2**20
    first = json.loads(walk.sh(line))
    assert first["labels"] == {}
    values = [value for _, value in first["points"]]
    assert values and max(values) > 0.9 * limit and max(values) <= limit, values
    limits = json.loads(walk.sh(line.replace("task_memory_used_bytes", "task_memory_limit_bytes")))
    assert {value for _, value in limits["points"]} == {limit}


@seed("L-11")
def follow_a_failure(walk: Llama, line: str) -> None:
    # seed L-11: -f "exits non-zero if it did not complete", after saying how it ended
    done = subprocess.run(
        ["bash", "-c", line],
        env=user_env(walk.server, walk.token),
        capture_output=True,
        text=True,
        timeout=60,
    )
    # the log on standard output, how it ended on standard error (a terminal shows both as
    # the seed's block; a pipe keeps the log alone)
    assert done.returncode == 1, done
    assert done.stdout.splitlines() == [
        "[rank1]: step 4400 loss 1.402",
        "[rank1]: step 4410 loss 1.402",
        "",
    ]
    ended = "llama-sft-1: Failed — OOMKilled: the container exceeded its memory limit"
    assert done.stderr == ended + "\n"


@seed("L-58")
def log_of_the_failed_worker(walk: Llama, line: str) -> None:
    # Debug a failed run, step 3: "Read the log of that worker (astra astraeus logs <worker>)"
    assert walk.sh(line).splitlines() == [
        "[rank1]: step 4400 loss 1.402",
        "[rank1]: step 4410 loss 1.402",
    ]


@seed("L-48")
def status_of_the_failure(walk: Llama, line: str) -> None:
    # seed L-29, L-48 (Debug a failed run, step 1): the run's reason names the worker, the
    # machine and why; each worker's line says where it ran, also once it ended
    assert walk.sh(line).splitlines() == [
        "llama-sft: Failed — Worker llama-sft-1 failed on local: OOMKilled: the container "
        "exceeded its memory limit; the gang does not run without it",
        "  llama-sft-0  Stopped  local  Stopped: its gang failed",
        "  llama-sft-1  Failed  local  OOMKilled: the container exceeded its memory limit",
    ]


@seed("L-30")
def workers_of_the_failure(walk: Llama, line: str) -> None:
    # seed L-30: the seed's columns; an ended worker's MACHINE is where it ran
    assert walk.sh(line).splitlines() == [
        "WORKER                        RANK   STATE       MACHINE               REASON",
        "llama-sft-0                   0      Stopped     local                 "
        "Stopped: its gang failed",
        "llama-sft-1                   1      Failed      local                 "
        "OOMKilled: the container exceeded its memory limit",
    ]


KILLED_PAGE: dict[str, Callable[[Llama, str], None]] = {
    "astra astraeus status llama-sft": status_of_the_failure,
    "astra astraeus workers llama-sft": workers_of_the_failure,
    'curl -sS "$API/tasks/llama-sft-1/logs?tail=200" -H "Authorization: Bearer $ASTRA_TOKEN"'
    " | jq -r .logs": failure_logs,
    'curl -sS "$API/tasks/llama-sft-1" -H "Authorization: Bearer $ASTRA_TOKEN"'
    " | jq .last_failure": last_failure,
    'curl -sS -G "$API/metrics/range" -H "Authorization: Bearer $ASTRA_TOKEN" \\\n'
    "    --data-urlencode metric=task_memory_used_bytes \\\n"
    "    --data-urlencode match=task:llama-sft-1 \\\n"
    "    --data-urlencode agg=max \\\n"
    "    --data-urlencode start=$(( $(date +%s) - 3600 )) | jq '.series[0]'": memory_near_the_limit,
    "astra astraeus logs llama-sft-1": log_of_the_failed_worker,
    "astra astraeus logs llama-sft-1 -f": follow_a_failure,
}


@pytest.mark.parametrize("line", walk(KILLED_PAGE))
def test_logs_page_a_failure(line: str, killed: Llama) -> None:
    KILLED_PAGE[line](killed, line)
