"""What one GraphQL request may ask for, refused before anything runs: its size in tokens, its
depth, its aliases, and strings holding control characters; and how refused requests are logged
(one line each, a traceback only for what nobody expected)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from graphql import ExecutionResult as GraphQLExecutionResult
from graphql import (
    GraphQLError,
    GraphQLSchema,
    StringValueNode,
    TypeInfo,
    TypeInfoVisitor,
    Visitor,
    get_named_type,
    visit,
)
from graphql.language import (
    ArgumentNode,
    DocumentNode,
    NamedTypeNode,
    OperationDefinitionNode,
    TypeNode,
)
from strawberry.extensions import (
    AddValidationRules,
    MaxTokensLimiter,
    SchemaExtension,
    max_aliases,
    query_depth_limiter,
)
from strawberry.types import ExecutionContext
from strawberry.utils.logging import StrawberryLogger

from backend.boundary import has_control_characters
from backend.errors import AstraeusError

log = logging.getLogger("backend.graphql")

# The console's largest operation (a run's page) is about 150 tokens, 5 deep, with no aliases;
# 1 000 aliases of `gpus { line }` (6 000 tokens) took 16 s to answer before these bounds, and
# are now refused by the parser after 2 000 tokens.
MAX_TOKENS = 2000
MAX_DEPTH = 10
MAX_ALIASES = 30
# The depth and alias bounds' validation rules, made once. QueryDepthLimiter and
# MaxAliasesLimiter make a new rule class each time they are made, i.e. at every request: the
# validation cache, keyed by the document and its rules, never found one and kept the last
# 256 documents, each with two classes of its own, and validated every request anew (issue 19).
DEPTH_RULE = query_depth_limiter.create_validator(MAX_DEPTH, None, None)
ALIASES_RULE = max_aliases.create_validator(MAX_ALIASES)


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
# the same rule for control characters (backend/runs/spec.py): its refusals name each field among
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
    return [
        lambda: MaxTokensLimiter(max_token_count=MAX_TOKENS),
        lambda: AddValidationRules([DEPTH_RULE, ALIASES_RULE]),
        ControlCharacters,
    ]


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
