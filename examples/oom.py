"""A workload that runs out of memory: it grows a buffer by 32 MiB a second. Its run asks for
256 MiB, so its control group kills it (OOMKilled); where the machine cannot limit memory it
stops itself at 1 GiB instead of eating the machine's."""

import time

import astraeus_progress

held = []
for step in range(1, 33):
    held.append(bytearray(32 * 2**20))
    astraeus_progress.report(step)
    print(f"step {step}: holding {step * 32} MiB", flush=True)
    time.sleep(1)
print("this machine did not limit the worker's memory: stopping at 1 GiB", flush=True)
