"""What `serve` keeps under steady load stays bounded (issue 19: 134 -> 199 MB in 12 minutes,
still rising; found with tracemalloc snapshots while bench/load.py ran, `python -m bench.load
--tracemalloc DIR` then `--compare A B`)."""

from __future__ import annotations

from graphql import parse
from graphql.execution.executor import Executor

from backend.resolvers.root import ExecutionPerEvent, schema
from backend.schema import guards

SUBSCRIPTION = "subscription { events { id kind run } }"


def test_a_subscriptions_events_keep_no_fields_of_the_ones_before() -> None:
    """graphql-core shares one memo of collected fields between a subscription's events, keyed
    by lists each event makes anew: it grew by every event delivered, for as long as the
    subscription lasted."""
    assert schema.execution_context_class is ExecutionPerEvent
    built = ExecutionPerEvent.build(schema._schema, parse(SUBSCRIPTION))
    assert isinstance(built, Executor)
    subscription = schema._schema.subscription_type
    assert subscription is not None
    for _ in range(100):  # what graphql-core does for each event: fields collected afresh
        event = built.build_per_event_executor(None)
        fields = [object()]  # a new list of field details, as each event's execution makes
        event._relevant_sub_fields[(subscription, id(fields))] = (fields, None)  # type: ignore[assignment]
        assert len(event._relevant_sub_fields) == 1
    assert built._relevant_sub_fields == {}


async def test_documents_checked_are_remembered_by_text_and_bounded() -> None:
    """The documents checked are kept by their text and the rules they were validated with,
    at most CHECKED_DOCUMENTS of them: the rules are the same tuple at every request (issue 19:
    rules made anew at each request never let the cache hit, and it kept 256 documents each
    with classes of its own)."""
    guards._checked.clear()
    first = await schema.execute("{ __typename }")
    second = await schema.execute("{ __typename }")
    assert first.data == second.data == {"__typename": "Query"}
    assert len(guards._checked) == 1
    for i in range(guards.CHECKED_DOCUMENTS + 10):
        await schema.execute(f"query Q{i} {{ __typename }}")
    assert len(guards._checked) == guards.CHECKED_DOCUMENTS
