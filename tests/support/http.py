"""One HTTP client for the tests' calls to live servers, its connections kept.

A client made for each call (``httpx.get``, ``httpx.post``) builds a TLS context and opens a
connection every time: 30 ms of CPU a call here against 2 ms on a kept connection. The
tests poll live servers several times a second for minutes, in six lanes on two cores, so
that was CPU the servers and workloads under test went without. ``httpx.Client`` is safe to
share between threads; a connection the server closed (a server stopped and started again)
is found closed before it is used and opened anew.
"""

from __future__ import annotations

import atexit

import httpx

HTTP = httpx.Client(limits=httpx.Limits(max_connections=50, max_keepalive_connections=20))
atexit.register(HTTP.close)
