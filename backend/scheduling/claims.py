"""Which runs of a queue compete: the ready machines each could ever use, and which of them the
runs left waiting ahead in the queue claim (issue 36: a run pinned to a pool with no machine
held up every run behind it, whatever their pool).

Two runs compete when some ready machine could take a worker of each: in its pool, running
what it asks for (processes or an image), with GPUs, cores and memory enough for one worker
once empty. A run left waiting for room, or in its restart wait without room kept for it,
claims every machine it could use. A later run may then take room only on machines no run
ahead of it claimed: a backfill that never delays a run ahead, since it takes nothing any of
them could ever use. Otherwise it is queued behind the first run ahead that claimed one.

Pure, and grouped: runs of one shape could use the same machines, computed once per shape, and
what the claims leave a shape is brought up to date from the claims made since it last looked:
each claim is looked at once per shape, however long the queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.scheduling.placement import Ask, Room

# What decides the machines a run could use (Ask fields).
Shape = tuple[str | None, bool, int, float, int]


def shape_of(ask: Ask) -> Shape:
    return (ask.pool, ask.image, ask.gpus, ask.cpu, ask.memory)


@dataclass(frozen=True)
class Ahead:
    """What the runs ahead leave a run: the first of them that claimed a machine it could use
    (None: none did), and the machines it may still take room on (all it could use when none
    was claimed)."""

    first: Ask | None
    free: frozenset[int]


class Claims:
    """The claims of the runs left waiting so far in a pass, taken in queue order."""

    def __init__(self, room: Room) -> None:
        self._room = room
        self._usable: dict[Shape, frozenset[int]] = {}
        # Each claim in queue order: the run, and the machines it was first to claim (so the
        # claims never share a machine).
        self._claims: list[tuple[Ask, frozenset[int]]] = []
        # shape -> how many claims it has seen, and what they left it
        self._seen: dict[Shape, tuple[int, Ahead]] = {}

    def usable(self, ask: Ask) -> frozenset[int]:
        """The ready machines that could ever take one worker of the ask."""
        shape = shape_of(ask)
        found = self._usable.get(shape)
        if found is None:
            found = frozenset(
                m.id
                for m in self._room.in_pool(ask.pool)
                if m.takes(ask) and m.could_ever_fit(ask.gpus, ask.cpu, ask.memory)
            )
            self._usable[shape] = found
        return found

    def ahead(self, ask: Ask) -> Ahead:
        shape = shape_of(ask)
        seen, left = self._seen.get(shape) or (0, Ahead(None, self.usable(ask)))
        if seen == len(self._claims):
            return left
        first, free = left.first, left.free
        for claimer, machines in self._claims[seen:]:
            taken = machines & free
            if taken:
                first = first or claimer
                free = free - taken
        left = Ahead(first, free)
        self._seen[shape] = (len(self._claims), left)
        return left

    def claim(self, ask: Ask) -> None:
        """The ask waits: the machines it could use that nobody ahead claimed are now its."""
        free = self.ahead(ask).free
        if free:
            self._claims.append((ask, free))
