"""The one backoff (agent/backoff.py): the agent's reconnects, the server's retries and
`astraeus up`'s agent restarts wait by it (issue 22)."""

from __future__ import annotations

from agent.backoff import Backoff


def test_waits_double_up_to_the_cap_and_start_over_on_reset() -> None:
    retry = Backoff(0.2, 1.0)
    assert [retry.wait() for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    retry.reset()
    assert retry.wait() == 0.2


def test_an_attempt_that_lasted_long_enough_starts_the_waits_over() -> None:
    retry = Backoff(0.5, 30, reset_after=60)
    assert [retry.wait(1) for _ in range(3)] == [0.5, 1.0, 2.0]
    assert retry.wait(59.9) == 4.0
    assert retry.wait(60) == 0.5
    assert retry.wait(None) == 1.0  # not measured: no reset


def test_a_lowered_cap_holds_from_the_next_wait() -> None:
    # the agent's: a quarter of the server's lease once welcomed
    retry = Backoff(0.5, 30)
    assert [retry.wait() for _ in range(5)] == [0.5, 1, 2, 4, 8]
    retry.cap = 5
    assert [retry.wait() for _ in range(2)] == [5, 5]


def test_jitter_spreads_each_wait_around_it() -> None:
    asked: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        asked.append((low, high))
        return high

    retry = Backoff(0.5, 30, jitter=0.5, uniform=uniform)
    assert [retry.wait(), retry.wait()] == [0.75, 1.5]
    assert asked == [(0.5, 1.5), (0.5, 1.5)]
