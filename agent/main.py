"""``astraeus agent``: join a cluster and run the workers placed on this machine."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
from pathlib import Path

from agent.connection import Agent, AgentConfig
from agent.gpus import SIMULATED_MODEL, NvmlSampler, discover


def machine_memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=os.environ.get("ASTRAEUS_AGENT_SERVER", "127.0.0.1:8081"),
        help="host:port of Astraeus' agent endpoint",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("ASTRAEUS_AGENT_TOKEN"),
        help="the cluster's machine token (or ASTRAEUS_AGENT_TOKEN)",
    )
    parser.add_argument("--token-file", type=Path, help="read the machine token from this file")
    parser.add_argument("--name", default=socket.gethostname(), help="the machine's name")
    parser.add_argument("--pool", help="the pool the machine belongs to")
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
        choices=("process", "docker"),
        default=os.environ.get("ASTRAEUS_AGENT_EXECUTOR", "process"),
        help="run workers as process groups here, or as containers through the Docker engine",
    )
    parser.add_argument(
        "--docker-socket", default="/var/run/docker.sock", help="the Docker engine's socket"
    )


def run(args: argparse.Namespace) -> int:
    token = args.token
    if args.token_file is not None:
        token = args.token_file.read_text().strip()
    if not token:
        print(
            "astraeus agent: a machine token is required (--token, --token-file or "
            "ASTRAEUS_AGENT_TOKEN)"
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="agent %(levelname)s %(message)s")
    config = AgentConfig(
        server=args.server,
        token=token,
        machine=args.name,
        data_dir=args.data_dir,
        gpus=discover(args.simulate_gpus, args.name, args.simulate_model),
        cpu_cores=float(os.cpu_count() or 1),
        memory_bytes=machine_memory_bytes(),
        pool=args.pool,
        heartbeat_seconds=args.heartbeat,
        sample_seconds=args.sample,
        executor=args.executor,
        docker_socket=args.docker_socket,
    )
    if config.gpus and not config.gpus[0].is_simulated:
        config.nvml = NvmlSampler()
    config.data_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(Agent(config).run_forever())
    return 0
