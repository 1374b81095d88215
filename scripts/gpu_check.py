"""GPU check for a lent NVIDIA machine (issue 4): what the agent's NVML code sees, under load.

Run on the device machine after `make setup` (and `pip install torch` for the CUDA load):

    .venv/bin/python scripts/gpu_check.py --seconds 60 > "$OUT/gpu_check.json"

It lists the GPUs through agent/gpus.py (the agent's own inventory), starts a half-precision
matmul loop on GPU 0 with torch when torch is there, and samples every second: utilisation,
memory used, and on Hopper or later the GPM ratios (SM, tensor, DRAM bandwidth) that become
task_gpu_sm_active_ratio, task_gpu_tensor_active_ratio and task_gpu_dram_active_ratio.
Anything NVML does not support is reported as absent (null), never as 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.gpus import nvml

LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
end = time.time() + {seconds}
while time.time() < end:
    b = a @ a
torch.cuda.synchronize()
"""

GPM = {"sm_active": 2, "tensor_active": 5, "dram_active": 10}  # NVML_GPM_METRIC_* ids


def gpm_ratios(pynvml: Any, handle: Any) -> dict[str, float | None]:
    """The GPM metrics over one second, as ratios from 0 to 1; None where unsupported."""
    try:
        if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            return dict.fromkeys(GPM)
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, first)
        time.sleep(1.0)
        pynvml.nvmlGpmSampleGet(handle, second)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM)
        request.sample1, request.sample2 = first, second
        for slot, metric in enumerate(GPM.values()):
            request.metrics[slot].metricId = metric
        pynvml.nvmlGpmMetricsGet(request)
        out: dict[str, float | None] = {}
        for slot, name in enumerate(GPM):
            m = request.metrics[slot]
            out[name] = m.value / 100.0 if m.nvmlReturn == 0 else None
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)
        return out
    except pynvml.NVMLError:
        return dict.fromkeys(GPM)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args()
    devices = nvml()
    result: dict[str, Any] = {"inventory": None, "load": None, "samples": []}
    if devices is None:
        print(json.dumps({"error": "NVML is not available on this machine"}))
        return 1
    result["inventory"] = [d.__dict__ for d in devices]
    load = None
    try:
        load = subprocess.Popen([sys.executable, "-c", LOAD.format(seconds=args.seconds)])
        result["load"] = "torch fp16 matmul on GPU 0"
    except OSError as error:
        result["load"] = f"none: {error}"
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    end = time.time() + args.seconds
    while time.time() < end and (load is None or load.poll() is None):
        utilisation = pynvml.nvmlDeviceGetUtilizationRates(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        result["samples"].append(
            {
                "at": time.time(),
                "gpu": 0,
                "utilization_ratio": utilisation.gpu / 100.0,
                "memory_used_bytes": int(memory.used),
                **gpm_ratios(pynvml, handle),
            }
        )
    if load is not None:
        load.wait()
        result["load_exit_code"] = load.returncode
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
