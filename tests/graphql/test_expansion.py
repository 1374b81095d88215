"""The measure of a document with its fragments expanded (issue 37 N1): exact, and in time
linear in the document, however large its expansion. The depth and alias rules it replaces
walked the expansion: 20 fragments each spreading the previous one twice took seconds each."""

from __future__ import annotations

import time
from typing import Any

import pytest
from graphql import parse, validate
from graphql.language import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from strawberry.extensions import max_aliases, query_depth_limiter

from backend.resolvers.root import schema
from backend.schema.expansion import Size, _Counter, measure


def fan_out(levels: int, leaf: str = "viewer { user }") -> str:
    parts = [f"fragment F0 on Query {{ {leaf} }}"]
    parts += [f"fragment F{i} on Query {{ ...F{i - 1} ...F{i - 1} }}" for i in range(1, levels)]
    return f"query Fan {{ ...F{levels - 1} }} " + " ".join(parts)


def test_a_fan_out_is_counted_exactly_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 37 N1: 2**199 leaves in 200 fragments, counted once each
    walked: list[object] = []
    selections = _Counter.selections

    def counted(self: _Counter, selection_set: SelectionSetNode | None) -> Size:
        walked.append(selection_set)
        return selections(self, selection_set)

    monkeypatch.setattr(_Counter, "selections", counted)
    for levels in (20, 200):
        walked.clear()
        document = parse(fan_out(levels))
        started = time.perf_counter()
        found = measure(document)
        took = time.perf_counter() - started
        assert found.operations == {"Fan": Size(fields=2**levels, aliases=0, depth=1)}
        assert found.fragments == levels
        assert found.largest_fragment.fields == 2**levels
        # each selection set walked once: the operation's, each fragment's, viewer's, and
        # user's (none)
        assert len(walked) == levels + 3
        assert took < 0.1, (levels, took)


def test_directives_cycles_and_unknown_fragments() -> None:
    found = measure(
        parse(
            "{ a @x @y @z @w { b } ...Missing } fragment A on Q { ...B } fragment B on Q { ...A c }"
        )
    )
    assert found.directives == 4
    assert found.cycle in ("A", "B")
    assert found.operations["anonymous"] == Size(fields=2, aliases=0, depth=1)
    assert measure(parse("{ __schema { types { fields { name } } } }")).operations == {
        "anonymous": Size(fields=4, aliases=0, depth=0)  # introspection: fields, not depth
    }


# --- against the expansion itself, on small documents ---------------------------------------

NAMES = ["a", "b", "c", "__typename"]


@st.composite
def documents(draw: Any) -> str:
    """An operation and up to five fragments, each spreading only fragments before it (no
    cycles), with fields, aliases, nested selections and inline fragments."""
    fragments = draw(st.integers(0, 5))

    def selections(depth: int, spreadable: int) -> str:
        items = []
        for _ in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["field", "field", "inline", "spread"]))
            if kind == "spread" and spreadable:
                items.append(f"...F{draw(st.integers(0, spreadable - 1))}")
            elif kind == "inline" and depth < 4:
                items.append(f"... {{ {selections(depth + 1, spreadable)} }}")
            else:
                name = draw(st.sampled_from(NAMES))
                alias = f"x{draw(st.integers(0, 9))}: " if draw(st.booleans()) else ""
                nested = depth < 4 and name != "__typename" and draw(st.booleans())
                inner = f" {{ {selections(depth + 1, spreadable)} }}" if nested else ""
                items.append(f"{alias}{name}{inner}")
        return " ".join(items)

    parts = [f"fragment F{i} on Q {{ {selections(0, i)} }}" for i in range(fragments)]
    return f"query Q {{ {selections(0, fragments)} }} " + " ".join(parts)


def expanded(selection_set: SelectionSetNode, fragments: dict[str, Any]) -> tuple[int, int]:
    """Fields and aliases, walking every spread again (exponential: small documents only)."""
    fields = aliases = 0
    for selection in selection_set.selections:
        if isinstance(selection, FieldNode):
            fields += 1
            aliases += selection.alias is not None
            if selection.selection_set is not None:
                inner = expanded(selection.selection_set, fragments)
                fields, aliases = fields + inner[0], aliases + inner[1]
        elif isinstance(selection, InlineFragmentNode):
            inner = expanded(selection.selection_set, fragments)
            fields, aliases = fields + inner[0], aliases + inner[1]
        elif isinstance(selection, FragmentSpreadNode):
            inner = expanded(fragments[selection.name.value].selection_set, fragments)
            fields, aliases = fields + inner[0], aliases + inner[1]
    return fields, aliases


def strawberrys_depth(document: DocumentNode) -> int:
    """The depth the depth bound always counted (Strawberry's QueryDepthLimiter)."""
    depths: dict[str, int] = {}
    rule = query_depth_limiter.create_validator(10_000, None, depths.update)
    assert validate(schema._schema, document, [rule]) == []
    return depths["Q"]


def strawberrys_aliases(document: DocumentNode) -> int:
    rule = max_aliases.create_validator(0)
    errors = validate(schema._schema, document, [rule])
    return int(errors[0].message.split()[0]) if errors else 0


@settings(max_examples=300, deadline=None)
@given(documents())
def test_the_measure_is_the_expansions(text: str) -> None:
    document = parse(text)
    fragments = {
        d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)
    }
    operation = next(d for d in document.definitions if isinstance(d, OperationDefinitionNode))
    fields, aliases = expanded(operation.selection_set, fragments)
    found = measure(document)
    assert found.operations == {
        "Q": Size(fields=fields, aliases=aliases, depth=strawberrys_depth(document))
    }
    assert aliases == strawberrys_aliases(document)
    assert found.cycle is None
    assert found.largest_fragment.fields == max(
        (expanded(f.selection_set, fragments)[0] for f in fragments.values()), default=0
    )
