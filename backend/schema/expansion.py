"""What a GraphQL document asks for once its fragments are expanded, counted in time linear in
the document, not in its expansion: each fragment is counted once and its count reused wherever
it is spread (issue 37 N1). Twenty fragments, each spreading the previous one twice, are 900
bytes that expand to a million fields; counted by walking the expansion (as the depth and alias
rules did), they blocked the server for 16-51 s before a single bound could refuse them."""

from __future__ import annotations

from dataclasses import dataclass

from graphql.language import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
)


@dataclass(frozen=True)
class Size:
    """Of a selection set with its fragments expanded: the fields it selects (at every level),
    how many of them are aliased, and how deep it goes. Depth is counted as the depth bound
    always counted it: a leaf is 0, a field with a selection is one more than its deepest
    child, and an introspection field (``__schema``, ``__type``, ``__typename``) is 0 however
    deep its own selection goes (its fields are still counted)."""

    fields: int = 0
    aliases: int = 0
    depth: int = 0

    def beside(self, other: Size) -> Size:
        return Size(
            self.fields + other.fields,
            self.aliases + other.aliases,
            max(self.depth, other.depth),
        )


@dataclass(frozen=True)
class Measure:
    """A whole document: each operation's size by name ("anonymous" if it has none), the largest
    fragment's own (an unused fragment is still validated), the number of fragments, the most
    directives on one field, fragment spread, inline fragment or definition, and a fragment
    that spreads itself (directly or through others), if one does."""

    operations: dict[str, Size]
    largest_fragment: Size
    fragments: int
    directives: int
    cycle: str | None

    @property
    def fields(self) -> int:
        return sum(size.fields for size in self.operations.values())

    @property
    def aliases(self) -> int:
        return sum(size.aliases for size in self.operations.values())


class _Counter:
    """Sizes of selection sets, each fragment's computed once. A fragment spread inside itself
    (directly or through others) counts as nothing there, and is named in ``cycle``."""

    def __init__(self, document: DocumentNode) -> None:
        self.fragments = {
            definition.name.value: definition
            for definition in document.definitions
            if isinstance(definition, FragmentDefinitionNode)
        }
        self.sizes: dict[str, Size] = {}
        self.open: set[str] = set()
        self.directives = 0
        self.cycle: str | None = None

    def fragment(self, name: str) -> Size:
        known = self.sizes.get(name)
        if known is not None:
            return known
        definition = self.fragments.get(name)
        if definition is None:
            return Size()  # unknown: validation says so
        if name in self.open:
            self.cycle = self.cycle or name
            return Size()
        self.open.add(name)
        size = self.selections(definition.selection_set)
        self.open.discard(name)
        self.sizes[name] = size
        return size

    def selections(self, selection_set: SelectionSetNode | None) -> Size:
        total = Size()
        if selection_set is None:
            return total
        for selection in selection_set.selections:
            self.directives = max(self.directives, len(selection.directives or ()))
            if isinstance(selection, FieldNode):
                inner = self.selections(selection.selection_set)
                introspection = selection.name.value.startswith("__")
                depth = 0 if introspection or selection.selection_set is None else inner.depth + 1
                own = Size(1 + inner.fields, inner.aliases + (selection.alias is not None), depth)
            elif isinstance(selection, InlineFragmentNode):
                own = self.selections(selection.selection_set)
            elif isinstance(selection, FragmentSpreadNode):
                own = self.fragment(selection.name.value)
            else:  # pragma: no cover - graphql-core has no other selection
                continue
            total = total.beside(own)
        return total


def measure(document: DocumentNode) -> Measure:
    """The document's sizes, in one pass over it (each fragment walked once)."""
    counter = _Counter(document)
    operations: dict[str, Size] = {}
    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            name = definition.name.value if definition.name else "anonymous"
            size = counter.selections(definition.selection_set)
            counter.directives = max(counter.directives, len(definition.directives or ()))
            previous = operations.get(name)
            operations[name] = previous.beside(size) if previous is not None else size
    largest = Size()
    for name, definition in counter.fragments.items():
        counter.directives = max(counter.directives, len(definition.directives or ()))
        size = counter.fragment(name)
        if size.fields > largest.fields:
            largest = size
    return Measure(operations, largest, len(counter.fragments), counter.directives, counter.cycle)
