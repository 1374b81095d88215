"""GPU check for a lent NVIDIA machine (issue 4): what the agent's NVML code sees, under load.

Run on the device machine after `make setup` (and `pip install torch` for the CUDA load):

    .venv/bin/python scripts/gpu_check.py --seconds 60 > "$OUT/gpu_check.json"

It lists the GPUs through agent/gpus.py (the agent's own inventory), starts a half-precision
matmul loop on GPU 0 with torch when torch is there, and reads GPU 0 every second through the
agent's own NvmlSampler: task_gpu_utilization_ratio, task_gpu_memory_used_bytes and, on Hopper
or later, the GPM ratios task_gpu_sm_active_ratio, task_gpu_tensor_active_ratio and
task_gpu_dram_active_ratio (measured between consecutive reads), plus its health check.
Anything NVML does not support is absent from a sample, never 0.
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

from agent.gpus import NvmlSampler, nvml

LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
end = time.time() + {seconds}
while time.time() < end:
    b = a @ a
torch.cuda.synchronize()
"""


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
    # The agent's own sampler: what it would send as task_gpu_* samples every second.
    sampler = NvmlSampler()
    result["gpm_supported"] = sampler.gpm_supported
    end = time.time() + args.seconds
    while time.time() < end and (load is None or load.poll() is None):
        result["samples"].append({"at": time.time(), "gpu": 0, **sampler.read(0)})
        faults = {index: fault.__dict__ for index, fault in sampler.faults().items()}
        result.setdefault("faults", []).append(faults)
        time.sleep(1.0)
    if load is not None:
        load.wait()
        result["load_exit_code"] = load.returncode
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
