"""A seedbed plug-in: one of each kind of thing a user can add without editing seedbed.

Importing this package registers them all::

    seedbed train --plugins seedbed_toyplug --env toyplug:CartPole-v1 --agent toyppo \
        --transport toyshm --loggers jsonl

(with this folder's parent, ``examples/plugin``, on PYTHONPATH). Each part is a module of its own:

- ``family``: the env family ``toyplug``, ids ``toyplug:GYM_ID``: a Gymnasium env whose rewards
  are multiplied by ``--reward-scale`` (its one setting);
- ``toyppo``: the agent ``toyppo``, a package with ``config`` and ``learning`` modules (here PPO's,
  renamed);
- ``transport``: the transport ``toyshm``, seedbed's shared memory under a name of its own;
- ``jsonl``: the logger sink ``jsonl``, which writes each metrics row to ``metrics.jsonl`` in the
  run directory.

Seedbed imports the package in every process of the run (the learner, each actor), so the
registrations below run once per process; ``unregister`` undoes them (tests).
"""

from __future__ import annotations

import seedbed.agents
import seedbed.envs
import seedbed.loggers
import seedbed.transport
from seedbed_toyplug.family import FAMILY
from seedbed_toyplug.jsonl import JsonLinesSink


def register() -> None:
    """Register the family, the agent, the transport and the sink."""
    seedbed.envs.register(FAMILY)
    seedbed.agents.register("toyppo", "seedbed_toyplug.toyppo")
    seedbed.transport.register("toyshm", "seedbed_toyplug.transport")
    seedbed.loggers.register("jsonl", JsonLinesSink)


def unregister() -> None:
    """Undo ``register``."""
    seedbed.envs.unregister(FAMILY.name)
    seedbed.agents.unregister("toyppo")
    seedbed.transport.unregister("toyshm")
    seedbed.loggers.unregister("jsonl")


register()
