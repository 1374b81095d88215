"""Whether a CUDA workload runs inside the process agent's sandbox (agent/enter.py, issue 37) on
a GPU machine: run as root from the repository's root, with a Python that has PyTorch and CUDA
(`sudo python3 scripts/gpu_sandbox.py`). It probes the machine as the agent does, then starts a
bf16 matrix product, a CUDA IPC handle and a look at /dev/shm, /tmp and /proc through enter.py,
as an unprivileged user (2000001) in its own mount and IPC namespaces, with private /tmp,
/var/tmp, /dev/shm and a hidepid /proc — what a worker of `astraeus agent` gets.

On an NVIDIA H200 (kernel 6.18, driver 580, PyTorch 2.11+cu130), 2026-12-04: the probe found
every part; the workload ran as 2000001, `cuda True`, the matrix product and the IPC handle
worked, its /dev/shm held only CUDA's and PyTorch's own files, its /tmp was empty, and /proc
showed only its own user. Two workers of one gang on one machine have two /dev/shm: NCCL's
shared-memory transport between them is not checked here (one GPU; NCCL refuses two ranks on
one device) — ranks a worker starts itself (torchrun --nproc_per_node) share its sandbox."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

ENTER = os.path.abspath("agent/enter.py")
py = shutil.which("python3")
print("python3:", py, flush=True)
probe_dir = tempfile.mkdtemp(prefix="probe-")
p = subprocess.run(
    [sys.executable, "-I", "-S", ENTER, "--probe", probe_dir], capture_output=True, text=True
)
print("probe:", p.stdout.strip(), p.stderr.strip()[-500:], flush=True)
found = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
folder = (
    tempfile.mkdtemp(prefix="worker-", dir="/var/lib")
    if os.path.isdir("/var/lib")
    else tempfile.mkdtemp()
)
os.chmod(folder, 0o711)
uid = 2000001
tmp, vtmp, home = (os.path.join(folder, n) for n in ("tmp", "var-tmp", "home"))
for d in (tmp, vtmp, home):
    os.makedirs(d)
    os.chown(d, uid, uid)
    os.chmod(d, 0o700)
WORK = r"""
import os, torch
print("uid", os.getuid(), "cuda", torch.cuda.is_available(), flush=True)
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
y = (x @ x).float().sum().item()
torch.cuda.synchronize()
print("matmul ok", torch.cuda.get_device_name(0), flush=True)
# CUDA IPC handle of a tensor (what a DataLoader worker or a same-machine rank would share)
import torch.multiprocessing as mp
t = torch.ones(1024, device="cuda")
storage = t.untyped_storage()
print("ipc handle", bool(storage._share_cuda_()), flush=True)
print("shm", os.listdir("/dev/shm"), "tmp", os.listdir("/tmp"), flush=True)
others = set()
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try: others.add(os.stat("/proc/" + pid).st_uid)
    except OSError: pass
print("uids seen in /proc", sorted(others), flush=True)
"""
sandbox = None
if found.get("private_tmp") and found.get("private_shm"):
    sandbox = {
        "tmp": [tmp, vtmp],
        "shm_bytes": 1 << 30,
        "hide_processes": bool(found.get("hidden_processes")),
    }
spec = {
    "argv": [py, "-c", WORK],
    "cwd": home,
    "env": {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", ""),
    },
    "identity": {"uid": uid, "gid": uid, "groups": []},
    "sandbox": sandbox,
}
with open(os.path.join(folder, "spec.json"), "w") as f:
    json.dump(spec, f)
print("sandbox used:", sandbox, flush=True)
r = subprocess.run(
    [sys.executable, "-I", "-S", ENTER, folder], capture_output=True, text=True, env={}
)
print("rc", r.returncode, flush=True)
print(r.stdout[-3000:], r.stderr[-3000:], flush=True)
