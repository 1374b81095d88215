"""A training-like workload: steps with a falling loss, a checkpoint every 100 steps, reported
to Astraeus (`import astraeus_progress`, on every worker's path), each rank printing its
lines as torchrun's ranks do. Runs for about 20 minutes."""

import math
import os
import random
import time

import astraeus_progress

rank = os.environ.get("RANK", "0")
for step in range(1, 2401):
    loss = 2.5 * math.exp(-step / 800) + 0.3 + random.uniform(-0.02, 0.02)
    checkpoint = step - step % 100 if step >= 100 else None
    astraeus_progress.report(step, loss=loss, checkpoint_step=checkpoint)
    if step % 10 == 0:
        print(f"[rank{rank}]: step {step} loss {loss:.3f} lr 2.0e-05", flush=True)
    time.sleep(0.5)
print(f"[rank{rank}]: done", flush=True)
