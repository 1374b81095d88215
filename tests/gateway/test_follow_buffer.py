"""The one buffer of a followed log's chunks (backend/gateway/follow_buffer.py): bounded, every
line it drops counted, the end always delivered."""

from __future__ import annotations

from backend.gateway.follow_buffer import FOLLOW_BUFFER, FollowBuffer, LogChunkInfo


def chunk(text: str, *, ended: bool = False, missed: int = 0) -> LogChunkInfo:
    return LogChunkInfo(text, archived=False, missed=missed, ended=ended)


def drained(follow: FollowBuffer) -> list[LogChunkInfo]:
    chunks = []
    while (taken := follow.take()) is not None:
        chunks.append(taken)
    return chunks


def test_a_full_follow_buffer_counts_every_line_it_drops() -> None:
    follow = FollowBuffer()
    for i in range(FOLLOW_BUFFER):
        follow.offer(chunk(f"line {i}\n"))
    follow.offer(chunk("x\ny\n"))  # no room: 2 lines missed
    follow.offer(chunk("z\n", ended=True))
    chunks = drained(follow)
    assert chunks[-1].ended
    kept = sum(c.text.count("\n") for c in chunks)
    # Every line is either delivered or counted as missed: FOLLOW_BUFFER + 2 + 1 in all.
    assert kept + chunks[-1].missed == FOLLOW_BUFFER + 3


def test_the_end_takes_the_newest_chunks_place_and_keeps_its_own_lines() -> None:
    follow = FollowBuffer(size=2)
    for text in ("a\n", "b\n", "c\nd\n"):  # c and d: no room
        follow.offer(chunk(text))
    follow.offer(chunk("e\n", ended=True, missed=1))  # its machine dropped a line before it
    # b makes room for the end: the lines missed are those between a and e, counted on e
    assert drained(follow) == [chunk("a\n"), chunk("e\n", ended=True, missed=1 + 2 + 1)]


def test_the_lines_dropped_are_told_on_the_next_chunk_that_gets_in() -> None:
    follow = FollowBuffer(size=1)
    follow.offer(chunk("a\n"))
    follow.offer(chunk("b\nc\n", missed=4))  # no room: its 2 lines and the 4 before them
    assert follow.arrived.is_set()
    assert follow.take() == chunk("a\n")
    follow.offer(chunk("d\n"))
    assert follow.take() == chunk("d\n", missed=6)
    assert follow.take() is None
    assert not follow.arrived.is_set()  # until the next chunk comes
