"""The documents of issue 37 N1, whose cost is in their expansion, and a concurrent client that
sends them to a live server while another process times its /healthz (tests/security/
test_graphql_stall.py on `astraeus up`, tests/e2e/test_topology.py on the production topology)."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

SENDERS = 10  # requests in flight at once
HEALTHZ_S = 1.0  # the most /healthz may take meanwhile (the issue's acceptance)


def fan_out(levels: int, leaf: str, spread: str = "...F{p} ...F{p}") -> str:
    """``levels`` fragments, each spreading the one before twice: 2**(levels-1) leaves."""
    parts = [f"fragment F0 on Query {{ {leaf} }}"]
    parts += [f"fragment F{i} on Query {{ {spread.format(p=i - 1)} }}" for i in range(1, levels)]
    return f"query {{ ...F{levels - 1} }} " + " ".join(parts)


def deeper_by_fragments(levels: int) -> str:
    """Each fragment two levels deeper than the one it spreads."""
    parts = ["fragment D0 on Run { name }"]
    parts += [
        f"fragment D{i} on Run {{ workers {{ run {{ ...D{i - 1} }} }} }}" for i in range(1, levels)
    ]
    return f"query {{ runs {{ ...D{levels - 1} }} }} " + " ".join(parts)


# Each attack, and what its refusal says (with a token; without one, every one of them is
# refused UNAUTHENTICATED before it is parsed).
ATTACKS: dict[str, tuple[str, str]] = {
    # the issue's documents: a million fields in 800 bytes, in 20 fragments
    "fan-out": (fan_out(20, "viewer { user workspace }"), "fields once its fragments"),
    "fan-out of __typename": (fan_out(20, "__typename"), "fields once its fragments"),
    "overlapping aliases": (
        fan_out(20, "a: viewer { user } a: runs { name } b: gpus { line } b: viewer { user }"),
        "fields once its fragments",
    ),
    "overlapping fields": (
        fan_out(16, 'run(name: "x") { name } run(name: "y") { state }'),
        "fields once its fragments",
    ),
    "directives on spreads": (
        fan_out(14, "viewer { user }", "...F{p} @include(if: true) @skip(if: false) ...F{p}"),
        "fields once its fragments",
    ),
    "directives on a field": (
        "{ viewer " + "@include(if: true) " * 12 + "{ user } }",
        "12 directives; at most 3",
    ),
    "deep by fragments": (deeper_by_fragments(8), "exceeds maximum operation depth of 10"),
    "deep lists": (
        "{ runs(workspace: " + "[" * 150 + '"x"' + "]" * 150 + ") { name } }",
        "String cannot represent a non string value",
    ),
    "lists past the parser's nesting": (
        "{ runs(workspace: " + "[" * 1000 + "]" * 1000 + ") { name } }",
        "nested too deeply",
    ),
    "many fragments": (
        "{ "
        + " ".join(f"...M{i}" for i in range(100))
        + " } "
        + " ".join(f"fragment M{i} on Query {{ __typename }}" for i in range(100)),
        "100 fragments; at most 20",
    ),
    "a fragment cycle": (
        "{ ...A } fragment A on Query { ...B ...B } fragment B on Query { ...A ...A }",
        "within itself",
    ),
    "many tokens": ("{ " + "__typename " * 3000 + "}", "more than 2000 tokens"),
    "a megabyte of commas": ("{ viewer { user " + "," * 2**20 + " } }", "characters long"),
}

# The heaviest document the bounds let through: 149 fields of one name, each with a field of
# its own (298 fields), compared pairwise by validation's overlapping-fields rule.
HEAVIEST_ALLOWED = "{ " + "viewer { user } " * 149 + "}"


def named(query: str, name: str) -> str:
    """The document with its (first) operation named so."""
    if query.startswith("query {"):
        return query.replace("query {", f"query {name} {{", 1)
    assert query.startswith("{"), query
    return f"query {name} {query}"


@dataclass
class Measured:
    answers: list[tuple[str, int, dict[str, Any]]]  # (attack, HTTP status, body)
    healthz: list[float]  # seconds each /healthz took meanwhile
    took: float


# Times /healthz every 50 ms until its stdin closes, printing the seconds each took, a line
# each: a process of its own, so that the senders' threads (JSON of a megabyte, in this
# process) cannot delay its clock readings, only the server can.
PROBE = """
import sys, threading, time, httpx
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
with httpx.Client(timeout=60) as client:
    while not done.is_set():
        started = time.monotonic()
        assert client.get(sys.argv[1] + "/healthz").status_code == 200
        print(f"{time.monotonic() - started:.4f}", flush=True)
        time.sleep(0.05)
"""


def attack(url: str, token: str | None, documents: dict[str, str], rounds: int = 1) -> Measured:
    """SENDERS clients each send every document ``rounds`` times (each time a new document),
    while /healthz is timed by another process."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answers: list[tuple[str, int, dict[str, Any]]] = []

    def send(sender: int) -> None:
        with httpx.Client(timeout=300) as client:
            for round_ in range(rounds):
                for name, query in documents.items():
                    # a document of its own: no cache of documents already checked helps
                    text = named(query, f"S{sender}R{round_}")
                    answer = client.post(f"{url}/graphql", json={"query": text}, headers=headers)
                    answers.append((name, answer.status_code, answer.json()))

    prober = subprocess.Popen(
        [sys.executable, "-c", PROBE, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert prober.stdout is not None
    first = prober.stdout.readline()  # probing, before the attack begins
    began = time.monotonic()
    try:
        with ThreadPoolExecutor(SENDERS) as pool:
            list(pool.map(send, range(SENDERS)))
    finally:
        out, _ = prober.communicate(b"", timeout=120)
    assert prober.returncode == 0
    return Measured(answers, [float(t) for t in (first + out).split()], time.monotonic() - began)
