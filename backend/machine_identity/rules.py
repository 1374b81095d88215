"""Pure rules of machine identity: what a token looks like, what a join token allows, and who
a machine is. No database, no clock."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta

# Join tokens and machine credentials say what they are, so a token pasted in the wrong place
# is told apart without a lookup. Cluster machine tokens made before them begin with astx_.
JOIN_PREFIX = "astj_"
CREDENTIAL_PREFIX = "astm_"
LEGACY_PREFIX = "astx_"

DEFAULT_EXPIRY = timedelta(hours=24)
MAX_EXPIRY = timedelta(days=365)
MAX_USES = 10_000

UNKNOWN = "The machine token is unknown or revoked."
JOIN_ONLY = (
    "This is a join token: `astraeus agent` exchanges it for the machine's own credential; "
    "it does not connect as a machine."
)
REVOKED = "This machine's credential was revoked by an organisation admin."


def hash_token(secret: str) -> str:
    """Tokens are long random strings, so one SHA-256 is enough to store them safely."""
    return hashlib.sha256(secret.encode()).hexdigest()


def well_formed(secret: str | None) -> bool:
    return bool(secret) and 20 <= len(secret or "") <= 128


def is_join_token(secret: str) -> bool:
    return secret.startswith(JOIN_PREFIX)


def expiry_problem(expires_in: timedelta) -> str | None:
    if expires_in <= timedelta(0) or expires_in > MAX_EXPIRY:
        return "must be a duration between 1s and 365d"
    return None


def uses_problem(uses: int) -> str | None:
    if not 1 <= uses <= MAX_USES:
        return f"must be between 1 and {MAX_USES}"
    return None


@dataclass(frozen=True)
class JoinTokenState:
    """What a join token's row says, for the rule that decides whether it lets a machine in."""

    expires_at: datetime | None
    uses_left: int | None
    revoked: bool


def join_refusal(token: JoinTokenState | None, now: datetime) -> str | None:
    """Why this token may not join a machine now, or None when it may."""
    if token is None or token.revoked:
        return "The join token is unknown or revoked."
    if token.expires_at is not None and token.expires_at <= now:
        return (
            f"The join token expired at {token.expires_at:%Y-%m-%d %H:%M} UTC: an admin makes "
            "another (astraeus agent-token create)."
        )
    if token.uses_left is not None and token.uses_left <= 0:
        return (
            "The join token has been used as many times as it allows: an admin makes another "
            "(astraeus agent-token create)."
        )
    return None


# A Join the server completed but whose answer its agent never got (the agent gave up on it,
# or the connection broke): the agent asks again with the same join token. Within this window,
# while the credential it was given has never connected, the retry is answered with a new
# credential in its place (the first one is revoked, no further use of the token is counted);
# after it, or once the credential has connected, the machine is joined (already_joined).
JOIN_RETRY_WINDOW = timedelta(minutes=10)


@dataclass(frozen=True)
class IssuedState:
    """What a machine's live credential's row says, for the join-retry rule."""

    join_token_id: int | None
    created_at: datetime
    last_used_at: datetime | None


def is_join_retry(live: list[IssuedState], join_token_id: int, now: datetime) -> bool:
    """Whether a Join with this token for a machine holding these live credentials is the
    retry of one whose answer was lost: one credential, made from this token within the
    window, never used to connect."""
    return (
        len(live) == 1
        and live[0].join_token_id == join_token_id
        and live[0].last_used_at is None
        and now - live[0].created_at <= JOIN_RETRY_WINDOW
    )


def already_joined(machine: str) -> str:
    return (
        f"Machine '{machine}' already has a credential of its own: its agent connects with it. "
        "To join it again, an admin revokes that credential first "
        f"(astraeus machine-credential revoke {machine})."
    )


@dataclass(frozen=True)
class MachinePrincipal:
    """A machine's agent, as its token says. With a credential, ``machine`` is the one machine
    it may register; a legacy cluster token (``machine`` None, ``legacy`` True) may register
    any machine of the cluster that holds no credential of its own, until it is revoked."""

    organization_id: int
    cluster_id: int
    machine: str | None
    credential_id: int | None = None
    join_token_id: int | None = None

    @property
    def legacy(self) -> bool:
        return self.credential_id is None

    def registration_refusal(self, machine: str, has_credential: bool) -> str | None:
        """Why this principal may not register as ``machine``, or None when it may."""
        if self.machine is not None and machine != self.machine:
            return (
                f"This credential belongs to machine '{self.machine}': it cannot register "
                f"as '{machine}'."
            )
        if self.legacy and has_credential:
            return (
                f"Machine '{machine}' has a credential of its own: a cluster machine token "
                "cannot register as it."
            )
        return None
