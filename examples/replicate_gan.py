"""A small GAN on a ring of 8 Gaussians with ``seedbed.replicate``, on one replica or on N.

    python examples/replicate_gan.py                      # one replica, in this process
    python examples/replicate_gan.py --replicas 2         # two processes, started here
    seedbed replicate -n 2 examples/replicate_gan.py      # two processes, started by seedbed

Two models and two losses per step: ``wrap_optimizer`` fits better than DDP here. Each
optimizer averages its own model's gradients over the replicas before it steps, so the
generator's backward pass through the discriminator costs no communication. Each replica draws
its own data and noise (its share of the global batch); the weights start from replica 0's.

Quality, as in the Unrolled GAN paper (Metz et al., 2017): of 2,500 generated points, the share
within 3 standard deviations of a mode ("high quality"), and how many of the 8 modes got at
least 1% of the points.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from seedbed.replicate import InputContext, ReplicaContext, Replicator

MODES = torch.tensor(
    [[2.0 * math.cos(2 * math.pi * k / 8), 2.0 * math.sin(2 * math.pi * k / 8)] for k in range(8)]
)
STD = 0.1  # of each Gaussian
NOISE = 16  # generator input size


@dataclass
class Args:
    replicas: int = 1  # processes to start; keep 1 under `seedbed replicate` or torchrun
    steps: int = 3000  # generator and discriminator updates
    batch: int = 256  # global batch of real points, split evenly over the replicas
    lr: float = 1e-3  # Adam, both models
    seed: int = 0


def parse_args(argv: list[str] | None = None) -> Args:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in vars(Args()).items():
        p.add_argument("--" + name, type=type(default), default=default)
    return Args(**vars(p.parse_args(argv)))


def sample_ring(n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` points from the mixture: a random mode each, plus Gaussian noise."""
    modes = MODES[torch.randint(len(MODES), (n,), generator=gen)]
    return modes + STD * torch.randn(n, 2, generator=gen)


def mlp(inputs: int, outputs: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(inputs, 128),
        nn.LeakyReLU(0.2),
        nn.Linear(128, 128),
        nn.LeakyReLU(0.2),
        nn.Linear(128, outputs),
    )


def quality(rep: ReplicaContext, generator: nn.Module, points: int = 2500) -> dict[str, float]:
    """High-quality share and modes covered, over ``points`` samples drawn by all replicas."""
    with torch.no_grad():
        fake = generator(torch.randn(points // rep.num_replicas, NOISE, device=rep.device))
        dist, mode = torch.cdist(fake, MODES.to(rep.device)).min(dim=1)
        good = dist < 3 * STD
        per_mode = torch.bincount(mode[good], minlength=len(MODES))
    total = rep.all_reduce({"good": good.sum(), "per_mode": per_mode, "n": len(fake)}, "sum")
    covered = (total["per_mode"] >= 0.01 * total["n"]).sum().item()
    return {"high_quality": total["good"].item() / total["n"], "modes": covered}


def train(args: Args) -> dict[str, float]:
    """Train on every replica; return the quality of the generator (the same on all)."""
    start = time.perf_counter()
    torch.set_num_threads(1)  # models this small: more threads only contend for the cores
    with Replicator() as rep:
        torch.manual_seed(args.seed + rep.replica_id)  # own noise; wrap_optimizer aligns weights
        generator, critic = mlp(NOISE, 2).to(rep.device), mlp(2, 1).to(rep.device)
        adam = {"lr": args.lr, "betas": (0.5, 0.999)}
        g_opt = rep.wrap_optimizer(torch.optim.Adam(generator.parameters(), **adam))
        d_opt = rep.wrap_optimizer(torch.optim.Adam(critic.parameters(), **adam))

        def input_fn(ctx: InputContext):
            gen = torch.Generator().manual_seed(1000 * args.seed + ctx.replica_id)
            while True:
                yield sample_ring(args.batch // ctx.num_replicas, gen).to(ctx.device)

        def step_fn(ctx: ReplicaContext, real: torch.Tensor) -> dict:
            fake = generator(torch.randn(len(real), NOISE, device=ctx.device))
            ones = torch.ones(len(real), 1, device=ctx.device)
            zeros = torch.zeros_like(ones)
            d_loss = F.binary_cross_entropy_with_logits(critic(real), ones)
            d_loss = d_loss + F.binary_cross_entropy_with_logits(critic(fake.detach()), zeros)
            d_opt.zero_grad()
            d_loss.backward()
            d_opt.step()
            g_loss = F.binary_cross_entropy_with_logits(critic(fake), ones)  # non-saturating
            g_opt.zero_grad()
            g_loss.backward()
            g_opt.step()
            return {"d_loss": d_loss.detach(), "g_loss": g_loss.detach()}

        # Every replica's stream is endless: no need to check each step that all still have data.
        outputs = rep.run(step_fn, input_fn, steps=args.steps, stop_together=False)
        losses = rep.reduce_outputs(outputs[-100:])
        result = quality(rep, generator)
        wall = time.perf_counter() - start
        if rep.is_primary:
            print(
                f"high-quality samples {result['high_quality']:.1%}, modes covered "
                f"{result['modes']}/8, last-100-step losses D {losses['d_loss'].item():.3f} "
                f"G {losses['g_loss'].item():.3f}, {len(outputs)} steps on {rep.num_replicas} "
                f"replica(s), {wall:.1f} s",
                flush=True,
            )
        return {**result, "steps": len(outputs), "wall_s": wall}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.replicas > 1:
        Replicator.spawn(args.replicas, train, args)
    else:
        train(args)


if __name__ == "__main__":
    main()
