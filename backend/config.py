"""One settings object; every setting is an ``ASTRAEUS_*`` environment variable."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# A network a setting names (the webhooks' allow-list, ASTRAEUS_WEBHOOK_ALLOW).
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(value: object) -> tuple[IPNetwork, ...]:
    """``"10.0.0.0/8, 127.0.0.1"`` (or a list of them) as networks; an address is a /32 or
    /128. A network with host bits set (``10.1.2.3/8``) is refused: it is likely a typo."""
    if isinstance(value, str):
        parts: Iterable[object] = [p for p in value.replace(";", ",").split(",") if p.strip()]
    elif isinstance(value, list | tuple):
        parts = value
    else:
        raise ValueError("must be a comma-separated list of networks such as 10.0.0.0/8")
    networks = []
    for part in parts:
        text = str(part).strip()
        try:
            networks.append(ipaddress.ip_network(text, strict=True))
        except ValueError as error:
            raise ValueError(f"{text!r} is not a network such as 10.0.0.0/8: {error}") from None
    return tuple(networks)


_DURATION_PART = re.compile(r"(\d+)(d|h|m|s)")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
MAX_DURATION_S = 36500 * 86400


def parse_duration(value: object) -> timedelta:
    """Read ``90``, ``"90s"``, ``"15m"``, ``"1h30m"`` or ``"2d"`` as a duration."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 30s, 15m, 12h or 1h30m")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().lower()
        if text.startswith("-"):
            raise ValueError("must not be negative")
        if text.isdigit():
            seconds = float(text)
        else:
            parts = _DURATION_PART.findall(text)
            if "".join(n + u for n, u in parts) != text:
                raise ValueError("must be a duration such as 30s, 15m, 12h or 1h30m")
            seconds = float(sum(int(n) * _UNIT_SECONDS[u] for n, u in parts))
    else:
        raise ValueError("must be a duration such as 30s, 15m, 12h or 1h30m")
    if seconds < 0:
        raise ValueError("must not be negative")
    if seconds > MAX_DURATION_S:  # a larger one overflowed timedelta (a 500 in ?step=)
        raise ValueError("must be at most 36500d (100 years)")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """The shortest form people write: ``12h``, ``1h30m``, ``45s``."""
    seconds = int(value.total_seconds())
    if seconds == 0:
        return "0s"
    out = []
    for unit in ("d", "h", "m", "s"):
        count, seconds = divmod(seconds, _UNIT_SECONDS[unit])
        if count:
            out.append(f"{count}{unit}")
    return "".join(out)


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "astraeus"


def parse_port_range(value: object) -> tuple[int, int]:
    """ASTRAEUS_MASTER_PORTS: FIRST-LAST, 1024 <= FIRST <= LAST <= 65535."""
    if isinstance(value, tuple):
        return value
    first, _, last = str(value).partition("-")
    try:
        low, high = int(first), int(last)
    except ValueError:
        raise ValueError(f"must be FIRST-LAST, such as 29500-30499 (got {value!r})") from None
    if not 1024 <= low <= high <= 65535:
        raise ValueError(f"must be FIRST-LAST with 1024 <= FIRST <= LAST <= 65535 (got {value!r})")
    return low, high


class Settings(BaseSettings):
    """Astraeus' settings. Each field is read from ``ASTRAEUS_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="ASTRAEUS_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str | None = None
    console_dir: Path | None = None
    broker: Literal["embedded", "redis"] = "embedded"
    redis_url: str = "redis://127.0.0.1:6379/0"
    migrate_on_start: bool | None = None
    log_level: str = "info"
    db_pool_size: int = 10
    db_echo: bool = False
    # The largest request body the API reads; a larger one is answered 413 before it is read
    # (a run's spec, the largest request, is bounded well under it in backend/spec.py).
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    # A run's code (`astra astraeus submit --workdir`, issue 41): the most bytes its files may be
    # unpacked; an upload is at most a little more (backend/code/rules.upload_limit).
    code_limit_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    # An uploaded archive no live run ships with goes this long after its last upload or use.
    code_retention: Duration = timedelta(days=30)
    # A GraphQL request's time budget: past it, it is answered TIME_BUDGET_EXCEEDED.
    graphql_time_budget: Duration = timedelta(seconds=30)
    # Database sessions one workspace's GraphQL requests hold at once, all of them together,
    # so that one workspace's heavy requests cannot take every connection from the others.
    graphql_sessions_per_workspace: int = Field(default=4, ge=1)
    lease_time: Duration = timedelta(seconds=60)
    # Where machines' agents connect (gRPC); 0 turns the agent endpoint off.
    agent_port: int = 8081
    # TLS on both listeners (HTTP API and the agents' gRPC endpoint): a PEM certificate (chain)
    # and its key. Without them the server listens in plaintext, only on a loopback host unless
    # allow_plaintext says so (behind a proxy that terminates TLS). backend/tls.py
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # The CA that signed tls_cert, for `astraeus up`'s local agent (default: tls_cert itself,
    # right for a self-signed one).
    tls_ca: Path | None = None
    # Agents must present a client certificate signed by this CA (PEM).
    agent_client_ca: Path | None = None
    allow_plaintext: bool = False
    # `astraeus up` starts an agent on this machine, with this many simulated GPUs where the
    # machine has no NVIDIA GPU (with NVML present it uses the real ones).
    local_agent: bool = True
    local_agent_gpus: int = 8
    # The ports a gang's rank 0 may be given as MASTER_PORT (FIRST-LAST), one per live run on
    # a machine (backend/scheduling/rules.py): keep them out of the machines' ephemeral range.
    master_ports: Annotated[tuple[int, int], NoDecode, BeforeValidator(parse_port_range)] = (
        29500,
        30499,
    )
    # How often the scheduling pass (leases, timers, placement) runs besides on events.
    scheduler_interval: Duration = timedelta(seconds=5)
    # How often each Slurm-backed cluster's jobs and nodes are read (backend/slurm/).
    slurm_import_interval: Duration = timedelta(seconds=30)
    # Workers' metric samples are kept this long as sampled; older ones are summarised to
    # one-minute values kept until the second retention (no longer than the first: none kept).
    metrics_retention: Duration = timedelta(days=15)
    metrics_downsampled_retention: Duration = timedelta(days=90)
    # Run the Dramatiq worker and the periodic pass inside the server (the embedded mode).
    # Default: on with the embedded broker, off with Redis (run `astraeus worker` instead).
    run_jobs: bool | None = None
    # Networks webhooks may be sent to although they are inside (loopback, private, …):
    # receivers of this organisation's own network, e.g. "10.20.0.0/16,127.0.0.1". Comma-
    # separated; empty: none. The server's own ports are refused whatever it says.
    webhook_allow: Annotated[tuple[IPNetwork, ...], NoDecode, BeforeValidator(parse_networks)] = ()
    # The keys secret values and webhook secrets are encrypted with at rest (Fernet keys,
    # comma-separated: the first encrypts, every one decrypts, so a key can be rotated). Unset:
    # read from ``secret_key_file``, by default ``<data_dir>/secret.key``, made at first start.
    # Every server process of one database needs the same keys.
    secret_key: str | None = Field(default=None, repr=False)
    secret_key_file: Path | None = None

    @model_validator(mode="after")
    def _leases_checked_in_time(self) -> Settings:
        # a lease check that finds the previous one over half a lease ago takes it that the
        # database was away and renews every lease (backend/machines/service.py)
        if self.scheduler_interval * 2 >= self.lease_time:
            raise ValueError(
                "ASTRAEUS_SCHEDULER_INTERVAL must be under half of ASTRAEUS_LEASE_TIME "
                f"({format_duration(self.scheduler_interval)} is not under half of "
                f"{format_duration(self.lease_time)})"
            )
        return self

    @property
    def runs_jobs_in_process(self) -> bool:
        if self.run_jobs is not None:
            return self.run_jobs
        return self.broker == "embedded"

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'astraeus.db'}"

    @property
    def is_embedded(self) -> bool:
        return self.resolved_database_url.startswith("sqlite")

    @property
    def should_migrate_on_start(self) -> bool:
        """Migrations run on start in the embedded mode; a server deployment upgrades explicitly."""
        if self.migrate_on_start is not None:
            return self.migrate_on_start
        return self.is_embedded

    @property
    def resolved_console_dir(self) -> Path:
        if self.console_dir is not None:
            return self.console_dir
        return Path(__file__).resolve().parent.parent / "frontend" / "dist"

    @property
    def api_url(self) -> str:
        scheme = "https" if self.tls_cert else "http"
        return self.public_url or f"{scheme}://{self.host}:{self.port}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def settings_problems(error: ValidationError) -> list[str]:
    """A refused setting as its environment variable and the reason, one line each."""
    lines = []
    for problem in error.errors():
        reason = str(problem["msg"]).removeprefix("Value error, ")
        if problem["loc"]:
            lines.append(f"ASTRAEUS_{str(problem['loc'][0]).upper()}: {reason}")
        else:
            lines.append(reason)
    return lines
