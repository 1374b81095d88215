"""The processes ``astraeus`` runs until a signal: ``up`` (everything embedded, with a local
agent: backend/cli/local_agent.py), ``serve`` (the API server), ``worker`` (the Dramatiq
actors), ``scheduler`` (the periodic jobs). ``agent``: backend/cli/agent_process.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from backend import crypto, migrations
from backend.access import redaction
from backend.cli import demo
from backend.cli.admin import cmd_bootstrap, token_file
from backend.cli.local_agent import LocalAgent, local_agent_command, local_agent_dir
from backend.config import Settings

if TYPE_CHECKING:
    import uvicorn


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
        command = local_agent_command(settings)
    server = _api_server(settings)
    agent = None
    if command:
        agent = LocalAgent(
            command, local_agent_dir(settings), serving=lambda: not server.should_exit
        )
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


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    """A Dramatiq worker process: runs the actors sent through Redis, each queue on threads of
    its own (the tick and lease checks never wait behind scheduling passes)."""
    from backend.jobs import broker as job_broker
    from backend.jobs import runtime

    broker = job_broker.install(settings)
    runtime.configure(settings)
    workers = job_broker.start_workers(broker, threads=args.threads)
    runtime.freeze_what_started()
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
