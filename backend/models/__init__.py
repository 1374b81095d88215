"""Every table of Astraeus, one module each, re-exported here for Alembic and the services."""

from backend.models.alert import Alert, AlertThreshold
from backend.models.base import Base
from backend.models.checkpoint import Checkpoint
from backend.models.cluster import Cluster, Pool
from backend.models.code import CodeArchive, CodeChunk
from backend.models.command import AgentCommand
from backend.models.failure import GpuFault, WorkerFailure, WorkerSeenLines
from backend.models.goodput import (
    AccountingMark,
    GoodputDay,
    GoodputHorizon,
    GoodputHour,
    GoodputInterval,
    GoodputOpenInterval,
    GoodputRecount,
    GoodputRunTotal,
)
from backend.models.history import Event, StateTransition
from backend.models.idle import IdleAction
from backend.models.install import InstallKey
from backend.models.machine import Gpu, LeaseCheck, Machine
from backend.models.machine_credential import JoinToken, MachineCredential
from backend.models.metric import MetricMinute, MetricSample
from backend.models.organization import Organization
from backend.models.rework import Redo
from backend.models.run import Run
from backend.models.secret import Secret
from backend.models.slurm import SlurmAccount, SlurmImport, SlurmRun
from backend.models.user import ApiToken, Membership, User
from backend.models.webhook import Webhook, WebhookDelivery
from backend.models.worker import Attempt, Worker
from backend.models.workspace import Workspace, WorkspaceQuota

__all__ = [
    "AccountingMark",
    "AgentCommand",
    "Alert",
    "AlertThreshold",
    "ApiToken",
    "Attempt",
    "Base",
    "Checkpoint",
    "Cluster",
    "CodeArchive",
    "CodeChunk",
    "Event",
    "GoodputDay",
    "GoodputHorizon",
    "GoodputHour",
    "GoodputInterval",
    "GoodputOpenInterval",
    "GoodputRecount",
    "GoodputRunTotal",
    "Gpu",
    "GpuFault",
    "IdleAction",
    "InstallKey",
    "JoinToken",
    "LeaseCheck",
    "Machine",
    "MachineCredential",
    "Membership",
    "MetricMinute",
    "MetricSample",
    "Organization",
    "Pool",
    "Redo",
    "Run",
    "Secret",
    "SlurmAccount",
    "SlurmImport",
    "SlurmRun",
    "StateTransition",
    "User",
    "Webhook",
    "WebhookDelivery",
    "Worker",
    "WorkerFailure",
    "WorkerSeenLines",
    "Workspace",
    "WorkspaceQuota",
]
