"""``astraeus agent``: a machine's agent (agent/main.py), this process alone: it loads the agent
and nothing of the server (its domains, migrations and web stack), so that every machine's
agent, and each restart of one, starts in a fraction of the server's time."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal

from backend.config import Settings


def _end_with_parent(parent: int) -> None:
    """Linux: this agent gets SIGTERM when `astraeus up` (``parent``) dies, however it dies."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)


def cmd_agent(settings: Settings, args: argparse.Namespace) -> int:
    from agent.main import run

    if args.end_with_parent:
        _end_with_parent(args.end_with_parent)
    return run(args)
