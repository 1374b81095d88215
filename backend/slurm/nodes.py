"""A Slurm-backed cluster's nodes as its machines (issue 25): each node `sinfo` lists, in the
pool of its partition, with its GPUs and its state (ready, draining, lost) as Slurm has it."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import (
    Cluster,
    Gpu,
    Machine,
    Pool,
)
from backend.slurm import repository, rules
from backend.slurm.rules import SlurmNode


async def sync_nodes(
    session: AsyncSession, cluster: Cluster, nodes: list[SlurmNode], now: datetime
) -> dict[str, Machine]:
    """Each node a machine of the cluster (in the pool of its first partition), with its GPUs
    and Slurm's state; a node Slurm no longer lists is removed."""
    machines = await repository.machines(session, cluster.id)
    pools = await repository.pools(session, cluster.id)
    for node in nodes:
        partition = node.partitions[0] if node.partitions else None
        pool = pools.get(partition) if partition else None
        if partition and pool is None:
            pool = Pool(cluster_id=cluster.id, name=partition, created_at=now)
            repository.add(session, pool)
            await session.flush()
            pools[partition] = pool
        machine = machines.get(node.name)
        if machine is None:
            machine = Machine(
                cluster_id=cluster.id, name=node.name, created_at=now, labels={}, executor="slurm"
            )
            repository.add(session, machine)
            machines[node.name] = machine
        state, reason = rules.machine_state(node)
        machine.pool_id = pool.id if pool else None
        machine.cpu_cores, machine.memory_bytes = node.cpus, node.memory_bytes
        machine.state, machine.reason, machine.last_seen_at = state, reason, now
        machine.labels = {"slurm_partitions": list(node.partitions)}
    listed = {n.name for n in nodes}
    for name, machine in machines.items():
        if name not in listed and machine.state != "removed":
            machine.state, machine.reason = "removed", "Slurm no longer lists this node"
    await session.flush()
    gpus = await repository.gpus_of(session, [m.id for m in machines.values()])
    for node in nodes:
        machine = machines[node.name]
        have = {g.index: g for g in gpus[machine.id]}
        for index in range(node.gpus):
            gpu = have.pop(index, None)
            if gpu is None:
                gpu = Gpu(machine_id=machine.id, index=index, uuid=f"slurm:{node.name}:{index}")
                repository.add(session, gpu)
            if gpu.uuid.startswith("slurm:"):  # else the node's agent named it (NVML's own)
                gpu.model = node.gpu_model
        await repository.delete(session, *have.values())
    return machines
