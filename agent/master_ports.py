"""Rank 0's MASTER_PORT on this machine: bound from its START until its process starts, claimed
machine-wide until the worker is gone (agent/rendezvous.py); a port another program holds ends
the start as PORT_TAKEN, with another port held for the gang's next placement here."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from agent import rendezvous
from agent.executor import EndCause, Exit
from agent.logs import WorkerLog
from agent.start import StartSpec

log = logging.getLogger("astraeus.agent")


class Gang(Protocol):
    """What a worker says of its gang (its start's variables) and its log."""

    @property
    def worker_id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> StartSpec: ...

    @property
    def log(self) -> WorkerLog: ...


class MasterPorts:
    """The MASTER_PORTs held here: by worker id, and those offered to a gang by port."""

    def __init__(self) -> None:
        self.reserved: dict[int, rendezvous.Claim] = {}
        # Ports held for gangs whose MASTER_PORT was taken here: by port, with when the hold
        # ends (rendezvous.OFFER_SECONDS after it was offered).
        self.offers: dict[int, tuple[rendezvous.Claim, float]] = {}

    def reserve(self, worker: Gang) -> Exit | None:
        """Rank 0 of a gang holds its MASTER_PORT until it starts. A port another program
        holds ends the start as PORT_TAKEN (not the run's failure: issue 37 N3), with another
        port held for the gang's next placement here (offered_port): that end, else None."""
        port = _master_port(worker)
        if not port:
            return None
        held = self._taken_offer(port) or rendezvous.claim(port)
        if held is None:
            log.warning("MASTER_PORT %d of worker %s is held by another program", port, worker.name)
            return self._port_taken(port, None)
        self.reserved[worker.worker_id] = held
        return None

    def started(self, worker_id: int) -> None:
        """Its process binds the port now: the sockets go, the machine-wide claim stays."""
        held = self.reserved.get(worker_id)
        if held is not None:
            held.started()

    def release(self, worker_id: int) -> None:
        held = self.reserved.pop(worker_id, None)
        if held is not None:
            held.end()

    def refused(self, worker: Gang, exit: Exit, uid: int | None) -> Exit:
        """A rank 0 whose process could not listen on its MASTER_PORT, which another user than
        its own (``uid``) holds (it exited saying the address is in use, while another user
        listened there): PORT_TAKEN, as when the agent's own bind fails at its start."""
        if exit.cause != EndCause.EXITED or not exit.code:
            return exit
        port = _master_port(worker)
        if not port or not rendezvous.in_use_said(worker.log.snapshot()):
            return exit
        owners = rendezvous.listening(port)
        if not owners or (uid is not None and owners == {uid}):
            return exit
        log.warning("MASTER_PORT %d of worker %s was taken by user %s", port, worker.name, owners)
        return self._port_taken(port, exit.code)

    def expire_offers(self) -> None:
        """Ports offered that no gang came back for in time are let go."""
        for stale in [p for p, (_, until) in self.offers.items() if until < time.monotonic()]:
            self.offers.pop(stale)[0].end()

    def _port_taken(self, port: int, code: int | None) -> Exit:
        """The end of a rank 0 whose MASTER_PORT another program holds, with a port the kernel
        picked held for the gang's next placement on this machine."""
        self.expire_offers()
        offer = rendezvous.claim_free()
        offered = None
        if offer is not None:
            self.offers[offer.port] = (offer, time.monotonic() + rendezvous.OFFER_SECONDS)
            offered = offer.port
        return Exit(code, EndCause.PORT_TAKEN, detail=str(port), offered_port=offered)

    def _taken_offer(self, port: int) -> rendezvous.Claim | None:
        """The port this agent offered, now given to a gang's rank 0 here."""
        offered = self.offers.pop(port, None)
        return offered[0] if offered is not None else None


def _master_port(worker: Gang) -> int:
    """Rank 0's MASTER_PORT of a gang of two or more; 0 for any other worker."""
    environment = worker.spec.astraeus_environment
    if environment.get("RANK") != "0" or int(environment.get("WORLD_SIZE") or 1) < 2:
        return 0
    return int(environment.get("MASTER_PORT") or 0)
