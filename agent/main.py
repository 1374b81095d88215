"""``astraeus agent``: join a cluster and run the workers placed on this machine."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys

from agent import instance, uid_handover
from agent.config import CREDENTIAL_FILE, AgentConfig
from agent.connection import Agent, until_stopped
from agent.gpus import NvmlSampler, discover
from agent.identity import WorkloadUsers
from agent.transport import Transport, TransportRefused


def machine_memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def transport(args: argparse.Namespace) -> Transport:
    return Transport(
        ca_file=args.ca_file,
        client_cert=args.client_cert,
        client_key=args.client_key,
        server_name=args.tls_server_name,
        tls=args.tls,
        insecure=args.insecure,
    )


def run(args: argparse.Namespace) -> int:
    token = args.token
    if args.token_file is not None and args.token_file.exists():
        token = args.token_file.read_text().strip()
    # The join token is needed once: then the machine's own credential is in its data folder.
    if not token and not (args.data_dir / CREDENTIAL_FILE).exists():
        print(
            "astraeus agent: a join token is required (--token, --token-file or "
            "ASTRAEUS_AGENT_TOKEN) until the machine has joined"
        )
        return 2
    tls = transport(args)
    try:
        tls.credentials(args.server)  # refused here, before any connection carries the token
    except TransportRefused as refused:
        print(refused, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="agent %(levelname)s %(message)s")
    config = AgentConfig(
        server=args.server,
        token=token or "",
        machine=args.name,
        data_dir=args.data_dir,
        gpus=discover(args.simulate_gpus, args.name, args.simulate_model),
        cpu_cores=float(os.cpu_count() or 1),
        memory_bytes=machine_memory_bytes(),
        pool=args.pool,
        advertise_address=args.advertise_address,
        heartbeat_seconds=args.heartbeat,
        sample_seconds=args.sample,
        executor=args.executor,
        slurm_conf=args.slurm_conf,
        slurm_bin=args.slurm_bin,
        docker_socket=args.docker_socket,
        users=WorkloadUsers(
            allowed=frozenset(args.allow_user) - {"root"},
            uids=args.workload_uids,
            gid_base=args.workload_gid_base,
        ),
        workload_pids_max=max(0, args.workload_pids_max),
        fill_roots=tuple(p.resolve() for p in args.fill_from_root),
        mount_roots=tuple(p.resolve() for p in args.mount_root),
        transport=tls,
    )
    if config.gpus and not config.gpus[0].is_simulated:
        config.nvml = NvmlSampler()
    config.data_dir.mkdir(parents=True, exist_ok=True)
    instance.claim(config.data_dir)  # held until this process ends, however it ends
    if config.users.switch and config.executor != "slurm":
        # Its workloads' user ids, machine-wide: held until this process ends (issue 37 N9).
        uid_handover.claim_range(config.users.uids, config.data_dir)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(until_stopped(Agent(config)))
    return 0
