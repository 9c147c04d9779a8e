"""Moving batches of arrays between actors and the learner: one interface, several backends.

``base`` is the interface (and its call loops), ``board`` the policy board's. Each backend is one
module that defines ``BACKEND`` (a ``base.Backend``) and has one entry in ``TRANSPORTS``: seedbed's
own are modules of this package, a user's is a module of the user's, added with ``register`` by a
plug-in (see ``seedbed.plugins``). The runtime asks ``backend(name)`` for the one ``--transport``
names, and the transport test suite runs over all of them. Remote actors on other machines come
in over gRPC (``remote``), whose gateway bridges each one into a slot of the learner's server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from seedbed.errors import ConfigError

if TYPE_CHECKING:
    from seedbed.transport.base import Backend

#: The default: seedbed train's actor processes on the learner's host use shared memory.
DEFAULT = "shm"
BUILTIN = (DEFAULT, "inprocess")
#: name -> the module that defines its ``BACKEND``; iterating gives the names, the default first.
TRANSPORTS: dict[str, str] = {name: f"seedbed.transport.{name}" for name in BUILTIN}


def register(name: str, module: str) -> None:
    """Add transport ``name``, whose module ``module`` (e.g. ``my_rl.rdma``) defines ``BACKEND``.

    The module is imported now, to check it. Registering the same module under its name again
    does nothing.

    Raises:
        ConfigError: One line, when the name is taken or the module cannot be imported or
            defines no ``BACKEND``.
    """
    if TRANSPORTS.get(name) == module:
        return
    if not name.isidentifier():
        raise ConfigError(f"transport name {name!r} must be a Python identifier (e.g. my_shm)")
    if name in TRANSPORTS:
        raise ConfigError(f"a transport named '{name}' is registered already ({TRANSPORTS[name]})")
    _backend_of(name, module)
    TRANSPORTS[name] = module


def unregister(name: str) -> None:
    """Remove the transport ``name`` that ``register`` added (tests add some and clean up)."""
    if name in BUILTIN:
        raise ConfigError(f"transport '{name}' is one of seedbed's own; it cannot be unregistered")
    TRANSPORTS.pop(name, None)


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
    return _backend_of(name, TRANSPORTS[name])


def _backend_of(name: str, module: str) -> Any:
    """``module``'s ``BACKEND``; a one-line error when it cannot be imported or has none."""
    from seedbed.transport.base import Backend

    try:
        found = getattr(importlib.import_module(module), "BACKEND", None)
    except ImportError as error:
        raise ConfigError(
            f"transport '{name}': cannot import {module} ({error}); put it on PYTHONPATH"
        ) from None
    if not isinstance(found, Backend):
        raise ConfigError(f"transport '{name}': {module} defines no BACKEND (a transport Backend)")
    return found
