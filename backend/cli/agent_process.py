"""``astraeus agent``: a machine's agent (agent/main.py), this process alone: it loads the agent
and nothing of the server (its domains, migrations and web stack), so that every machine's
agent, and each restart of one, starts in a fraction of the server's time."""

from __future__ import annotations

import argparse

from backend.config import Settings


def cmd_agent(settings: Settings, args: argparse.Namespace) -> int:
    from agent.main import run

    return run(args)
