"""The machine's GPUs behind one interface: NVML on a real machine, simulated ones on request."""

from __future__ import annotations

from dataclasses import dataclass

SIMULATED_MODEL = "Simulated GPU"


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    model: str
    memory_bytes: int
    healthy: bool = True
    health_reason: str = ""


def simulated(count: int, machine: str, memory_bytes: int = 80 * 2**30) -> list[GpuDevice]:
    """GPUs that do not exist, named "Simulated GPU" wherever they appear."""
    return [GpuDevice(i, f"SIM-{machine}-{i}", SIMULATED_MODEL, memory_bytes) for i in range(count)]


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


def discover(simulate: int, machine: str) -> list[GpuDevice]:
    """NVML when it is there (never simulated then); otherwise the simulated GPUs asked for."""
    real = nvml()
    if real is not None:
        return real
    return simulated(simulate, machine)
