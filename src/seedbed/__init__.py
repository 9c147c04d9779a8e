"""seedbed: fast, cheap reinforcement learning on PyTorch.

SEED-style central inference, TF-Replicator-style replication and ActorQ-style quantized actors.
Heavy modules (torch) are imported lazily by the parts that need them, so actor processes and
``seedbed --help`` start quickly.
"""

from __future__ import annotations

__version__ = "0.1.0"
