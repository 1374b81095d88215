"""A two-rank PyTorch DDP training script as a user writes it: nothing of Astraeus in it but the
optional progress file. torch.distributed reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
from the environment (init_method env://), as torchrun and Astraeus both set them.

    python ddp_train.py [--steps N] [--sleep SECONDS] [--exit-at STEP --exit-rank RANK]
                        [--hang-at STEP --hang-rank RANK] [--overwrite-progress]

Each step's line ends with the time it was logged (seconds since the epoch).
"""

import argparse
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--exit-at", type=int, default=-1, help="a rank ends here (a crash)")
    parser.add_argument("--exit-rank", type=int, default=1)
    parser.add_argument(
        "--hang-at",
        type=int,
        default=-1,
        help="a rank hangs after this step's update, before logging it (a deadlock): the "
        "others block in the next step's all-reduce",
    )
    parser.add_argument("--hang-rank", type=int, default=1)
    parser.add_argument(
        "--overwrite-progress",
        action="store_true",
        help="write the progress file anew each step (by default a line is appended)",
    )
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    master = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    print(f"rank {rank} of {world}: joined at {master}", flush=True)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    print(f"rank {rank}: model ready, training", flush=True)
    progress = os.environ.get("ASTRAEUS_PROGRESS_FILE")
    for step in range(args.steps):
        if step == args.exit_at and rank == args.exit_rank:
            print(f"rank {rank}: giving up at step {step}", flush=True)
            sys.exit(3)
        inputs = torch.randn(64, 16, generator=generator)
        targets = inputs.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients over gloo here
        optimizer.step()
        if step == args.hang_at and rank == args.hang_rank:
            threading.Event().wait()  # never set
        print(f"rank {rank} step {step} loss {loss.item():.4f} at {time.time():.3f}", flush=True)
        if progress:
            with open(progress, "w" if args.overwrite_progress else "a") as f:
                f.write(f"{step}\n")
        time.sleep(args.sleep)
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
