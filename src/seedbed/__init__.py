"""seedbed: fast, cheap reinforcement learning on PyTorch.

SEED-style central inference, TF-Replicator-style replication and ActorQ-style quantized actors.
Heavy modules (torch) are imported lazily by the parts that need them, so actor processes and
``seedbed --help`` start quickly.

From Python, ``seedbed.train`` runs what ``seedbed train`` runs and ``seedbed.evaluate`` what
``seedbed eval`` runs::

    summary = seedbed.train(env="CartPole-v1", total_frames=200_000, progress=False)
    result = seedbed.evaluate(summary["run_dir"], episodes=10)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seedbed.config import RunConfig, TrainConfig

__version__ = "0.1.0"


def train(config: RunConfig | TrainConfig | None = None, /, **settings: Any) -> dict[str, Any]:
    """Train as ``seedbed train`` does and return the run's summary (also its summary.json).

    ``settings`` take the flags' names with underscores (``env="atari:Pong"``,
    ``total_frames=10**6``, an agent's own such as ``epochs=2``), over the defaults of the env's
    family, and are checked the same way: a bad one raises ``seedbed.errors.ConfigError`` with
    the flag's message. ``config`` (a ``RunConfig`` or ``TrainConfig``) is a layer beneath them.
    Users' envs are named ``module:EnvId-v0``; the module registers them with Gymnasium.
    ``plugins=["my_plugins"]`` names modules that register env families, agents, transports or
    loggers: they are imported first, here and in every actor (``seedbed.plugins``).
    """
    from seedbed.config import RunConfig, TrainConfig, to_dict
    from seedbed.resolve import resolve

    layers = []
    if isinstance(config, RunConfig):
        layers.append(config.to_dict())
    elif isinstance(config, TrainConfig):
        layers.append(to_dict(config))
    elif config is not None:
        raise TypeError(f"config must be a RunConfig or TrainConfig, not {type(config).__name__}")
    config = resolve([*layers, settings])  # bad settings fail here, before torch is imported
    from seedbed.runtime.train import train as run

    return run(config)


def evaluate(
    path: str | Path,
    episodes: int = 10,
    video: str | None = None,
    seed: int = 12345,
    device: str = "cpu",
    plugins: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run a trained policy as ``seedbed eval`` does: ``path`` is a run directory (its newest
    checkpoint) or a checkpoint file; returns the episodes' returns, mean, std, min and max.
    ``plugins``: the modules the checkpoint may import (its plug-ins, its env's module)."""
    from seedbed.errors import ConfigError
    from seedbed.runtime.evaluate import evaluate as run

    if episodes <= 0:
        raise ConfigError(f"--episodes must be positive, got {episodes}")
    return run(path, episodes, video, seed, device, tuple(plugins))
