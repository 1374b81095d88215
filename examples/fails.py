"""A workload that fails: it loads, trains a little, then raises (exit code 1). Its run's
failure panel says "Your program: its log."."""

import time

import astraeus_progress

print("loading the data set from /data/shards", flush=True)
for step in range(1, 31):
    astraeus_progress.report(step, loss=2.0 - step / 100)
    time.sleep(1)
print("Traceback (most recent call last):", flush=True)
print('  File "train.py", line 88, in <module>', flush=True)
raise RuntimeError("shard 17 is corrupt: expected 4096 records, found 0")
