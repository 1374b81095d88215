"""What the server asks a worker to be: the protocol's StartWorker, read once into a frozen
value (``StartSpec.of``) that the agent's parts and its executors (ProcessWorker,
ContainerWorker) read by name, and that a worker's folder keeps as payload.json (``to_json``,
``from_json``: the same keys as ever, so a worker kept by an earlier agent is taken back)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from astraeus.agent.v1 import agent_pb2

NONE: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Mount:
    """A drive mounted in the worker: its folder of this machine linked (or bound) at
    ``path``; filled from ``fill_from`` first, once, where given."""

    drive: str
    path: str
    fill_from: str | None = None
    read_only: bool = False


@dataclass(frozen=True)
class Credential:
    """A secret the worker is given: as the variable ``env``, as the file ``file``, or both."""

    secret: str
    env: str | None = None
    file: str | None = None


@dataclass(frozen=True)
class StartSpec:
    """A worker's start (see the proto's StartWorker); ``uid``: the user id of the agent's
    range it runs as, chosen here (agent/workers.py), never sent by the server."""

    worker: str = ""
    run: str = ""
    rank: int = 0
    attempt: int = 0
    workspace_id: int = 0
    image: str | None = None
    command: tuple[str, ...] = ()
    user: str | None = None
    working_dir: str | None = None
    environment: Mapping[str, str] = field(default_factory=lambda: NONE)
    astraeus_environment: Mapping[str, str] = field(default_factory=lambda: NONE)
    mounts: tuple[Mount, ...] = ()
    credentials: tuple[Credential, ...] = ()
    cpu: float | None = None
    cpu_request: float | None = None
    memory_limit_bytes: int | None = None
    gpu_ids: tuple[int, ...] = ()
    # The gang's machines: only they reach rank 0's MASTER_PORT (agent/network.py).
    gang_addresses: tuple[str, ...] = ()
    # Names it on this machine (agent/identity.py local_name); None where a server sends none.
    worker_key: str | None = None
    # The code its run ships with (sha256:…, issue 41): fetched and unpacked while it prepares.
    code: str | None = None
    uid: int | None = None

    @classmethod
    def of(cls, start: agent_pb2.StartWorker) -> StartSpec:
        return cls(
            worker=start.worker,
            run=start.run,
            rank=start.rank,
            attempt=start.attempt,
            workspace_id=start.workspace_id,
            image=start.image or None,
            command=tuple(start.command),
            user=start.user or None,
            working_dir=start.working_dir or None,
            environment=MappingProxyType(dict(start.environment)),
            astraeus_environment=MappingProxyType(dict(start.astraeus_environment)),
            mounts=tuple(
                Mount(m.drive, m.path, m.fill_from or None, m.read_only) for m in start.mounts
            ),
            credentials=tuple(
                Credential(c.secret, c.env or None, c.file or None) for c in start.credentials
            ),
            cpu=start.cpu if start.HasField("cpu") else None,
            cpu_request=start.cpu_request if start.HasField("cpu_request") else None,
            memory_limit_bytes=(
                start.memory_limit_bytes if start.HasField("memory_limit_bytes") else None
            ),
            gpu_ids=tuple(start.gpu_ids),
            gang_addresses=tuple(start.gang_addresses),
            worker_key=start.worker_key or None,
            code=start.code or None,
        )

    def with_uid(self, uid: int) -> StartSpec:
        return dataclasses.replace(self, uid=uid)

    def to_json(self) -> dict[str, Any]:
        """As payload.json keeps it."""
        kept: dict[str, Any] = {
            "worker": self.worker,
            "run": self.run,
            "rank": self.rank,
            "attempt": self.attempt,
            "workspace_id": self.workspace_id,
            "image": self.image,
            "command": list(self.command),
            "user": self.user,
            "working_dir": self.working_dir,
            "environment": dict(self.environment),
            "astraeus_environment": dict(self.astraeus_environment),
            "mounts": [dataclasses.asdict(m) for m in self.mounts],
            "credentials": [dataclasses.asdict(c) for c in self.credentials],
            "cpu": self.cpu,
            "cpu_request": self.cpu_request,
            "memory_limit_bytes": self.memory_limit_bytes,
            "gpu_ids": list(self.gpu_ids),
            "gang_addresses": list(self.gang_addresses),
        }
        if self.worker_key:
            kept["worker_key"] = self.worker_key
        if self.code:
            kept["code"] = self.code
        if self.uid is not None:
            kept["uid"] = self.uid
        return kept

    @classmethod
    def from_json(cls, kept: Mapping[str, Any]) -> StartSpec:
        """From payload.json, as this agent or an earlier one wrote it (a key it lacks: the
        default)."""
        return cls(
            worker=str(kept.get("worker") or ""),
            run=str(kept.get("run") or ""),
            rank=int(kept.get("rank") or 0),
            attempt=int(kept.get("attempt") or 0),
            workspace_id=int(kept.get("workspace_id") or 0),
            image=_text(kept.get("image")),
            command=tuple(str(a) for a in kept.get("command") or ()),
            user=_text(kept.get("user")),
            working_dir=_text(kept.get("working_dir")),
            environment=_variables(kept.get("environment")),
            astraeus_environment=_variables(kept.get("astraeus_environment")),
            mounts=tuple(
                Mount(
                    str(m["drive"]),
                    str(m.get("path") or ""),
                    _text(m.get("fill_from")),
                    bool(m.get("read_only")),
                )
                for m in kept.get("mounts") or ()
            ),
            credentials=tuple(
                Credential(str(c["secret"]), _text(c.get("env")), _text(c.get("file")))
                for c in kept.get("credentials") or ()
            ),
            cpu=_number(kept.get("cpu")),
            cpu_request=_number(kept.get("cpu_request")),
            memory_limit_bytes=(
                int(kept["memory_limit_bytes"])
                if kept.get("memory_limit_bytes") is not None
                else None
            ),
            gpu_ids=tuple(int(g) for g in kept.get("gpu_ids") or ()),
            gang_addresses=tuple(str(a) for a in kept.get("gang_addresses") or ()),
            worker_key=_text(kept.get("worker_key")),
            code=_text(kept.get("code")),
            uid=int(kept["uid"]) if kept.get("uid") is not None else None,
        )


def _variables(found: Any) -> Mapping[str, str]:
    return MappingProxyType({str(k): str(v) for k, v in (found or {}).items()})


def _text(found: Any) -> str | None:
    return str(found) if found else None


def _number(found: Any) -> float | None:
    return float(found) if found is not None else None
