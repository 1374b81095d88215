"""``astraeus``: run and administer an Astraeus server.

astraeus up                 embedded: SQLite in the data folder, migrations, first-run set-up
astraeus serve              the API server (a deployment runs ``db upgrade`` first)
astraeus db upgrade         apply the migrations
astraeus bootstrap          create the first organisation, cluster, workspace and admin token
astraeus workspace create   add a workspace to an organisation
astraeus workspace ceiling  the highest priority a workspace's runs may ask for
astraeus workspace quota    the most GPUs a workspace's runs may hold on a cluster
astraeus cluster preemption may runs preempt other workspaces' runs over their quota
astraeus token create       a token for a user acting in a workspace (--expires 30d)
astraeus token list         the organisation's user tokens
astraeus token revoke       revoke a user token by id or prefix
astraeus secrets new-key    print a new encryption key (to put first when rotating)
astraeus secrets reencrypt  encrypt stored secrets with the first key (after a key rotation)
astraeus agent-token        join tokens machines exchange for their own credential
astraeus machine-credential list or revoke machines' credentials
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from backend.config import Settings, get_settings, parse_duration, settings_problems
from backend.errors import AstraeusError

Command = Callable[[Settings, argparse.Namespace], int]


def _later(module: str, name: str) -> Command:
    """A subcommand's function, imported when that subcommand runs: `astraeus agent` loads the
    agent alone (about 0.6 s of CPU), not the server's domains, migrations and web stack
    (about 2.4 s more), and an admin command loads the services it calls."""

    def run(settings: Settings, args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(f"backend.cli.{module}"), name)(settings, args))

    return run


def _duration(text: str) -> timedelta:
    """``--expires 1h``: a duration such as 12h, 30d or 1h30m."""
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _when(text: str) -> datetime:
    """An argument's time: ISO 8601, UTC where it names no zone."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError("must be a time such as 2026-11-01T00:00:00Z") from error
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _expiry(text: str) -> timedelta:
    """``--expires 30d``: a duration such as 12h, 30d or 1h30m (not 0)."""
    try:
        found = parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    if found <= timedelta(0):
        raise argparse.ArgumentTypeError("must be longer than 0s")
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="astraeus", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run everything embedded (SQLite, migrations, set-up)")
    up.add_argument("--host")
    up.add_argument("--port", type=int)
    up.add_argument(
        "--demo",
        action="store_true",
        help="also submit the example workloads (examples/): training, a failure, an OOM kill, "
        "an idle notebook and a stall",
    )
    up.set_defaults(func=_later("processes", "cmd_up"))

    serve = sub.add_parser("serve", help="run the API server")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.set_defaults(func=_later("processes", "cmd_serve"))

    worker = sub.add_parser("worker", help="run the Dramatiq actors (production: with Redis)")
    worker.add_argument(
        "--threads",
        type=int,
        default=2,
        help="threads for webhooks and pruning (the tick, lease checks and passes have theirs)",
    )
    worker.set_defaults(func=_later("processes", "cmd_worker"))

    agent = sub.add_parser("agent", help="join a cluster and run the workers placed here")
    from agent.arguments import add_arguments

    add_arguments(agent)
    agent.set_defaults(func=_later("agent_process", "cmd_agent"))

    scheduler = sub.add_parser(
        "scheduler", help="send the periodic jobs (scheduling pass, metrics pruning)"
    )
    scheduler.set_defaults(func=_later("processes", "cmd_scheduler"))

    db = sub.add_parser("db", help="database administration").add_subparsers(
        dest="db_command", required=True
    )
    upgrade = db.add_parser("upgrade", help="apply the migrations")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(func=_later("admin", "cmd_db_upgrade"))

    boot = sub.add_parser("bootstrap", help="first-run set-up; prints the admin token once")
    boot.add_argument("--organization", default="default")
    boot.add_argument("--cluster", default="local")
    boot.add_argument("--workspace", default="default")
    boot.add_argument("--admin", default="admin")
    boot.set_defaults(func=_later("admin", "cmd_bootstrap"))

    keys = sub.add_parser("secrets", help="secrets at rest").add_subparsers(
        dest="secrets_command", required=True
    )
    reencrypt = keys.add_parser(
        "reencrypt", help="encrypt every stored secret with the first key (key rotation)"
    )
    reencrypt.set_defaults(func=_later("admin", "cmd_secrets_reencrypt"))
    new_key = keys.add_parser("new-key", help="print a new encryption key (key rotation)")
    new_key.set_defaults(func=_later("admin", "cmd_secrets_new_key"))

    ws = sub.add_parser("workspace", help="workspaces").add_subparsers(
        dest="ws_command", required=True
    )
    ws_create = ws.add_parser("create", help="add a workspace")
    ws_create.add_argument("name")
    ws_create.add_argument("--organization", default="default")
    ws_create.set_defaults(func=_later("admin", "cmd_workspace_create"))
    ceiling = ws.add_parser(
        "ceiling", help="the highest priority a workspace's runs may ask for (default 50)"
    )
    ceiling.add_argument("name")
    ceiling.add_argument("ceiling", type=int, help="0 to 100")
    ceiling.add_argument("--organization", default="default")
    ceiling.set_defaults(func=_later("admin", "cmd_workspace_ceiling"))

    quota = ws.add_parser("quota", help="the most GPUs a workspace's runs may hold on a cluster")
    quota.add_argument("name")
    quota.add_argument("--cluster", default="local")
    quota.add_argument("--gpus", required=True, help="a number, or none for no quota")
    quota.add_argument("--organization", default="default")
    quota.set_defaults(func=_later("admin", "cmd_workspace_quota"))

    cluster = sub.add_parser("cluster", help="clusters").add_subparsers(
        dest="cluster_command", required=True
    )
    preemption = cluster.add_parser(
        "preemption", help="may runs preempt other workspaces' runs over their quota?"
    )
    preemption.add_argument("name")
    preemption.add_argument(
        "--over-quota",
        choices=["allow", "deny"],
        required=True,
        help="allow: a higher-priority run may preempt runs of a workspace over its quota; "
        "deny (the default): runs preempt only their own workspace's",
    )
    preemption.add_argument("--organization", default="default")
    preemption.set_defaults(func=_later("admin", "cmd_cluster_preemption"))

    create = cluster.add_parser(
        "create", help="a new cluster: scheduled by Astraeus, or run by Slurm (--slurm)"
    )
    create.add_argument("name")
    create.add_argument(
        "--slurm",
        action="store_true",
        help="Slurm runs it: its jobs (sbatch included) are imported as runs, its nodes as "
        "machines, its partitions as pools",
    )
    create.add_argument("--slurm-conf", help="the slurm.conf Slurm's commands read (SLURM_CONF)")
    create.add_argument("--slurm-bin", help="the folder of sacct, squeue and sinfo (default: PATH)")
    create.add_argument(
        "--timeout",
        type=float,
        default=20.0,
        help="seconds a Slurm command may take (they block while slurmctld is down)",
    )
    create.add_argument(
        "--state-dir",
        help="a folder the server and every node see: runs submitted to Slurm from Astraeus keep "
        "their job output, logs and ends there (without it, runs are not submitted)",
    )
    create.add_argument(
        "--node-python",
        default="python3",
        help="the Python on the nodes that has Astraeus's agent package (agent.slurm_task)",
    )
    create.add_argument(
        "--slurm-operator",
        action="store_true",
        help="the server's Slurm user is an operator: runs above priority 50 get a nice below 0",
    )
    create.add_argument(
        "--stall-timeout",
        type=_duration,
        metavar="DURATION",
        help="with --slurm: an imported job whose output stops for this long (30m) is counted "
        "stalled from its last line; Slurm keeps it running (default: never)",
    )
    create.add_argument(
        "--import-since",
        type=_when,
        help="import the jobs active since this time (ISO 8601; default: now)",
    )
    create.add_argument("--organization", default="default")
    create.set_defaults(func=_later("slurm", "cmd_cluster_create"))

    account = cluster.add_parser(
        "account", help="the workspace a Slurm account's jobs are imported into"
    )
    account.add_argument("cluster")
    account.add_argument("account", help="the Slurm account (sacctmgr's)")
    target = account.add_mutually_exclusive_group(required=True)
    target.add_argument("--workspace")
    target.add_argument("--none", action="store_true", help="import its jobs no more")
    account.add_argument("--organization", default="default")
    account.set_defaults(func=_later("slurm", "cmd_cluster_account"))

    importing = cluster.add_parser("import", help="read a Slurm cluster's jobs and nodes now")
    importing.add_argument("cluster")
    importing.add_argument(
        "--since", type=_when, help="read again every job active since this time (ISO 8601)"
    )
    importing.add_argument("--organization", default="default")
    importing.set_defaults(func=_later("slurm", "cmd_cluster_import"))

    shown = cluster.add_parser("status", help="a Slurm cluster's import: when, errors, accounts")
    shown.add_argument("cluster")
    shown.add_argument("--organization", default="default")
    shown.set_defaults(func=_later("slurm", "cmd_cluster_status"))

    token = sub.add_parser("token", help="API tokens").add_subparsers(
        dest="token_command", required=True
    )
    create = token.add_parser("create", help="print a new token (shown once)")
    create.add_argument("--workspace", help="the workspace a user token acts in")
    create.add_argument("--user", help="the user a token is for (created if new)")
    create.add_argument("--agent", action="store_true", help="a machine token for agents")
    create.add_argument("--cluster", default="local", help="the cluster an agent token joins")
    create.add_argument("--organization", default="default")
    create.add_argument("--admin", action="store_true", help="make the user an organisation admin")
    create.add_argument("--name", default="", help="a label to tell the token apart")
    create.add_argument(
        "--expires",
        type=_expiry,
        metavar="DURATION",
        help="a user token is refused this long from now (30d, 12h; default: never)",
    )
    _join_token_options(create)
    create.set_defaults(func=_later("tokens", "cmd_token_create"))
    listing = token.add_parser("list", help="the organisation's user tokens (never secrets)")
    listing.add_argument("--organization", default="default")
    listing.set_defaults(func=_later("tokens", "cmd_token_list"))
    revoke = token.add_parser("revoke", help="revoke a user token; its streams end within seconds")
    revoke.add_argument("token", help="the token's id or first characters (astraeus token list)")
    revoke.add_argument("--organization", default="default")
    revoke.set_defaults(func=_later("tokens", "cmd_token_revoke"))
    _machine_commands(sub)
    return parser


def _machine_commands(sub: Any) -> None:
    """``agent-token`` and ``machine-credential``: how machines join (backend/cli/machines.py)."""

    def scoped(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--cluster", default="local", help="the cluster (default: local)")
        parser.add_argument("--organization", default="default")
        return parser

    tokens = sub.add_parser(
        "agent-token", help="join tokens machines exchange for credentials of their own"
    ).add_subparsers(dest="agent_token_command", required=True)
    create = scoped(tokens.add_parser("create", help="print a new join token (shown once)"))
    _join_token_options(create)
    create.add_argument(
        "--expires", type=_duration, help="how long it lets machines join, e.g. 1h or 7d (24h)"
    )
    create.add_argument("--name", default="", help="a label to tell the token apart")
    create.set_defaults(func=_later("machines", "create_join_token"))
    listed = scoped(tokens.add_parser("list", help="the cluster's join tokens"))
    listed.set_defaults(func=_later("machines", "list_join_tokens"))
    revoke = scoped(tokens.add_parser("revoke", help="no machine joins with it any more"))
    revoke.add_argument("id", type=int, help="the token's id (agent-token list)")
    revoke.set_defaults(func=_later("machines", "revoke_join_token"))

    credentials = sub.add_parser(
        "machine-credential", help="machines' own credentials"
    ).add_subparsers(dest="machine_credential_command", required=True)
    shown = scoped(credentials.add_parser("list", help="each machine's credential"))
    shown.set_defaults(func=_later("machines", "list_credentials"))
    gone = scoped(
        credentials.add_parser(
            "revoke", help="the machine is lost at once, its workers placed elsewhere"
        )
    )
    gone.add_argument("machine", help="the machine's name")
    gone.set_defaults(func=_later("machines", "revoke_credential"))


def _join_token_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--uses", type=int, default=1, help="how many machines may join with it (default 1)"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = get_settings()
    except ValidationError as error:
        for line in settings_problems(error):
            print(f"astraeus: {line}", file=sys.stderr)
        return 2
    try:
        return int(args.func(settings, args))
    except AstraeusError as error:
        print(f"astraeus: {error.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
