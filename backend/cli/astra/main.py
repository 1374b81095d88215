"""``astra astraeus runs | status | workers | goodput | submit | stop | delete``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from backend.cli.astra import goodput as goodput_table
from backend.cli.astra.client import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
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
