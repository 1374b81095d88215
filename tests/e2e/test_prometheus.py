"""A real Prometheus scrapes /v1/goodput/metrics with the API token (seed G-35: the seed's
scrape config, with the token in a file as Prometheus reads it)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.live import Server, free_port
from tests.support.http import HTTP

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus is not installed here"
)

SCRAPE = """
scrape_configs:
  - job_name: astralyx-goodput
    scrape_interval: 1s
    scheme: http
    metrics_path: /v1/goodput/metrics
    authorization:
      credentials_file: {token_file}
    static_configs:
      - targets: ["127.0.0.1:{port}"]
"""


def test_prometheus_scrapes_the_goodput_gauges(tmp_path: Path) -> None:
    port = free_port()
    server = Server(tmp_path / "data", port, local_agent=False)
    server.start()
    token_file = tmp_path / "token"
    token_file.write_text(server.admin_token)
    config = tmp_path / "prometheus.yml"
    config.write_text(SCRAPE.format(token_file=token_file, port=port))
    web = free_port()
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("wb"),
    )
    try:
        deadline = time.monotonic() + 60
        result: list[dict[str, object]] = []
        while time.monotonic() < deadline and not result:
            time.sleep(1)
            try:
                answer = HTTP.get(
                    f"http://127.0.0.1:{web}/api/v1/query",
                    params={"query": "astraeus_workers_stalled"},
                    timeout=5,
                ).json()
            except (httpx.TransportError, ValueError):
                continue
            result = answer.get("data", {}).get("result", [])
        assert result, (tmp_path / "prometheus.log").read_text()[-2000:]
        [series] = result
        assert series["metric"]["namespace"] == "default"  # type: ignore[index]
        assert series["metric"]["job"] == "astralyx-goodput"  # type: ignore[index]
        assert series["value"][1] == "0"  # type: ignore[index]
        targets = HTTP.get(f"http://127.0.0.1:{web}/api/v1/targets").json()
        [target] = targets["data"]["activeTargets"]
        assert target["health"] == "up", target
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=15)
        server.stop()
