"""Where a replicated learner's front door places a new remote actor: on the replica with the
fewest connected actors.

Each learner replica runs its own gateway; actors dial replica 0's (the front door). After the
token and hello checks the front door asks ``Placement.place`` which replica takes the actor:
itself (it serves it) or another one (it answers with a ``Redirect`` to that replica's
address). The front door counts its own actors live; the others' counts come from the replicas'
meeting after each learner step (``update``), which may be a step old, so the redirects issued
since then count too: a burst of actors that arrives between two meetings is spread out rather
than sent to one replica. Which replica an actor lands on is a balance, not a promise: an actor
that leaves, or never follows its redirect, is seen at the next meeting.

The gateway's event loop calls ``place``, the learner's thread ``mark`` and ``update``: a lock
keeps the counts whole. Nothing here knows of gRPC or torch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence


def choose(loads: Sequence[int], counts: Sequence[int], slots: Sequence[int]) -> int | None:
    """The replica with the fewest actors (``loads``: pending redirects included) among those
    with a free slot (``counts``, the actors counted there, below ``slots``, its slots); the
    lowest such index on a tie, so the front door serves an actor itself when it can. None when
    every slot is taken.

    Pending redirects order the replicas but never fill one: a redirect whose actor never
    arrives would otherwise close a replica that has no actors, and so never steps and is never
    counted again. An actor sent to a replica that filled meanwhile is refused there and comes
    back to the front door.
    """
    free = [i for i, (n, room) in enumerate(zip(counts, slots, strict=True)) if n < room]
    return min(free, key=lambda i: (loads[i], i)) if free else None


class Placement:
    """The front door's view of every replica's gateway (replica 0 is the front door itself).

    The call loop::

        placement = Placement(addresses, slots)   # every replica's gateway address and slots
        target = placement.place(here)            # per new actor, ``here`` the front door's own
        ...                                       # None: serve it here; else redirect there
        mark = placement.mark()                   # the learner's thread, before the meeting
        placement.update(counts, mark)            # every replica's connected actors, gathered
    """

    def __init__(self, addresses: Sequence[str], slots: Sequence[int]) -> None:
        """``addresses[i]`` and ``slots[i]``: replica i's gateway address and remote slots."""
        if len(addresses) != len(slots) or not addresses:
            raise ValueError("Placement needs one address and one slot count per replica")
        self.addresses = list(addresses)
        self.slots = list(slots)
        self._counts = [0] * len(slots)  # connected actors per replica, as last gathered
        self._issued = [0] * len(slots)  # redirects to each replica, ever
        self._counted = [0] * len(slots)  # of those, the ones the last gathered counts include
        self._lock = threading.Lock()

    @property
    def redirects(self) -> int:
        """Redirects issued in all."""
        with self._lock:
            return sum(self._issued)

    def loads(self, here: int) -> list[int]:
        """Each replica's actors as the front door sees them now: its own ``here``, the others'
        last gathered counts plus the redirects sent to them since."""
        with self._lock:
            return self._loads(here)

    def _loads(self, here: int) -> list[int]:
        pending = [a - b for a, b in zip(self._issued, self._counted, strict=True)]
        return [here] + [c + p for c, p in zip(self._counts[1:], pending[1:], strict=True)]

    def place(self, here: int) -> str | None:
        """Where a new actor goes, ``here`` being the front door's connected actors: None to
        serve it at the front door (or refuse it there, when every slot is taken), else the
        address of the replica it is redirected to (counted as pending until the next update)."""
        with self._lock:
            counts = [here, *self._counts[1:]]
            target = choose(self._loads(here), counts, self.slots)
            if target is None or target == 0:
                return None
            self._issued[target] += 1
            return self.addresses[target]

    def mark(self) -> list[int]:
        """The redirects issued so far, taken just before the replicas count their actors: the
        counts then gathered include (nearly) all of them, and ``update`` stops counting them."""
        with self._lock:
            return list(self._issued)

    def update(self, counts: Sequence[int], mark: Sequence[int]) -> None:
        """Every replica's connected actors as gathered after ``mark``: redirects issued before
        ``mark`` are in them, later ones stay pending."""
        if len(counts) != len(self.slots):
            raise ValueError(f"expected {len(self.slots)} counts, got {len(counts)}")
        with self._lock:
            self._counts = [int(c) for c in counts]
            self._counted = list(mark)
