"""A two-rank PyTorch DDP training script as a user writes it: nothing of Astraeus in it but the
optional progress file. torch.distributed reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
from the environment (init_method env://), as torchrun and Astraeus both set them.

    python ddp_train.py [--steps N] [--sleep SECONDS] [--exit-at STEP --exit-rank RANK]
"""

import argparse
import os
import sys
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
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    master = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    print(f"rank {rank} of {world}: joined at {master}", flush=True)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
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
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if progress:
            with open(progress, "a") as f:
                f.write(f"{step}\n")
        time.sleep(args.sleep)
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
