"""A workload that hangs: steps for two minutes, then stops making progress and stops writing
(a dead collective, say) while it keeps its GPUs. With stall_timeout 2m and on_stall keep,
Astraeus marks it stalled and counts its GPU time as stalled."""

import time

import astraeus_progress

for step in range(1, 121):
    astraeus_progress.report(step, loss=1.0 / step)
    if step % 10 == 0:
        print(f"step {step}", flush=True)
    time.sleep(1)
print("all-reduce on ring 0 ...", flush=True)
while True:
    time.sleep(3600)
