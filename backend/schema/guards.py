"""What one GraphQL request may ask for, refused before anything runs: its length and tokens,
its fields once its fragments are expanded, its depth, aliases, fragments and directives, and
strings holding control characters; checked off the event loop within a deadline; and how
refused requests are logged (one line each, a traceback only for what nobody expected)."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any, TypeVar

from graphql import ExecutionResult as GraphQLExecutionResult
from graphql import (
    GraphQLError,
    GraphQLSchema,
    StringValueNode,
    TypeInfo,
    TypeInfoVisitor,
    Visitor,
    get_named_type,
    parse,
    visit,
)
from graphql.language import (
    ArgumentNode,
    DocumentNode,
    FragmentDefinitionNode,
    NamedTypeNode,
    NameNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    TypeNode,
)
from graphql.validation import ASTValidationRule
from strawberry.extensions import SchemaExtension
from strawberry.schema.schema import validate_document
from strawberry.types import ExecutionContext
from strawberry.utils.logging import StrawberryLogger

from backend.boundary import has_control_characters
from backend.errors import AstraeusError
from backend.request.context import Context
from backend.schema.expansion import measure

log = logging.getLogger("backend.graphql")

# The console's largest operation (a run's page with its fragments) is 1 100 characters and
# selects 129 fields, 4 deep, with no aliases, in 2 fragments; its deepest is 5; the CLI's are
# smaller; a full introspection query selects 220 fields. Each refusal is cheap and says what
# the bound is (tests/graphql/test_guards.py checks every operation of both passes them).
# 1 000 aliases of `gpus { line }` (6 000 tokens) took 16 s to answer before these bounds, and
# are now refused by the parser after 2 000 tokens.
MAX_TOKENS = 2000
# Lexing is linear but slow in Python (0.1-0.4 s a MiB of commas, spaces or one string): a
# longer document is refused before it is read (2 000 tokens of 25 characters; a full
# introspection query is 1 500 characters).
MAX_CHARACTERS = 50_000
MAX_DEPTH = 10
MAX_ALIASES = 30
# Fields selected with every fragment expanded where it is spread (issue 37 N1: 20 fragments,
# each spreading the previous twice, are 900 bytes selecting a million fields). Validation's
# overlapping-fields rule compares fields of one response name pairwise: the slowest document
# of 300 fields we found (149 of one name, each with a field of its own) takes 0.1 s to
# validate, off the event loop (500 such fields took 0.3 s).
MAX_FIELDS = 300
MAX_FRAGMENTS = 20
MAX_DIRECTIVES = 3  # on one field, fragment spread, inline fragment or definition
# How long a new document may wait for, and take in, its parsing and validation (each), off
# the event loop; past it the request is refused and the work not yet started is dropped.
CHECK_DEADLINE_S = 5.0
# Documents parsed and validated, by their text: the console's repeat their queries.
CHECKED_DOCUMENTS = 256
# Threads parsing and validating new documents: they hold the interpreter's lock in turns with
# the event loop (every 5 ms), so /healthz, heartbeats and cached requests keep being served.
CHECKING_THREADS = 2

TOO_COMPLEX = {"code": "QUERY_TOO_COMPLEX"}


def refusal(document: DocumentNode) -> GraphQLError | None:
    """Why a document is refused, or None: each bound says what it is. Its fragments are
    counted before it is measured (the measure recurses into each fragment it spreads)."""
    fragments = sum(isinstance(d, FragmentDefinitionNode) for d in document.definitions)
    if fragments > MAX_FRAGMENTS:
        return GraphQLError(
            f"The document defines {fragments} fragments; at most {MAX_FRAGMENTS} are allowed.",
            extensions=TOO_COMPLEX,
        )
    found = measure(document)
    if found.cycle is not None:
        return GraphQLError(f"Cannot spread fragment '{found.cycle}' within itself.")
    if found.directives > MAX_DIRECTIVES:
        return GraphQLError(
            f"A selection carries {found.directives} directives; at most {MAX_DIRECTIVES} "
            "are allowed on one.",
            extensions=TOO_COMPLEX,
        )
    fields = max(found.fields, found.largest_fragment.fields)
    if fields > MAX_FIELDS:
        return GraphQLError(
            f"The document selects {fields} fields once its fragments are expanded (each "
            f"counted wherever it is spread); at most {MAX_FIELDS} are allowed.",
            extensions=TOO_COMPLEX,
        )
    for name, size in found.operations.items():
        if size.depth > MAX_DEPTH:
            return GraphQLError(
                f"'{name}' exceeds maximum operation depth of {MAX_DEPTH}", extensions=TOO_COMPLEX
            )
    if found.aliases > MAX_ALIASES:
        return GraphQLError(
            f"{found.aliases} aliases found. Allowed: {MAX_ALIASES}", extensions=TOO_COMPLEX
        )
    return None


def prepare(text: str) -> tuple[DocumentNode | None, GraphQLError | None]:
    """The document, parsed and measured; and why it is refused, if it is (no document when it
    could not be parsed). Linear in the text, which is at most MAX_CHARACTERS long."""
    if len(text) > MAX_CHARACTERS:
        return None, GraphQLError(
            f"The document is {len(text)} characters long; at most {MAX_CHARACTERS} are allowed.",
            extensions=TOO_COMPLEX,
        )
    try:
        document = parse(text, max_tokens=MAX_TOKENS)
    except GraphQLError as error:
        return None, error
    return document, refusal(document)


Rules = tuple[type[ASTValidationRule], ...]
T = TypeVar("T")


@cache
def _checking() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(CHECKING_THREADS, thread_name_prefix="graphql-check")


class Overdue(Exception):
    """A document's parsing or validation did not end within CHECK_DEADLINE_S."""


async def off_the_loop(
    work: Callable[..., T], *args: Any, gate: asyncio.Semaphore | None = None
) -> T:
    """``work(*args)`` in a checking thread, through the caller's workspace's gate (one of its
    documents at a time), waited for at most CHECK_DEADLINE_S, the waits for the gate and for
    a thread included; past it, work not yet started is dropped and Overdue raised. What has
    started runs to its end: the bounds keep it short."""

    async def in_thread() -> T:
        started = _checking().submit(work, *args)
        try:
            return await asyncio.wrap_future(started)
        finally:
            started.cancel()  # nothing if it has started

    async def through_the_gate() -> T:
        if gate is None:
            return await in_thread()
        async with gate:
            return await in_thread()

    try:
        return await asyncio.wait_for(through_the_gate(), CHECK_DEADLINE_S)
    except TimeoutError:
        raise Overdue from None


def _gate(context: ExecutionContext) -> asyncio.Semaphore | None:
    caller = context.context
    return caller.checking_gate() if isinstance(caller, Context) else None


# text and rules -> the document and its validation errors; touched on the event loop only
_checked: OrderedDict[tuple[str, Rules], tuple[DocumentNode, list[GraphQLError]]] = OrderedDict()


def remembered(text: str, rules: Rules) -> tuple[DocumentNode, list[GraphQLError]] | None:
    found = _checked.get((text, rules))
    if found is not None:
        _checked.move_to_end((text, rules))
    return found


def remember(text: str, rules: Rules, document: DocumentNode, errors: list[GraphQLError]) -> None:
    _checked[(text, rules)] = (document, errors)
    while len(_checked) > CHECKED_DOCUMENTS:
        _checked.popitem(last=False)


def _nothing(operation_name: str | None) -> DocumentNode:
    """A document of one empty query, of the operation asked for: what a request refused
    before its own document was parsed carries, with its refusal (Strawberry looks up the
    operation's type before it reads the refusal, and a document it parses itself would be
    parsed a second time, on the event loop)."""
    name = NameNode(value=operation_name) if operation_name is not None else None
    operation = OperationDefinitionNode(
        operation=OperationType.QUERY,
        name=name,
        variable_definitions=(),
        directives=(),
        selection_set=SelectionSetNode(selections=()),
    )
    return DocumentNode(definitions=(operation,))


def _overdue() -> GraphQLError:
    return GraphQLError(
        f"The request could not be checked within {CHECK_DEADLINE_S:g} s (the server is busy "
        "checking others); try again.",
        extensions={"code": "TIME_BUDGET_EXCEEDED"},
    )


class CheckedDocument(SchemaExtension):
    """Parses, bounds and validates the request's document off the event loop (issue 37 N1):
    its length, tokens and measure (linear: fragments counted once each) before graphql-core's
    validation, whose overlapping-fields rule is quadratic in the fields it is given, and all
    of it in a checking thread within CHECK_DEADLINE_S. Documents that passed are remembered
    by their text (parsed and validated once)."""

    def __init__(self) -> None:
        super().__init__()
        self._errors: list[GraphQLError] | None = None

    async def on_parse(self) -> AsyncIterator[None]:
        context = self.execution_context
        text = context.query
        if context.graphql_document is None and text:
            await self._parse(context, text)
        yield

    async def _parse(self, context: ExecutionContext, text: str) -> None:
        known = remembered(text, context.validation_rules)
        if known is not None:
            context.graphql_document, self._errors = known
            return
        try:
            document, refused = await off_the_loop(prepare, text, gate=_gate(context))
        except Overdue:
            document, refused = None, _overdue()
        if refused is not None:
            context.pre_execution_errors = [refused]
        context.graphql_document = document or _nothing(context.operation_name)

    async def on_validate(self) -> AsyncIterator[None]:
        context = self.execution_context
        if context.pre_execution_errors is None and self._errors is not None:
            context.pre_execution_errors = list(self._errors)  # the remembered list kept as is
        elif context.pre_execution_errors is None and context.graphql_document is not None:
            context.pre_execution_errors = await self._validate(context, context.graphql_document)
        yield

    async def _validate(
        self, context: ExecutionContext, document: DocumentNode
    ) -> list[GraphQLError]:
        rules = context.validation_rules
        try:
            errors = await off_the_loop(
                validate_document, context.schema._schema, document, rules, gate=_gate(context)
            )
        except Overdue:
            return [_overdue()]
        if context.query:
            remember(context.query, rules, document, errors)
        return errors


def _bad_strings(value: Any, path: str) -> Iterator[str]:
    """The paths of strings in a variable's value (lists and objects walked) that hold one."""
    if isinstance(value, str):
        if has_control_characters(value):
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _bad_strings(key, f"{path}.{key!s}")
            yield from _bad_strings(item, f"{path}.{key!s}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _bad_strings(item, f"{path}[{index}]")


# A JSON argument (a run's specification) is checked by its own validator, field by field, with
# the same rule for control characters (backend/spec.py): its refusals name each field among
# the spec's other errors, as the seed's `errors { field message }` does, so it is left to it.
CHECKED_BY_THEIR_RESOLVER = frozenset({"JSON"})


class _Literals(Visitor):
    """The arguments whose literal strings hold a refused character."""

    def __init__(self, types: TypeInfo | None) -> None:
        super().__init__()
        self.arguments: list[str] = []
        self._argument: str | None = None
        self._types = types

    def enter_argument(self, node: ArgumentNode, *_: Any) -> None:
        found = self._types.get_argument() if self._types is not None else None
        if found is not None and get_named_type(found.type).name in CHECKED_BY_THEIR_RESOLVER:
            return
        self._argument = node.name.value

    def leave_argument(self, node: ArgumentNode, *_: Any) -> None:
        self._argument = None

    def enter_string_value(self, node: StringValueNode, *_: Any) -> None:
        if self._argument is not None and has_control_characters(node.value):
            self.arguments.append(self._argument)


def _type_name(node: TypeNode) -> str:
    while not isinstance(node, NamedTypeNode):
        node = node.type  # type: ignore[attr-defined]  # NonNull and List wrap a type
    return node.name.value


def control_character_fields(
    document: DocumentNode,
    variables: dict[str, Any] | None,
    schema: GraphQLSchema | None = None,
) -> list[str]:
    """The arguments and variables (paths into their values) holding a refused character;
    with the schema, those of a type its resolver checks itself are left to it."""
    types = TypeInfo(schema) if schema is not None else None
    literals = _Literals(types)
    visit(document, TypeInfoVisitor(types, literals) if types is not None else literals)
    found = list(dict.fromkeys(literals.arguments))
    left = {
        definition.variable.name.value
        for operation in document.definitions
        if isinstance(operation, OperationDefinitionNode)
        for definition in operation.variable_definitions or ()
        if schema is not None and _type_name(definition.type) in CHECKED_BY_THEIR_RESOLVER
    }
    for name, value in (variables or {}).items():
        if name not in left:
            found.extend(_bad_strings(value, f"${name}"))
    return found


class ControlCharacters(SchemaExtension):
    """A string argument (literal or variable) holding NUL or another control character is
    refused before execution with INVALID_PARAMETER naming it (PostgreSQL answered NUL with an
    error the caller saw as "Unexpected error.")."""

    def on_execute(self) -> Iterator[None]:
        context = self.execution_context
        if context.graphql_document is not None:
            fields = control_character_fields(
                context.graphql_document, context.variables, context.schema._schema
            )
            if fields:
                context.result = GraphQLExecutionResult(
                    data=None,
                    errors=[
                        GraphQLError(
                            f"{field}: must not hold NUL or other control characters",
                            extensions={"code": "INVALID_PARAMETER"},
                        )
                        for field in fields
                    ],
                )
        yield


def bounds() -> list[Any]:
    """The schema's extensions that bound a request before it runs (the time budget and the
    database sessions a workspace holds are the server's: backend/app.py)."""
    return [CheckedDocument, ControlCharacters]


def expected(error: GraphQLError) -> bool:
    """A refusal the caller caused and can act on: a syntax or validation error (a bound
    included), a value its variable's type refused (said by the type before anything ran: a
    DateTime of year 10000 was "Unexpected error."), an AstraeusError, or one with a code."""
    original = error.original_error
    if original is None or isinstance(original, AstraeusError):
        return True
    if not isinstance(original, GraphQLError):
        return False
    return error.path is None or bool((error.extensions or {}).get("code"))


def log_errors(errors: list[GraphQLError], context: ExecutionContext | None) -> None:
    """Expected errors in one line each (an unauthenticated call printed a whole traceback);
    anything else with its traceback, as Strawberry logs it."""
    for error in errors:
        if expected(error):
            code = (error.extensions or {}).get("code", "INVALID_REQUEST")
            log.info("graphql refused: %s: %s", code, error.message)
        else:
            StrawberryLogger.error(error, context)
