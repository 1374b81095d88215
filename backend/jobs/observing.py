"""What an operator needs to see a backlog: each queue's depth, how long each actor took and
how long its messages waited, as Prometheus text and as log warnings.

Durations are kept where every process can read them (Redis hashes under the broker's
namespace in production, this process's memory when embedded), so a server answers for the
workers that ran the actors."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import dq_name
from redis import Redis

log = logging.getLogger(__name__)

# A message that waited this long in its queue is a backlog: warned about as it starts.
WAITED_WARNING_S = 60.0
# A queue this deep is warned about by the scheduler's watch (one pass is queued at most,
# one tick a minute: hundreds of messages is work the workers do not keep up with).
DEPTH_WARNING = 100


class Stats(Protocol):
    def add(self, actor: str, field: str, amount: float) -> None: ...

    def read(self) -> dict[str, dict[str, float]]: ...


class RedisStats:
    def __init__(self, client: Redis, namespace: str) -> None:
        self.client, self.key = client, f"{namespace}:stats"

    def add(self, actor: str, field: str, amount: float) -> None:
        self.client.hincrbyfloat(self.key, f"{actor}|{field}", amount)

    def read(self) -> dict[str, dict[str, float]]:
        stats: dict[str, dict[str, float]] = {}
        for key, value in self.client.hgetall(self.key).items():
            actor, field = (key.decode() if isinstance(key, bytes) else key).split("|", 1)
            stats.setdefault(actor, {})[field] = float(value)
        return stats


class LocalStats:
    def __init__(self) -> None:
        self._stats: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def add(self, actor: str, field: str, amount: float) -> None:
        with self._lock:
            fields = self._stats.setdefault(actor, {})
            fields[field] = fields.get(field, 0.0) + amount

    def read(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {actor: dict(fields) for actor, fields in self._stats.items()}


def stats_for(broker: Broker) -> Stats:
    if isinstance(broker, RedisBroker):
        return RedisStats(broker.client, broker.namespace)
    return LocalStats()


class Timing(dramatiq.Middleware):
    """Each message's wait in its queue and its actor's run time, added to the stats; a long
    wait logged as a backlog. Dramatiq calls both hooks on the worker thread that runs the
    message, one message at a time, so the start is kept per thread."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self._started = threading.local()

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self._started.at = time.monotonic()
        waited = max(0.0, time.time() - message.message_timestamp / 1000)
        self.stats.add(message.actor_name, "waited_seconds", waited)
        if waited >= WAITED_WARNING_S:
            log.warning(
                "%s waited %.0fs in queue %s: the workers are behind (a backlog)",
                message.actor_name,
                waited,
                message.queue_name,
            )

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        started = getattr(self._started, "at", None)
        if started is None:
            return
        self._started.at = None
        took = time.monotonic() - started
        self.stats.add(message.actor_name, "seconds", took)
        self.stats.add(message.actor_name, "count", 1)
        if exception is not None:
            self.stats.add(message.actor_name, "failed", 1)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._started.at = None


def depths(broker: Broker, queues: list[str]) -> dict[str, int]:
    """Messages waiting in each queue, delayed ones (retries) included."""
    if isinstance(broker, RedisBroker):
        client, ns = broker.client, broker.namespace
        return {
            q: int(client.llen(f"{ns}:{q}")) + int(client.llen(f"{ns}:{dq_name(q)}"))
            for q in queues
        }
    if isinstance(broker, StubBroker):
        return {
            q: sum(broker.queues[n].qsize() for n in (q, dq_name(q)) if n in broker.queues)
            for q in queues
        }
    return {}


def warn_if_behind(found: dict[str, int]) -> None:
    for queue, depth in found.items():
        if depth >= DEPTH_WARNING:
            log.warning(
                "queue %s holds %d messages: the workers are behind (a backlog)", queue, depth
            )


def exposition(found: dict[str, int], stats: dict[str, dict[str, float]]) -> str:
    """Prometheus text: depth per queue; per actor, run time, wait, failures, folded asks."""
    lines = _family("astraeus_jobs_queued", "gauge", "Messages waiting in a broker queue.")
    lines += [f'astraeus_jobs_queued{{queue="{q}"}} {n}' for q, n in sorted(found.items())]
    lines += _family("astraeus_job_duration_seconds", "summary", "How long an actor ran.")
    for actor, fields in sorted(stats.items()):
        if "count" in fields:
            label = f'{{actor="{actor}"}}'
            lines.append(f"astraeus_job_duration_seconds_sum{label} {fields['seconds']:.6f}")
            lines.append(f"astraeus_job_duration_seconds_count{label} {fields['count']:g}")
    for name, field, text in (
        ("astraeus_job_waited_seconds_total", "waited_seconds", "Time messages waited queued."),
        ("astraeus_job_failures_total", "failed", "Messages whose actor raised."),
        ("astraeus_job_folded_total", "folded", "Asks folded into a message already queued."),
    ):
        lines += _family(name, "counter", text)
        lines += [
            f'{name}{{actor="{actor}"}} {fields[field]:g}'
            for actor, fields in sorted(stats.items())
            if field in fields
        ]
    return "\n".join(lines) + "\n"


def _family(name: str, kind: str, text: str) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
