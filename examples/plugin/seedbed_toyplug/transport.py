"""The transport ``toyshm``: a module that defines ``BACKEND`` (a ``transport.base.Backend``).

A real one would bring its own server, endpoints and policy board; this one is seedbed's shared
memory under another name and description, which is all the registry needs to see.
"""

from __future__ import annotations

import dataclasses

from seedbed.transport.shm import BACKEND as SHM

BACKEND = dataclasses.replace(SHM, about="toyshm: shared memory, registered by a plug-in")
