"""Users' plug-ins: modules of their own that register what seedbed does not ship.

A plug-in is any importable module that, when imported, registers some of: an environment
family (``seedbed.envs.register``), an agent (``seedbed.agents.register``), a transport
(``seedbed.transport.register``) and a logger sink (``seedbed.loggers.register``). The run
setting ``plugins`` (``--plugins MODULE,...``) names them; a registration exists only in a
process that imported its module, so every process of a run imports them before it reads its
settings: the command line (before it builds its flags), ``resolve`` (the learner, the Python
API, ``seedbed eval``), each local actor and learner replica, and each remote or Ray actor, to
which the learner sends the names in its assignment.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from seedbed.errors import ConfigError

_IMPORTED: list[str] = []  # the plug-ins this process imported, in order


def imported_plugins() -> tuple[str, ...]:
    """The plug-in modules this process imported (a run's other processes import the same)."""
    return tuple(_IMPORTED)


def import_plugins(modules: Iterable[str]) -> None:
    """Import each module in ``modules``, in order (a module imported before is not run again).

    Raises:
        ConfigError: One line, when a name is not a module name, or when a module cannot be
            imported: then it says to put the module on PYTHONPATH (or install its package)
            wherever the learner and actors run.
    """
    for module in modules:
        if not all(part.isidentifier() for part in module.split(".")):
            raise ConfigError(f"--plugins: '{module}' is not a module name (e.g. my_plugins.rl)")
        try:
            importlib.import_module(module)
            if module not in _IMPORTED:
                _IMPORTED.append(module)
        except ImportError as error:
            raise ConfigError(
                f"cannot import plug-in '{module}' ({error}); put it on PYTHONPATH or install "
                "its package, where the learner and every actor run"
            ) from None
