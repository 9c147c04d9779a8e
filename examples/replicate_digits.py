"""Digits classification with ``seedbed.replicate``: one script, on one replica or on N.

    python examples/replicate_digits.py                      # one replica, in this process
    python examples/replicate_digits.py --replicas 2         # two processes, started here
    seedbed replicate -n 2 examples/replicate_digits.py      # two processes, started by seedbed

The global batch stays the same whatever the number of replicas: each replica trains on its
equal share of every batch and DDP averages the gradients, so N replicas compute the same
updates as one. scikit-learn's 8x8 digits (1,797 images, bundled with it) are split 75/25.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from seedbed.replicate import InputContext, ReplicaContext, Replicator


@dataclass
class Args:
    replicas: int = 1  # processes to start; keep 1 under `seedbed replicate` or torchrun
    epochs: int = 10  # passes over the training images
    batch: int = 64  # global batch, split evenly over the replicas
    lr: float = 0.1  # SGD learning rate (momentum 0.9)
    seed: int = 0  # seed of the split, the weights and the batch order


def parse_args(argv: list[str] | None = None) -> Args:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in vars(Args()).items():
        p.add_argument("--" + name, type=type(default), default=default)
    return Args(**vars(p.parse_args(argv)))


def load_digits_split(seed: int) -> tuple[torch.Tensor, ...]:
    """Train and test images (scaled to [0, 1]) and labels, split the same way on every replica."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_train = int(0.75 * len(x))
    train, test = order[:n_train], order[n_train:]
    return x[train], y[train], x[test], y[test]


def train(args: Args) -> dict[str, float]:
    """Train on every replica; return the test accuracy (the same on all of them)."""
    start = time.perf_counter()
    torch.set_num_threads(1)  # models this small: more threads only contend for the cores
    with Replicator() as rep:
        x_train, y_train, x_test, y_test = load_digits_split(args.seed)
        torch.manual_seed(args.seed)
        net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        model = rep.wrap_model(net)  # DDP with several replicas; `net` itself with one
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        steps_per_epoch = len(x_train) // args.batch

        def input_fn(ctx: InputContext):
            if args.batch % ctx.num_replicas:
                raise ValueError(f"--batch {args.batch} does not split over {ctx.num_replicas}")
            share = args.batch // ctx.num_replicas
            first = ctx.replica_id * share
            for epoch in range(args.epochs):
                gen = torch.Generator().manual_seed(args.seed + epoch)
                order = torch.randperm(len(x_train), generator=gen)
                for step in range(steps_per_epoch):
                    idx = order[step * args.batch + first : step * args.batch + first + share]
                    yield x_train[idx].to(ctx.device), y_train[idx].to(ctx.device)

        def step_fn(ctx: ReplicaContext, batch: tuple[torch.Tensor, torch.Tensor]) -> dict:
            x, y = batch
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return {"loss": loss.detach()}

        outputs = rep.run(step_fn, input_fn)
        loss = rep.reduce_outputs(outputs[-steps_per_epoch:])["loss"].item()
        with torch.no_grad():  # each replica scores its share of the test set
            mine = slice(rep.replica_id, None, rep.num_replicas)
            predicted = net(x_test[mine].to(rep.device)).argmax(1)
            correct = (predicted == y_test[mine].to(rep.device)).sum()
        total = rep.all_reduce({"correct": correct, "count": len(predicted)}, "sum")
        accuracy = total["correct"].item() / total["count"]
        wall = time.perf_counter() - start
        if rep.is_primary:
            print(
                f"test accuracy {accuracy:.3f}, last-epoch loss {loss:.3f}, {len(outputs)} "
                f"steps on {rep.num_replicas} replica(s), {wall:.1f} s",
                flush=True,
            )
        return {"accuracy": accuracy, "loss": loss, "steps": len(outputs), "wall_s": wall}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.replicas > 1:
        Replicator.spawn(args.replicas, train, args)
    else:
        train(args)


if __name__ == "__main__":
    main()
