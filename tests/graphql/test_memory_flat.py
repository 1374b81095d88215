"""What `serve` keeps under steady load stays bounded (issue 19: 134 -> 199 MB in 12 minutes,
still rising; found with tracemalloc snapshots while bench/load.py ran, `python -m bench.load
--tracemalloc DIR` then `--compare A B`)."""

from __future__ import annotations

from graphql import parse
from graphql.execution.executor import Executor

from backend.schema import guards
from backend.schema.schema import ExecutionPerEvent, schema

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


def test_the_bounds_rules_are_made_once() -> None:
    """The validation cache is keyed by the document and its rules: rules made anew at each
    request (two classes each) never let it hit, and it kept 256 documents with theirs."""
    first = [e() for e in guards.bounds()]
    second = [e() for e in guards.bounds()]
    rules = [getattr(e, "validation_rules", None) for e in first]
    assert [getattr(e, "validation_rules", None) for e in second] == rules
    assert [guards.DEPTH_RULE, guards.ALIASES_RULE] in rules
