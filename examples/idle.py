"""A notebook left open: it holds its GPU and does nothing with it (idle GPU time)."""

import time

while True:
    print("kernel alive, waiting for input", flush=True)
    time.sleep(60)
