"""Headless Chromium for the console's tests: Debian's chromium driven by Playwright's driver
(playwright-core), a page at 1280 by 800, screenshots where $ASTRAEUS_SCREENSHOTS says."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # scripts/screenshots.py launches the browser without the tests' server
    from tests.e2e.live import Server

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "frontend" / "dist"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Chromium as this machine kind runs it: no sandbox as root, and no background connections
# (the closed network refuses them).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The console's pages as the tests and docs/screenshots see them.
VIEWPORT = {"width": 1280, "height": 800}

try:
    from playwright import sync_api
except ImportError:  # pragma: no cover - a dev dependency: make setup installs it
    sync_api = None  # type: ignore[assignment]

NEEDS_CHROMIUM = pytest.mark.skipif(
    sync_api is None or not Path(CHROMIUM).exists(),
    reason="Debian's chromium is not installed (apt-get install chromium; .ci/run does)",
)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's chromium, headless, driven by Playwright's driver, until the block ends (the
    tests' browser fixture and scripts/screenshots.py)."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


def console_dir() -> str:
    assert (DIST / "index.html").is_file(), "the console is not built: run make console"
    return str(DIST)


def screenshots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("ASTRAEUS_SCREENSHOTS") or tmp_path)
    folder = folder if folder.is_absolute() else ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sign_in(page: Any, server: Server, token: str) -> None:
    page.goto(f"{server.url}/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r".*/o/default/w/default/goodput$"))
