"""``astra astraeus runs | status | workers | goodput | gpus | logs | events | submit | stop |
delete``: the API's answers as the seeds print them, or as JSON with ``--json``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from backend.cli.astra import goodput as goodput_table
from backend.cli.astra import machines as machines_table
from backend.cli.astra import quota as quota_cli
from backend.cli.astra.client import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    Api,
    CliError,
    resolve_target,
)
from backend.cli.astra.style import PLAIN, Paint, wanted
from backend.cli.astra.terminal import as_json

EXIT_INTERRUPTED = 130  # Ctrl-C while following, as shells report it
EXIT_BROKEN_PIPE = 141  # the reader went away (`| head`): 128 + SIGPIPE, as shells report it

WORKER_FIELDS = "name rank state reason machine lastPlacement { machine } gpus exitCode restarts"
# A worker in these has run somewhere (or never will): its machine is where it ran last.
ENDED = ("Completed", "Failed", "Stopped")
# A Slurm run's job (issue 38); null on any other cluster
SLURM_FIELDS = "jobId submittedHere jobName account user partition qos priority cancelledBy"
RUN_QUERY = f"""query($name: String!) {{
  run(name: $name) {{ name state reason workers {{ {WORKER_FIELDS} }} slurm {{ {SLURM_FIELDS} }} }}
}}"""
RUNS_QUERY = """query($all: Boolean!) {
  runs(all: $all) { name state reason createdAt createdBy workers { state gpus } }
}"""
CREATE_RUN = """mutation($spec: JSON!) {
  createRun(spec: $spec) { run { name state reason } errors { code field message } }
}"""


# What `describe` adds to a run's state: its idle policy and its checkpoint advice (issue 41).
DESCRIBE_QUERY = """query($name: String!) {
  run(name: $name) { name state reason idlePolicy { gpuUtilizationBelow window action } }
  checkpointAdvice(run: $name) { checkpoints costSeconds intervalSeconds failures scope
    optimalIntervalSeconds gpuHoursSavedPerWeek sentence } }"""


def _load_run(api: Api, name: str) -> dict[str, Any]:
    run = api.graphql(RUN_QUERY, name=name)["run"]
    if run is None:
        raise CliError(f"astra: no run named '{name}' in this workspace", EXIT_NOT_FOUND)
    return dict(run)


def cell(text: object, width: int) -> str:
    """Left-aligned in ``width``, and at least two spaces before the next column."""
    return f"{text!s:<{width - 2}}  "


def machine_of(worker: dict[str, Any]) -> str:
    """Where the worker is placed; once it ended, where it ran last (a failed worker's machine
    is where to look: seed L-48); '-' while it waits to be placed."""
    last = worker.get("lastPlacement") or {}
    if worker["machine"]:
        return str(worker["machine"])
    if worker["state"] in ENDED and last.get("machine"):
        return str(last["machine"])
    return "-"


def format_status(run: dict[str, Any], paint: Paint = PLAIN) -> str:
    """``llama-sft: Running — 2 of 2 workers running``, then a line per worker (seed L-29), then
    a Slurm run's job (issue 38): a run on another cluster reads as the seed prints it."""
    lines = [f"{run['name']}: {paint.state(run['state'])} — {run['reason']}"]
    for w in run["workers"]:
        state = paint.state(w["state"])
        lines.append(f"  {w['name']}  {state}  {machine_of(w)}  {w['reason']}")
    if run.get("slurm"):
        lines.append(format_slurm(run["slurm"]))
    return "\n".join(lines)


def format_slurm(job: dict[str, Any]) -> str:
    """``Slurm:    job 12 · partition gpu · account nlp · QOS normal · priority 4294901759``,
    then ``· cancelled by root`` when it was (issue 38); what Slurm did not say is left out."""
    parts = [f"job {job['jobId']}"]
    for label, key in (("partition", "partition"), ("account", "account"), ("QOS", "qos")):
        if job[key]:
            parts.append(f"{label} {job[key]}")
    if job["priority"] is not None:
        parts.append(f"priority {job['priority']}")
    if job["cancelledBy"]:
        parts.append(f"cancelled by {job['cancelledBy']}")
    return "Slurm:    " + " · ".join(parts)


def format_workers(run: dict[str, Any], paint: Paint = PLAIN) -> str:
    """The seed's WORKER RANK STATE MACHINE REASON table, to its column widths (seed L-30)."""
    rows = [f"{'WORKER':<30}{'RANK':<7}{'STATE':<12}{'MACHINE':<22}REASON"]
    for w in run["workers"]:
        state = paint.state(cell(w["state"], 12), w["state"])
        machine = cell(machine_of(w), 22)
        rows.append(f"{cell(w['name'], 30)}{cell(w['rank'], 7)}{state}{machine}{w['reason']}")
    return "\n".join(rows)


def when(iso: str, precision: str = "%Y-%m-%d %H:%M") -> str:
    """A time of the API as UTC, to the minute (or as asked)."""
    return datetime.fromisoformat(iso).astimezone(UTC).strftime(precision)


def format_runs(runs: list[dict[str, Any]], paint: Paint = PLAIN) -> str:
    rows = [f"{'RUN':<32}{'STATE':<12}{'WORKERS':<9}{'GPUS':<6}{'CREATED':<18}REASON"]
    for run in runs:
        workers = run["workers"]
        gpus = sum(w["gpus"] for w in workers)
        state = paint.state(cell(run["state"], 12), run["state"])
        created = cell(when(run["createdAt"]), 18)
        rows.append(
            f"{cell(run['name'], 32)}{state}{cell(len(workers), 9)}{cell(gpus, 6)}{created}"
            f"{run['reason']}"
        )
    return "\n".join(rows)


def cmd_status(api: Api, args: argparse.Namespace) -> str:
    run = _load_run(api, args.run)
    return as_json(run) if args.json else format_status(run, args.paint)


def cmd_describe(api: Api, args: argparse.Namespace) -> str:
    _load_run(api, args.run)  # a run of another workspace, or none: not found, exit 4
    found = api.graphql(DESCRIBE_QUERY, name=args.run)
    return as_json(found) if args.json else format_describe(found, args.paint)


def format_describe(found: dict[str, Any], paint: Any) -> str:
    """``<run>: <State> — <reason>``, its idle policy, and how often it should checkpoint."""
    run, advice = found["run"], found["checkpointAdvice"]
    policy = run["idlePolicy"]
    idle = "none"
    if policy is not None:
        what = "stop it" if policy["action"] == "stop" else "tell the workspace"
        below = f"{policy['gpuUtilizationBelow']:g}"
        idle = f"{what} when every GPU stays under {below}% for {policy['window']}"
    return "\n".join(
        [
            f"{run['name']}: {paint.state(run['state'])} — {run['reason']}",
            f"Idle policy: {idle}",
            f"How often to checkpoint: {advice['sentence']}",
        ]
    )


def cmd_workers(api: Api, args: argparse.Namespace) -> str:
    run = _load_run(api, args.run)
    return as_json(run["workers"]) if args.json else format_workers(run, args.paint)


def cmd_runs(api: Api, args: argparse.Namespace) -> str:
    runs = api.graphql(RUNS_QUERY, all=args.all)["runs"]
    return as_json(runs) if args.json else format_runs(runs, args.paint)


def _changed(run: dict[str, Any], args: argparse.Namespace) -> str:
    """What a submit, stop or delete left: ``<run>: <State> — <reason>``, or the run as JSON."""
    if args.json:
        return as_json(run)
    return f"{run['name']}: {args.paint.state(run['state'])} — {run['reason']}"


def cmd_submit(api: Api, args: argparse.Namespace) -> str:
    path = Path(args.spec)
    try:
        spec = json.loads(sys.stdin.read() if args.spec == "-" else path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        message = f"astra: cannot read the specification {args.spec}: {exc}"
        raise CliError(message, EXIT_USAGE) from None
    if args.name:
        spec["name"] = args.name
    if args.workdir is not None:  # shipped first: the spec names it (issue 41)
        from backend.cli.astra import workdir  # (pathspec: only the commands that pack load it)

        print(workdir.attach(api, spec, Path(args.workdir)), file=sys.stderr)
    payload = api.graphql(CREATE_RUN, spec=spec)["createRun"]
    if payload["errors"]:
        lines = [f"  {e['field'] or 'spec'}: {e['message']}" for e in payload["errors"]]
        raise CliError("astra: the run was refused:\n" + "\n".join(lines), EXIT_REFUSED)
    return _changed(payload["run"], args)


CHANGE_RUN = """mutation($name: String!) {{
  {field}(name: $name) {{ run {{ name state reason }} errors {{ code field message }} }}
}}"""


def _change(api: Api, field: str, args: argparse.Namespace) -> str:
    payload = api.graphql(CHANGE_RUN.format(field=field), name=args.run)[field]
    if payload["errors"]:
        error = payload["errors"][0]
        code = EXIT_NOT_FOUND if error["code"] == "JOB_NOT_FOUND" else EXIT_REFUSED
        raise CliError(f"astra: {error['message']}", code)
    return _changed(payload["run"], args)


def cmd_stop(api: Api, args: argparse.Namespace) -> str:
    return _change(api, "stopRun", args)


def cmd_delete(api: Api, args: argparse.Namespace) -> str:
    return _change(api, "deleteRun", args)


GOODPUT = f"""query($by: GoodputScope!, $start: DateTime) {{
  goodput(by: $by, start: $start) {{
    rows(first: 10000) {{ name ledger {{ {goodput_table.LEDGER_FIELDS} }} }}
    total {{ {goodput_table.LEDGER_FIELDS} }}
    rework {{ gpuHours unknownRuns }}
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
  run(name: $name) {{
    name goodput {{ {goodput_table.LEDGER_FIELDS} }}
    rework {{ gpuHours redos {{ checkpointStep stepsRedone }} }}
  }}
}}"""


GOODPUT_COST = """query($by: CostScope!, $start: DateTime) { goodputCost(by: $by, start: $start) {
  currency rows { name held lost byCategory { category amount } }
  total { name held lost byCategory { category amount } } } }"""


def _rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(r["name"], r["ledger"]) for r in report["rows"]]


def cmd_goodput(api: Api, args: argparse.Namespace) -> str:
    """The seed's GPU-hours table: by workspace, run, machine or pool over the last days; by
    ISO week; or one run's own since it was submitted. With --cost, as money."""
    if args.cost and (args.run or args.weeks is not None):
        raise CliError("astra: --cost is over the last days, by workspace or run", EXIT_USAGE)
    if args.run:
        run = api.graphql(RUN_GOODPUT, name=args.run)["run"]
        if run is None:
            raise CliError(f"astra: no run named '{args.run}' in this workspace", EXIT_NOT_FOUND)
        if args.json:
            return as_json(run)
        decimals = goodput_table.decimals_for([run["goodput"]])
        found = goodput_table.table("run", [(run["name"], run["goodput"])], None, decimals)
        return found + goodput_table.run_rework_line(run["goodput"], run["rework"], decimals)
    if args.weeks is not None:
        weeks = api.graphql(GOODPUT_WEEKLY, by=args.by.upper(), weeks=args.weeks)
        found = weeks["goodputWeekly"]
        if args.json:
            return as_json(found)
        return goodput_table.weekly_table(args.by, found)
    start = (datetime.now(UTC) - timedelta(days=args.days)).isoformat()
    if args.cost:
        if args.by not in ("workspace", "run"):
            raise CliError("astra: --cost is by workspace or run", EXIT_USAGE)
        cost = api.graphql(GOODPUT_COST, by=args.by.upper(), start=start)["goodputCost"]
        return as_json(cost) if args.json else goodput_table.cost_table(args.by, cost)
    report = api.graphql(GOODPUT, by=args.by.upper(), start=start)["goodput"]
    if args.json:
        return as_json(report)
    rows = _rows(report)
    decimals = goodput_table.decimals_for([ledger for _, ledger in rows] + [report["total"]])
    found = goodput_table.table(args.by, rows, report["total"], decimals)
    return found + goodput_table.rework_line(report["total"], report["rework"], decimals)


GPUS = (
    "{ gpus { machine index model memoryBytes health healthReason utilization heldBy "
    "heldElsewhere line } }"
)
FOLLOW = """subscription($w: String!, $tail: Int!) {
  followLog(worker: $w, tail: $tail) { text missed ended behind } }"""
SLOWED_NOTICE_EVERY_S = 5.0


MACHINES = (
    "{ machines { name cluster pool state reason gpus unhealthyGpus isolation "
    "isolationNotEnforced } }"
)
MACHINE_HEALTH = """query($start: DateTime) { machineHealth(start: $start) { machines {
  machine pool lostGpuHours failureCount failures { kind count } faultCount vsPool action
} } }"""


def cmd_machines(api: Api, args: argparse.Namespace) -> str:
    """Organisation admins: the machines, a line each; with --worst, ranked by the GPU time
    lost on them over the last days, with their failures, GPU faults and what to do."""
    if not args.worst:
        found = api.graphql(MACHINES)["machines"]
        if args.json:
            return as_json(found)
        lines = [f"{'MACHINE':<24}{'POOL':<12}{'STATE':<10}{'GPUS':>5}{'UNHEALTHY':>10}  REASON"]
        lines += [
            f"{m['name']:<24}{m['pool'] or '-':<12}{m['state']:<10}{m['gpus']:>5}"
            f"{m['unhealthyGpus']:>10}  {m['reason']}"
            for m in found
        ]
        # What a machine does not enforce of its workers' sandbox, said under the table.
        lines += [f"{m['name']}: {m['isolation']}" for m in found if m["isolationNotEnforced"]]
        return "\n".join(lines)
    start = (datetime.now(UTC) - timedelta(days=args.days)).isoformat()
    found = api.graphql(MACHINE_HEALTH, start=start)["machineHealth"]["machines"]
    if args.json:
        return as_json(found)
    return machines_table.worst(found)


def cmd_gpus(api: Api, args: argparse.Namespace) -> str:
    """Every GPU the workspace may use: `gpu-07/0  NVIDIA H100 80GB HBM3  97%  ok  held by …`."""
    gpus = api.graphql(GPUS)["gpus"]
    return as_json(gpus) if args.json else "\n".join(g["line"] for g in gpus)


def _worker(api: Api, name: str) -> dict[str, Any]:
    """The worker named, or the one a run's name means, as the server's log answers it: a
    failed run's, the worker its reason names (the first that failed: its log has the cause);
    another's, its first (seed L-10, L-59)."""
    try:
        return api.get(f"/tasks/{name}")
    except CliError as error:
        if error.exit_code != EXIT_NOT_FOUND:
            raise
        try:
            job = api.get(f"/jobs/{name}")
        except CliError as no_run:
            if no_run.exit_code != EXIT_NOT_FOUND:
                raise
            raise error from None
        shown = job.get("failed_worker") or next(iter(job["task_names"]), None)
        if shown is None:
            raise
        return api.get(f"/tasks/{shown}")


def cmd_logs(api: Api, args: argparse.Namespace) -> str:
    """A worker's last lines (a run: its first worker; a failed run: the worker that failed it);
    with -f, its new lines as they are written until it ends, then a blank line and how it
    ended (seed L-8: the exit status says whether it completed)."""
    if not args.follow:
        params = {} if args.tail is None else {"tail": args.tail}
        found = api.get(f"/tasks/{args.worker}/logs", **params)
        return as_json(found) if args.json else str(found["logs"]).rstrip("\n")
    worker = _worker(api, args.worker)
    tail = FOLLOW_TAIL if args.tail is None else args.tail
    open_line = False  # the last text written ended inside a line
    slowed_told = -SLOWED_NOTICE_EVERY_S  # when the reader was last told the server is behind
    from backend.cli.astra.subscribe import subscribe  # (websockets: only the followers load it)

    for chunk in subscribe(api, FOLLOW, "followLog", w=worker["name"], tail=tail):
        if args.json:
            print(as_json(chunk, indent=None), flush=True)
            continue
        if chunk["missed"]:
            print(("\n" if open_line else "") + missed_notice(chunk["missed"]), flush=True)
            open_line = False
        if chunk.get("behind") and time.monotonic() - slowed_told >= SLOWED_NOTICE_EVERY_S:
            # on stderr: the log's own lines stay as the worker wrote them
            print(
                f"[the server is {chunk['behind']:.0f} s behind: lines arrive late]",
                file=sys.stderr,
                flush=True,
            )
            slowed_told = time.monotonic()
        if chunk["text"]:
            sys.stdout.write(chunk["text"])
            sys.stdout.flush()
            open_line = not chunk["text"].endswith("\n")
    end = _ended(api, worker["name"])
    if not args.json:
        # a last line the worker left unfinished is ended, then the seed's blank line
        print("\n" if open_line else "", flush=True)
    if end["status"] != "Completed":  # on stderr, in the colour of an error
        said = f"{end['name']}: {end['status']} — {end['reason']}"
        raise CliError(as_json(end, indent=None) if args.json else said, EXIT_FAILED)
    if args.json:
        return as_json(end, indent=None)
    return f"{end['name']}: {args.paint.state(end['status'])} — {end['reason']}"


def missed_notice(lines: int) -> str:
    """Where a follower missed lines it could not keep up with: ``[… 1 line missed]``."""
    return f"[… {lines} line{'' if lines == 1 else 's'} missed]"


ENDING_WAIT_S = 30.0
FOLLOW_TAIL = 10  # -f starts with the last lines, as tail -f does


def _ended(api: Api, name: str) -> dict[str, Any]:
    """The worker once its machine has reported how it ended (the log ends first), or as it
    is after a while."""
    deadline = time.monotonic() + ENDING_WAIT_S
    while True:
        worker = _worker(api, name)
        if worker["status"] not in ("Running", "Stopping") or time.monotonic() > deadline:
            return worker
        time.sleep(0.2)


EVENT_FIELDS = "id kind state reason run worker createdAt"
EVENTS = f"""query($name: String, $kind: String, $limit: Int!) {{
  events(name: $name, kind: $kind, limit: $limit) {{ events {{ {EVENT_FIELDS} }} }}
}}"""
FOLLOW_EVENTS = f"""subscription($name: String, $kind: String, $after: ID) {{
  events(name: $name, kind: $kind, after: $after) {{ {EVENT_FIELDS} }}
}}"""
EVENT_COLUMNS = (("TIME", 21), ("KIND", 16), ("NAME", 26), ("STATE", 12))


def format_event(event: dict[str, Any], paint: Paint = PLAIN) -> str:
    """``2026-11-29 15:04:05  run.state  llama-sft  Running  2 of 2 workers running``."""
    time_, kind, name, state = (
        cell(when(event["createdAt"], "%Y-%m-%d %H:%M:%S"), 21),
        cell(event["kind"], 16),
        cell(event["worker"] or event["run"] or "-", 26),
        cell(event["state"] or "-", 12),
    )
    return f"{time_}{kind}{name}{paint.state(state, event['state'])}{event['reason']}"


EVENTS_HEADER = "".join(f"{title:<{width}}" for title, width in EVENT_COLUMNS) + "REASON"


def cmd_events(api: Api, args: argparse.Namespace) -> str:
    """The workspace's events, oldest first, the newest last (seed L-43, L-46); with -f, then
    each new one as it happens, until interrupted."""
    page = api.graphql(EVENTS, name=args.run, kind=args.kind, limit=args.limit)["events"]
    events = list(reversed(page["events"]))
    if not args.follow:
        if args.json:
            return as_json(events)
        return "\n".join([EVENTS_HEADER, *(format_event(e, args.paint) for e in events)])
    print(as_json(events) if args.json else EVENTS_HEADER, flush=True)
    if not args.json:
        for event in events:
            print(format_event(event, args.paint), flush=True)
    after = events[-1]["id"] if events else None
    from backend.cli.astra.subscribe import subscribe  # (websockets: only the followers load it)

    for event in subscribe(
        api, FOLLOW_EVENTS, "events", name=args.run, kind=args.kind, after=after
    ):
        line = as_json(event, indent=None) if args.json else format_event(event, args.paint)
        print(line, flush=True)
    return ""


HISTORY_BY_API = (
    "astra does not print history. Use the API:\n"
    '  curl -sS "$API/jobs/{run}" -H "Authorization: Bearer $ASTRA_TOKEN" '
    "| jq -c '.history[] | [.transition_at, .state, .reason]'\n"
    "or follow its events: astra astraeus events --run {run} -f"
)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("must be a whole number of 1 or more")
    return int(text)


def _whole(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError("must be a whole number of 0 or more")
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
    command(
        "describe", cmd_describe, "a run's state, idle policy and how often it should checkpoint"
    ).add_argument("run")
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
    goodput.add_argument(
        "--cost",
        action="store_true",
        help="as money: each pool's price per GPU-hour (by workspace or run)",
    )
    goodput.add_argument("--weeks", type=_positive, help="by ISO week, the last N weeks")
    goodput.add_argument("--run", help="one run's own ledger since it was submitted")
    command("gpus", cmd_gpus, "every GPU the workspace may use, its use and holder")
    machines = command("machines", cmd_machines, "organisation admins: the machines")
    machines.add_argument(
        "--worst",
        action="store_true",
        help="ranked by the GPU time lost on them, with failures, GPU faults and what to do",
    )
    machines.add_argument("--days", type=_positive, default=7, help="the last days (7)")
    logs = command(
        "logs", cmd_logs, "a worker's log (a run: its first worker; failed: the one that failed it)"
    )
    logs.add_argument("worker")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until it ends")
    logs.add_argument(
        "--tail", type=_whole, help="the last N lines (1 000; with -f: 10, then each new one)"
    )
    command("stop", cmd_stop, "wind a run down; it ends Stopped").add_argument("run")
    command("delete", cmd_delete, "delete a run, its workers and their logs").add_argument("run")
    events = command("events", cmd_events, "the workspace's events, the newest last")
    events.add_argument("--run", help="only this run's and its workers' events")
    events.add_argument("--kind", help="only this kind: run.state, worker.state, alert.firing, …")
    events.add_argument("--limit", type=_positive, default=50, help="the last N events (50)")
    events.add_argument("-f", "--follow", action="store_true", help="then each new one")
    history = sub.add_parser("history", help="astra does not print history: where to find it")
    history.add_argument("run")
    history.set_defaults(json=False)
    submit = command("submit", cmd_submit, "submit a run from its JSON specification")
    submit.add_argument("spec", help="a JSON file, or - for standard input")
    submit.add_argument("--name", help="submit under this name instead of the file's")
    submit.add_argument(
        "--workdir",
        metavar="FOLDER",
        help="ship this folder with the run (as git would commit it: .gitignore and "
        ".astraeusignore apply); each worker's command starts in its copy",
    )
    quota_cli.add_commands(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.paint = Paint(wanted(sys.stdout))
    try:
        if args.command == "history":  # seed L-45: say where the history is instead
            raise CliError(HISTORY_BY_API.format(run=args.run), EXIT_USAGE)
        # a table's strings as a terminal may print them; --json's as the API answered
        api = Api(resolve_target(), for_terminal=not args.json)
        printed = args.func(api, args)
        if printed:
            print(printed)
        sys.stdout.flush()  # a closed pipe is found here, not at exit
    except BrokenPipeError:
        return _reader_gone()
    except CliError as error:
        print(Paint(wanted(sys.stderr)).error(str(error)), file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_OK


def _reader_gone() -> int:
    """The reader closed the pipe (`| head -1`): end quietly, as Unix tools do, with the
    status of a SIGPIPE (issue 21). What is still buffered goes nowhere, not to a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
