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
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from agent.backoff import Backoff
from backend import migrations
from backend.access import redaction
from backend.access import service as access
from backend.access.service import TokenRow
from backend.cli import demo
from backend.cli import machines as machine_cli
from backend.clock import SystemClock
from backend.config import Settings, get_settings, parse_duration, settings_problems
from backend.db import Database
from backend.errors import AstraeusError
from backend.machine_identity import service as identity
from backend.organizations import service as organizations
from backend.secrets import crypto
from backend.secrets import service as secrets_service

if TYPE_CHECKING:
    import uvicorn

T = TypeVar("T")


class NoDataYet(AstraeusError):
    """An embedded database asked for before `astraeus up` made it (issue 21)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(
            code="NO_DATA",
            message=(
                f"there is no Astraeus data in {settings.data_dir} yet: start it with "
                "`astraeus up` (it makes the database and the admin token), then run this again"
            ),
            status=503,
        )


def _in_transaction(settings: Settings, work: Callable[..., Awaitable[T]]) -> T:
    # SQLAlchemy's 'unable to open database file' (a traceback), said plainly: no `up` yet
    url = settings.resolved_database_url
    embedded = url.startswith("sqlite:///") and ":memory:" not in url
    if embedded and not Path(url.removeprefix("sqlite:///")).is_file():
        raise NoDataYet(settings)

    async def go() -> T:
        db = Database.from_url(settings.resolved_database_url)
        try:
            async with db.transaction() as session:
                return await work(session)
        finally:
            await db.dispose()

    return asyncio.run(go())


def token_file(settings: Settings) -> Path:
    return settings.data_dir / "admin-token"


def cmd_bootstrap(settings: Settings, args: argparse.Namespace) -> int:
    result = _in_transaction(
        settings,
        lambda s: organizations.bootstrap(
            s,
            SystemClock(),
            organization=args.organization,
            cluster=args.cluster,
            workspace=args.workspace,
            admin=args.admin,
        ),
    )
    if result is None:
        print("Astraeus is already set up; `astraeus token create` makes more tokens.")
        return 0
    path = token_file(settings) if settings.is_embedded else None
    if path is not None:
        _write_private(path, result.token + "\n")
    print(f"organization: {result.organization}")
    print(f"cluster:      {result.cluster}")
    print(f"workspace:    {result.workspace}")
    print(f"admin user:   {result.user} (organisation admin)")
    if path is not None and getattr(args, "token_to_terminal_only", False) and not _terminal():
        # `astraeus up`'s output is the server's log when it is not a terminal: the token
        # stays in its file
        print(f"token:        in {path} (shown only on a terminal)")
    else:
        print(f"token:        {result.token}")
    return 0


def _terminal() -> bool:
    return sys.stdout.isatty()


def _write_private(path: Path, text: str) -> None:
    """A file only this user may read (0600 from its creation), in a folder of its own."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)  # made before with another mode


def _private_data(settings: Settings) -> None:
    """The data folder (0700) and what the server keeps there (0600): the embedded database,
    its journal files, the tokens' files and the encryption key, made now if new. Other
    users of the machine, the local agent's workloads among them, read none of it."""
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.data_dir.chmod(0o700)
    files = [token_file(settings), settings.data_dir / "agent-token"]
    if settings.is_embedded:
        db = Path(settings.resolved_database_url.removeprefix("sqlite:///"))
        if not db.exists():  # SQLite takes an empty file as an empty database
            db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(db, os.O_WRONLY | os.O_CREAT, 0o600))
        # SQLite makes its -wal and -shm files with the database file's mode
        files += [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    crypto.configure(crypto.load_keyring(settings))  # the key file, made now if new
    files.append(crypto.key_file(settings))
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            path.chmod(0o600)


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    migrations.upgrade(settings.resolved_database_url, args.revision)
    print(f"database at revision {migrations.current(settings.resolved_database_url)}")
    return 0


def cmd_workspace_create(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> str:
        org = await organizations.organization_by_name(session, args.organization)
        ws = await organizations.create_workspace(
            session,
            SystemClock(),
            organization_id=org.id,
            name=args.name,
        )
        return ws.name

    print(f"workspace {_in_transaction(settings, work)} created")
    return 0


def cmd_workspace_ceiling(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> int:
        org = await organizations.organization_by_name(session, args.organization)
        ws = await organizations.set_priority_ceiling(session, org.id, args.name, args.ceiling)
        return ws.priority_ceiling

    print(
        f"workspace {args.name}: runs may ask for priority up to {_in_transaction(settings, work)}"
    )
    return 0


def cmd_workspace_quota(settings: Settings, args: argparse.Namespace) -> int:
    gpus = None if args.gpus == "none" else int(args.gpus)

    async def work(session: AsyncSession) -> int | None:
        org = await organizations.organization_by_name(session, args.organization)
        return await organizations.set_quota(session, org.id, args.name, args.cluster, gpus)

    limit = _in_transaction(settings, work)
    held = "no quota" if limit is None else f"at most {limit} GPUs at once"
    print(f"workspace {args.name} on {args.cluster}: {held}")
    return 0


def cmd_cluster_preemption(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> bool:
        org = await organizations.organization_by_name(session, args.organization)
        allowed = args.over_quota == "allow"
        found = await organizations.set_preemption_policy(session, org.id, args.name, allowed)
        return found.preempt_over_quota

    if _in_transaction(settings, work):
        print(f"cluster {args.name}: runs may preempt other workspaces' runs over their quota")
    else:
        print(f"cluster {args.name}: runs preempt only their own workspace's runs")
    return 0


def cmd_token_create(settings: Settings, args: argparse.Namespace) -> int:
    if args.agent:
        return cmd_agent_token_create(settings, args)
    if not args.workspace or not args.user:
        print("astraeus: a user token needs --workspace and --user", file=sys.stderr)
        return 2

    async def work(session: AsyncSession) -> str:
        clock = SystemClock()
        org = await organizations.organization_by_name(session, args.organization)
        ws = await organizations.workspace_by_name(session, org.id, args.workspace)
        user = await access.ensure_user(
            session,
            clock,
            name=args.user,
            organization_id=org.id,
            workspace_id=ws.id,
            org_admin=args.admin,
        )
        issued = await access.issue_user_token(
            session,
            clock,
            user=user,
            organization_id=org.id,
            workspace_id=ws.id,
            name=args.name,
            expires_in=args.expires,
        )
        return issued.secret

    print(_in_transaction(settings, work))
    return 0


def _expiry(text: str) -> timedelta:
    """``--expires 30d``: a duration such as 12h, 30d or 1h30m (not 0)."""
    try:
        found = parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    if found <= timedelta(0):
        raise argparse.ArgumentTypeError("must be longer than 0s")
    return found


def cmd_token_list(settings: Settings, args: argparse.Namespace) -> int:
    """Every user token of the organisation: id, prefix, user, workspace, state, when it was
    created and last used (written at most a minute late)."""

    async def work(session: AsyncSession) -> list[TokenRow]:
        org = await organizations.organization_by_name(session, args.organization)
        return await access.organization_tokens(session, org.id)

    now = datetime.now(UTC)
    rows = [
        [
            str(t.id),
            t.prefix,
            t.user_name,
            t.workspace_name or "-",
            t.name or "-",
            _token_state(t, now),
            _when(t.created_at),
            _when(t.last_used_at),
        ]
        for t in _in_transaction(settings, work)
    ]
    header = ["ID", "PREFIX", "USER", "WORKSPACE", "NAME", "STATE", "CREATED", "LAST USED"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _token_state(token: TokenRow, now: datetime) -> str:
    if token.revoked_at is not None:
        return f"revoked {_when(token.revoked_at)}"
    if token.expires_at is None:
        return "active"
    return f"{'expired' if token.expires_at <= now else 'expires'} {_when(token.expires_at)}"


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.strftime("%Y-%m-%dT%H:%MZ")


def cmd_token_revoke(settings: Settings, args: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> TokenRow:
        org = await organizations.organization_by_name(session, args.organization)
        return await access.revoke_organization_token(session, SystemClock(), org.id, args.token)

    found = _in_transaction(settings, work)
    print(f"token {found.id} ({found.prefix}…, {found.user_name}) revoked")
    return 0


def cmd_secrets_reencrypt(settings: Settings, args: argparse.Namespace) -> int:
    """After a new key was put first in ASTRAEUS_SECRET_KEY or the key file: every stored
    secret encrypted with it, so that the old key can be dropped."""
    crypto.configure(crypto.load_keyring(settings))
    count = _in_transaction(settings, secrets_service.reencrypt)
    print(f"{count} stored secrets encrypted with the first key; the others may now be dropped")
    return 0


def cmd_secrets_new_key(settings: Settings, args: argparse.Namespace) -> int:
    """A new key, to put first in ASTRAEUS_SECRET_KEY or the key file when rotating."""
    print(crypto.Keyring.new_key())
    return 0


def cmd_agent_token_create(settings: Settings, args: argparse.Namespace) -> int:
    """`token create --agent`: a join token, as `astraeus agent-token create` makes."""
    return machine_cli.create_join_token(_in_transaction, settings, args)


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    if settings.is_embedded:
        _private_data(settings)
    else:  # the keys, from the settings or the data folder's key file, before serving
        crypto.configure(crypto.load_keyring(settings))
    if args.host:
        settings.host = args.host
    if args.port:
        settings.port = args.port
    return _serve(_api_server(settings))


def _api_server(settings: Settings) -> uvicorn.Server:
    import uvicorn

    from backend.app import create_app
    from backend.tls import server_tls

    tls = server_tls(settings)  # refuses plaintext off loopback, naming the settings
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            proxy_headers=True,
            # A WebSocket message is bounded as a request body is (uvicorn's default: 16 MiB).
            ws_max_size=settings.max_body_bytes,
            **(tls.uvicorn_options() if tls else {}),
        )
    )
    redaction.install()  # uvicorn's loggers are configured by now: no token in the access log
    return server


def _serve(server: uvicorn.Server) -> int:
    """What ``uvicorn.run`` does with one process: serve until a signal, 3 if it never started."""
    from uvicorn.main import STARTUP_FAILURE

    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else STARTUP_FAILURE


def cmd_up(settings: Settings, args: argparse.Namespace) -> int:
    """Everything on one machine: migrations, first-run set-up, then the server."""
    # The database (every workspace's secrets) and the tokens: this user's alone. The local
    # agent's workloads, which run as users of their own, keep their folders elsewhere when
    # they cannot reach into it (agent/identity.py).
    _private_data(settings)
    migrations.upgrade(settings.resolved_database_url)
    bootstrap_args = argparse.Namespace(
        organization="default",
        cluster="local",
        workspace="default",
        admin="admin",
        token_to_terminal_only=True,
    )
    cmd_bootstrap(settings, bootstrap_args)
    if args.host:
        settings.host = args.host
    if args.port:
        settings.port = args.port
    token = token_file(settings)
    print()
    print(f"Astraeus is starting at {settings.api_url}/")
    print(f"  export API={settings.api_url}/v1 ASTRALYX_API={settings.api_url}/v1")
    if token.exists():
        print(f"  export ASTRA_TOKEN=$(cat {token}) ASTRALYX_TOKEN=$(cat {token})")
    print(f"  data: {settings.data_dir}", flush=True)
    settings.migrate_on_start = False
    command = None
    if settings.local_agent and settings.agent_port:
        command = _local_agent_command(settings)
    server = _api_server(settings)
    agent = LocalAgent(command, serving=lambda: not server.should_exit) if command else None
    if agent is not None:
        agent.start()
    if getattr(args, "demo", False):
        if token.exists():
            demo.submit_in_background(settings.api_url, token.read_text().strip())
        else:
            print("  demo: no admin token in the data folder; the examples were not submitted")
    try:
        return _serve(server)
    finally:
        if agent is not None:
            agent.stop()


# The embedded machine's pool: every machine is in one, or the pool ledgers (`goodput --by
# pool`, the pool's goodput_drop alert) would leave its time out.
LOCAL_POOL = "local"


def _local_agent_command(settings: Settings) -> list[str] | None:
    """The embedded mode's machine: this one, joined with a machine token of the cluster."""
    if settings.agent_client_ca is not None:
        print(
            "  local agent: not started: ASTRAEUS_AGENT_CLIENT_CA asks agents for a client "
            "certificate; start `astraeus agent --client-cert … --client-key …` on this machine",
            flush=True,
        )
        return None
    from agent.connection import CREDENTIAL_FILE

    # The local machine joins once with a join token; its agent keeps its own credential.
    token = settings.data_dir / "agent-token"
    if not (settings.data_dir / "agent" / CREDENTIAL_FILE).exists():
        old = token.read_text().strip() if token.exists() else None

        async def work(session: AsyncSession) -> str:
            org = await organizations.organization_by_name(session, "default")
            cluster = await organizations.cluster_by_name(session, org.id, "local")
            issued = await identity.rejoin_token(session, SystemClock(), cluster, "local", old)
            return issued.secret

        try:
            secret = _in_transaction(settings, work)
        except AstraeusError:
            return None  # set up by hand (another organisation or cluster): no local agent
        token.unlink(missing_ok=True)
        token.touch(mode=0o600)
        token.write_text(secret + "\n")
    command = [
        sys.executable,
        "-m",
        "backend.cli.server",
        "agent",
        "--server",
        f"127.0.0.1:{settings.agent_port}",
        "--token-file",
        str(token),
        "--name",
        "local",
        # Gangs' MASTER_ADDR: the embedded cluster's one machine reaches itself on loopback.
        "--advertise-address",
        "127.0.0.1",
        "--pool",
        LOCAL_POOL,
        "--data-dir",
        str(settings.data_dir / "agent"),
        "--simulate-gpus",
        str(settings.local_agent_gpus),
        "--end-with-parent",
        str(os.getpid()),
        *_local_agent_tls(settings),
    ]
    print(
        f"  local agent: machine 'local' in pool '{LOCAL_POOL}', up to "
        f"{settings.local_agent_gpus} simulated GPUs "
        "without NVIDIA ones",
        flush=True,
    )
    return command


def _local_agent_tls(settings: Settings) -> list[str]:
    """With a certificate, the local agent verifies it: with its CA (ASTRAEUS_TLS_CA), else the
    certificate itself (a self-signed one), as the name of the public URL when there is one."""
    if settings.tls_cert is None:
        return []
    flags = ["--ca-file", str(settings.tls_ca or settings.tls_cert)]
    public_host = urlsplit(settings.public_url).hostname if settings.public_url else None
    return [*flags, "--tls-server-name", public_host] if public_host else flags


# Starting the local agent again after it exits: 1 s, doubling up to 30 s; an agent that stayed
# up 60 s starts the wait over at 1 s.
RESTART_DELAY_FIRST = 1.0
RESTART_DELAY_MAX = 30.0
RESTART_DELAY_RESET_AFTER = 60.0


def restart_backoff() -> Backoff:
    """The waits before starting the local agent again (``wait(seconds it stayed up)``)."""
    return Backoff(RESTART_DELAY_FIRST, RESTART_DELAY_MAX, reset_after=RESTART_DELAY_RESET_AFTER)


class LocalAgent:
    """`astraeus up`'s local agent, started again whenever it exits while the server serves, so
    that the machine is not lost while the server is fine (issue 17). Its workers outlive it: the
    agent started again takes them back from its data folder.

    One thread starts each agent process and waits for it. The agent asks for SIGTERM when its
    parent dies (``--end-with-parent``), and Linux sends it when the *thread* that started it
    ends: the thread therefore lives until its agent has exited, and ``stop`` ends the agent
    before the thread. No ``preexec_fn``: the server's threads (gRPC's among them) make running
    Python between fork and exec unsafe, and without one the child is spawned by vfork."""

    def __init__(self, command: list[str], *, serving: Callable[[], bool]) -> None:
        self.command = command
        self.serving = serving
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # no agent starts once `stop` has begun
        self._thread = threading.Thread(target=self._supervise, name="local-agent", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 15) -> None:
        """No more starts first, then the agent ends as `up` ends it: SIGTERM, then SIGKILL after
        ``timeout`` seconds."""
        with self._lock:
            self._stopping.set()
            process = self.process
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._thread.join(timeout=timeout)

    def _ending(self) -> bool:
        return self._stopping.is_set() or not self.serving()

    def _supervise(self) -> None:
        restarts = restart_backoff()
        while True:
            started = time.monotonic()
            outcome = self._run_agent()
            if outcome is None or self._ending():
                return
            delay = restarts.wait(time.monotonic() - started)
            print(f"local agent {outcome}; starting it again in {delay:g}s", flush=True)
            if self._stopping.wait(delay):
                return

    def _run_agent(self) -> str | None:
        """Start the agent and wait until it exits: how it ended, or None when `up` ends."""
        with self._lock:
            if self._ending():
                return None
            try:
                self.process = subprocess.Popen(self.command)
            except OSError as error:
                return f"could not start ({error})"
        return f"exited with code {self.process.wait()}"


def _end_with_parent(parent: int) -> None:
    """Linux: this agent gets SIGTERM when `astraeus up` (``parent``) dies, however it dies."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    """A Dramatiq worker process: runs the actors sent through Redis, each queue on threads of
    its own (the tick and lease checks never wait behind scheduling passes)."""
    from backend.jobs import broker as job_broker
    from backend.jobs import runtime

    broker = job_broker.install(settings)
    runtime.configure(settings)
    workers = job_broker.start_workers(broker, threads=args.threads)
    print(
        f"astraeus worker: {job_broker.CLOCK_THREADS} threads for the tick and leases, "
        f"{job_broker.SCHEDULING_THREADS} for scheduling passes, {args.threads} for webhooks "
        f"and pruning, on the {settings.broker} broker",
        flush=True,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()
    job_broker.stop_workers(workers)
    return 0


def cmd_scheduler(settings: Settings, args: argparse.Namespace) -> int:
    """Send the periodic jobs: the scheduling pass (leases, timers, placement) and the lease
    check every interval, metrics pruning every ten minutes, and warn of a queue's backlog."""
    from backend.jobs import broker as job_broker

    job_broker.install(settings)
    interval = settings.scheduler_interval.total_seconds()
    print(
        f"astraeus scheduler: a pass every {interval:g}s, metrics pruned every "
        f"{job_broker.PRUNE_INTERVAL_S:g}s",
        flush=True,
    )
    asyncio.run(job_broker.periodic(settings))
    return 0


def cmd_agent(settings: Settings, args: argparse.Namespace) -> int:
    from agent.main import run

    if args.end_with_parent:
        _end_with_parent(args.end_with_parent)
    return run(args)


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
    up.set_defaults(func=cmd_up)

    serve = sub.add_parser("serve", help="run the API server")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run the Dramatiq actors (production: with Redis)")
    worker.add_argument(
        "--threads",
        type=int,
        default=2,
        help="threads for webhooks and pruning (the tick, lease checks and passes have theirs)",
    )
    worker.set_defaults(func=cmd_worker)

    agent = sub.add_parser("agent", help="join a cluster and run the workers placed here")
    from agent.main import add_arguments

    add_arguments(agent)
    # `astraeus up`'s local agent: end when that process does (its pid)
    agent.add_argument("--end-with-parent", type=int, metavar="PID", help=argparse.SUPPRESS)
    agent.set_defaults(func=cmd_agent)

    scheduler = sub.add_parser(
        "scheduler", help="send the periodic jobs (scheduling pass, metrics pruning)"
    )
    scheduler.set_defaults(func=cmd_scheduler)

    db = sub.add_parser("db", help="database administration").add_subparsers(
        dest="db_command", required=True
    )
    upgrade = db.add_parser("upgrade", help="apply the migrations")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(func=cmd_db_upgrade)

    boot = sub.add_parser("bootstrap", help="first-run set-up; prints the admin token once")
    boot.add_argument("--organization", default="default")
    boot.add_argument("--cluster", default="local")
    boot.add_argument("--workspace", default="default")
    boot.add_argument("--admin", default="admin")
    boot.set_defaults(func=cmd_bootstrap)

    keys = sub.add_parser("secrets", help="secrets at rest").add_subparsers(
        dest="secrets_command", required=True
    )
    reencrypt = keys.add_parser(
        "reencrypt", help="encrypt every stored secret with the first key (key rotation)"
    )
    reencrypt.set_defaults(func=cmd_secrets_reencrypt)
    new_key = keys.add_parser("new-key", help="print a new encryption key (key rotation)")
    new_key.set_defaults(func=cmd_secrets_new_key)

    ws = sub.add_parser("workspace", help="workspaces").add_subparsers(
        dest="ws_command", required=True
    )
    ws_create = ws.add_parser("create", help="add a workspace")
    ws_create.add_argument("name")
    ws_create.add_argument("--organization", default="default")
    ws_create.set_defaults(func=cmd_workspace_create)
    ceiling = ws.add_parser(
        "ceiling", help="the highest priority a workspace's runs may ask for (default 50)"
    )
    ceiling.add_argument("name")
    ceiling.add_argument("ceiling", type=int, help="0 to 100")
    ceiling.add_argument("--organization", default="default")
    ceiling.set_defaults(func=cmd_workspace_ceiling)

    quota = ws.add_parser("quota", help="the most GPUs a workspace's runs may hold on a cluster")
    quota.add_argument("name")
    quota.add_argument("--cluster", default="local")
    quota.add_argument("--gpus", required=True, help="a number, or none for no quota")
    quota.add_argument("--organization", default="default")
    quota.set_defaults(func=cmd_workspace_quota)

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
    preemption.set_defaults(func=cmd_cluster_preemption)

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
    machine_cli.add_join_token_options(create)
    create.set_defaults(func=cmd_token_create)
    listing = token.add_parser("list", help="the organisation's user tokens (never secrets)")
    listing.add_argument("--organization", default="default")
    listing.set_defaults(func=cmd_token_list)
    revoke = token.add_parser("revoke", help="revoke a user token; its streams end within seconds")
    revoke.add_argument("token", help="the token's id or first characters (astraeus token list)")
    revoke.add_argument("--organization", default="default")
    revoke.set_defaults(func=cmd_token_revoke)
    machine_cli.add_commands(sub, _in_transaction)
    return parser


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
