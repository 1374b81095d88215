"""The machine's GPUs behind one interface: NVML on a real machine, simulated ones on request."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

from astraeus.agent.v1 import agent_pb2

SIMULATED_MODEL = "Simulated GPU"
SIMULATED_UUID = "SIM-"


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    model: str
    memory_bytes: int
    healthy: bool = True
    health_reason: str = ""

    @property
    def is_simulated(self) -> bool:
        return self.uuid.startswith(SIMULATED_UUID)


def simulated(
    count: int, machine: str, model: str = SIMULATED_MODEL, memory_bytes: int = 80 * 2**30
) -> list[GpuDevice]:
    """GPUs that do not exist, named "Simulated GPU" wherever they appear unless a model is
    given (to rehearse a cluster of that model); their UUIDs always say SIM."""
    return [
        GpuDevice(i, f"{SIMULATED_UUID}{machine}-{i}", model, memory_bytes) for i in range(count)
    ]


def simulated_memory_used(worker_bytes: float, gpus: int, gpu_memory_bytes: int) -> float:
    """What one of a worker's simulated GPUs shows as used memory: an even share of the memory
    charged to the worker (its control group's, or its processes' resident memory), at most the
    GPU's own. It follows the workload: a worker that allocates more holds more on its GPUs, one
    that frees memory holds less, and an idle one next to nothing; a real GPU's figure is NVML's."""
    if gpus <= 0:
        return 0.0
    return float(min(max(worker_bytes, 0.0) / gpus, gpu_memory_bytes))


def nvml() -> list[GpuDevice] | None:
    """The machine's NVIDIA GPUs through NVML; None where there is no NVIDIA driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    devices = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        devices.append(
            GpuDevice(
                index=index,
                uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                model=name.decode() if isinstance(name, bytes) else name,
                memory_bytes=int(memory),
            )
        )
    return devices


def discover(simulate: int, machine: str, model: str = SIMULATED_MODEL) -> list[GpuDevice]:
    """NVML when it is there (never simulated then); otherwise the simulated GPUs asked for."""
    real = nvml()
    if real is not None:
        return real
    return simulated(simulate, machine, model)


# NVML_GPM_METRIC_* ids (nvml.h): SM activity, any tensor pipe activity, DRAM bandwidth.
GPM_METRICS = {
    "task_gpu_sm_active_ratio": 2,
    "task_gpu_tensor_active_ratio": 5,
    "task_gpu_dram_active_ratio": 10,
}
# XIDs that mean the GPU cannot be trusted with work (NVIDIA's XID catalogue): 48 double-bit
# ECC, 62/64/79 internal errors and fallen off the bus, 92-95 ECC/contained errors, 119/120 GSP.
FATAL_XIDS = {48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120}


@dataclass(frozen=True)
class GpuCounters:
    """What NVML says of a GPU's health at one moment."""

    uncorrected_ecc: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    xid: int | None = None


@dataclass(frozen=True)
class GpuFault:
    """A fault that makes a GPU unhealthy: its kind, from the NVML reading that showed it (the
    server classifies by it), and a sentence for people (shown, never read back)."""

    kind: agent_pb2.GpuFaultKind
    reason: str

    def message(self, index: int) -> agent_pb2.GpuHealth:
        """The protocol's report of this fault on GPU ``index``."""
        return agent_pb2.GpuHealth(index=index, healthy=False, kind=self.kind, reason=self.reason)


def health_change(before: GpuCounters, now: GpuCounters) -> GpuFault | None:
    """The fault that makes a GPU unhealthy since the last look; None if none."""
    if now.xid is not None and now.xid in FATAL_XIDS:
        return GpuFault(
            agent_pb2.GPU_FAULT_KIND_XID, f"XID {now.xid}: the GPU reported a fatal error"
        )
    if now.uncorrected_ecc > before.uncorrected_ecc:
        added = now.uncorrected_ecc - before.uncorrected_ecc
        return GpuFault(agent_pb2.GPU_FAULT_KIND_ECC, f"ECC: {added} uncorrectable memory error(s)")
    if now.remap_failed and not before.remap_failed:
        return GpuFault(
            agent_pb2.GPU_FAULT_KIND_ROW_REMAP_FAILED,
            "Row remapping failed: the GPU's memory needs service",
        )
    if now.remap_pending and not before.remap_pending:
        return GpuFault(
            agent_pb2.GPU_FAULT_KIND_ROW_REMAP_PENDING,
            "Row remapping pending: the GPU must be reset",
        )
    return None


class NvmlSampler:
    """Per-GPU readings through NVML: utilisation, memory used, GPM ratios, health.

    GPM ratios are measured between two GPM samples, the one of the previous reading and the
    one taken now, so no reading sleeps. Anything the GPU or driver does not support is left
    out (absent), never reported as 0.
    """

    def __init__(self) -> None:
        import pynvml

        self.nvml = pynvml
        self.handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in self._indexes()}
        self.gpm_supported = {i: self._gpm_supported(h) for i, h in self.handles.items()}
        self.gpm_previous: dict[int, Any] = {}
        self.counters = {i: self._counters(h) for i, h in self.handles.items()}
        self.events = self._xid_events()

    def _indexes(self) -> range:
        return range(self.nvml.nvmlDeviceGetCount())

    def _gpm_supported(self, handle: Any) -> bool:
        try:
            return bool(self.nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except (self.nvml.NVMLError, AttributeError):
            return False

    def read(self, index: int) -> dict[str, float]:
        """The GPU's metrics now, by metric name."""
        handle = self.handles.get(index)
        if handle is None:
            return {}
        values: dict[str, float] = {}
        with contextlib.suppress(self.nvml.NVMLError):
            rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            values["task_gpu_utilization_ratio"] = rates.gpu / 100.0
        with contextlib.suppress(self.nvml.NVMLError):
            values["task_gpu_memory_used_bytes"] = float(
                self.nvml.nvmlDeviceGetMemoryInfo(handle).used
            )
        if self.gpm_supported.get(index):
            values.update(self._gpm(index, handle))
        return values

    def _gpm(self, index: int, handle: Any) -> dict[str, float]:
        nvml = self.nvml
        try:
            sample = nvml.nvmlGpmSampleAlloc()
            nvml.nvmlGpmSampleGet(handle, sample)
        except nvml.NVMLError:
            return {}
        previous = self.gpm_previous.get(index)
        self.gpm_previous[index] = sample
        if previous is None:
            return {}
        out: dict[str, float] = {}
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = previous, sample
            for slot, metric in enumerate(GPM_METRICS.values()):
                request.metrics[slot].metricId = metric
            nvml.nvmlGpmMetricsGet(request)
            for slot, name in enumerate(GPM_METRICS):
                m = request.metrics[slot]
                if m.nvmlReturn == 0:
                    out[name] = m.value / 100.0
        except nvml.NVMLError:
            pass
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlGpmSampleFree(previous)
        return out

    def _counters(self, handle: Any, xid: int | None = None) -> GpuCounters:
        nvml = self.nvml
        ecc, pending, failed = 0, False, False
        with contextlib.suppress(nvml.NVMLError):
            ecc = int(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            )
        with contextlib.suppress(nvml.NVMLError):
            _, _, pending_, failed_ = nvml.nvmlDeviceGetRemappedRows(handle)
            pending, failed = bool(pending_), bool(failed_)
        return GpuCounters(ecc, pending, failed, xid)

    def _xid_events(self) -> Any:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            for handle in self.handles.values():
                with contextlib.suppress(nvml.NVMLError):
                    xid = nvml.nvmlEventTypeXidCriticalError
                    nvml.nvmlDeviceRegisterEvents(handle, xid, events)
            return events
        except nvml.NVMLError:
            return None

    def _pending_xids(self) -> dict[int, int]:
        """XID events since the last look, by GPU index (waits for none)."""
        found: dict[int, int] = {}
        if self.events is None:
            return found
        by_handle = {id(h): i for i, h in self.handles.items()}
        while True:
            try:
                event = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.nvml.NVMLError:
                return found
            index = by_handle.get(id(event.device))
            if index is None:
                with contextlib.suppress(self.nvml.NVMLError):
                    index = self.nvml.nvmlDeviceGetIndex(event.device)
            if index is not None:
                found[index] = int(event.eventData)

    def faults(self) -> dict[int, GpuFault]:
        """GPUs that became unhealthy since the last look, with the fault."""
        xids = self._pending_xids()
        found = {}
        for index, handle in self.handles.items():
            now = self._counters(handle, xids.get(index))
            fault = health_change(self.counters[index], now)
            self.counters[index] = dataclasses.replace(now, xid=None)
            if fault is not None:
                found[index] = fault
        return found
