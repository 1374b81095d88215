"""``astra astraeus runs | status | workers | goodput | gpus | logs | submit | stop | delete``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from websockets.exceptions import InvalidHandshake
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from backend.cli.astra import goodput as goodput_table
from backend.cli.astra.client import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Api,
    CliError,
    resolve_target,
)

WORKER_FIELDS = "name rank state reason machine gpus exitCode restarts"
RUN_QUERY = f"""query($name: String!) {{
  run(name: $name) {{ name state reason workers {{ {WORKER_FIELDS} }} }}
}}"""
RUNS_QUERY = """query($all: Boolean!) {
  runs(all: $all) { name state reason createdAt createdBy workers { state gpus } }
}"""
CREATE_RUN = """mutation($spec: JSON!) {
  createRun(spec: $spec) { run { name state reason } errors { code field message } }
}"""


def _load_run(api: Api, name: str) -> dict[str, Any]:
    run = api.graphql(RUN_QUERY, name=name)["run"]
    if run is None:
        raise CliError(f"astra: no run named '{name}' in this workspace", EXIT_NOT_FOUND)
    return dict(run)


def running_of_total(workers: list[dict[str, Any]]) -> str:
    running = sum(1 for w in workers if w["state"] == "Running")
    return f"{running} of {len(workers)} workers running"


def format_status(run: dict[str, Any]) -> str:
    """``llama-sft: Running — 2 of 2 workers running``, then a line per worker."""
    lines = [f"{run['name']}: {run['state']} — {run['reason']}"]
    for w in run["workers"]:
        lines.append(f"  {w['name']}  {w['state']}  {w['machine'] or '-'}  {w['reason']}")
    return "\n".join(lines)


def format_workers(run: dict[str, Any]) -> str:
    """The seed's WORKER RANK STATE MACHINE REASON table."""
    rows = [f"{'WORKER':<30}{'RANK':<7}{'STATE':<12}{'MACHINE':<22}REASON"]
    for w in run["workers"]:
        rows.append(
            f"{w['name']:<30}{w['rank']!s:<7}{w['state']:<12}{w['machine'] or '-':<22}{w['reason']}"
        )
    return "\n".join(rows)


def format_runs(runs: list[dict[str, Any]]) -> str:
    rows = [f"{'RUN':<32}{'STATE':<12}{'WORKERS':<9}{'GPUS':<6}{'CREATED':<18}REASON"]
    for run in runs:
        workers = run["workers"]
        gpus = sum(w["gpus"] for w in workers)
        created = datetime.fromisoformat(run["createdAt"]).strftime("%Y-%m-%d %H:%M")
        rows.append(
            f"{run['name']:<32}{run['state']:<12}{len(workers)!s:<9}{gpus!s:<6}"
            f"{created:<18}{run['reason']}"
        )
    return "\n".join(rows)


def cmd_status(api: Api, args: argparse.Namespace) -> str:
    run = _load_run(api, args.run)
    return json.dumps(run, indent=2) if args.json else format_status(run)


def cmd_workers(api: Api, args: argparse.Namespace) -> str:
    run = _load_run(api, args.run)
    return json.dumps(run["workers"], indent=2) if args.json else format_workers(run)


def cmd_runs(api: Api, args: argparse.Namespace) -> str:
    runs = api.graphql(RUNS_QUERY, all=args.all)["runs"]
    return json.dumps(runs, indent=2) if args.json else format_runs(runs)


def cmd_submit(api: Api, args: argparse.Namespace) -> str:
    path = Path(args.spec)
    try:
        spec = json.loads(sys.stdin.read() if args.spec == "-" else path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        message = f"astra: cannot read the specification {args.spec}: {exc}"
        raise CliError(message, EXIT_USAGE) from None
    if args.name:
        spec["name"] = args.name
    payload = api.graphql(CREATE_RUN, spec=spec)["createRun"]
    if payload["errors"]:
        lines = [f"  {e['field'] or 'spec'}: {e['message']}" for e in payload["errors"]]
        raise CliError("astra: the run was refused:\n" + "\n".join(lines), EXIT_REFUSED)
    run = payload["run"]
    return f"{run['name']}: {run['state']} — {run['reason']}"


CHANGE_RUN = """mutation($name: String!) {{
  {field}(name: $name) {{ run {{ name state reason }} errors {{ code field message }} }}
}}"""


def _change(api: Api, field: str, name: str) -> str:
    payload = api.graphql(CHANGE_RUN.format(field=field), name=name)[field]
    if payload["errors"]:
        error = payload["errors"][0]
        code = EXIT_NOT_FOUND if error["code"] == "JOB_NOT_FOUND" else EXIT_REFUSED
        raise CliError(f"astra: {error['message']}", code)
    run = payload["run"]
    return f"{run['name']}: {run['state']} — {run['reason']}"


def cmd_stop(api: Api, args: argparse.Namespace) -> str:
    return _change(api, "stopRun", args.run)


def cmd_delete(api: Api, args: argparse.Namespace) -> str:
    return _change(api, "deleteRun", args.run)


GOODPUT = f"""query($by: GoodputScope!, $start: DateTime) {{
  goodput(by: $by, start: $start) {{
    rows(first: 10000) {{ name ledger {{ {goodput_table.LEDGER_FIELDS} }} }}
    total {{ {goodput_table.LEDGER_FIELDS} }}
  }}
}}"""
GOODPUT_WEEKLY = f"""query($by: GoodputScope!, $weeks: Int!) {{
  goodputWeekly(by: $by, weeks: $weeks) {{
    week report {{
      rows(first: 10000) {{ name ledger {{ {goodput_table.LEDGER_FIELDS} }} }}
      total {{ {goodput_table.LEDGER_FIELDS} }}
    }}
  }}
}}"""
RUN_GOODPUT = f"""query($name: String!) {{
  run(name: $name) {{ name goodput {{ {goodput_table.LEDGER_FIELDS} }} }}
}}"""


def _rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(r["name"], r["ledger"]) for r in report["rows"]]


def cmd_goodput(api: Api, args: argparse.Namespace) -> str:
    """The seed's GPU-hours table: by workspace, run, machine or pool over the last days; by
    ISO week; or one run's own since it was submitted."""
    if args.run:
        run = api.graphql(RUN_GOODPUT, name=args.run)["run"]
        if run is None:
            raise CliError(f"astra: no run named '{args.run}' in this workspace", EXIT_NOT_FOUND)
        if args.json:
            return json.dumps(run, indent=2)
        return goodput_table.table("run", [(run["name"], run["goodput"])], None)
    if args.weeks is not None:
        weeks = api.graphql(GOODPUT_WEEKLY, by=args.by.upper(), weeks=args.weeks)
        found = weeks["goodputWeekly"]
        if args.json:
            return json.dumps(found, indent=2)
        return "\n\n".join(
            f"Week {w['week']}\n"
            + goodput_table.table(args.by, _rows(w["report"]), w["report"]["total"])
            for w in found
        )
    start = (datetime.now(UTC) - timedelta(days=args.days)).isoformat()
    report = api.graphql(GOODPUT, by=args.by.upper(), start=start)["goodput"]
    if args.json:
        return json.dumps(report, indent=2)
    return goodput_table.table(args.by, _rows(report), report["total"])


GPUS = "{ gpus { line } }"
FOLLOW = """subscription($w: String!, $tail: Int!) {
  followLog(worker: $w, tail: $tail) { text missed ended } }"""


def cmd_gpus(api: Api, args: argparse.Namespace) -> str:
    """Every GPU the workspace may use: `gpu-07/0  NVIDIA H100 80GB HBM3  97%  ok  held by …`."""
    gpus = api.graphql(GPUS)["gpus"]
    return json.dumps(gpus, indent=2) if args.json else "\n".join(g["line"] for g in gpus)


def _worker(api: Api, name: str) -> dict[str, Any]:
    """The worker named, or a run's first worker."""
    try:
        return api.get(f"/tasks/{name}")
    except CliError as error:
        if error.exit_code != EXIT_NOT_FOUND:
            raise
        tasks = api.get("/tasks", job=name)["tasks"]
        if not tasks:
            raise
        return dict(tasks[0])


def cmd_logs(api: Api, args: argparse.Namespace) -> str:
    """A worker's last lines (a run: its first worker); with -f, its new lines as they are
    written until it ends, then how it ended (the exit status says whether it completed)."""
    if not args.follow:
        params = {} if args.tail is None else {"tail": args.tail}
        found = api.get(f"/tasks/{args.worker}/logs", **params)
        return str(found["logs"]).rstrip("\n")
    worker = _worker(api, args.worker)
    for chunk in follow_log(api, worker["name"], args.tail or 0):
        if chunk["missed"]:
            print(f"[… {chunk['missed']} lines missed]", flush=True)
        if chunk["text"]:
            sys.stdout.write(chunk["text"])
            sys.stdout.flush()
    end = _ended(api, worker["name"])
    line = f"{end['name']}: {end['status']} — {end['reason']}"
    if end["status"] != "Completed":
        raise CliError(line, EXIT_FAILED)
    return line


ENDING_WAIT_S = 30.0


def _ended(api: Api, name: str) -> dict[str, Any]:
    """The worker once its machine has reported how it ended (the log ends first), or as it
    is after a while."""
    deadline = time.monotonic() + ENDING_WAIT_S
    while True:
        worker = _worker(api, name)
        if worker["status"] not in ("Running", "Stopping") or time.monotonic() > deadline:
            return worker
        time.sleep(0.2)


def follow_log(api: Api, worker: str, tail: int) -> Iterator[dict[str, Any]]:
    """The followLog subscription over a WebSocket (graphql-transport-ws), chunk by chunk."""
    try:
        with connect(api.websocket_url, subprotocols=[Subprotocol("graphql-transport-ws")]) as ws:
            token = api.target.token
            ws.send(
                json.dumps(
                    {"type": "connection_init", "payload": {"Authorization": f"Bearer {token}"}}
                )
            )
            json.loads(ws.recv())
            query = {"query": FOLLOW, "variables": {"w": worker, "tail": tail}}
            ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": query}))
            for raw in ws:
                message = json.loads(raw)
                if message["type"] == "next":
                    payload = message["payload"]
                    if payload.get("errors"):
                        raise CliError(f"astra: {payload['errors'][0]['message']}", EXIT_REFUSED)
                    yield payload["data"]["followLog"]
                elif message["type"] == "error":
                    raise CliError(f"astra: {message['payload'][0]['message']}", EXIT_REFUSED)
                elif message["type"] == "complete":
                    return
    except (OSError, InvalidHandshake) as exc:
        raise CliError(
            f"astra: cannot follow at {api.websocket_url}: {exc}", EXIT_UNREACHABLE
        ) from None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("must be a whole number of 1 or more")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="astra", description="Astraeus from the terminal.")
    top = parser.add_subparsers(dest="product", required=True)
    astraeus = top.add_parser("astraeus", help="GPU runs, their workers and their goodput")
    sub = astraeus.add_subparsers(dest="command", required=True)

    def command(name: str, func: Callable[[Api, argparse.Namespace], str], help: str) -> Any:
        p = sub.add_parser(name, help=help)
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.set_defaults(func=func)
        return p

    command("status", cmd_status, "a run's state and reason, a line per worker").add_argument("run")
    command("workers", cmd_workers, "a run's workers: rank, state, machine, reason").add_argument(
        "run"
    )
    command("runs", cmd_runs, "the workspace's runs that have not ended").add_argument(
        "-a", "--all", action="store_true", help="add ended and deleted runs"
    )
    goodput = command("goodput", cmd_goodput, "where the GPU time went, as GPU-hours")
    goodput.add_argument(
        "--by", choices=["workspace", "run", "machine", "pool"], default="workspace"
    )
    goodput.add_argument("--days", type=_positive, default=7, help="the last days (7)")
    goodput.add_argument("--weeks", type=_positive, help="by ISO week, the last N weeks")
    goodput.add_argument("--run", help="one run's own ledger since it was submitted")
    command("gpus", cmd_gpus, "every GPU the workspace may use, its use and holder")
    logs = command("logs", cmd_logs, "a worker's log (a run: its first worker)")
    logs.add_argument("worker")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until it ends")
    logs.add_argument(
        "--tail", type=_positive, help="the last N lines (1 000; with -f: none, new lines only)"
    )
    command("stop", cmd_stop, "wind a run down; it ends Stopped").add_argument("run")
    command("delete", cmd_delete, "delete a run, its workers and their logs").add_argument("run")
    submit = command("submit", cmd_submit, "submit a run from its JSON specification")
    submit.add_argument("spec", help="a JSON file, or - for standard input")
    submit.add_argument("--name", help="submit under this name instead of the file's")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        api = Api(resolve_target())
        print(args.func(api, args))
    except CliError as error:
        print(str(error), file=sys.stderr)
        return error.exit_code
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
