"""Where a learner listens and an actor connects: ``HOST:PORT`` or ``unix:PATH``; and where
each learner replica listens beside the front door.

Checked where the address is given (``--listen`` with the run's settings, ``seedbed actor
--connect``), so a typo is one line before anything starts; the gateway and the client take
the address as it is.
"""

from __future__ import annotations

from seedbed.errors import ConfigError


def check_address(address: str, flag: str) -> None:
    """A one-line error unless ``address`` is ``HOST:PORT`` or ``unix:PATH``."""
    if address.startswith("unix:"):
        if len(address) > len("unix:"):
            return
    else:
        host, _, port = address.rpartition(":")
        if host and port.isdigit() and int(port) < 65536:
            return
    raise ConfigError(f"{flag} {address!r}: expected HOST:PORT (e.g. 127.0.0.1:5000) or unix:PATH")


WILDCARD_HOSTS = ("0.0.0.0", "[::]", "::")  # a listener on every interface


def on_host(address: str, host: str) -> str:
    """``address`` (``HOST:PORT``) with ``host`` in place of its host: the same port."""
    port = address.rpartition(":")[2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def replica_address(address: str, replica_id: int) -> str:
    """Where learner replica ``replica_id`` listens when replica 0, the front door, listens on
    ``address``: the same host on a free port, or a sibling of its Unix socket."""
    if replica_id == 0:
        return address
    if address.startswith("unix:"):
        return f"{address}.replica-{replica_id}"
    return f"{address.rpartition(':')[0]}:0"
