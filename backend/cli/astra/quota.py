"""``astra astraeus quota show | set`` and ``astra astraeus threshold show`` (issue 21): a
workspace's GPU quota on a cluster (members read their own workspace's, the organisation's
admins read and set any of its workspaces'), and a cluster's alert thresholds (admins)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from backend.cli.astra.client import EXIT_USAGE, Api, CliError, exit_for

DEFAULT_CLUSTER = "local"  # the embedded server's cluster
QUOTA_FIELDS = "workspace cluster gpus"
READ_QUOTA = f"""query($c: String!, $w: String) {{
  quota(cluster: $c, workspace: $w) {{ {QUOTA_FIELDS} }} }}"""
SET_QUOTA = f"""mutation($w: String!, $c: String!, $g: Int) {{
  setQuota(workspace: $w, cluster: $c, gpus: $g) {{
    quota {{ {QUOTA_FIELDS} }} errors {{ code field message }} }} }}"""
THRESHOLDS = """query($c: String!) {
  thresholds(cluster: $c) { name value default updatedAt } }"""

Command = Callable[[str, Callable[[Api, argparse.Namespace], str], str], Any]


def add_commands(command: Command) -> None:
    """The subcommands, added with main's ``command`` (each takes --json)."""
    show = command("quota", cmd_quota, "a workspace's GPU quota on a cluster; admins set it")
    show.add_argument("action", choices=["show", "set"], help="show it, or set it (admins)")
    show.add_argument("gpus", nargs="?", help="with set: the most GPUs at once, or none to lift it")
    show.add_argument("--workspace", help="another workspace of the organisation (admins)")
    show.add_argument("--cluster", default=DEFAULT_CLUSTER, help="the cluster (local)")
    price = command("price", cmd_price, "a pool's price per GPU-hour (admins): goodput --cost")
    price.add_argument("action", choices=["set"], help="set it (none: no price)")
    price.add_argument("pool", help="the pool")
    price.add_argument("amount", help="what a GPU-hour costs, or none")
    price.add_argument("--currency", default="USD", help="ISO 4217 (USD)")
    price.add_argument("--cluster", default=DEFAULT_CLUSTER, help="the cluster (local)")
    threshold = command("threshold", cmd_threshold, "a cluster's alert thresholds (admins)")
    threshold.add_argument("action", choices=["show"])
    threshold.add_argument("--cluster", default=DEFAULT_CLUSTER, help="the cluster (local)")


def _gpus(text: str | None) -> int | None:
    if text is None:
        raise CliError(
            "astra: quota set needs a GPU count: a whole number, or none to lift it", EXIT_USAGE
        )
    if text == "none":
        return None
    if not text.isdigit():
        raise CliError(
            f"astra: gpus: must be a whole number of 0 or more, or none: {text!r}", EXIT_USAGE
        )
    return int(text)


def mutated(payload: dict[str, Any], key: str) -> Any:
    """A mutation's ``key`` once done; its first error, with the field it names, as the CLI's
    error and exit code otherwise."""
    if payload["errors"]:
        error = payload["errors"][0]
        field = f"{error['field']}: " if error.get("field") else ""
        raise CliError(f"astra: {field}{error['message']}", exit_for(error["code"]))
    return payload[key]


def quota_line(quota: dict[str, Any]) -> str:
    """`default's GPU quota on local: 4 GPUs` (the sentence "Waits for namespace quota" counts
    against), or that it has none."""
    gpus = quota["gpus"]
    if gpus is None:
        return f"{quota['workspace']} has no GPU quota on {quota['cluster']}"
    unit = "GPU" if gpus == 1 else "GPUs"
    return f"{quota['workspace']}'s GPU quota on {quota['cluster']}: {gpus} {unit}"


def cmd_quota(api: Api, args: argparse.Namespace) -> str:
    if args.action == "show":
        if args.gpus is not None:
            raise CliError("astra: quota show takes no GPU count (set it: quota set N)", EXIT_USAGE)
        found = api.graphql(READ_QUOTA, c=args.cluster, w=args.workspace)["quota"]
    else:
        if args.workspace is None:
            raise CliError(
                "astra: quota set needs --workspace: the workspace to set it for", EXIT_USAGE
            )
        gpus = _gpus(args.gpus)
        answer = api.graphql(SET_QUOTA, w=args.workspace, c=args.cluster, g=gpus)
        found = mutated(answer["setQuota"], "quota")
    return json.dumps(found, indent=2) if args.json else quota_line(found)


def threshold_table(rows: list[dict[str, Any]]) -> str:
    """NAME, VALUE, DEFAULT and when it was SET (`default`: never set)."""
    width = max(len("NAME"), *(len(r["name"]) for r in rows))
    lines = [f"{'NAME':<{width}}  {'VALUE':>7}  {'DEFAULT':>7}  SET"]
    for r in rows:
        when = r["updatedAt"][:19].replace("T", " ") if r["updatedAt"] else "default"
        lines.append(f"{r['name']:<{width}}  {r['value']:>7g}  {r['default']:>7g}  {when}")
    return "\n".join(lines)


def cmd_threshold(api: Api, args: argparse.Namespace) -> str:
    rows = api.graphql(THRESHOLDS, c=args.cluster)["thresholds"]
    return json.dumps(rows, indent=2) if args.json else threshold_table(rows)


SET_PRICE = """mutation($c: String!, $p: String!, $price: Float, $cur: String!) {
  setPoolPrice(cluster: $c, pool: $p, pricePerGpuHour: $price, currency: $cur) {
    price { cluster pool pricePerGpuHour currency } errors { code field message } } }"""


def _amount(text: str) -> float | None:
    if text == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise CliError(
            f"astra: amount: must be a number (a GPU-hour's price), or none: {text!r}", EXIT_USAGE
        ) from None


def price_line(price: dict[str, Any]) -> str:
    """`h100 on local: 2.50 USD a GPU-hour`, or that it has no price."""
    if price["pricePerGpuHour"] is None:
        return f"{price['pool']} on {price['cluster']} has no price"
    return (
        f"{price['pool']} on {price['cluster']}: "
        f"{price['pricePerGpuHour']:.2f} {price['currency']} a GPU-hour"
    )


def cmd_price(api: Api, args: argparse.Namespace) -> str:
    answer = api.graphql(
        SET_PRICE, c=args.cluster, p=args.pool, price=_amount(args.amount), cur=args.currency
    )
    found = mutated(answer["setPoolPrice"], "price")
    return json.dumps(found, indent=2) if args.json else price_line(found)
