"""A two-rank PyTorch DDP training script as a user writes it: nothing of Astraeus in it but the
optional progress file. torch.distributed reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
from the environment (init_method env://), as torchrun and Astraeus both set them.

    python ddp_train.py [--steps N] [--sleep SECONDS] [--exit-at STEP --exit-rank RANK]
                        [--hang-at STEP --hang-rank RANK] [--overwrite-progress]
                        [--checkpoint PATH --checkpoint-every N [--fail-at STEP]
                         [--checkpoint-mb MB]]
                        [--oom-child-at STEP]

Each step's line ends with the time it was logged (seconds since the epoch). With
--checkpoint, rank 0 saves the model, the optimizer and the step every N steps (written aside,
then renamed; --checkpoint-mb adds that many MB of weights, as a larger model's, so that it
takes a while to write) and reports it in its progress line ({"step": …, "checkpoint_step": …});
a start
that finds the file resumes after its step, rank 0's state broadcast to the others by DDP.
With --oom-child-at, each rank starts a helper process there that grows until the kernel kills
it for memory (its worker's memory limit) and goes on training without it (a data loader's
worker dying, say).
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# The kernel kills the process of the group it scores highest: this one, whatever the sizes.
HUNGRY = (
    "open('/proc/self/oom_score_adj', 'w').write('1000')\n"
    "chunks = []\n"
    "while True:\n"
    "    chunks.append(bytearray(64 * 2**20))\n"
)


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
    parser.add_argument("--checkpoint", help="where rank 0 saves its checkpoint and resumes from")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--checkpoint-mb", type=int, default=0, help="more weights to save")
    parser.add_argument(
        "--fail-at",
        type=int,
        default=-1,
        help="rank 1 crashes here on a fresh start, not on one resumed from a checkpoint (a "
        "fault the restart does not meet again)",
    )
    parser.add_argument(
        "--oom-child-at",
        type=int,
        default=-1,
        help="each rank's helper process is killed for memory here; the rank goes on",
    )
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
    network = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(network.parameters(), lr=0.05)
    first, saved = 0, None
    if args.checkpoint and os.path.exists(args.checkpoint) and rank == 0:
        state = torch.load(args.checkpoint)
        network.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = state["step"] + 1
        saved = state["step"]
    start = torch.tensor([first])
    dist.broadcast(start, 0)  # where rank 0 resumes, every rank resumes
    first = int(start.item())
    model = DistributedDataParallel(network)  # broadcasts rank 0's parameters to the others
    generator = torch.Generator().manual_seed(rank * 1000 + first)
    print(f"rank {rank}: model ready, training from step {first}", flush=True)
    progress = os.environ.get("ASTRAEUS_PROGRESS_FILE")
    for step in range(first, args.steps):
        if step == args.fail_at and rank == 1 and first == 0:
            print(f"rank {rank}: crashing at step {step}", flush=True)
            os._exit(4)
        if step == args.exit_at and rank == args.exit_rank:
            print(f"rank {rank}: giving up at step {step}", flush=True)
            sys.exit(3)
        if step == args.oom_child_at:
            ended = subprocess.run([sys.executable, "-c", HUNGRY]).returncode
            print(f"rank {rank}: helper ended {ended} at step {step}, going on", flush=True)
        inputs = torch.randn(64, 16, generator=generator)
        targets = inputs.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients over gloo here
        optimizer.step()
        if step == args.hang_at and rank == args.hang_rank:
            threading.Event().wait()  # never set
        print(f"rank {rank} step {step} loss {loss.item():.4f} at {time.time():.3f}", flush=True)
        if args.checkpoint and rank == 0 and (step + 1) % args.checkpoint_every == 0:
            aside = args.checkpoint + ".part"
            torch.save(
                {
                    "model": network.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "more": torch.randn(args.checkpoint_mb * 2**18, generator=generator),
                },
                aside,
            )
            with open(aside, "rb+") as written:
                os.fsync(written.fileno())  # on the disk, as a checkpoint must be
            os.replace(aside, args.checkpoint)
            saved = step
            print(f"rank {rank}: checkpoint at step {step}", flush=True)
        if progress:
            line = (
                f"{step}" if saved is None else json.dumps({"step": step, "checkpoint_step": saved})
            )
            with open(progress, "w" if args.overwrite_progress else "a") as f:
                f.write(line + "\n")
        time.sleep(args.sleep)
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
