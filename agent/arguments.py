"""`astraeus agent`'s command line: its options, read before anything of the agent is loaded.

`astraeus` builds every subcommand's options at each start (backend/cli/server.py): these import
only the constants they show, not the agent's connection, executors and engine (0.17 s of CPU
an admin command such as `astraeus token create` spent loading them, issue 39)."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from agent.gpus import SIMULATED_MODEL
from agent.identity import GID_BASE
from agent.sandbox import PIDS_MAX


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=os.environ.get("ASTRAEUS_AGENT_SERVER", "127.0.0.1:8081"),
        help="host:port of Astraeus' agent endpoint",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("ASTRAEUS_AGENT_TOKEN"),
        help="a join token of the cluster (or ASTRAEUS_AGENT_TOKEN), exchanged once for the "
        "machine's own credential, kept in the data folder",
    )
    parser.add_argument("--token-file", type=Path, help="read the join token from this file")
    add_transport_arguments(parser)
    parser.add_argument("--name", default=socket.gethostname(), help="the machine's name")
    parser.add_argument("--pool", help="the pool the machine belongs to")
    parser.add_argument(
        "--advertise-address",
        default=os.environ.get("ASTRAEUS_AGENT_ADVERTISE_ADDRESS", ""),
        metavar="ADDRESS",
        help="the IP address or host name other machines reach this one at: a gang whose rank "
        "0 runs here is told it as MASTER_ADDR (default: the local address of the connection "
        "to the server)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(
            os.environ.get("ASTRAEUS_AGENT_DATA_DIR", Path.home() / ".local/share/astraeus-agent")
        ),
    )
    parser.add_argument(
        "--simulate-gpus",
        type=int,
        default=0,
        help="without NVIDIA GPUs, present this many simulated ones",
    )
    parser.add_argument(
        "--simulate-model",
        default=SIMULATED_MODEL,
        help=f"the model simulated GPUs report ({SIMULATED_MODEL!r}), to rehearse a cluster's",
    )
    parser.add_argument("--heartbeat", type=float, default=10.0, help="seconds between heartbeats")
    parser.add_argument(
        "--sample", type=float, default=5.0, help="seconds between samples of the workers"
    )
    parser.add_argument(
        "--executor",
        choices=("process", "docker", "slurm"),
        default=os.environ.get("ASTRAEUS_AGENT_EXECUTOR", "process"),
        help="run workers as process groups here, or as containers through the Docker engine; "
        "slurm: on a node of a cluster Slurm runs, run none and watch the jobs Slurm runs here "
        "(--name must be the node's name in Slurm)",
    )
    parser.add_argument(
        "--slurm-conf",
        default=_text("ASTRAEUS_AGENT_SLURM_CONF"),
        help="with --executor slurm: the slurm.conf Slurm's commands read (default: Slurm's own)",
    )
    parser.add_argument(
        "--slurm-bin",
        default=_text("ASTRAEUS_AGENT_SLURM_BIN"),
        help="with --executor slurm: the folder of scontrol (default: the PATH)",
    )
    parser.add_argument(
        "--docker-socket", default="/var/run/docker.sock", help="the Docker engine's socket"
    )
    parser.add_argument(
        "--allow-user",
        action="append",
        default=_listed("ASTRAEUS_AGENT_ALLOWED_USERS", ","),
        metavar="NAME",
        help="a user of this machine a run's spec may ask to run as (repeatable; root never); "
        "other workloads run as a user id of their own (--workload-uids)",
    )
    parser.add_argument(
        "--workload-uids",
        type=_id_range,
        default=_id_range(os.environ.get("ASTRAEUS_AGENT_WORKLOAD_UIDS", "2000000-2065535")),
        metavar="FIRST-LAST",
        help="user ids the agent gives workloads, one per worker (none in /etc/passwd needed)",
    )
    parser.add_argument(
        "--workload-pids-max",
        type=int,
        default=int(os.environ.get("ASTRAEUS_AGENT_WORKLOAD_PIDS_MAX", PIDS_MAX)),
        metavar="N",
        help=f"the most processes and threads one worker may have together (its control "
        f"group's pids.max, a container's --pids-limit; default {PIDS_MAX}; 0: no limit)",
    )
    parser.add_argument(
        "--workload-gid-base",
        type=int,
        default=int(os.environ.get("ASTRAEUS_AGENT_WORKLOAD_GID_BASE", GID_BASE)),
        help="a workspace's workers share the group this plus its id (its drives' group)",
    )
    parser.add_argument(
        "--fill-from-root",
        action="append",
        type=Path,
        default=[Path(p) for p in _listed("ASTRAEUS_AGENT_FILL_FROM_ROOTS", ":")],
        metavar="FOLDER",
        help="a folder drives may be filled from (fill_from), with what is under it; none by "
        "default: fill_from is refused",
    )
    parser.add_argument(
        "--mount-root",
        action="append",
        type=Path,
        default=[Path(p) for p in _listed("ASTRAEUS_AGENT_MOUNT_ROOTS", ":")],
        metavar="FOLDER",
        help="a folder mount paths may be linked under; none by default: only relative paths "
        "(under the worker's own folder)",
    )


def add_transport_arguments(parser: argparse.ArgumentParser) -> None:
    """TLS to the server (agent/transport.py): plaintext only to loopback or with --insecure."""
    parser.add_argument(
        "--ca-file",
        type=Path,
        default=_path("ASTRAEUS_AGENT_CA_FILE"),
        help="verify the server's certificate with this CA (PEM); implies TLS",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=_flag("ASTRAEUS_AGENT_TLS"),
        help="connect over TLS, verifying the server with the system's CAs",
    )
    parser.add_argument(
        "--client-cert",
        type=Path,
        default=_path("ASTRAEUS_AGENT_CLIENT_CERT"),
        help="present this certificate (PEM) to a server that asks for one; with --client-key",
    )
    parser.add_argument(
        "--client-key",
        type=Path,
        default=_path("ASTRAEUS_AGENT_CLIENT_KEY"),
        help="the client certificate's private key (PEM)",
    )
    parser.add_argument(
        "--tls-server-name",
        default=_text("ASTRAEUS_AGENT_TLS_SERVER_NAME"),
        help="the name the server's certificate carries, when --server names it otherwise",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=_flag("ASTRAEUS_AGENT_INSECURE"),
        help="allow plaintext to a server that is not on a loopback address (the machine token "
        "crosses the network in clear: only on a network you trust)",
    )


def _text(variable: str) -> str | None:
    return os.environ.get(variable) or None


def _path(variable: str) -> Path | None:
    value = _text(variable)
    return Path(value) if value else None


def _flag(variable: str) -> bool:
    return os.environ.get(variable, "").strip().lower() in {"1", "true", "yes", "on"}


def _listed(variable: str, separator: str) -> list[str]:
    return [item for item in os.environ.get(variable, "").split(separator) if item]


def _id_range(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    try:
        low, high = int(first), int(last)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a range such as 2000000-2065535"
        ) from None
    if not 0 < low <= high:
        raise argparse.ArgumentTypeError(f"{text!r} must be FIRST-LAST with 0 < FIRST <= LAST")
    return low, high
