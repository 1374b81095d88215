"""A small cluster simulated in memory: random submissions, scheduling passes, agent reports,
lost and drained machines, stops, timers and time, with the lifecycle's invariants checked
after every step.

No database: the runs are ``RunView``s, the scheduler's inputs are built from them the way
``backend.scheduling.service`` builds them from rows, and every rule's ``Effects`` are read
the way ``backend.lifecycle.service.persist`` reads them.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from backend.config import format_duration
from backend.lifecycle import endings, progress, rules, sentences, starting, stops
from backend.lifecycle.sentences import (
    End,
    EndCause,
    budget_exhausted_sentence,
    restart_backoff,
    time_limit_sentence,
)
from backend.lifecycle.states import (
    COMPLETED,
    ENDED_STATES,
    FAILED,
    HELD_PHASES,
    PENDING,
    PREPARING,
    PULLING,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
)
from backend.lifecycle.views import Effects, Placement, RunPolicy, RunView, Transition, WorkerView
from backend.scheduling.placement import Ask, Held, Holder, MachineRoom
from backend.scheduling.rules import plan

T0 = datetime(2026, 10, 1, 1, 2, 11, tzinfo=UTC)
WORKSPACE = 1
PICK = st.integers(min_value=0, max_value=2**16)
BARRIER = timedelta(minutes=15)  # a gang not all ready after this is requeued

# -- the moves a worker may make, written out -----------------------------------------------------

WAITING = "waiting"
ENDED = "ended"
REQUEUED = frozenset({"requeued:failure", "requeued:preemption", "requeued:stall"})
STOPPING_PHASES = frozenset(
    {
        "stopping:owner",
        "stopping:time_limit",
        "stopping:preemption",
        "stopping:stall",
        "stopping:failure",
    }
)
BOOTING = frozenset({STARTING, PREPARING, PULLING})
BOOT_PHASES = frozenset({"starting", "restart"})

# The phases a worker may be in, by state.
PHASES = {
    PENDING: REQUEUED | {WAITING},
    STARTING: BOOT_PHASES,
    PREPARING: BOOT_PHASES,
    PULLING: BOOT_PHASES,
    RUNNING: frozenset({"running", "stalled"}),
    STOPPING: STOPPING_PHASES,
    STOPPED: REQUEUED | {ENDED},
    FAILED: REQUEUED | {ENDED},
    COMPLETED: frozenset({ENDED}),
}

# state -> the states it may move to (a same-state entry: only its phase changes).
WORKER_MOVES = {
    PENDING: {STARTING, STOPPED},  # placed; or the run ends while it waits
    STARTING: {PREPARING, PULLING, RUNNING, STOPPING, COMPLETED, FAILED},
    PREPARING: {PULLING, STARTING, RUNNING, STOPPING, COMPLETED, FAILED},
    PULLING: {PREPARING, STARTING, RUNNING, STOPPING, COMPLETED, FAILED},
    RUNNING: {RUNNING, STOPPING, COMPLETED, FAILED},  # running <-> stalled
    STOPPING: {STOPPED, FAILED},  # Failed: it had failed before the gang's failure
    STOPPED: {STOPPED, PENDING},  # requeued -> ended when the run ends after all; requeued
    FAILED: {FAILED, PENDING},
    COMPLETED: {PENDING},  # its gang restarts after another worker failed
}


def worker_move_ok(before: tuple[str, str], after: tuple[str, str]) -> bool:
    (s0, p0), (s1, p1) = before, after
    if p1 not in PHASES[s1] or p1 == WAITING or s1 not in WORKER_MOVES[s0]:
        return False
    if (s0, p0) == (s1, p1):
        return False  # nothing changed: never recorded
    if s0 == s1:
        if s0 == RUNNING:
            return {p0, p1} == {"running", "stalled"}
        return p0 in REQUEUED and p1 == ENDED
    if s0 == PENDING:
        if s1 == STARTING:  # the first placement starts, a later one restarts
            return p1 == ("starting" if p0 == WAITING else "restart")
        return p1 == ENDED
    if s0 in BOOTING and s1 in BOOTING:
        return p0 == p1  # preparing, pulling, ready: the same attempt's phase
    if s1 == RUNNING:
        return p1 == "running"
    if s1 == PENDING:
        # Queued again: a worker that stopped or failed waits in the phase it stopped in; one
        # that had completed starts over with its gang. An ended phase is never undone.
        return (s0 == COMPLETED and p1 in REQUEUED) or (p0 in REQUEUED and p1 == p0)
    return True


# A run's states and where each may go.
RUN_MOVES = {
    PENDING: {STARTING, FAILED, STOPPED},
    STARTING: {PREPARING, PULLING, RUNNING, PENDING, COMPLETED, FAILED, STOPPED},
    PREPARING: {PULLING, STARTING, RUNNING, PENDING, COMPLETED, FAILED, STOPPED},
    PULLING: {PREPARING, STARTING, RUNNING, PENDING, COMPLETED, FAILED, STOPPED},
    RUNNING: {PENDING, COMPLETED, FAILED, STOPPED},
}

EXITS = [
    End(EndCause.EXITED, 0),
    End(EndCause.EXITED, 1),
    End(EndCause.SIGNALLED, 137, signal=9),
    End(EndCause.OOM_KILLED, 137),
    End(EndCause.EXITED, 143),
    End(EndCause.IMAGE_PULL, detail="pull access denied for llama:latest"),
    End(EndCause.NOT_STARTED, detail="Waiting for drive data: it is not reachable"),
]


@dataclass(frozen=True)
class RunSpec:
    workers: int
    gpus: int
    priority: int
    policy: RunPolicy


RUN_SPECS = st.builds(
    RunSpec,
    workers=st.integers(1, 3),
    gpus=st.integers(0, 4),
    priority=st.sampled_from([0, 10, 50, 90]),
    policy=st.builds(
        RunPolicy,
        restart_policy=st.sampled_from(["on_failure", "never"]),
        max_restarts=st.integers(0, 3),
        time_limit=st.sampled_from([None, timedelta(minutes=10), timedelta(hours=1)]),
        stall_timeout=st.sampled_from([None, timedelta(minutes=5), timedelta(minutes=30)]),
        on_stall=st.sampled_from(["restart", "keep"]),
    ),
)


@dataclass
class Machine:
    id: int
    name: str
    gpus: int
    state: str = "ready"  # ready | draining | lost


@dataclass
class Agent:
    """What a machine's agent knows of one worker it was told to start."""

    attempt: int
    stage: str = "preparing"  # preparing | ready | running
    released: bool = False
    stopping: bool = False  # told to stop: it ends the container, then says so
    last: str | None = None  # its last report, which a reconnect may deliver again


@dataclass
class Meta:
    priority: int
    created_at: datetime
    gpus: int
    places: int = 0
    # Times it was queued again after a placement: its restarts, counted when decided.
    requeues: int = 0


class Cluster(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.machines: dict[int, Machine] = {}
        self.runs: dict[int, RunView] = {}
        self.meta: dict[int, Meta] = {}
        # worker id -> its recorded (state, phase, at), from submission
        self.history: dict[int, list[tuple[str, str, datetime]]] = {}
        self.run_history: dict[int, list[tuple[str, str, datetime]]] = {}
        self.agents: dict[int, Agent] = {}
        self.progress: dict[int, datetime] = {}  # worker id -> its last progress we reported
        self.ended: dict[int, tuple[str, str, datetime | None]] = {}
        self.next_worker = 1
        self.next_port = 29500

    # -- helpers -----------------------------------------------------------------------------

    def live_runs(self) -> list[RunView]:
        return [r for r in self.runs.values() if not r.ended]

    def alive_workers(self) -> list[tuple[RunView, WorkerView]]:
        return [(r, w) for r in self.runs.values() for w in r.workers if w.alive]

    def agent_workers(self, stages: set[str]) -> list[tuple[RunView, WorkerView, Agent]]:
        out = []
        for r, w in self.alive_workers():
            a = self.agents.get(w.id)
            if a is not None and a.stage in stages:
                out.append((r, w, a))
        return out

    def apply(
        self, run: RunView, step: str, stopping: set[str], call: Callable[[Effects], None]
    ) -> Effects:
        """Run one rule on one gang and check what it recorded, as ``persist`` would write it."""
        was_ended = run.ended
        before_failures = run.failures_in_row
        fx = Effects()
        call(fx)
        self.record(run, fx, step, stopping, was_ended, before_failures)
        return fx

    def record(
        self,
        run: RunView,
        fx: Effects,
        step: str,
        stopping: set[str],
        was_ended: bool,
        before_failures: int,
    ) -> None:
        workers = {w.id: w for w in run.workers}
        if was_ended:
            assert fx.transitions == [], f"{step}: an ended run changed: {fx.transitions}"
            assert fx.commands == [], f"{step}: an ended run sent commands: {fx.commands}"
        for t in fx.transitions:
            assert t.run_id == run.id
            if t.worker_id is None:
                self.record_run(run, t, step)
            else:
                self.record_worker(run, workers[t.worker_id], t, step, stopping)
        for c in fx.commands:
            w = workers[c.worker_id]  # type: ignore[index]
            if c.kind == "start":
                assert c.machine_id == w.machine_id
                assert c.payload["attempt"] == run.attempt == w.attempt
                assert c.payload["gpu_ids"] == w.gpu_ids
                self.agents[w.id] = Agent(attempt=run.attempt)
            elif c.kind == "release":
                assert c.payload["attempt"] == run.attempt
                assert all(x.ready and x.alive for x in run.workers), "released before all ready"
                agent = self.agents.get(w.id)
                if agent is not None and agent.attempt == run.attempt:
                    assert not agent.released, f"{w.name} released twice"
                    agent.released = True
            elif c.kind == "stop":
                # Asked to stop in this very step (it may have gone since, with its machine).
                assert any(
                    t.worker_id == w.id and t.state == STOPPING and t.machine_id == c.machine_id
                    for t in fx.transitions
                ), c
                agent = self.agents.get(w.id)
                if agent is not None:
                    agent.stopping = True
            else:
                raise AssertionError(f"unexpected command {c}")
        # Pending again: after a failure or stall with its backoff counted; else for free.
        if run.state == PENDING and any(
            t.worker_id is None and t.state == PENDING for t in fx.transitions
        ):
            if run.reason.startswith("Restarting in "):
                assert run.failures_in_row >= 1
                assert run.restart_at == self.now + restart_backoff(run.failures_in_row)
                assert run.reason.startswith(
                    f"Restarting in {format_duration(restart_backoff(run.failures_in_row))} "
                    f"({run.failures_in_row}/{run.policy.max_restarts}): "
                )
            else:
                assert run.restart_at is None
                assert run.failures_in_row == before_failures, "a free requeue counted a failure"
        # Agents forget workers that are gone or started again.
        for w in run.workers:
            agent = self.agents.get(w.id)
            if agent is not None and (not w.alive or agent.attempt != w.attempt):
                del self.agents[w.id]

    def record_run(self, run: RunView, t: Transition, step: str) -> None:
        assert t.at == self.now, f"{step}: run transition dated {t.at}, now {self.now}"
        assert t.phase is None and t.held_gpus == 0
        history = self.run_history[run.id]
        prev = history[-1][0]
        assert prev not in ENDED_STATES, f"{step}: ended run {run.name} moved to {t.state}"
        assert t.state in RUN_MOVES[prev], f"{step}: run {run.name} moved {prev} -> {t.state}"
        if t.state == RUNNING:
            assert all(w.state == RUNNING for w in run.workers), "Running before all its workers"
        if t.state == COMPLETED:
            assert all(w.state == COMPLETED for w in run.workers)
        if t.state == PENDING and prev != PENDING:
            self.meta[run.id].requeues += 1
        history.append((t.state, t.reason, t.at))
        event(f"run -> {t.state}: {re.sub(r'[0-9]+', 'N', t.reason)[:40]}")

    def record_worker(
        self, run: RunView, w: WorkerView, t: Transition, step: str, stopping: set[str]
    ) -> None:
        history = self.history[w.id]
        s0, p0, at0 = history[-1]
        assert t.phase is not None
        assert worker_move_ok((s0, p0), (t.state, t.phase)), (
            f"{step}: {w.name} moved ({s0}, {p0}) -> ({t.state}, {t.phase}); "
            f"history {[h[:2] for h in history]}"
        )
        # (d) what it holds
        assert t.gpus == w.gpus
        assert t.held_gpus == (w.gpus if t.phase in HELD_PHASES else 0), t
        assert (t.machine_id is not None) == (t.phase in HELD_PHASES), t
        # (e) times: now, but a stall is dated at the last progress; never earlier than before
        if t.phase == "stalled":
            # Stalled from its last progress, and only once the stall timeout has passed (a
            # gang member stopped with the one that stalled: half of it, rules.STALLED_WITH_GANG)
            timeout = run.policy.stall_timeout
            assert timeout is not None and t.at == self.progress[w.id] == w.progress_at, t
            if t.reason.startswith("Stalled with its gang"):
                timeout = timeout * rules.STALLED_WITH_GANG
            assert self.now - t.at >= timeout, (t, self.now)
        else:
            assert t.at == self.now, f"{step}: {w.name} transition dated {t.at}, now {self.now}"
        assert t.at >= at0, f"{step}: {w.name} went back in time: {at0} -> {t.at}"
        if t.state == STOPPING:
            assert t.phase in stopping, f"{step}: {w.name} stopping as {t.phase}"
        if t.phase == "stopping:time_limit":
            limit = run.policy.time_limit
            assert limit is not None and run.started_at is not None
            assert self.now >= run.started_at + limit
        if t.phase in BOOT_PHASES:
            assert t.phase == ("starting" if w.attempt == 1 else "restart")
        history.append((t.state, t.phase, t.at))
        event(f"worker {s0}/{p0} -> {t.state}/{t.phase}")

    # -- the cluster ---------------------------------------------------------------------------

    @initialize(
        gpus=st.lists(st.integers(1, 8), min_size=2, max_size=4),
        specs=st.lists(RUN_SPECS, min_size=1, max_size=3),
    )
    def a_cluster_with_work(self, gpus: list[int], specs: list[RunSpec]) -> None:
        for i, n in enumerate(gpus, start=1):
            self.machines[i] = Machine(i, f"gpu-{i:02d}", n)
        for spec in specs:
            self.submit(spec)

    @precondition(lambda self: len(self.runs) < 6)
    @rule(spec=RUN_SPECS)
    def submit(self, spec: RunSpec) -> None:
        run_id = len(self.runs) + 1
        name = f"run-{run_id}"
        views = []
        for rank in range(spec.workers):
            wid = self.next_worker
            self.next_worker += 1
            views.append(
                WorkerView(
                    id=wid,
                    rank=rank,
                    name=f"{name}-{rank}",
                    gpus=spec.gpus,
                    state=PENDING,
                    reason=sentences.WAITING_FOR_ROOM,
                    phase=WAITING,
                )
            )
            self.history[wid] = [(PENDING, WAITING, self.now)]
        self.runs[run_id] = RunView(run_id, name, PENDING, "Run created", spec.policy, views)
        self.meta[run_id] = Meta(spec.priority, self.now, spec.gpus)
        self.run_history[run_id] = [(PENDING, "Run created", self.now)]

    @rule()
    def schedule(self) -> None:
        """One pass, built like ``scheduling.service.schedule`` builds it from rows."""
        placed = [(w, r) for r in self.runs.values() for w in r.workers if w.machine_id]
        held: dict[int, set[int]] = defaultdict(set)
        for w, _ in placed:
            assert w.machine_id is not None
            held[w.machine_id].update(w.gpu_ids)
        rooms = [
            MachineRoom(
                id=m.id,
                name=m.name,
                pool=None,
                state=m.state,
                cpu_total=64.0,
                memory_total=2**40,
                healthy_gpus=m.gpus,
                free_gpus=[i for i in range(m.gpus) if i not in held[m.id]],
                cpu_free=64.0 - sum(1.0 for w, _ in placed if w.machine_id == m.id),
                memory_free=2**40,
            )
            for m in sorted(self.machines.values(), key=lambda m: m.name)
        ]
        holders = []
        used = 0
        for run in self.runs.values():
            mine = [w for w in run.workers if w.machine_id]
            if not mine:
                continue
            gpus = sum(len(w.gpu_ids) for w in mine)
            used += gpus
            since = run.placed_at or self.now
            holders.append(
                Holder(
                    run_id=run.id,
                    name=run.name,
                    priority=self.meta[run.id].priority,
                    workspace_id=WORKSPACE,
                    held=tuple(Held(w.machine_id, tuple(w.gpu_ids), 1.0, 0) for w in mine),  # type: ignore[arg-type]
                    cost=gpus * max((self.now - since).total_seconds(), 0.0),
                    stopping=run.stop_cause is not None,
                )
            )
        asks = [
            Ask(
                run_id=r.id,
                name=r.name,
                workspace_id=WORKSPACE,
                workspace="default",
                priority=self.meta[r.id].priority,
                queued_at=self.meta[r.id].created_at,
                workers=len(r.workers),
                gpus=self.meta[r.id].gpus,
                cpu=1.0,
                memory=0,
                restart_at=r.restart_at,
            )
            for r in self.runs.values()
            if r.state == PENDING
        ]
        decided = plan(asks, rooms, holders, {}, {WORKSPACE: used}, self.now, cluster="local")
        for run_id in sorted(decided.preemptions):
            run = self.runs[run_id]
            assert run.placed and run.stop_cause is None
            by = decided.preemptions[run_id]
            self.apply(
                run,
                "preempt",
                {"stopping:preemption"},
                lambda fx, run=run, by=by: stops.preempt(run, by, self.now, fx),
            )
        for run_id in sorted(decided.placements):
            run = self.runs[run_id]
            placements = decided.placements[run_id]
            assert run.state == PENDING and not run.placed
            assert run.restart_at is None or run.restart_at <= self.now
            for p in placements:
                assert self.machines[p.machine_id].state == "ready"
                assert len(p.gpu_ids) == self.meta[run_id].gpus
            port = self.next_port
            self.next_port += 1
            self.apply(
                run,
                "place",
                set(),
                lambda fx, run=run, ps=placements, port=port: starting.place(
                    run, ps, self.now, fx, master_port=port, start_payload={}
                ),
            )
            self.meta[run_id].places += 1
            assert all(w.alive for w in run.workers)
        for run_id, reason in decided.reasons.items():
            if self.runs[run_id].state == PENDING:
                self.runs[run_id].reason = reason

    # -- what the agents report ----------------------------------------------------------------

    def agent_step(self, run: RunView, w: WorkerView, agent: Agent, kind: str) -> None:
        """What an honest agent may say next: preparing or pulling, then ready at the barrier,
        running once released, then progress; told to stop, that it exited."""
        if agent.stopping and kind == "next":
            self.apply(
                run,
                f"stopped {w.name}",
                set(),
                lambda fx: endings.worker_exited(
                    run, w, self.now, fx, End(EndCause.EXITED, 143), attempt=agent.attempt
                ),
            )
            assert not w.alive
        elif agent.stage == "preparing" and kind in (PREPARING, PULLING, STARTING):
            agent.last = kind
            self.apply(
                run,
                f"{kind} {w.name}",
                set(),
                lambda fx: starting.worker_preparing(
                    run, w, kind, f"{kind} …", self.now, fx, attempt=agent.attempt
                ),
            )
        elif agent.stage == "preparing":
            agent.stage = agent.last = "ready"
            self.apply(
                run,
                f"ready {w.name}",
                set(),
                lambda fx: starting.worker_ready(run, w, self.now, fx, attempt=agent.attempt),
            )
        elif agent.stage == "ready" and agent.released:
            agent.stage = agent.last = "running"
            self.apply(
                run,
                f"running {w.name}",
                set(),
                lambda fx: starting.worker_running(run, w, self.now, fx, attempt=agent.attempt),
            )
            if w.stop_cause is None:
                assert (w.state, w.phase, w.progress_at) == (RUNNING, "running", self.now)
                self.progress[w.id] = self.now
        elif agent.stage == "running":
            self.apply(
                run,
                f"progress {w.name}",
                set(),
                lambda fx: progress.worker_progress(run, w, self.now, fx),
            )
            if w.stop_cause is None:
                assert w.progress_at == self.now and w.stalled_since is None
                assert (w.state, w.phase) == (RUNNING, "running")
                self.progress[w.id] = self.now

    @precondition(lambda self: self.agents)
    @rule(
        pick=PICK,
        kind=st.sampled_from([PREPARING, PULLING, STARTING, "next", "next", "next", "exit"]),
        exit=st.sampled_from(EXITS),
    )
    def agent_reports(self, pick: int, kind: str, exit: tuple[int | None, str | None]) -> None:
        """One worker's agent says what it may say next, or that the worker exited."""
        cands = self.agent_workers({"preparing", "ready", "running"})
        run, w, agent = cands[pick % len(cands)]
        if kind != "exit":
            self.agent_step(run, w, agent, kind)
            return
        self.apply(
            run,
            f"exited {w.name} {exit}",
            {"stopping:failure"},
            lambda fx: endings.worker_exited(run, w, self.now, fx, exit, attempt=agent.attempt),
        )
        assert not w.alive and w.machine_id is None and w.gpu_ids == []
        assert w.exit_code == exit.exit_code

    @precondition(lambda self: self.agents)
    @rule()
    def every_agent_reports(self) -> None:
        """Every agent moves on (no progress reports: those come one at a time)."""
        for run, w, agent in self.agent_workers({"preparing", "ready", "running"}):
            if not (w.alive and self.agents.get(w.id) is agent):
                continue  # gone with its gang while the others reported
            if agent.stage != "running" or agent.stopping:
                self.agent_step(run, w, agent, "next")

    @precondition(lambda self: any(a.last for a in self.agents.values()))
    @rule(pick=PICK)
    def agent_delivers_its_last_report_again(self, pick: int) -> None:
        """After a reconnect the agent sends its last report again: nothing changes."""
        cands = [c for c in self.agent_workers({"preparing", "ready", "running"}) if c[2].last]
        run, w, agent = cands[pick % len(cands)]
        kind, attempt = agent.last, agent.attempt
        before = (run.state, [(x.state, x.phase, x.ready) for x in run.workers])

        def call(fx: Effects) -> None:
            if kind == "ready":
                starting.worker_ready(run, w, self.now, fx, attempt=attempt)
            elif kind == "running":
                starting.worker_running(run, w, self.now, fx, attempt=attempt)
            else:
                assert kind is not None
                starting.worker_preparing(run, w, kind, f"{kind} …", self.now, fx, attempt=attempt)

        fx = self.apply(run, f"again {kind} {w.name}", set(), call)
        assert fx.transitions == [] and fx.commands == [], fx
        assert (run.state, [(x.state, x.phase, x.ready) for x in run.workers]) == before

    @precondition(lambda self: any(w.attempt > 1 for _, w in self.alive_workers()))
    @rule(pick=PICK, kind=st.sampled_from(["preparing", "ready", "running", "exited"]))
    def report_from_an_earlier_attempt(self, pick: int, kind: str) -> None:
        cands = [(r, w) for r, w in self.alive_workers() if w.attempt > 1]
        run, w = cands[pick % len(cands)]
        old = w.attempt - 1
        before = (run.state, run.reason, [(x.state, x.phase, x.ready) for x in run.workers])

        def call(fx: Effects) -> None:
            if kind == "preparing":
                starting.worker_preparing(run, w, PULLING, "Pulling", self.now, fx, attempt=old)
            elif kind == "ready":
                starting.worker_ready(run, w, self.now, fx, attempt=old)
            elif kind == "running":
                starting.worker_running(run, w, self.now, fx, attempt=old)
            else:
                endings.worker_exited(run, w, self.now, fx, End(EndCause.EXITED, 1), attempt=old)

        fx = self.apply(run, f"stale {kind} {w.name}", set(), call)
        assert fx.transitions == [] and fx.commands == [] and not fx.freed
        assert (run.state, run.reason, [(x.state, x.phase, x.ready) for x in run.workers]) == before

    # -- machines, owners and time ------------------------------------------------------------

    @rule(pick=PICK, kind=st.sampled_from(["lost", "drain", "back", "stop"]))
    def disrupt(self, pick: int, kind: str) -> None:
        """A machine is lost, drained or back; or an owner stops a run."""
        if kind == "stop":
            runs = self.live_runs()
            if runs:
                run = runs[pick % len(runs)]
                self.apply(
                    run,
                    f"stop {run.name}",
                    {"stopping:owner"},
                    lambda fx: stops.stop(run, "alice", self.now, fx),
                )
            return
        m = self.machines[pick % len(self.machines) + 1]
        if kind == "back":
            m.state = "ready"
        elif kind == "lost" and m.state != "lost":
            m.state = "lost"
            for run in self.runs.values():
                self.apply(
                    run,
                    f"lost {m.name}",
                    {"stopping:failure"},
                    lambda fx, run=run: stops.machine_lost(run, m.id, self.now, self.now, fx),
                )
                assert not any(w.machine_id == m.id for w in run.workers)
        elif kind == "drain" and m.state == "ready":
            m.state = "draining"
            for run in self.runs.values():
                if any(w.machine_id == m.id for w in run.workers) and not run.ended and run.placed:
                    self.apply(
                        run,
                        f"drain {m.name}",
                        {"stopping:preemption"},
                        lambda fx, run=run: stops.drain_preempt(run, m.name, self.now, fx),
                    )

    @rule()
    def check_timers(self) -> None:
        for run in self.runs.values():
            self.apply(
                run,
                f"timers {run.name}",
                {"stopping:time_limit", "stopping:failure", "stopping:stall"},
                lambda fx, run=run: rules.check_timers(run, self.now, fx),
            )
            if run.ended or run.stop_cause is not None:
                continue
            # Nothing that is due is left undone: time limit, barrier, stalls.
            limit, timeout = run.policy.time_limit, run.policy.stall_timeout
            if limit is not None and run.started_at is not None:
                assert self.now < run.started_at + limit, run
            if run.state in BOOTING and run.placed_at is not None:
                assert self.now - run.placed_at < BARRIER, run
            for w in run.workers:
                if timeout is not None and w.state == RUNNING and w.stalled_since is None:
                    assert self.now - self.progress[w.id] < timeout, w

    @rule(seconds=st.sampled_from([1, 5, 10, 30, 60, 120, 300, 600, 900, 3600]), tick=st.booleans())
    def advance(self, seconds: int, tick: bool) -> None:
        """Time passes; on a tick the periodic jobs run: timers, then a scheduling pass."""
        self.now += timedelta(seconds=seconds)
        if tick:
            self.check_timers()
            self.schedule()

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def no_gpu_is_held_twice(self) -> None:  # (a)
        owner: dict[tuple[int, int], str] = {}
        for run in self.runs.values():
            for w in run.workers:
                if not w.alive:
                    assert w.machine_id is None and w.gpu_ids == [] and not w.placed, w
                    continue
                assert len(w.gpu_ids) == w.gpus == len(set(w.gpu_ids))
                machine = self.machines[w.machine_id]  # type: ignore[index]
                for g in w.gpu_ids:
                    assert 0 <= g < machine.gpus
                    key = (machine.id, g)
                    assert key not in owner, f"{machine.name}/{g}: {owner[key]} and {w.name}"
                    owner[key] = w.name
                assert w.machine_name == machine.name

    @invariant()
    def gangs_are_placed_whole(self) -> None:  # (b)
        for run in self.live_runs():
            placed = [w for w in run.workers if w.placed]
            if not placed:
                # Nothing placed and not ended: it waits, whole, to be placed (again).
                assert run.state == PENDING and run.stop_cause is None, run
                assert all(w.state == PENDING and w.stop_cause is None for w in run.workers)
                continue
            assert run.state != PENDING
            if run.stop_cause is None:
                # Placed whole; only a worker that already completed has given back its room.
                assert all(w.placed or w.state == COMPLETED for w in run.workers), run
                assert all(w.stop_cause is None for w in run.workers)
                if all(w.alive and w.ready for w in run.workers):
                    # All at the barrier: every agent was told to go.
                    assert all(self.agents[w.id].released for w in run.workers), run
            else:
                assert all(w.stop_cause is not None for w in placed)
            for w in placed:
                assert (w.state == STOPPING) == (w.stop_cause is not None), w

    @invariant()
    def histories_match_the_views(self) -> None:  # (c), (d)
        for run in self.runs.values():
            assert self.run_history[run.id][-1][0] == run.state
            for w in run.workers:
                assert self.history[w.id][-1][:2] == (w.state, w.phase), w.name
                assert w.alive == (w.phase in HELD_PHASES), w
                assert w.held_gpus == (w.gpus if w.alive else 0)
                # counted when the restart is decided (issue 36: as the restart loop's count)
                assert w.restarts == self.meta[run.id].requeues and w.attempt in (0, run.attempt)
            assert run.attempt == self.meta[run.id].places

    @invariant()
    def ended_runs_stay_ended(self) -> None:  # (f)
        for run in self.runs.values():
            if run.id in self.ended:
                assert (run.state, run.reason, run.ended_at) == self.ended[run.id]
            if not run.ended:
                continue
            self.ended[run.id] = (run.state, run.reason, run.ended_at)
            assert run.ended_at is not None and run.restart_at is None
            for w in run.workers:
                assert not w.alive and w.state in ENDED_STATES and w.phase == ENDED, w
            if run.state == COMPLETED:
                assert all(w.state == COMPLETED for w in run.workers)
                n = len(run.workers)
                assert run.reason == f"{n} of {n} {'worker' if n == 1 else 'workers'} completed"
            if run.state == STOPPED:
                assert run.reason == "Stopped by alice"
            if run.state == FAILED:
                self.check_failed_reason(run)

    def check_failed_reason(self, run: RunView) -> None:
        policy, reason = run.policy, run.reason
        if policy.time_limit is not None and reason == time_limit_sentence(policy.time_limit):
            return
        if reason == budget_exhausted_sentence(policy.max_restarts):
            assert policy.restart_policy == "on_failure" and policy.max_restarts > 0
            assert run.failures_in_row == policy.max_restarts
            return
        name = re.escape(run.name)
        failed = re.fullmatch(
            rf"Worker ({name}-\d+) failed on (gpu-\d\d): (.+); the gang does not run without it",
            reason,
        )
        if failed:
            w = run.worker(failed[1])
            assert (w.state, w.reason) == (FAILED, failed[3]), (w, reason)
            assert w.last_failure is not None and w.last_failure["reason"] == failed[3]
            return
        if policy.stall_timeout is not None and policy.on_stall == "restart":
            quiet = format_duration(policy.stall_timeout)
            if re.fullmatch(
                rf"Worker {name}-\d+ stalled on gpu-\d\d: no progress for {quiet}", reason
            ):
                return
        raise AssertionError(f"{run.name} failed with an unexpected reason: {reason!r}")

    @invariant()
    def failures_stay_within_the_budget(self) -> None:  # (g)
        for run in self.runs.values():
            assert 0 <= run.failures_in_row <= run.policy.max_restarts, run


# About ten seconds; ASTRAEUS_PROPERTY_EXAMPLES=5000 searches harder.
Cluster.TestCase.settings = settings(
    max_examples=int(os.environ.get("ASTRAEUS_PROPERTY_EXAMPLES", "200")),
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCluster = Cluster.TestCase


# -- what the machine above found, kept as plain examples -----------------------------------------


def _running_gang(policy: RunPolicy, workers: int = 2) -> tuple[RunView, list[WorkerView]]:
    views = [WorkerView(i + 1, i, f"llm-{i}", 1, PENDING, "", WAITING) for i in range(workers)]
    run = RunView(1, "llm", PENDING, "Run created", policy, views)
    placements = [Placement(i + 1, f"gpu-{i + 1:02d}", (0,)) for i in range(workers)]
    fx = Effects()
    starting.place(run, placements, T0, fx, master_port=29500, start_payload={})
    for w in views:
        starting.worker_running(run, w, T0, fx, attempt=1)
    assert run.state == RUNNING
    return run, views


def test_a_drain_while_a_failed_gang_winds_down_does_not_requeue_it() -> None:
    run, (crashed, survivor) = _running_gang(RunPolicy(restart_policy="never"))
    fx = Effects()
    endings.worker_exited(
        run, crashed, T0 + timedelta(seconds=5), fx, End(EndCause.EXITED, 1), attempt=1
    )
    stops.drain_preempt(run, "gpu-02", T0 + timedelta(seconds=6), fx)
    assert (survivor.state, survivor.phase) == (STOPPING, "stopping:failure")
    endings.worker_exited(
        run, survivor, T0 + timedelta(seconds=7), fx, End(EndCause.EXITED, 143), attempt=1
    )
    assert (run.state, run.reason) == (
        FAILED,
        "Worker llm-0 failed on gpu-01: Exited with code 1; the gang does not run without it",
    )
    assert [(w.state, w.phase) for w in run.workers] == [(FAILED, ENDED), (STOPPED, ENDED)]


def test_the_time_a_failed_gang_takes_to_wind_down_does_not_reset_its_count() -> None:
    run, (crashed, survivor) = _running_gang(RunPolicy(max_restarts=1))
    run.failures_in_row = 1  # its one restart is spent
    fx = Effects()
    endings.worker_exited(
        run, crashed, T0 + timedelta(minutes=5), fx, End(EndCause.EXITED, 1), attempt=1
    )
    assert (crashed.state, crashed.phase) == (FAILED, ENDED)
    # Six more minutes to stop the survivor: ten since the gang ran whole, five of them down.
    endings.worker_exited(
        run, survivor, T0 + timedelta(minutes=11), fx, End(EndCause.EXITED, 143), attempt=1
    )
    assert (run.state, run.reason) == (FAILED, "Retry budget exhausted after 1/1 restarts")
    assert [(w.state, w.phase) for w in run.workers] == [(FAILED, ENDED), (STOPPED, ENDED)]


def test_a_running_report_delivered_again_is_not_progress() -> None:
    policy = RunPolicy(stall_timeout=timedelta(minutes=5), on_stall="keep")
    run, (w,) = _running_gang(policy, workers=1)
    fx = Effects()
    rules.check_timers(run, T0 + timedelta(minutes=5), fx)
    assert (w.phase, w.stalled_since) == ("stalled", T0)
    fx = Effects()
    starting.worker_running(run, w, T0 + timedelta(minutes=6), fx, attempt=1)
    assert fx.transitions == []
    assert (w.phase, w.stalled_since, w.progress_at) == ("stalled", T0, T0)
    progress.worker_progress(run, w, T0 + timedelta(minutes=7), fx)
    assert (w.phase, w.stalled_since, w.progress_at) == ("running", None, T0 + timedelta(minutes=7))
