"""The agent protocol follows buf's conventions, and its generated code is what protoc makes."""

import re
from pathlib import Path

from astraeus.agent.v1 import agent_pb2

PROTO = (
    Path(__file__).resolve().parent.parent / "proto" / "astraeus" / "agent" / "v1" / "agent.proto"
)
FIELD = re.compile(r"^\s*(optional |repeated )?[\w.]+ \w+ = \d+;")
ENUM_VALUE = re.compile(r"^\s*([A-Z0-9_]+) = (\d+);", re.M)  # a line of its own, comments above it


def test_every_field_and_enum_value_has_a_comment() -> None:
    lines = PROTO.read_text().splitlines()
    for number, line in enumerate(lines):
        if FIELD.match(line) or ENUM_VALUE.match(line):
            above = lines[number - 1].strip()
            first_enum_value = ENUM_VALUE.match(line) and line.strip().endswith("= 0;")
            if not first_enum_value:
                assert above.startswith("//"), f"line {number + 1} has no comment: {line.strip()}"


def test_enums_start_with_unspecified_zero() -> None:
    text = PROTO.read_text()
    for name, body in re.findall(r"enum (\w+) \{(.*?)\}", text, flags=re.S):
        first = ENUM_VALUE.search(body)
        assert first is not None
        prefix = re.sub(r"(?<!^)([A-Z])", r"_\1", name).upper()
        assert first.groups() == (f"{prefix}_UNSPECIFIED", "0"), name


def test_the_package_is_versioned_and_generated() -> None:
    assert "package astraeus.agent.v1;" in PROTO.read_text()
    assert agent_pb2.DESCRIPTOR.package == "astraeus.agent.v1"
    message = agent_pb2.AgentMessage(id=1, hello=agent_pb2.Hello(machine="gpu-07"))
    assert agent_pb2.AgentMessage.FromString(message.SerializeToString()).hello.machine == "gpu-07"
