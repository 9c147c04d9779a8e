"""Moving batches of arrays between actors and the learner: one interface, several backends.

``base`` is the interface (and its call loops), ``board`` the policy board's. Each backend is one
module of this package that defines ``BACKEND`` (a ``base.Backend``) and one entry in
``TRANSPORTS``; the runtime asks ``backend(name)`` for the one ``--transport`` names, and the
transport test suite runs over all of them. Remote actors on other machines come in over gRPC
(``remote``), whose gateway bridges each one into a slot of the learner's server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from seedbed.errors import ConfigError

if TYPE_CHECKING:
    from seedbed.transport.base import Backend

# name -> its module in this package. The first is the default: seedbed train's actor processes
# on the learner's host use shared memory.
TRANSPORTS = ("shm", "inprocess")


def check_transport(name: str, actor_processes: bool = False) -> None:
    """Raise a one-line ConfigError when ``name`` is not a registered transport, or, with
    ``actor_processes``, is one that cannot reach actors in other processes."""
    if name not in TRANSPORTS:
        raise ConfigError(f"--transport {name}: unknown; choose one of {', '.join(TRANSPORTS)}")
    if actor_processes and not backend(name).actor_processes:
        fit = [n for n in TRANSPORTS if backend(n).actor_processes]
        raise ConfigError(
            f"--transport {name} reaches only threads of the learner's process (tests); "
            f"seedbed train's actors are processes: use --transport {' or '.join(fit)}"
        )


def backend(name: str) -> Backend:
    """The ``Backend`` of transport ``name``, its module imported now (config stays light)."""
    check_transport(name)
    return importlib.import_module(f"seedbed.transport.{name}").BACKEND
