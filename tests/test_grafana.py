"""The Grafana dashboard of deploy/grafana (issue 23) over the Prometheus gauges Astraeus serves.

No Grafana installs here (not in Debian's packages, nor on PyPI or npm), so the nearest real
checks: its JSON against Grafana's own dashboard schema (@grafana/schema's types, in the
console's type check: frontend/src/grafana.test.ts), and here its queries against the gauges
of /v1/goodput/metrics (names and labels, on a live exposition), the provisioning files, and the
compose file's grafana profile."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import yaml

from backend.accounting.exposition import GAUGES
from tests.lifecycle.world import World
from tests.support import Tenancy
from tests.support.accounting import sample, tick

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = json.loads((GRAFANA / "dashboards" / "astraeus.json").read_text())
# the list: goodput by workspace and run, stalled workers, stragglers, unhealthy GPUs,
# alerts
WANTED = {
    "astraeus_goodput_ratio",
    "astraeus_run_goodput_ratio",
    "astraeus_workers_stalled",
    "astraeus_runs_with_straggler",
    "astraeus_gpus_unhealthy",
    "astraeus_threshold_alerts_firing",
}
SELECTOR = re.compile(r"(astraeus_\w+)(\{([^}]*)\})?")
GROUPING = re.compile(r"by \(([^)]*)\)")


def queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p["targets"]]


def test_every_query_names_a_gauge_with_its_labels() -> None:
    used = set()
    for title, expr in queries():
        found = SELECTOR.findall(expr)
        assert found, (title, expr)
        for metric, _, matchers in found:
            assert metric in GAUGES, (title, metric)
            used.add(metric)
            labels = set(GAUGES[metric][1])
            for matcher in filter(None, (m.strip() for m in matchers.split(","))):
                name, value = re.fullmatch(r'(\w+)\s*=\s*"([^"]*)"', matcher).groups()  # type: ignore[union-attr]
                assert name in labels, (title, name)
                if name == "scope":
                    assert value in ("cluster", "workspace", "machine", "pool"), (title, value)
                if name == "window":
                    assert value in ("hour", "day"), (title, value)
            for grouped in GROUPING.findall(expr):
                assert {g.strip() for g in grouped.split(",")} <= labels, (title, grouped)
        # a legend names labels the series has
        for p in DASHBOARD["panels"]:
            for t in p["targets"]:
                for label in re.findall(r"\{\{(\w+)\}\}", t["legendFormat"]):
                    metric = SELECTOR.search(t["expr"]).group(1)  # type: ignore[union-attr]
                    assert label in GAUGES[metric][1], (p["title"], label)
    assert used >= WANTED, WANTED - used


def test_the_provisioning_names_the_dashboards_data_source() -> None:
    source = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "astraeus.yml").read_text())
    (ds,) = source["datasources"]
    assert (ds["uid"], ds["type"], ds["url"]) == (
        "astraeus-prometheus",
        "prometheus",
        "http://prometheus:9090",
    )
    uids = {p["datasource"]["uid"] for p in DASHBOARD["panels"]}
    assert uids == {ds["uid"]}
    boards = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "astraeus.yml").read_text())
    assert boards["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    scrape = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    (job,) = scrape["scrape_configs"]
    assert job["metrics_path"] == "/v1/goodput/metrics"  # the seed's endpoint
    assert job["authorization"]["credentials_file"] == "/etc/prometheus/astraeus-token"


def test_the_compose_files_grafana_profile_mounts_them() -> None:
    services: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    grafana, prometheus = services["grafana"], services["prometheus"]
    assert grafana["profiles"] == prometheus["profiles"] == ["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert mounts["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    assert mounts["/var/lib/grafana/dashboards"] == "./deploy/grafana/dashboards"
    # no default password: a file the admin writes
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"] in mounts
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]
    scraped = {v.split(":")[1]: v.split(":")[0] for v in prometheus["volumes"]}
    assert scraped["/etc/prometheus/prometheus.yml"] == "./deploy/grafana/prometheus.yml"
    for path in [*mounts.values(), *scraped.values()]:
        if path.startswith("./deploy/grafana/") and not path.endswith(("token", "password")):
            assert (ROOT / path).exists(), path


async def test_the_live_exposition_has_every_gauge_the_dashboard_asks_for(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # an admin's scrape (as deploy/grafana/prometheus.yml's token) of a running run
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=2)
    await world.schedule()
    await world.start("llama-sft-0")
    world.clock.advance(minutes=2)
    await sample(world, {0: 0.9})
    await tick(world)
    text = (
        await client.get(
            "/v1/goodput/metrics", headers={"Authorization": f"Bearer {tenancy.admin_token}"}
        )
    ).text
    served = set(re.findall(r"^# TYPE (\w+) gauge$", text, re.M))
    # alerts firing only when some are: the rest are always there for an admin
    assert served >= WANTED - {"astraeus_threshold_alerts_firing"}, text
    assert 'astraeus_gpus_unhealthy{cluster="local"} 0.0' in text
